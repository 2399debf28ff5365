package broker

import (
	"context"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/delaybridge/delaybridge/internal/tcpproxy"
	"github.com/delaybridge/delaybridge/internal/testenv"
)

func testURL() string {
	if u := os.Getenv("DELAYBRIDGE_TEST_AMQP_URL"); u != "" {
		return u
	}
	return "amqp://guest:guest@127.0.0.1:5672/"
}

// freeAddr is a local host:port nothing listens on (for now).
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return addr
}

// closedPortURL names a local port nothing listens on.
func closedPortURL(t *testing.T) string {
	t.Helper()
	return "amqp://guest:secret@" + freeAddr(t) + "/"
}

// startProxy starts a proxy to target, killed at cleanup; Kill cuts every
// connection it carried: to the client, the broker went away.
func startProxy(t *testing.T, target string) *tcpproxy.Proxy {
	t.Helper()
	p, err := tcpproxy.Start(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// proxyURL is the test URL with host:port swapped for the proxy's.
func proxyURL(t *testing.T, p *tcpproxy.Proxy) string {
	t.Helper()
	u := testURL()
	i := strings.Index(u, "@")
	j := strings.Index(u[i+1:], "/")
	if i < 0 || j < 0 {
		t.Fatalf("cannot rewrite %s", Redact(u))
	}
	return u[:i+1] + p.Addr() + u[i+1+j:]
}

func brokerAddr(t *testing.T) string {
	t.Helper()
	u := testURL()
	i := strings.Index(u, "@")
	j := strings.Index(u[i+1:], "/")
	return u[i+1 : i+1+j]
}

// A broker that is down at start is skipped for the next one in the list.
func TestConnFailsOverAtStart(t *testing.T) {
	testConn(t) // skip or fail when there is no broker at all
	dead := closedPortURL(t)
	c := NewConn(ConnOptions{URLs: []string{dead, testURL()}, Name: "failover-start", Logger: zerolog.Nop()})
	if err := c.Connect(); err != nil {
		t.Fatalf("Connect with one live broker in the list: %v", err)
	}
	defer c.Close()
	if got, want := c.Broker(), Redact(testURL()); got != want {
		t.Fatalf("Broker() = %s, want %s", got, want)
	}
}

// With every broker down the error names each of them, without passwords.
func TestConnErrorNamesEveryBroker(t *testing.T) {
	a, b := closedPortURL(t), closedPortURL(t)
	c := NewConn(ConnOptions{URLs: []string{a, b}, Name: "failover-none", Logger: zerolog.Nop()})
	err := c.Connect()
	if err == nil {
		c.Close()
		t.Fatal("Connect succeeded with no broker up")
	}
	msg := err.Error()
	if !strings.Contains(msg, Redact(a)) || !strings.Contains(msg, Redact(b)) || strings.Contains(msg, "secret") {
		t.Fatalf("error %q must name both brokers and hide the password", msg)
	}
}

// A connection lost mid-run moves to the next broker within one attempt.
func TestConnFailsOverWhenTheBrokerGoesAway(t *testing.T) {
	testConn(t)
	p := startProxy(t, brokerAddr(t))
	first := proxyURL(t, p)
	c := NewConn(ConnOptions{URLs: []string{first, testURL()}, Name: "failover-run", Logger: zerolog.Nop(),
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond})
	if err := c.Connect(); err != nil {
		t.Fatal(err)
	}
	if got := c.Broker(); got != Redact(first) {
		t.Fatalf("started on %s, want the first broker %s", got, Redact(first))
	}
	testenv.Start(t, c.Run)

	p.Kill() // the first broker goes away for good

	if !testenv.Eventually(20*time.Second, func() bool { return c.Broker() == Redact(testURL()) && c.Connected() }) {
		t.Fatalf("still on %s (connected=%v) after 20s", c.Broker(), c.Connected())
	}
	wctx, wcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer wcancel()
	conn, err := c.Wait(wctx)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("the failed-over connection does not work: %v", err)
	}
	_ = ch.Close()
}
