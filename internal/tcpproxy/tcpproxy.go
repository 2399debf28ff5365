// Package tcpproxy is a test helper: a TCP proxy in front of a broker or a
// database that a test can stall (the peer goes silent) or kill (the peer
// goes away). It is not used by the bridge itself.
package tcpproxy

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// dialTimeout bounds each dial to the target.
const dialTimeout = 5 * time.Second

// Proxy forwards every connection it accepts on 127.0.0.1 to its target.
type Proxy struct {
	target string
	ln     net.Listener
	ctx    context.Context // cancelled by Kill: ends dials in flight
	cancel context.CancelFunc
	wg     sync.WaitGroup

	accepted  atomic.Int64
	bytesUp   atomic.Int64 // client → target, forwarded
	swallowed atomic.Int64 // either way, read and dropped while stalled

	mu       sync.Mutex
	stalled  bool
	refusing bool
	killed   bool
	links    map[*link]struct{}
}

// link is one client connection and, unless it was accepted while the
// proxy stalled, its connection to the target.
type link struct {
	client, upstream net.Conn
	once             sync.Once
}

func (l *link) close() {
	l.once.Do(func() {
		_ = l.client.Close()
		if l.upstream != nil {
			_ = l.upstream.Close()
		}
	})
}

// Start listens on 127.0.0.1:0 and forwards each accepted connection to
// target (host:port). Kill or Close it when done.
func Start(target string) (*Proxy, error) { return StartAt("127.0.0.1:0", target) }

// StartAt is Start listening on addr: on the address of a proxy killed
// before, it is that node coming back.
func StartAt(addr, target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Proxy{target: target, ln: ln, ctx: ctx, cancel: cancel, links: map[*link]struct{}{}}
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

// Addr is the proxy's host:port, to dial instead of the target's.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Accepted is how many client connections the proxy accepted so far.
func (p *Proxy) Accepted() int { return int(p.accepted.Load()) }

// BytesUp is how many bytes the clients sent through to the target.
func (p *Proxy) BytesUp() int64 { return p.bytesUp.Load() }

// Swallowed is how many bytes, either way, the proxy read and dropped
// while stalled.
func (p *Proxy) Swallowed() int64 { return p.swallowed.Load() }

// Open is the number of client connections the proxy holds now.
func (p *Proxy) Open() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.links)
}

// Stall makes the proxy a peer gone silent: every connection stays open,
// bytes read from either side are dropped, and new connections are
// accepted and held open but never answered.
func (p *Proxy) Stall() {
	p.mu.Lock()
	p.stalled = true
	p.mu.Unlock()
}

// Refuse makes the proxy a server gone down, as a database restarting: it
// closes every connection it carries, on both sides, and until Resume
// closes each new connection at once, without dialing the target. It
// returns how many client connections it cut.
func (p *Proxy) Refuse() int {
	p.mu.Lock()
	p.refusing = true
	p.mu.Unlock()
	return p.cut()
}

// Resume forwards again for new connections, after Stall or Refuse. It
// closes every connection the proxy holds, since their streams lost bytes
// while stalled.
func (p *Proxy) Resume() {
	p.mu.Lock()
	p.stalled, p.refusing = false, false
	p.mu.Unlock()
	p.cut()
}

// Kill makes the proxy a node gone away: it closes the listener (further
// dials are refused) and every connection it carried, on both sides, waits
// until its goroutines ended and returns how many client connections it
// cut. Only the first call does anything.
func (p *Proxy) Kill() int {
	p.mu.Lock()
	if p.killed {
		p.mu.Unlock()
		return 0
	}
	p.killed = true
	p.mu.Unlock()
	p.cancel()
	_ = p.ln.Close()
	n := p.cut()
	p.wg.Wait()
	return n
}

// Close is Kill, for t.Cleanup.
func (p *Proxy) Close() { p.Kill() }

// cut closes and forgets every link, and says how many there were.
func (p *Proxy) cut() int {
	p.mu.Lock()
	links := p.links
	p.links = map[*link]struct{}{}
	p.mu.Unlock()
	for l := range links {
		l.close()
	}
	return len(links)
}

// add registers l, or closes it and reports false when the proxy was
// killed, or began refusing, meanwhile.
func (p *Proxy) add(l *link) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.killed || p.refusing {
		l.close()
		return false
	}
	p.links[l] = struct{}{}
	return true
}

func (p *Proxy) remove(l *link) {
	l.close()
	p.mu.Lock()
	delete(p.links, l)
	p.mu.Unlock()
}

func (p *Proxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // closed by Kill
		}
		p.accepted.Add(1)
		p.mu.Lock()
		stalled, refusing := p.stalled, p.refusing
		p.mu.Unlock()
		if refusing {
			_ = c.Close()
			continue
		}
		if stalled {
			p.add(&link{client: c}) // held open, never answered
			continue
		}
		p.wg.Add(1)
		go p.forward(c)
	}
}

func (p *Proxy) forward(c net.Conn) {
	defer p.wg.Done()
	d := net.Dialer{Timeout: dialTimeout}
	up, err := d.DialContext(p.ctx, "tcp", p.target)
	if err != nil {
		_ = c.Close()
		return
	}
	l := &link{client: c, upstream: up}
	if !p.add(l) {
		return
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.pipe(l, up, c, &p.bytesUp)
	}()
	p.pipe(l, c, up, nil)
	<-done
}

// pipe copies src to dst until either fails, dropping what it reads while
// the proxy stalls; then it closes the link.
func (p *Proxy) pipe(l *link, dst, src net.Conn, count *atomic.Int64) {
	defer p.remove(l)
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			stalled := p.stalled
			p.mu.Unlock()
			if stalled {
				p.swallowed.Add(int64(n))
			} else {
				// Counted before the write: the target may answer, and the
				// answer reach the client, before Write returns here, and a
				// client that saw the answer must see the bytes counted.
				if count != nil {
					count.Add(int64(n))
				}
				k, werr := dst.Write(buf[:n])
				if count != nil && k < n {
					count.Add(int64(k - n)) // not forwarded after all
				}
				if werr != nil {
					return
				}
			}
		}
		if err != nil {
			return
		}
	}
}
