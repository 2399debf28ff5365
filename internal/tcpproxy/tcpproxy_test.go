package tcpproxy

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/delaybridge/delaybridge/internal/testenv"
)

// echoServer echoes every connection back; it counts the connections it
// accepted and closes at cleanup.
type echoServer struct {
	ln       net.Listener
	accepted atomic.Int64
	wg       sync.WaitGroup
	mu       sync.Mutex
	conns    []net.Conn
}

// setup checks for leaked goroutines once the test's proxy and echo server
// are gone, and starts the echo server and a proxy in front of it.
func setup(t *testing.T) (*echoServer, *Proxy) {
	t.Helper()
	t.Cleanup(func() { goleak.VerifyNone(t) }) // runs last
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &echoServer{ln: ln}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			e.accepted.Add(1)
			e.mu.Lock()
			e.conns = append(e.conns, c)
			e.mu.Unlock()
			e.wg.Add(1)
			go func() {
				defer e.wg.Done()
				_, _ = io.Copy(c, c)
				_ = c.Close()
			}()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		e.mu.Lock()
		for _, c := range e.conns {
			_ = c.Close()
		}
		e.mu.Unlock()
		e.wg.Wait()
	})
	p, err := Start(ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return e, p
}

func dial(t *testing.T, p *Proxy) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", p.Addr(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// roundTrip writes msg and wants it echoed within 5 s.
func roundTrip(t *testing.T, c net.Conn, msg string) {
	t.Helper()
	if _, err := c.Write([]byte(msg)); err != nil {
		t.Fatalf("write: %v", err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != msg {
		t.Fatalf("read %q, %v; want %q", buf, err, msg)
	}
}

// silent writes msg and wants no answer within d, the connection still open.
func silent(t *testing.T, c net.Conn, msg string, d time.Duration) {
	t.Helper()
	if _, err := c.Write([]byte(msg)); err != nil {
		t.Fatalf("write: %v", err)
	}
	_ = c.SetReadDeadline(time.Now().Add(d))
	n, err := c.Read(make([]byte, 64))
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("read %d bytes, %v; want a timeout on an open connection", n, err)
	}
}

// closed wants c closed by the proxy within 5 s.
func closed(t *testing.T, c net.Conn) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadAll(c); err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("the connection is still open: %v", err)
		}
	}
}

func TestForward(t *testing.T) {
	e, p := setup(t)
	a, b := dial(t, p), dial(t, p)
	roundTrip(t, a, "hello")
	roundTrip(t, b, "world!")
	roundTrip(t, a, "again")
	if got := p.Accepted(); got != 2 {
		t.Errorf("Accepted = %d, want 2", got)
	}
	if got := e.accepted.Load(); got != 2 {
		t.Errorf("the target accepted %d connections, want 2", got)
	}
	if got := p.BytesUp(); got != int64(len("hello")+len("world!")+len("again")) {
		t.Errorf("BytesUp = %d, want 16", got)
	}
	if got := p.Open(); got != 2 {
		t.Errorf("Open = %d, want 2", got)
	}
	_ = a.Close()
	testenv.WaitFor(t, 5*time.Second, "Open to drop to 1 after a client closed", func() bool { return p.Open() == 1 })
}

func TestStall(t *testing.T) {
	e, p := setup(t)
	a := dial(t, p)
	roundTrip(t, a, "before")
	up := p.BytesUp()
	p.Stall()
	silent(t, a, "during", 200*time.Millisecond)
	testenv.WaitFor(t, 5*time.Second, "the stalled bytes to be swallowed", func() bool { return p.Swallowed() == int64(len("during")) })
	if got := p.BytesUp(); got != up {
		t.Errorf("BytesUp moved from %d to %d while stalled", up, got)
	}
	// A stalled proxy still accepts, but answers nothing and does not dial
	// the target.
	b := dial(t, p)
	silent(t, b, "new", 200*time.Millisecond)
	if got := p.Accepted(); got != 2 {
		t.Errorf("Accepted = %d, want 2", got)
	}
	if got := e.accepted.Load(); got != 1 {
		t.Errorf("the target accepted %d connections, want 1 (none while stalled)", got)
	}
	if got := p.Open(); got != 2 {
		t.Errorf("Open = %d, want 2", got)
	}
	// Still silent later: nothing passes either way.
	silent(t, a, "more", 200*time.Millisecond)
}

func TestResume(t *testing.T) {
	_, p := setup(t)
	a := dial(t, p)
	roundTrip(t, a, "before")
	p.Stall()
	b := dial(t, p)
	silent(t, a, "lost", 100*time.Millisecond)
	testenv.WaitFor(t, 5*time.Second, "Open to count the held connection", func() bool { return p.Open() == 2 })
	p.Resume()
	// The connections of the stall lost bytes: they are closed.
	closed(t, a)
	closed(t, b)
	testenv.WaitFor(t, 5*time.Second, "Open to drop to 0", func() bool { return p.Open() == 0 })
	c := dial(t, p)
	roundTrip(t, c, "after")
	if got := p.Accepted(); got != 3 {
		t.Errorf("Accepted = %d, want 3", got)
	}
}

func TestKill(t *testing.T) {
	_, p := setup(t)
	a, b := dial(t, p), dial(t, p)
	roundTrip(t, a, "x")
	roundTrip(t, b, "y")
	p.Stall()
	c := dial(t, p) // held while stalled: cut as well
	testenv.WaitFor(t, 5*time.Second, "the held connection", func() bool { return p.Open() == 3 })
	if got := p.Kill(); got != 3 {
		t.Errorf("Kill cut %d connections, want 3", got)
	}
	closed(t, a)
	closed(t, b)
	closed(t, c)
	if c, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
		_ = c.Close()
		t.Error("a killed proxy still accepts connections")
	}
	if got := p.Open(); got != 0 {
		t.Errorf("Open = %d after Kill, want 0", got)
	}
	if got := p.Kill(); got != 0 {
		t.Errorf("a second Kill cut %d connections, want 0", got)
	}
	p.Close()
}

// A client whose target refuses is accepted, then closed; Kill returns.
func TestTargetDown(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	target := ln.Addr().String()
	_ = ln.Close()
	p, err := Start(target)
	if err != nil {
		t.Fatal(err)
	}
	c := dial(t, p)
	closed(t, c) // the dial to the target failed: the client is closed
	if got := p.Accepted(); got != 1 {
		t.Errorf("Accepted = %d, want 1", got)
	}
	done := make(chan int, 1)
	go func() { done <- p.Kill() }()
	select {
	case n := <-done:
		if n != 0 {
			t.Errorf("Kill cut %d connections, want 0", n)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Kill hangs")
	}
}

func TestRefuse(t *testing.T) {
	e, p := setup(t)
	a, b := dial(t, p), dial(t, p)
	roundTrip(t, a, "x")
	roundTrip(t, b, "y")
	if got := p.Refuse(); got != 2 {
		t.Errorf("Refuse cut %d connections, want 2", got)
	}
	closed(t, a)
	closed(t, b)
	// Refusing: a new connection is closed at once, and the target never
	// hears of it.
	c := dial(t, p)
	closed(t, c)
	if got := e.accepted.Load(); got != 2 {
		t.Errorf("the target accepted %d connections, want 2 (none while refusing)", got)
	}
	if got := p.Open(); got != 0 {
		t.Errorf("Open = %d while refusing, want 0", got)
	}
	p.Resume()
	d := dial(t, p)
	roundTrip(t, d, "after")
	if got := p.Accepted(); got != 4 {
		t.Errorf("Accepted = %d, want 4", got)
	}
}
