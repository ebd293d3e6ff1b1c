// Package redistest provides test helpers that start real redis-server
// processes (standalone or a small Redis Cluster) for integration tests.
//
// Every server runs on its own free 127.0.0.1 port in a t.TempDir(), without
// persistence (StartPersistent: with), and is killed on t.Cleanup (and, on
// Linux, by the kernel when the process that started it dies). The shared
// Redis on 6379 is never used. StartCluster and StartClusterWithReplicas
// start a Redis Cluster, StartSentinel a master and a replica watched by
// three Sentinels. Launch starts one server for programs that are not tests.
package redistest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	// readyTimeout bounds how long one redis-server start may take to answer PING.
	readyTimeout = 10 * time.Second
	// clusterReadyTimeout bounds how long the cluster may take to report cluster_state:ok.
	clusterReadyTimeout = 15 * time.Second
	// pollInterval is the pause between readiness polls.
	pollInterval = 20 * time.Millisecond
	// startAttempts is how often a start is retried when the port was taken by someone else.
	startAttempts = 5
	// logTailLines is how many log lines are included in failure messages.
	logTailLines = 40

	// Cluster nodes need port and port+10000 (cluster bus). Both ranges are
	// kept below the Linux ephemeral range (32768+) so that outgoing
	// connections do not grab them.
	clusterPortMin   = 15000
	clusterPortMax   = 22000 // exclusive
	clusterBusOffset = 10000
)

// errPortInUse reports that redis-server could not bind its port(s).
var errPortInUse = errors.New("address already in use")

// Require skips the test when redis-server is not on PATH. When the
// environment variable CI is "true", it fails the test instead, because CI
// must run the integration tests (.ci/run installs redis-server).
func Require(t testing.TB) {
	t.Helper()
	requireBinary(t, "redis-server")
}

// requireBinary skips (or, with CI=true, fails) the test when name is not on PATH.
func requireBinary(t testing.TB, name string) {
	t.Helper()
	if _, err := exec.LookPath(name); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("redistest: %s is required in CI but was not found on PATH (%v); .ci/run installs it", name, err)
		}
		t.Skipf("redistest: %s not found on PATH (%v); skipping integration test that needs a real Redis", name, err)
	}
}

// Server is a redis-server process started for one test.
type Server struct {
	// Addr is the "127.0.0.1:port" address the server listens on.
	Addr string

	port      int
	dir       string
	kind      kind
	extraArgs []string

	mu   sync.Mutex
	proc *process
	// logStart holds the sizes of the log files when the current launch
	// began, so that errors are looked up only in the output of that launch.
	logStart map[string]int64
}

// kind is what a Server runs as.
type kind int

const (
	standalone   kind = iota // a plain Redis
	clusterNode              // a node of a Redis Cluster (--cluster-enabled yes)
	sentinelNode             // a Sentinel (redis-server <conf> --sentinel)
)

// process is one running redis-server.
type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed after cmd.Wait returned
}

// Start starts a standalone redis-server on a free 127.0.0.1 port in
// t.TempDir() with --save "" --appendonly no --maxmemory-policy noeviction,
// waits until it answers PING, and registers t.Cleanup to kill it. extraArgs
// are appended to the command line.
func Start(t testing.TB, extraArgs ...string) *Server {
	t.Helper()
	Require(t)
	return startServer(t, standalone, freePort, extraArgs)
}

// StartPersistent is Start with persistence: every write is appended and
// fsynced before it is acknowledged (--appendonly yes --appendfsync always),
// so a server killed with Stop and started again with Restart comes back
// with every acknowledged write. Its port lies below the kernel's ephemeral
// range, so that no outgoing connection takes it while the server is down.
func StartPersistent(t testing.TB, extraArgs ...string) *Server {
	t.Helper()
	Require(t)
	args := append([]string{"--appendonly", "yes", "--appendfsync", "always"}, extraArgs...)
	return startServer(t, standalone, freeStablePort, args)
}

// startServer creates a Server in a fresh temp dir and starts it on a port
// from pickPort, retrying with a new port when the bind fails.
func startServer(t testing.TB, k kind, pickPort func() (int, error), extraArgs []string) *Server {
	t.Helper()
	dir := t.TempDir()
	s, err := launchIn(dir, k, pickPort, extraArgs)
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	routes.watch(t, s) // (see RouteRedisLogs)
	// Registered after t.TempDir, so it runs before the directory is removed.
	t.Cleanup(s.Stop)
	return s
}

// Launch starts a standalone redis-server as Start does, for programs that
// are not tests (the bench harness): its files go in dir, which the caller
// removes after Stop. The error names what went wrong and includes the
// server's log.
func Launch(dir string, extraArgs ...string) (*Server, error) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		return nil, fmt.Errorf("redis-server not on PATH: %w", err)
	}
	return launchIn(dir, standalone, freePort, extraArgs)
}

// launchIn starts a server with its files in dir on a port from pickPort,
// retrying with a new port when the bind fails.
func launchIn(dir string, k kind, pickPort func() (int, error), extraArgs []string) (*Server, error) {
	s := &Server{
		dir:       dir,
		kind:      k,
		extraArgs: append([]string(nil), extraArgs...),
	}
	var lastErr error
	for attempt := 0; attempt < startAttempts; attempt++ {
		port, err := pickPort()
		if err != nil {
			return nil, fmt.Errorf("find free port: %w", err)
		}
		s.port = port
		s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		lastErr = s.launch()
		if lastErr == nil {
			return s, nil
		}
		if !errors.Is(lastErr, errPortInUse) {
			break
		}
	}
	return nil, fmt.Errorf("start redis-server: %w\n%s", lastErr, s.logTail())
}

// Client returns a new client for the server that is closed on t.Cleanup.
func (s *Server) Client(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Restart kills the server with SIGKILL (if it still runs) and starts it
// again on the same port and directory, waiting until it answers PING. Call
// Stop first to keep it down for a while. Without persistence all data is
// lost; with it (StartPersistent) every acknowledged write is back. Loaded
// scripts are gone either way (NOSCRIPT).
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.Stop()
	var err error
	for attempt := 0; attempt < startAttempts; attempt++ {
		if err = s.launch(); err == nil || !errors.Is(err, errPortInUse) {
			break
		}
		time.Sleep(100 * time.Millisecond) // give the kernel a moment to release the port
	}
	if err != nil {
		t.Fatalf("redistest: restart redis-server on %s: %v\n%s", s.Addr, err, s.logTail())
	}
}

// Stop kills the server now and waits for the process to exit. It is safe to
// call more than once; later calls do nothing.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		s.proc.kill()
		s.proc = nil
	}
}

// Pause stops the server process (SIGSTOP) without closing its sockets: a
// Redis that hangs, as under a long fork, swap or a stuck host. Resume
// continues it; Stop and the test cleanup kill a paused server as usual.
func (s *Server) Pause(t testing.TB) {
	t.Helper()
	s.signal(t, syscall.SIGSTOP)
}

// Resume continues a paused server (SIGCONT).
func (s *Server) Resume(t testing.TB) {
	t.Helper()
	s.signal(t, syscall.SIGCONT)
}

func (s *Server) signal(t testing.TB, sig syscall.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		t.Fatalf("redistest: signal %v: server on %s is not running", sig, s.Addr)
	}
	if err := s.proc.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("redistest: signal %v to redis-server on %s: %v", sig, s.Addr, err)
	}
}

// args returns the redis-server command line arguments.
func (s *Server) args() []string {
	args := []string{
		"--port", strconv.Itoa(s.port),
		"--bind", "127.0.0.1",
		"--dir", s.dir,
		"--logfile", filepath.Join(s.dir, "redis.log"),
		"--daemonize", "no",
		"--save", "",
		"--appendonly", "no",
		"--maxmemory-policy", "noeviction",
	}
	switch s.kind {
	case clusterNode:
		args = append(args,
			"--cluster-enabled", "yes",
			"--cluster-config-file", filepath.Join(s.dir, "nodes.conf"),
			"--cluster-node-timeout", "2000",
		)
	case sentinelNode:
		// A Sentinel needs a config file of its own, which it rewrites.
		args = append([]string{s.sentinelConf(), "--sentinel"}, args...)
	}
	return append(args, s.extraArgs...)
}

// launch starts redis-server on s.port and waits until it is ready. On
// failure the process is killed and the error wraps errPortInUse when the
// port was taken.
func (s *Server) launch() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		return errors.New("server already running")
	}
	switch s.kind {
	case clusterNode:
		// A stale nodes.conf from a previous start would make the node
		// refuse to start or keep an old identity.
		_ = os.Remove(filepath.Join(s.dir, "nodes.conf"))
	case sentinelNode:
		// Fresh on every launch: what a Sentinel monitors is set by commands.
		if err := os.WriteFile(s.sentinelConf(), nil, 0o644); err != nil {
			return err
		}
	}

	s.logStart = map[string]int64{}
	for _, name := range logFiles {
		if fi, err := os.Stat(filepath.Join(s.dir, name)); err == nil {
			s.logStart[name] = fi.Size()
		}
	}

	out, err := os.OpenFile(filepath.Join(s.dir, "stdout.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command("redis-server", s.args()...)
	cmd.Dir = s.dir
	killWithParent(cmd)
	cmd.Stdout = out
	cmd.Stderr = out
	err = cmd.Start()
	_ = out.Close() // the child holds its own descriptor
	if err != nil {
		return fmt.Errorf("exec redis-server: %w", err)
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()

	if err := s.waitReady(p); err != nil {
		p.kill()
		return err
	}
	s.proc = p
	return nil
}

// waitReady polls the server until it answers PING from the process we
// started, the process exits, or readyTimeout passes.
func (s *Server) waitReady(p *process) error {
	deadline := time.Now().Add(readyTimeout)
	var lastErr error
	for {
		select {
		case <-p.done:
			if s.logContains("Address already in use") {
				return fmt.Errorf("redis-server exited: port %d or its cluster bus port: %w", s.port, errPortInUse)
			}
			return fmt.Errorf("redis-server exited before becoming ready (%v)", p.cmd.ProcessState)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis-server on %s not ready after %v: last error: %v", s.Addr, readyTimeout, lastErr)
		}
		if lastErr = pingOwn(s.Addr, p.cmd.Process.Pid); lastErr == nil {
			return nil
		}
		time.Sleep(pollInterval)
	}
}

// pingOwn sends PING and INFO server to addr over a plain connection and
// checks that the server answers PONG and is the process with the given pid
// (not some other server that won a race for the port). A raw connection is
// used so that no client pool state or dial-retry backoff delays polling.
func pingOwn(addr string, pid int) error {
	conn, err := net.DialTimeout("tcp", addr, 250*time.Millisecond)
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(time.Second)); err != nil {
		return err
	}
	if _, err := io.WriteString(conn, "*1\r\n$4\r\nPING\r\n*2\r\n$4\r\nINFO\r\n$6\r\nserver\r\n"); err != nil {
		return err
	}
	r := bufio.NewReader(conn)
	line, err := r.ReadString('\n')
	if err != nil {
		return err
	}
	if line = strings.TrimSpace(line); line != "+PONG" {
		return fmt.Errorf("PING replied %q", line)
	}
	line, err = r.ReadString('\n')
	if err != nil {
		return err
	}
	line = strings.TrimSpace(line)
	if !strings.HasPrefix(line, "$") {
		return fmt.Errorf("INFO replied %q", line)
	}
	n, err := strconv.Atoi(line[1:])
	if err != nil || n < 0 {
		return fmt.Errorf("INFO replied %q", line)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return err
	}
	want := "process_id:" + strconv.Itoa(pid)
	for _, l := range strings.Split(string(body), "\n") {
		if strings.TrimSpace(l) == want {
			return nil
		}
	}
	return fmt.Errorf("server on %s is not our process (want %s)", addr, want)
}

// kill sends SIGKILL and waits for the process to exit.
func (p *process) kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

// logFiles are the files in the server's dir that receive its output.
var logFiles = []string{"redis.log", "stdout.log"}

// logContains reports whether the output of the current launch contains substr.
func (s *Server) logContains(substr string) bool {
	for _, name := range logFiles {
		b, err := os.ReadFile(filepath.Join(s.dir, name))
		if err != nil {
			continue
		}
		if off := s.logStart[name]; off <= int64(len(b)) {
			b = b[off:]
		}
		if strings.Contains(string(b), substr) {
			return true
		}
	}
	return false
}

// logTail returns the last lines of the server's log files for failure messages.
func (s *Server) logTail() string {
	var sb strings.Builder
	for _, name := range logFiles {
		path := filepath.Join(s.dir, name)
		lines, err := tailLines(path, logTailLines)
		if err != nil || len(lines) == 0 {
			continue
		}
		fmt.Fprintf(&sb, "--- last %d lines of %s ---\n%s\n", len(lines), path, strings.Join(lines, "\n"))
	}
	if sb.Len() == 0 {
		return "(no redis-server output)"
	}
	return sb.String()
}

// tailLines returns up to n last lines of the file at path.
func tailLines(path string, n int) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return lines, sc.Err()
}

// ClosedAddr returns a 127.0.0.1 address nothing listens on (a port the
// kernel just handed out and that was closed again): connecting to it is
// refused, as to a Redis that is down.
func ClosedAddr(t testing.TB) string {
	t.Helper()
	port, err := freePort()
	if err != nil {
		t.Fatalf("redistest: a free port: %v", err)
	}
	return "127.0.0.1:" + strconv.Itoa(port)
}

// freePort asks the kernel for a free 127.0.0.1 TCP port.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// freeStablePort returns a random free port in [clusterPortMin,
// clusterPortMax), below the ephemeral range: a server restarted after a
// while finds its port still free.
func freeStablePort() (int, error) {
	for i := 0; i < 200; i++ {
		if port := clusterPortMin + rand.IntN(clusterPortMax-clusterPortMin); portFree(port) {
			return port, nil
		}
	}
	return 0, errors.New("no free port found below the ephemeral range")
}

// freeClusterPort returns a random port in [clusterPortMin, clusterPortMax)
// such that both it and its cluster bus port (+10000) are currently free.
func freeClusterPort() (int, error) {
	for i := 0; i < 200; i++ {
		port := clusterPortMin + rand.IntN(clusterPortMax-clusterPortMin)
		if portFree(port) && portFree(port+clusterBusOffset) {
			return port, nil
		}
	}
	return 0, errors.New("no free port pair (port, port+10000) found")
}

// portFree reports whether 127.0.0.1:port can be listened on right now.
func portFree(port int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return false
	}
	_ = l.Close()
	return true
}
