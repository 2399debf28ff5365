package integration

// Connection loss (docs/contract.md §3 "Nothing lost … through broker restarts and
// connection loss", §6 /readyz): the bridge's broker connections are
// force-closed, and the broker application is restarted, while messages are
// being ingested and dispatched. The bridge must not exit: it reconnects,
// /readyz answers 503 while it is disconnected and 200 again afterwards, and
// nothing is lost or early.
//
// Broker control goes through rabbitmqctl (DELAYBRIDGE_TEST_RABBITMQCTL, default
// "rabbitmqctl" on PATH); without it these tests are skipped (failed under
// CI=true: internal/testenv). TestBrokerRestartMidFlow stops the broker every
// test uses, so it is testenv.Disruptive: it runs only in scripts/test.sh's
// serial step. TestForcedConnectionClose closes only the bridge's own
// connections and runs with the others.

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/testenv"
)

// TestForcedConnectionClose: while ~2,000 messages due over the next ~6 s
// are being published (over ~5 s), ingested and dispatched, every broker
// connection of the bridge (and only those: the test's own stay up) is
// force-closed with `rabbitmqctl close_connection`, twice: at ~1.5 s all at
// once, at ~3.5 s (later if the bridge was slow to reconnect) one after the
// other, publish first, as close_all_connections does. The bridge keeps
// running, reconnects and is ready again; a second wave published after the
// reconnects is delivered too; zero lost, zero early, duplicates counted and
// logged (a forward whose confirm was lost with the connection may be sent
// again).
func TestForcedConnectionClose(t *testing.T) {
	t.Parallel()
	requireRabbitmqctl(t)
	const n = 2000
	b, dest, c, pub, mon := startWatchedBridge(t, "it-forced-close-publisher", nil)

	// rabbitmqctl takes ~1 s (more under load): list the bridge's
	// connections ahead, so that each close lands when planned.
	targets := waitNewBridgeConnections(t, b, nil, 15*time.Second)

	start := time.Now()
	// 50 batches of 40, one every 100 ms: ~5 s of publishing
	pubDone := publishWaveAsync(pub, b.TimeoutsQueue(), []string{dest}, "close-", n, 40, 100*time.Millisecond, 500*time.Millisecond, 6*time.Second)

	var closes []time.Time
	for i, off := range []time.Duration{1500 * time.Millisecond, 3500 * time.Millisecond} {
		if i > 0 {
			// The previous close must have been recovered from before the
			// next, and the new connections are the next targets.
			waitBridgeReadyAgain(t, b, 30*time.Second)
			targets = waitNewBridgeConnections(t, b, targets, 15*time.Second)
		}
		if d := time.Until(start.Add(off)); d > 0 {
			time.Sleep(d)
		} else {
			t.Logf("close %d: %s later than planned", i+1, (-d).Round(time.Millisecond))
		}
		if !b.Running() {
			t.Fatalf("close %d: the bridge exited with code %d after its connections were force-closed; want it to reconnect", i+1, b.exitCode)
		}
		issued := time.Now()
		closes = append(closes, issued)
		reason := fmt.Sprintf("delaybridge integration test: forced close %d", i+1)
		if i == 0 {
			closeBrokerConnections(t, targets, reason) // all at once
		} else {
			// One after the other, publish first, as close_all_connections
			// does: the bridge sees one connection die while the other lives.
			publishFirst := func(c brokerConn) int {
				if strings.Contains(c.Name, "publish") {
					return 0
				}
				return 1
			}
			slices.SortFunc(targets, func(a, b brokerConn) int { return cmp.Compare(publishFirst(a), publishFirst(b)) })
			for _, bc := range targets {
				closeBrokerConnections(t, []brokerConn{bc}, reason)
			}
		}
		t.Logf("close %d issued at +%s, done after %s: force-closed the bridge connections %v (%d deliveries so far)",
			i+1, issued.Sub(start).Round(time.Millisecond), time.Since(issued).Round(time.Millisecond), targets, c.Count())
	}

	res := awaitWave(t, pubDone)
	due := res.due
	waitBridgeReadyAgain(t, b, 30*time.Second)
	t.Logf("ready again %s after the last close", time.Since(closes[len(closes)-1]).Round(time.Millisecond))
	if !mon.sawStatusBetween(http.StatusServiceUnavailable, closes[0].Add(-2*time.Second), time.Now()) {
		t.Logf("note: /readyz was never seen answering 503 (polled every %s); the reconnects may have been quicker than that", readyPollEvery)
	}
	if conns := bridgeConnections(t, b); len(conns) == 0 {
		t.Errorf("after reconnecting the bridge has no broker connections that can be told apart as its own")
	} else {
		t.Logf("bridge connections after the reconnects: %v", conns)
	}

	// Ingest must be consuming again: a second wave after the reconnects.
	publishMore(t, due, pub, b.TimeoutsQueue(), []string{dest}, "close-after-", 200, 100, 50*time.Millisecond, 500*time.Millisecond, 2*time.Second)

	got, rep := collectWave(t, c, due, 30*time.Second, 2*time.Second)
	logWaveReport(t, c, due, got, rep)
	t.Logf("/readyz transitions (from the start of publishing): %s", mon.String(start))

	checkReadyAndStop(t, b)
	checkBridgeQueuesDrained(t, b)
}

// TestBrokerRestartMidFlow: while messages are being ingested and
// dispatched, the broker application is stopped for 5 s and started again
// (rabbitmqctl stop_app / start_app / await_startup). 100 messages stored
// beforehand, due in an hour, are rescheduled through the admin API once
// stop_app returned, to fall due during the outage, however long the stop
// took (the flow's own messages may all be delivered before a slow stop
// closes the connections). The bridge does not
// exit, /readyz answers 503 while the broker is down and 200 once the bridge
// reconnected; everything published before the restart (durable queues,
// persistent messages) and a second wave published after it is delivered:
// zero lost, zero early (late is allowed), duplicates counted.
//
// The bridge is back at once (docs/contract.md §3.5 "Reconnecting"): each of
// its connections is restored within 2 s of start_app's return, and the
// first message due during the outage arrives within 5 s. The bridge checks
// the broker's port every 250 ms and its connections came back within 0.2 s
// of start_app's return (the broker opens its port shortly before that
// returns), so 2 s leaves a loaded machine room; a bridge that only waits
// out its backoff (from 100 ms, doubling, capped at 10 s: 3–6 s per attempt
// by the end of this outage) has all three connections back within 2 s in
// about 1 run in 100, and within 5 s in most runs, hence the two bounds.
// The lateness of the messages due during the outage is logged.
//
// Disruptive: it stops the broker every test uses, of this package and of
// any other running at the time, so it runs only in the serial step of
// scripts/test.sh (testenv.Disruptive). The broker is always started again,
// even when the test fails.
func TestBrokerRestartMidFlow(t *testing.T) {
	testenv.Disruptive(t)
	requireRabbitmqctl(t)
	const held, heldPrefix = 100, "restart-held-"
	b, dest, c, pub, mon := startWatchedBridge(t, "it-broker-restart-publisher", map[string]string{"DELAYBRIDGE_ADMIN_TOKEN": adminToken})

	// The held messages: due in an hour, stored before the flow, and made
	// due during the outage once the broker is down, whenever stop_app
	// returns (it took 2 s on an idle machine, 12 s on a loaded one, when
	// the flow was long delivered). Nothing can be published then; the
	// admin API, over HTTP, still reaches the store.
	due, err := publishWave(pub, b.TimeoutsQueue(), []string{dest}, heldPrefix, held, held, time.Millisecond, time.Hour, time.Hour+time.Second)
	if err != nil {
		t.Fatalf("publishing the held messages: %v (%d confirmed before that)", err, len(due))
	}
	for deadline := time.Now().Add(30 * time.Second); len(listIDs(t, b, "--id-prefix", heldPrefix)) < held; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the %d held messages were not all stored within 30 s", held)
		}
	}

	// Wave 1: 30 batches of 50 over ~1.8 s, due 0.5–8 s after publishing, so
	// that the stop comes while some are being ingested and dispatched.
	start := time.Now()
	wave, err := publishWave(pub, b.TimeoutsQueue(), []string{dest}, "restart-", 1500, 50, 60*time.Millisecond, 500*time.Millisecond, 8*time.Second)
	maps.Copy(due, wave)
	if err != nil {
		t.Fatalf("publishing: %v (%d confirmed before that)", err, len(wave))
	}
	pub.Close()
	t.Logf("published %d messages in %s; %d delivered so far", len(wave), time.Since(start).Round(time.Millisecond), c.Count())

	// Registered after every queue-deleting cleanup, so it runs before them.
	t.Cleanup(func() { ensureBrokerRunning(t) })
	stopAt := time.Now()
	if out, err := rabbitmqctl("stop_app"); err != nil {
		t.Fatalf("rabbitmqctl stop_app: %v\n%s", err, out)
	}
	stopped := time.Now()
	t.Logf("broker app stopped at +%s (took %s); %d delivered so far", stopped.Sub(start).Round(time.Millisecond),
		stopped.Sub(stopAt).Round(time.Millisecond), c.Count())
	heldDue := time.Now().Add(time.Second).UTC().Truncate(time.Millisecond)
	if out := mustCLI(t, b, "reschedule", "--id-prefix", heldPrefix, "--at", heldDue.Format(time.RFC3339Nano)); out != fmt.Sprintf("rescheduled %d timeouts\n", held) {
		t.Fatalf("reschedule of the held messages during the outage: %q", out)
	}
	for id := range due {
		if strings.HasPrefix(id, heldPrefix) {
			due[id] = heldDue
		}
	}
	t.Logf("the %d held messages rescheduled %s after the stop, due %s after it", held,
		time.Since(stopped).Round(time.Millisecond), heldDue.Sub(stopped).Round(time.Millisecond))
	// Down for 5 s, and for 3 s after the held messages fell due.
	time.Sleep(time.Until(later(stopped.Add(5*time.Second), heldDue.Add(3*time.Second))))
	if out, err := rabbitmqctl("start_app"); err != nil {
		t.Fatalf("rabbitmqctl start_app: %v\n%s", err, out)
	}
	upAt := time.Now()
	if out, err := rabbitmqctl("await_startup"); err != nil {
		t.Fatalf("rabbitmqctl await_startup: %v\n%s", err, out)
	}
	t.Logf("broker app started again at +%s (down for %s)", upAt.Sub(start).Round(time.Millisecond), upAt.Sub(stopAt).Round(time.Millisecond))

	if !b.Running() {
		t.Fatalf("the bridge exited with code %d during the broker restart; want it to reconnect", b.exitCode)
	}
	if !mon.sawStatusBetween(http.StatusServiceUnavailable, stopAt, upAt) {
		t.Errorf("/readyz never answered 503 while the broker was down (%s)", mon.String(start))
	}
	waitBridgeReadyAgain(t, b, 30*time.Second)
	t.Logf("bridge ready again %s after the broker was back", time.Since(upAt).Round(time.Millisecond))

	// Ingest must be consuming again: a second wave after the restart.
	pub2, err := newFaultPublisher("it-broker-restart-publisher-2")
	if err != nil {
		t.Fatalf("publisher after the restart: %v", err)
	}
	t.Cleanup(pub2.Close)
	publishMore(t, due, pub2, b.TimeoutsQueue(), []string{dest}, "restart-after-", 300, 100, 50*time.Millisecond, 500*time.Millisecond, 2*time.Second)

	got, rep := collectWave(t, c, due, 30*time.Second, 2*time.Second)
	logWaveReport(t, c, due, got, rep)
	t.Logf("/readyz transitions (from the start of publishing): %s", mon.String(start))
	checkBackAtOnce(t, b, due, rep, stopped, upAt, 2*time.Second, 5*time.Second)

	checkReadyAndStop(t, b)
	checkBridgeQueuesDrained(t, b)
}

// startWatchedBridge starts a bridge (with env), fault clients on <endpoint>.dst (the
// publisher named publisher) and a monitor of its /readyz. When the test
// ends, even by t.Fatal, it logs the summary of the bridge's log and the
// test's runtime.
func startWatchedBridge(t *testing.T, publisher string, env map[string]string) (b *bridgeProc, dest string, c *faultConsumer, pub *faultPublisher, mon *readyMonitor) {
	t.Helper()
	testStart := time.Now()
	b = startBridge(t, env)
	dest = b.Endpoint + ".dst"
	_, c, pub = startFaultClients(t, publisher, dest)
	mon = startReadyMonitor(t, b.HTTPAddr)
	t.Cleanup(func() {
		summarizeBridgeLog(t, "", b)
		t.Logf("runtime %s", time.Since(testStart).Round(time.Millisecond))
	})
	return b, dest, c, pub, mon
}

// checkBackAtOnce checks that the bridge resumed at once after the broker's
// return at up, following an outage from down (when the bridge had no
// connection left): each of its connections was restored (its log) within
// connBound, and the first message due during the outage arrived within
// fwdBound. It logs those delays and the lateness of the messages due during
// the outage.
func checkBackAtOnce(t *testing.T, b *bridgeProc, due map[string]time.Time, rep faultReport, down, up time.Time, connBound, fwdBound time.Duration) {
	t.Helper()
	restored := connectionLogLines(t, b, "broker connection restored")
	var delays []string
	for _, role := range []string{"consume", "ingest", "publish"} {
		var at time.Time
		for _, l := range restored {
			if strings.HasPrefix(l.Connection, "delaybridge "+role+" ") && l.At.After(down) && (at.IsZero() || l.At.Before(at)) {
				at = l.At
			}
		}
		if at.IsZero() {
			t.Errorf("no \"broker connection restored\" log line for the %s connection after the outage", role)
			continue
		}
		delays = append(delays, fmt.Sprintf("%s %s", role, at.Sub(up).Round(time.Millisecond)))
		if at.Sub(up) > connBound {
			t.Errorf("the %s connection was restored %s after the broker was back, want within %s", role, at.Sub(up).Round(time.Millisecond), connBound)
		}
	}
	var first time.Time
	var lates []time.Duration
	for id, d := range due {
		as := rep.arrivals[id]
		if d.Before(down) || d.After(up) || len(as) == 0 {
			continue
		}
		lates = append(lates, as[0].At.Sub(d))
		if first.IsZero() || as[0].At.Before(first) {
			first = as[0].At
		}
	}
	if len(lates) == 0 {
		t.Fatalf("no message was due during the outage: the test proves nothing")
	}
	slices.Sort(lates)
	resume := first.Sub(up)
	t.Logf("back after the outage: connections restored (after start_app returned) %s; first forward of a message due during the outage %s after; lateness of the %d messages due during the outage: median %s, max %s",
		strings.Join(delays, ", "), resume.Round(time.Millisecond), len(lates),
		lates[len(lates)/2].Round(time.Millisecond), lates[len(lates)-1].Round(time.Millisecond))
	if resume > fwdBound {
		t.Errorf("the first message due during the outage arrived %s after the broker was back, want within %s", resume.Round(time.Millisecond), fwdBound)
	}
}

// ---------------------------------------------------------------------------
// Broker control

func rabbitmqctlPath() string {
	if p := os.Getenv("DELAYBRIDGE_TEST_RABBITMQCTL"); p != "" {
		return p
	}
	return "rabbitmqctl"
}

// requireRabbitmqctl skips (fails under CI=true) when there is no broker or
// no rabbitmqctl.
func requireRabbitmqctl(t *testing.T) {
	t.Helper()
	requireBroker(t)
	if _, err := exec.LookPath(rabbitmqctlPath()); err != nil {
		testenv.Unavailable(t, "%s not found (%v): this test controls the broker with it (set DELAYBRIDGE_TEST_RABBITMQCTL)", rabbitmqctlPath(), err)
	}
}

// rabbitmqctl runs rabbitmqctl -q args… and returns its combined output.
func rabbitmqctl(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, rabbitmqctlPath(), append([]string{"-q"}, args...)...).CombinedOutput()
	return string(out), err
}

// ensureBrokerRunning starts the broker app (a no-op when it runs) and waits
// for it, so a failed test never leaves the shared broker stopped.
func ensureBrokerRunning(t *testing.T) {
	for _, cmd := range []string{"start_app", "await_startup"} {
		if out, err := rabbitmqctl(cmd); err != nil {
			t.Errorf("cleanup: rabbitmqctl %s: %v\n%s", cmd, err, out)
		}
	}
}

// brokerConn is one AMQP connection as rabbitmqctl lists it.
type brokerConn struct {
	Pid      string // Erlang pid, for close_connection
	PeerPort int
	Name     string // the connection_name client property
}

func (c brokerConn) String() string { return fmt.Sprintf("%q (port %d)", c.Name, c.PeerPort) }

var connectionNameProp = regexp.MustCompile(`\{"connection_name","((?:[^"\\]|\\.)*)"\}`)

// listBrokerConnections lists every connection on the broker.
func listBrokerConnections() ([]brokerConn, error) {
	out, err := rabbitmqctl("list_connections", "--no-table-headers", "pid", "peer_port", "client_properties")
	if err != nil {
		return nil, fmt.Errorf("rabbitmqctl list_connections: %v\n%s", err, out)
	}
	var conns []brokerConn
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		f := strings.SplitN(sc.Text(), "\t", 3)
		if len(f) < 3 || !strings.HasPrefix(f[0], "<") {
			continue
		}
		port, _ := strconv.Atoi(f[1])
		c := brokerConn{Pid: f[0], PeerPort: port}
		if m := connectionNameProp.FindStringSubmatch(f[2]); m != nil {
			c.Name = m[1]
		}
		conns = append(conns, c)
	}
	return conns, sc.Err()
}

// bridgeOwner is the lock owner the bridge logged ("owner" field of its JSON
// log lines; the last one wins), "" if none.
func bridgeOwner(b *bridgeProc) string {
	owner := ""
	for _, line := range strings.Split(b.Stderr(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil {
			if o, ok := m["owner"].(string); ok && o != "" {
				owner = o
			}
		}
	}
	return owner
}

// processBrokerPorts returns the local ports of the process's TCP
// connections to the broker's port (Linux /proc).
func processBrokerPorts(pid int) (map[int]bool, error) {
	brokerPort := 5672
	if u, err := url.Parse(amqpURL); err == nil && u.Port() != "" {
		brokerPort, _ = strconv.Atoi(u.Port())
	}
	fds, err := filepath.Glob(fmt.Sprintf("/proc/%d/fd/*", pid))
	if err != nil {
		return nil, err
	}
	inodes := map[string]bool{}
	for _, fd := range fds {
		if l, err := os.Readlink(fd); err == nil && strings.HasPrefix(l, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] = true
		}
	}
	ports := map[int]bool{}
	for _, table := range []string{"tcp", "tcp6"} {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/%s", pid, table))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(data), "\n")[1:] {
			f := strings.Fields(line)
			if len(f) < 10 || !inodes[f[9]] {
				continue
			}
			local, remote := f[1], f[2]
			rp, err1 := strconv.ParseInt(remote[strings.LastIndex(remote, ":")+1:], 16, 32)
			lp, err2 := strconv.ParseInt(local[strings.LastIndex(local, ":")+1:], 16, 32)
			if err1 == nil && err2 == nil && int(rp) == brokerPort {
				ports[int(lp)] = true
			}
		}
	}
	return ports, nil
}

// bridgeConnections returns the bridge's broker connections: those named
// "delaybridge consume|ingest|publish|sweep <owner>" with the owner the bridge logged, and
// those whose client port belongs to the bridge process.
func bridgeConnections(t *testing.T, b *bridgeProc) []brokerConn {
	t.Helper()
	all, err := listBrokerConnections()
	if err != nil {
		t.Fatalf("%v", err)
	}
	owner := bridgeOwner(b)
	ports, err := processBrokerPorts(b.cmd.Process.Pid)
	if err != nil {
		t.Logf("cannot read the bridge's sockets: %v", err)
	}
	var mine []brokerConn
	for _, c := range all {
		byName := owner != "" && (c.Name == "delaybridge consume "+owner || c.Name == "delaybridge ingest "+owner ||
			c.Name == "delaybridge publish "+owner || c.Name == "delaybridge sweep "+owner)
		if byName || ports[c.PeerPort] {
			mine = append(mine, c)
			if !byName {
				t.Logf("connection %s of the bridge process is not named \"delaybridge consume|ingest|publish|sweep %s\"", c, owner)
			}
		}
	}
	return mine
}

// waitNewBridgeConnections waits until the bridge has broker connections
// none of which is in old, and returns them. It fails the test on timeout
// or when the bridge exits.
func waitNewBridgeConnections(t *testing.T, b *bridgeProc, old []brokerConn, timeout time.Duration) []brokerConn {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		conns := bridgeConnections(t, b)
		fresh := len(conns) > 0
		for _, c := range conns {
			for _, o := range old {
				if c.Pid == o.Pid {
					fresh = false
				}
			}
		}
		if fresh {
			return conns
		}
		if !b.Running() {
			t.Fatalf("the bridge exited with code %d while waiting for its broker connections", b.exitCode)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no new broker connections of the bridge within %s (have %v, owner %q)", timeout, conns, bridgeOwner(b))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// closeBrokerConnections force-closes conns concurrently (as
// close_all_connections would), each with `rabbitmqctl close_connection`.
func closeBrokerConnections(t *testing.T, conns []brokerConn, reason string) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make([]error, len(conns))
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if out, err := rabbitmqctl("close_connection", c.Pid, reason); err != nil {
				errs[i] = fmt.Errorf("rabbitmqctl close_connection %s: %v\n%s", c.Pid, err, out)
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Errorf("%v", err)
		}
	}
}

// ---------------------------------------------------------------------------
// Readiness

const readyPollEvery = 25 * time.Millisecond

// getReadyz returns the status code of GET /readyz (0 on a transport error).
func getReadyz(addr string) (int, error) {
	client := &http.Client{Timeout: 500 * time.Millisecond}
	resp, err := client.Get("http://" + addr + "/readyz")
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

// waitBridgeReadyAgain waits until /readyz answers 200; it fails the test if
// the bridge exits or timeout passes.
func waitBridgeReadyAgain(t *testing.T, b *bridgeProc, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		code, err := getReadyz(b.HTTPAddr)
		if code == http.StatusOK {
			return
		}
		if !b.Running() {
			t.Fatalf("the bridge exited with code %d instead of becoming ready again (last /readyz: %d %v)", b.exitCode, code, err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the bridge is not ready again within %s (last /readyz: %d %v)", timeout, code, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// readySample is a change of /readyz's answer (0: no answer).
type readySample struct {
	At     time.Time
	Status int
}

// readyMonitor polls /readyz and records every change of its answer.
type readyMonitor struct {
	mu      sync.Mutex
	changes []readySample
}

func startReadyMonitor(t *testing.T, addr string) *readyMonitor {
	m := &readyMonitor{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		last := -1
		for ctx.Err() == nil {
			code, _ := getReadyz(addr)
			if code != last {
				last = code
				m.mu.Lock()
				m.changes = append(m.changes, readySample{time.Now(), code})
				m.mu.Unlock()
			}
			select {
			case <-ctx.Done():
			case <-time.After(readyPollEvery):
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return m
}

// sawStatusBetween reports whether /readyz answered code at some moment in
// [from, to].
func (m *readyMonitor) sawStatusBetween(code int, from, to time.Time) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i, s := range m.changes {
		end := time.Now()
		if i+1 < len(m.changes) {
			end = m.changes[i+1].At
		}
		if s.Status == code && !s.At.After(to) && !end.Before(from) {
			return true
		}
	}
	return false
}

// String lists the changes relative to since.
func (m *readyMonitor) String(since time.Time) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var parts []string
	for _, s := range m.changes {
		parts = append(parts, fmt.Sprintf("+%s→%d", s.At.Sub(since).Round(time.Millisecond), s.Status))
	}
	return strings.Join(parts, " ")
}
