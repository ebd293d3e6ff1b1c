package redistest

import (
	"io"
	"net"
	"sync"
	"testing"
)

// Proxy forwards TCP connections on a loopback port to a Redis server, the
// way a DNS name or a load balancer in front of a failover pair does: the
// target can be switched, and connections opened before the switch keep
// talking to the old server. It can also refuse new connections.
type Proxy struct {
	// Addr is the "127.0.0.1:port" address clients dial.
	Addr string

	ln     net.Listener
	mu     sync.Mutex
	target string
	refuse bool
	conns  []net.Conn
	closed bool
}

// StartProxy starts a proxy to target and registers t.Cleanup to close it
// and every connection through it.
func StartProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("redistest: proxy: %v", err)
	}
	p := &Proxy{Addr: ln.Addr().String(), ln: ln, target: target}
	go p.serve()
	t.Cleanup(p.Close)
	return p
}

// SetTarget sends connections opened from now on to target; open ones stay
// where they are.
func (p *Proxy) SetTarget(target string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.target = target
}

// Refuse makes the proxy cut its open connections and close new ones at
// once (on), as a network partition would, or forward them again (off).
func (p *Proxy) Refuse(on bool) {
	p.mu.Lock()
	p.refuse = on
	var cut []net.Conn
	if on {
		cut, p.conns = p.conns, nil
	}
	p.mu.Unlock()
	for _, c := range cut {
		_ = c.Close()
	}
}

// Close stops the proxy and closes every connection through it.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.closed = true
	conns := p.conns
	p.conns = nil
	p.mu.Unlock()
	_ = p.ln.Close()
	for _, c := range conns {
		_ = c.Close()
	}
}

func (p *Proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		target, refuse, closed := p.target, p.refuse, p.closed
		p.mu.Unlock()
		if refuse || closed {
			_ = c.Close()
			continue
		}
		up, err := net.Dial("tcp", target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, up)
		p.mu.Unlock()
		go pipe(c, up)
		go pipe(up, c)
	}
}

func pipe(dst, src net.Conn) {
	_, _ = io.Copy(dst, src)
	_ = dst.Close()
	_ = src.Close()
}
