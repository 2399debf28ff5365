package integration

// Broker failover at run time (docs/operations.md "Production",
// DELAYBRIDGE_AMQP_FAILOVER_URLS): the bridge is given two brokers and the
// one it uses goes away while messages are being ingested and dispatched.
//
// The test machine has one RabbitMQ node, so the two "brokers" are TCP
// proxies started by the test in front of it. Killing a proxy closes its
// listener (further dials are refused) and every connection it carried, on
// both sides, as a node that goes down would.

import (
	"encoding/json"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/internal/tcpproxy"
)

// TestFailoverBrokerMidRun: the bridge starts with DELAYBRIDGE_AMQP_URL at
// proxy A and DELAYBRIDGE_AMQP_FAILOVER_URLS at proxy B (both in front of the
// test broker). 1,500 messages due 0.5–6 s ahead are published straight to
// the broker over ~3 s; about 2 s in, proxy A is killed. The bridge must not
// exit: it logs "connected to broker" with proxy B's (redacted) URL for both
// its connections, proxy B carries them, /readyz answers 200 again, every
// confirmed message arrives and none early. Duplicates are counted; each must
// be a forward that may have been unconfirmed when A's connection died (due
// before the kill, first copy at most ~1 s after it, next copy after it).
// E.Timeouts and the error queue end empty.
func TestFailoverBrokerMidRun(t *testing.T) {
	t.Parallel()
	requireBroker(t)
	const (
		n      = 1500
		batch  = 50
		every  = 100 * time.Millisecond // 30 batches: ~3 s of publishing
		killAt = 2 * time.Second
	)
	testStart := time.Now()
	live, err := url.Parse(amqpURL)
	if err != nil {
		t.Fatalf("parse the broker URL: %v", err)
	}
	target := live.Host
	if live.Port() == "" {
		port := "5672"
		if live.Scheme == "amqps" {
			port = "5671"
		}
		target = net.JoinHostPort(live.Hostname(), port)
	}
	proxyA, proxyB := startProxy(t, target), startProxy(t, target)
	viaProxy := func(p *tcpproxy.Proxy) string {
		u := *live
		u.Host = p.Addr()
		return u.String()
	}
	urlA, urlB := viaProxy(proxyA), viaProxy(proxyB)

	b := startBridge(t, map[string]string{
		"DELAYBRIDGE_AMQP_URL":           urlA,
		"DELAYBRIDGE_AMQP_FAILOVER_URLS": urlB,
	})
	dests := []string{b.Endpoint + ".dst-a", b.Endpoint + ".dst-b"}
	_, c, pub := startFaultClients(t, "it-failover-publisher", dests...)
	mon := startReadyMonitor(t, b.HTTPAddr)
	defer func() { // also after a t.Fatal
		summarizeBridgeLog(t, "", b)
		t.Logf("proxy A %s: %d connections accepted, %d bytes from the bridge; proxy B %s: %d connections accepted, %d bytes from the bridge",
			proxyA.Addr(), proxyA.Accepted(), proxyA.BytesUp(), proxyB.Addr(), proxyB.Accepted(), proxyB.BytesUp())
		t.Logf("runtime %s", time.Since(testStart).Round(time.Millisecond))
	}()

	// Before the kill: all three connections on A (tried first), none on B.
	atStart := connectedBrokers(t, b)
	for _, l := range atStart {
		if l.Broker != broker.Redact(urlA) {
			t.Fatalf("at start-up want every connection logged as connected to proxy A %s, got %v", broker.Redact(urlA), atStart)
		}
	}
	if len(atStart) != 3 || !hasRoles(atStart, "consume", "ingest", "publish") {
		t.Fatalf("at start-up want the consume, ingest and publish connections logged as connected to proxy A %s, got %v", broker.Redact(urlA), atStart)
	}
	if a, bb := proxyA.Accepted(), proxyB.Accepted(); a < 3 || bb != 0 {
		t.Fatalf("at start-up proxy A accepted %d connections (want ≥ 3), proxy B %d (want 0)", a, bb)
	}

	start := time.Now()
	pubDone := publishWaveAsync(pub, b.TimeoutsQueue(), dests, "failover-", n, batch, every, 500*time.Millisecond, 6*time.Second)

	time.Sleep(time.Until(start.Add(killAt)))
	if !b.Running() {
		t.Fatalf("the bridge exited with code %d before proxy A was killed", b.exitCode)
	}
	delivered := c.Count()
	killed := proxyA.Kill()
	kill := time.Now()
	t.Logf("proxy A killed at +%s (%d connections cut, %d deliveries so far)", kill.Sub(start).Round(time.Millisecond), killed, delivered)

	// Both connections move to B, and the bridge is ready again.
	deadline := time.Now().Add(20 * time.Second)
	var onB []brokerLogLine
	for {
		onB = onB[:0]
		for _, l := range connectedBrokers(t, b) {
			if l.Broker == broker.Redact(urlB) {
				onB = append(onB, l)
			}
		}
		if hasRoles(onB, "consume", "ingest", "publish") {
			break
		}
		if !b.Running() {
			t.Fatalf("the bridge exited with code %d after proxy A was killed; want it to fail over to proxy B", b.exitCode)
		}
		if time.Now().After(deadline) {
			t.Fatalf("20 s after the kill the log does not show all three connections connected to proxy B %s (have %v)", broker.Redact(urlB), onB)
		}
		time.Sleep(50 * time.Millisecond)
	}
	waitBridgeReadyAgain(t, b, 20*time.Second)
	readyAt := mon.readyAfter(kill)
	if readyAt.IsZero() {
		readyAt = time.Now()
	}
	var lastConnect time.Time
	for _, l := range onB {
		if l.At.After(lastConnect) {
			lastConnect = l.At
		}
	}
	t.Logf("after the kill: connected to proxy B %v; last connection %s after the kill; /readyz 200 again %s after the kill",
		onB, lastConnect.Sub(kill).Round(time.Millisecond), readyAt.Sub(kill).Round(time.Millisecond))
	if !mon.sawStatusBetween(http.StatusServiceUnavailable, kill, readyAt) {
		t.Logf("note: /readyz was never seen answering 503 after the kill (polled every %s); the failover may have been quicker than that", readyPollEvery)
	}
	if pw, ok := live.User.Password(); ok && pw != "" && pw != "xxxxx" && strings.Contains(b.Stderr(), ":"+pw+"@") {
		t.Errorf("the bridge log contains the broker password")
	}

	res := awaitWave(t, pubDone)
	due := res.due
	t.Logf("published and confirmed %d messages in %s", len(due), time.Since(start).Round(time.Millisecond))

	got, rep := collectWave(t, c, due, 15*time.Second, 1500*time.Millisecond)
	checkDuplicatesExplainedByKills(t, rep, due, []killEvent{{At: kill, Running: readyAt}}, nil)
	logWaveReport(t, c, due, got, rep)
	t.Logf("/readyz transitions (from the start of publishing): %s", mon.String(start))

	// Proxy B carried the bridge's traffic: its consume and publish
	// connections (at least), with the whole run's forwards on them.
	if acc := proxyB.Accepted(); acc < 2 {
		t.Errorf("proxy B accepted %d connections after the kill, want ≥ 2 (consume and publish)", acc)
	}
	if proxyB.BytesUp() == 0 {
		t.Errorf("proxy B carried no bytes from the bridge")
	}
	if proxyB.Open() < 2 {
		t.Errorf("proxy B carries %d connections at the end, want ≥ 2 (consume and publish)", proxyB.Open())
	}

	checkReadyAndStop(t, b)
	checkBridgeQueuesDrained(t, b)
}

// brokerLogLine is one "connected to broker" line of the bridge's log.
type brokerLogLine struct {
	Connection string // "delaybridge consume|ingest|publish <owner>"
	Broker     string // the broker's URL, password redacted
	At         time.Time
}

func (l brokerLogLine) String() string {
	role, _, _ := strings.Cut(strings.TrimPrefix(l.Connection, "delaybridge "), " ")
	return role + "→" + l.Broker
}

// connectedBrokers returns the bridge's "connected to broker" log lines in
// order (written per connection when more than one broker is configured).
func connectedBrokers(t *testing.T, b *bridgeProc) []brokerLogLine {
	t.Helper()
	out := connectionLogLines(t, b, "connected to broker")
	for _, l := range out {
		if l.Broker == "" {
			t.Errorf("a \"connected to broker\" line without its broker: %v", l)
		}
	}
	return out
}

// connectionLogLines returns the bridge's log lines with message msg about
// one of its connections, in order.
func connectionLogLines(t *testing.T, b *bridgeProc, msg string) []brokerLogLine {
	t.Helper()
	var out []brokerLogLine
	for _, line := range strings.Split(b.Stderr(), "\n") {
		var m struct{ Message, Connection, Broker, Time string }
		if json.Unmarshal([]byte(line), &m) != nil || m.Message != msg {
			continue
		}
		if m.Connection == "" {
			t.Errorf("a %q line without its connection: %s", msg, line)
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, m.Time)
		if err != nil {
			t.Errorf("a %q line with an unparsable time: %s", msg, line)
		}
		out = append(out, brokerLogLine{Connection: m.Connection, Broker: m.Broker, At: at})
	}
	return out
}

// hasRoles reports whether lines include a connection of each role.
func hasRoles(lines []brokerLogLine, roles ...string) bool {
	for _, r := range roles {
		found := false
		for _, l := range lines {
			if strings.HasPrefix(l.Connection, "delaybridge "+r+" ") {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// readyAfter is the first moment after t at which /readyz answered 200
// following an answer other than 200, or zero if no such change was seen
// (e.g. the failover was quicker than the polling).
func (m *readyMonitor) readyAfter(t time.Time) time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	down := false
	for _, s := range m.changes {
		if s.At.Before(t) {
			continue
		}
		if s.Status != http.StatusOK {
			down = true
		} else if down {
			return s.At
		}
	}
	return time.Time{}
}

// ---------------------------------------------------------------------------
// Proxies in front of the test broker or database

// startProxy starts a tcpproxy to target (host:port), killed at cleanup.
func startProxy(t testing.TB, target string) *tcpproxy.Proxy {
	t.Helper()
	p, err := tcpproxy.Start(target)
	if err != nil {
		t.Fatalf("proxy to %s: %v", target, err)
	}
	t.Cleanup(p.Close)
	return p
}
