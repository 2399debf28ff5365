package broker

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/delaybridge/delaybridge/internal/tcpproxy"
	"github.com/delaybridge/delaybridge/internal/testenv"
)

// acceptCounter listens on addr (":0" for any port) and counts the
// connections it accepts, closing each at once; closed at cleanup.
func acceptCounter(t *testing.T, addr string) (net.Listener, *atomic.Int64) {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	n := new(atomic.Int64)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			n.Add(1)
			_ = c.Close()
		}
	}()
	return l, n
}

// pauseResult is what pause returned and when.
type pauseResult struct {
	alive bool
	at    time.Time
}

func startPause(c *Conn, d time.Duration, closed map[string]bool) <-chan pauseResult {
	done := make(chan pauseResult, 1)
	go func() {
		alive := c.pause(context.Background(), d, closed)
		done <- pauseResult{alive, time.Now()}
	}()
	return done
}

// A pause ends as soon as a broker port that was closed accepts
// connections again, whether the closed port was seen by the last attempt
// (closed) or by a probe during the pause (nil: no attempt yet).
func TestPauseEndsWhenAClosedPortOpens(t *testing.T) {
	for _, tc := range []struct {
		name   string
		closed func(addr string) map[string]bool
	}{
		{"refused at the last attempt", func(addr string) map[string]bool { return map[string]bool{addr: true} }},
		{"found closed by a probe", func(string) map[string]bool { return nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := freeAddr(t)
			c := NewConn(ConnOptions{URL: "amqp://guest:guest@" + addr + "/", Logger: zerolog.Nop(),
				ProbeInterval: 50 * time.Millisecond})
			const backoff = 30 * time.Second
			done := startPause(c, backoff, tc.closed(addr))
			select {
			case r := <-done:
				t.Fatalf("pause ended (alive=%v) while the port was still closed", r.alive)
			case <-time.After(500 * time.Millisecond):
			}
			_, accepted := acceptCounter(t, addr)
			opened := time.Now()
			select {
			case r := <-done:
				if !r.alive {
					t.Fatal("pause reported its context ended")
				}
				t.Logf("pause ended %s after the port opened (backoff %s)", r.at.Sub(opened).Round(time.Millisecond), backoff)
			case <-time.After(10 * time.Second): // far above the 50 ms probe interval, far below the backoff
				t.Fatalf("pause still waiting 10 s after the port opened")
			}
			// The probe's connect returns before the listener counts it.
			testenv.Eventually(5*time.Second, func() bool { return accepted.Load() > 0 })
			time.Sleep(200 * time.Millisecond) // four probe intervals: any further probe
			if n := accepted.Load(); n != 1 {
				t.Errorf("%d probe connections reached the open port, want 1", n)
			}
		})
	}
}

// A port that accepts connections is not a broker coming back: the pause
// keeps its length and the port sees at most one probe (none when the last
// attempt reached it), so a broker that refuses the bridge after accepting
// its connection is not hammered.
func TestPauseKeepsTheBackoffWhileThePortIsOpen(t *testing.T) {
	for _, tc := range []struct {
		name   string
		closed map[string]bool
		probes int64
	}{
		{"reached at the last attempt", map[string]bool{}, 0},
		{"no attempt yet", nil, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, accepted := acceptCounter(t, "127.0.0.1:0")
			c := NewConn(ConnOptions{URL: "amqp://guest:guest@" + l.Addr().String() + "/", Logger: zerolog.Nop(),
				ProbeInterval: 10 * time.Millisecond})
			const backoff = 800 * time.Millisecond
			began := time.Now()
			r := <-startPause(c, backoff, tc.closed)
			if !r.alive {
				t.Fatal("pause reported its context ended")
			}
			if took := r.at.Sub(began); took < backoff {
				t.Errorf("pause ended after %s, want the whole backoff %s", took, backoff)
			}
			if n := accepted.Load(); n != tc.probes {
				t.Errorf("%d probe connections during the pause, want %d", n, tc.probes)
			}
		})
	}
}

// With probes off, or a backoff no longer than the probe interval, a pause
// is a plain sleep; and it ends with its context.
func TestPauseWithoutProbes(t *testing.T) {
	addr := freeAddr(t)
	url := "amqp://guest:guest@" + addr + "/"
	off := NewConn(ConnOptions{URL: url, Logger: zerolog.Nop(), ProbeInterval: -1})
	done := startPause(off, 700*time.Millisecond, map[string]bool{addr: true})
	time.Sleep(100 * time.Millisecond)
	_, accepted := acceptCounter(t, addr)
	began := time.Now()
	if r := <-done; !r.alive || r.at.Sub(began) < 500*time.Millisecond {
		t.Errorf("with probes off the pause ended %s after the port opened (alive=%v), want the whole backoff",
			r.at.Sub(began), r.alive)
	}
	if n := accepted.Load(); n != 0 {
		t.Errorf("%d probes with probes off", n)
	}

	on := NewConn(ConnOptions{URL: url, Logger: zerolog.Nop(), ProbeInterval: 50 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	res := make(chan bool, 1)
	go func() { res <- on.pause(ctx, time.Minute, nil) }()
	cancel()
	select {
	case alive := <-res:
		if alive {
			t.Error("pause reported alive after its context ended")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("pause did not end with its context")
	}
}

// probeAddr takes the port from the URL, or the scheme's default.
func TestProbeAddr(t *testing.T) {
	for url, want := range map[string]string{
		"amqp://u:p@rabbit-1:5681/vh": "rabbit-1:5681",
		"amqp://rabbit":               "rabbit:5672",
		"amqps://u:p@rabbit/":         "rabbit:5671",
		"amqp://u:p@[::1]:5672/":      "[::1]:5672",
		"http://nope":                 "",
	} {
		if got := probeAddr(url); got != want {
			t.Errorf("probeAddr(%q) = %q, want %q", url, got, want)
		}
	}
}

// The broker goes away (its port closes) while the Conn is in a long
// backoff, and comes back on the same port: the Conn is connected again
// within seconds, not at the end of the backoff.
func TestConnReconnectsAsSoonAsTheBrokerIsBack(t *testing.T) {
	testConn(t)
	p := startProxy(t, brokerAddr(t))
	addr := p.Addr()
	const minBackoff = 40 * time.Second // every pause 20–40 s
	c := NewConn(ConnOptions{URL: proxyURL(t, p), Name: "probe-back", Logger: zerolog.Nop(),
		MinBackoff: minBackoff, MaxBackoff: minBackoff})
	if err := c.Connect(); err != nil {
		t.Fatal(err)
	}
	testenv.Start(t, c.Run)

	p.Kill() // the broker goes away: its port closes
	testenv.WaitFor(t, 10*time.Second, "the Conn to notice the lost connection", func() bool { return !c.Connected() })
	time.Sleep(time.Second) // down for a while, as stop_app … start_app

	back, err := tcpproxy.StartAt(addr, brokerAddr(t))
	if err != nil {
		t.Fatalf("cannot listen on %s again: %v", addr, err)
	}
	t.Cleanup(back.Close)
	returned := time.Now()
	// 10 s: generous for a loaded machine, far below the 20 s shortest pause.
	testenv.WaitFor(t, 10*time.Second, "the Conn to reconnect after the broker came back", c.Connected)
	t.Logf("connected again %s after the broker came back (pause %s–%s)", time.Since(returned).Round(time.Millisecond),
		minBackoff/2, minBackoff)
	if n := back.Accepted(); n > 2 {
		t.Errorf("%d connections to the broker that came back, want the probe and the one AMQP connection", n)
	}
}

// A broker whose port accepts connections but that closes them before the
// AMQP handshake completes (a proxy refusing: the attempt reaches it) gets
// one attempt per backoff, no probes.
func TestConnBacksOffFromABrokerThatAcceptsAndDrops(t *testing.T) {
	testConn(t)
	p := startProxy(t, brokerAddr(t))
	c := NewConn(ConnOptions{URL: proxyURL(t, p), Name: "probe-drop", Logger: zerolog.Nop(),
		MinBackoff: 2 * time.Second, MaxBackoff: 2 * time.Second, ProbeInterval: 10 * time.Millisecond})
	if err := c.Connect(); err != nil {
		t.Fatal(err)
	}
	testenv.Start(t, c.Run)
	before := p.Accepted()
	p.Refuse()
	time.Sleep(3500 * time.Millisecond) // pauses of 1–2 s: at most 3 attempts
	// Each attempt is one connection; the first pause (no attempt yet)
	// adds at most one probe.
	if n := p.Accepted() - before; n > 4 {
		t.Errorf("%d connections in 3.5 s to a port that accepts and drops them, want at most 4 (one per 1–2 s backoff and one probe)", n)
	} else {
		t.Logf("%d connections in 3.5 s", n)
	}
	if c.Connected() {
		t.Error("connected through a proxy that refuses")
	}
}
