package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"net"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// Scenario S learns each admission's exact time on the Redis clock from
// Redis itself: MONITOR shows the commands a script runs, and every
// decision that admits calls writes the bucket state (HSET key T: ts, x,
// q, then per and owed of each bucket, as doubles), ts being the
// decision's Redis TIME in microseconds. What
// a tier owes rises by exactly per_us for each call admitted and falls by
// rate each microsecond, in whole numbers, so two writes in a row tell how
// many calls the second decision admitted: (owed - max(owed_before -
// elapsed x rate, 0)) / per_us, the same for every tier.

// stateWrite is one HSET of the bucket hash seen by MONITOR.
type stateWrite struct {
	at               int64  // MONITOR's timestamp, us on the Redis clock
	L, T, S          string // the fields written (L limits, T state, s suspended until)
	hasL, hasT, hasS bool
}

// monitor reads MONITOR on its own connection and keeps the HSETs of key.
type monitor struct {
	conn   net.Conn
	key    string
	mu     sync.Mutex
	writes []stateWrite
	lines  int
	done   chan error
}

func startMonitor(ctx context.Context, o *redis.Options, key string) (*monitor, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", o.Addr)
	if err != nil {
		return nil, err
	}
	rd := bufio.NewReaderSize(conn, 1<<20)
	send := func(args ...string) (string, error) {
		var b strings.Builder
		fmt.Fprintf(&b, "*%d\r\n", len(args))
		for _, a := range args {
			fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
		}
		if _, err := conn.Write([]byte(b.String())); err != nil {
			return "", err
		}
		return rd.ReadString('\n')
	}
	if o.Password != "" {
		args := []string{"AUTH", o.Password}
		if o.Username != "" {
			args = []string{"AUTH", o.Username, o.Password}
		}
		if r, err := send(args...); err != nil || !strings.HasPrefix(r, "+OK") {
			conn.Close()
			return nil, fmt.Errorf("MONITOR connection: AUTH: %q %v", r, err)
		}
	}
	if r, err := send("MONITOR"); err != nil || !strings.HasPrefix(r, "+OK") {
		conn.Close()
		return nil, fmt.Errorf("MONITOR: %q %v", r, err)
	}
	m := &monitor{conn: conn, key: key, done: make(chan error, 1)}
	needle := `"HSET" "` + key + `"`
	go func() {
		for {
			line, err := rd.ReadString('\n')
			if err != nil {
				m.done <- err
				return
			}
			m.mu.Lock()
			m.lines++
			m.mu.Unlock()
			if !strings.Contains(line, needle) {
				continue
			}
			args := monitorArgs(line)
			var w stateWrite
			if sec, _, ok := strings.Cut(line, " "); ok {
				if f, err := strconv.ParseFloat(strings.TrimPrefix(sec, "+"), 64); err == nil {
					w.at = int64(f * 1e6)
				}
			}
			for i := 2; i+1 < len(args); i += 2 { // HSET key f v f v ...
				switch args[i] {
				case "L":
					w.L, w.hasL = args[i+1], true
				case "T":
					w.T, w.hasT = args[i+1], true
				case "s":
					w.S, w.hasS = args[i+1], true
				}
			}
			m.mu.Lock()
			m.writes = append(m.writes, w)
			m.mu.Unlock()
		}
	}()
	return m, nil
}

// stop ends MONITOR and returns the writes seen, in order, and how many
// lines it read in all.
func (m *monitor) stop() ([]stateWrite, int) {
	_ = m.conn.Close()
	<-m.done
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.writes, m.lines
}

// monitorArgs splits a MONITOR line (`1712345678.123456 [0 lua] "HSET"
// "k" "v"`) into its quoted arguments.
func monitorArgs(line string) []string {
	var args []string
	for i := 0; i < len(line); i++ {
		if line[i] != '"' {
			continue
		}
		var b strings.Builder
		for i++; i < len(line) && line[i] != '"'; i++ {
			if line[i] != '\\' || i+1 >= len(line) {
				b.WriteByte(line[i])
				continue
			}
			// Redis writes bytes as sdscatrepr does: \n \r \t \a \b, \xHH
			// for other bytes that do not print, \\ and \".
			i++
			switch c := line[i]; c {
			case 'n':
				b.WriteByte('\n')
			case 'r':
				b.WriteByte('\r')
			case 't':
				b.WriteByte('\t')
			case 'a':
				b.WriteByte('\a')
			case 'b':
				b.WriteByte('\b')
			case 'x':
				if v, err := strconv.ParseUint(line[i+1:min(i+3, len(line))], 16, 8); err == nil && i+2 < len(line) {
					b.WriteByte(byte(v))
					i += 2
				} else {
					b.WriteByte(c)
				}
			default:
				b.WriteByte(c)
			}
		}
		args = append(args, b.String())
	}
	return args
}

// bucketTier is one token bucket of the limits in force: rate tokens per
// period, each token per_us of owed.
type bucketTier struct{ rate, perUS int64 }

// parseL reads the token buckets of an L field by period ("1000").
func parseL(L string) (map[string]bucketTier, error) {
	out := map[string]bucketTier{}
	for _, tok := range strings.Fields(L) {
		if strings.HasPrefix(tok, "#") {
			continue
		}
		parts := strings.Split(tok, "/")
		if len(parts) != 3 {
			return nil, fmt.Errorf("L %q: item %q is not a token bucket", L, tok)
		}
		r, err1 := strconv.ParseInt(parts[0], 10, 64)
		p, err2 := strconv.ParseInt(parts[1], 10, 64)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("L %q: item %q", L, tok)
		}
		out[parts[1]] = bucketTier{rate: r, perUS: p * 1000}
	}
	return out, nil
}

// parseT reads a T field (internal/lua/lib.lua: little-endian doubles ts,
// x, q, then period and owed of each bucket that owes): ts (us) and what
// each bucket owes, by period ("1000").
func parseT(T string) (int64, map[string]int64, error) {
	if len(T) < 24 || (len(T)-24)%16 != 0 {
		return 0, nil, fmt.Errorf("T %q: want 24 bytes and 16 per bucket", T)
	}
	f := func(i int) float64 { return math.Float64frombits(binary.LittleEndian.Uint64([]byte(T[8*i : 8*i+8]))) }
	owed := map[string]int64{}
	for i := 3; 8*i < len(T); i += 2 {
		owed[strconv.FormatInt(int64(f(i)), 10)] = int64(f(i + 1))
	}
	return int64(f(0)), owed, nil
}

// replay is what the state writes of one key say happened.
type replay struct {
	admitted []int64    // Redis time (us) of every call admitted, one entry per call
	changes  []int64    // when each SetLimits wrote (us)
	suspend  [][2]int64 // suspensions written: from, until (us)
	// disagree counts the writes whose tiers disagreed on how many calls
	// they admitted (0: the replay is exact).
	disagree int
}

// admissionsFromWrites replays the state writes of one key, from its first
// SetLimits on.
func admissionsFromWrites(writes []stateWrite) (replay, error) {
	var (
		tiers map[string]bucketTier
		owed  = map[string]int64{}
		ts    int64
		out   replay
	)
	for _, w := range writes {
		if w.hasS {
			until, err := strconv.ParseInt(w.S, 10, 64)
			if err != nil {
				return out, fmt.Errorf("s %q", w.S)
			}
			out.suspend = append(out.suspend, [2]int64{w.at, until})
		}
		if w.hasL {
			// When it happened: the script's TIME, written as T's ts when a
			// bucket owes; else MONITOR's timestamp (a few us later).
			at := w.at
			if w.hasT {
				if ts, _, err := parseT(w.T); err == nil {
					at = ts
				}
			}
			out.changes = append(out.changes, at)
			// SetLimits: new limits, the tokens carried over; no call.
			t, err := parseL(strings.TrimSpace(w.L))
			if err != nil {
				return out, err
			}
			tiers, owed = t, map[string]int64{}
			if w.hasT {
				if ts, owed, err = parseT(w.T); err != nil {
					return out, err
				}
			}
			continue
		}
		if !w.hasT || tiers == nil {
			continue
		}
		now, next, err := parseT(w.T)
		if err != nil {
			return out, err
		}
		k, exact := int64(-1), true
		for per, t := range tiers {
			before := max(owed[per]-max(now-ts, 0)*t.rate, 0)
			d := next[per] - before
			n := d / t.perUS
			if d%t.perUS != 0 || n < 0 || (k >= 0 && n != k) {
				exact = false
			}
			k = max(k, n)
		}
		if !exact {
			out.disagree++
		}
		for range k {
			out.admitted = append(out.admitted, now)
		}
		ts, owed = now, next
	}
	return out, nil
}
