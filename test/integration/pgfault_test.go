package integration

// Store failures with DELAYBRIDGE_STORE=postgres: the bridge's database
// sessions killed while it works, the database going silent for longer
// than the circuit breakers allow, a database refusing connections at
// start, and schemas the bridge must refuse (newer than the binary, or
// claimed by another endpoint).

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/delaybridge/delaybridge/internal/tcpproxy"
	"github.com/delaybridge/delaybridge/internal/testenv"
)

// pgEnv is the environment of a postgres-mode bridge on pg's schema.
func pgEnv(pg *pgTest, extra map[string]string) map[string]string {
	env := map[string]string{
		"DELAYBRIDGE_STORE":           "postgres",
		"DELAYBRIDGE_POSTGRES_URL":    pg.URL,
		"DELAYBRIDGE_POSTGRES_SCHEMA": pg.Schema,
	}
	for k, v := range extra {
		env[k] = v
	}
	return env
}

// logLine is one JSON line of a bridge's log, with its raw text.
type logLine struct {
	Raw     string
	Level   string
	Message string
	Time    time.Time
	Fields  map[string]any
}

// bridgeLogLines parses the bridge's stderr; lines that are not JSON come
// back with Level "nonjson".
func bridgeLogLines(stderr string) []logLine {
	var out []logLine
	for _, raw := range strings.Split(stderr, "\n") {
		if strings.TrimSpace(raw) == "" {
			continue
		}
		var m map[string]any
		if json.Unmarshal([]byte(raw), &m) != nil {
			out = append(out, logLine{Raw: raw, Level: "nonjson"})
			continue
		}
		l := logLine{Raw: raw, Fields: m}
		l.Level, _ = m["level"].(string)
		l.Message, _ = m["message"].(string)
		if s, ok := m["time"].(string); ok {
			l.Time, _ = time.Parse(time.RFC3339Nano, s)
		}
		out = append(out, l)
	}
	return out
}

// refusalLine is the last line of a bridge's stderr at level error, or not
// JSON, that contains s: why a bridge refused to start. When there is none
// it fails the test, saying the line it wanted (what), and returns "".
func refusalLine(t *testing.T, stderr, s, what string) string {
	t.Helper()
	found := ""
	for _, l := range bridgeLogLines(stderr) {
		if (l.Level == "error" || l.Level == "nonjson") && strings.Contains(l.Raw, s) {
			found = l.Raw
		}
	}
	if found == "" {
		t.Errorf("no error line %s:\n%s", what, tail(stderr, 4<<10))
	}
	return found
}

// terminateBridgeSessions ends every backend whose application_name is the
// bridge's ('delaybridge <owner>') and returns how many it ended.
func (p *pgTest) terminateBridgeSessions(t testing.TB, owner string) int {
	t.Helper()
	return p.countSessions(t, "terminate the bridge's sessions", `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))
		FROM pg_stat_activity WHERE application_name = $1 AND pid <> pg_backend_pid()`, owner)
}

// bridgeSessions counts the backends named after the bridge's owner.
func (p *pgTest) bridgeSessions(t testing.TB, owner string) int {
	t.Helper()
	return p.countSessions(t, "count the bridge's sessions", `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, owner)
}

// countSessions runs query, a count over the backends whose
// application_name ($1) is the bridge's of owner, and returns the count;
// what says what failed.
func (p *pgTest) countSessions(t testing.TB, what, query, owner string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var n int
	if err := p.conn.QueryRow(ctx, query, "delaybridge "+owner).Scan(&n); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return n
}

// waitTableEmpty waits up to timeout for the timeouts table to hold no row
// and returns the count left.
func (p *pgTest) waitTableEmpty(t testing.TB, timeout time.Duration) int {
	t.Helper()
	for deadline := time.Now().Add(timeout); ; {
		left, total := p.rows(t, 10)
		if total == 0 {
			return 0
		}
		if time.Now().After(deadline) {
			for _, r := range left {
				t.Logf("left in the store: %s due %s lock %q expires %v attempts %d last error %q", r.ID,
					r.DueAt.Format("15:04:05.000"), r.Lock, r.LockExpiresAt, r.Attempts, r.LastError)
			}
			return total
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// readyWatch polls GET /readyz until stopped and records every change of
// its answer.
type readyWatch struct {
	mu      sync.Mutex
	changes []string
	not200  int
	stop    chan struct{}
	done    chan struct{}
}

func watchReady(addr string) *readyWatch {
	w := &readyWatch{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		client := &http.Client{Timeout: time.Second}
		last := ""
		for {
			state := ""
			resp, err := client.Get("http://" + addr + "/readyz")
			if err != nil {
				state = "error: " + err.Error()
			} else {
				state = resp.Status
				resp.Body.Close()
			}
			w.mu.Lock()
			if state != "200 OK" {
				w.not200++
			}
			if state != last {
				w.changes = append(w.changes, time.Now().Format("15:04:05.000")+" "+state)
				last = state
			}
			w.mu.Unlock()
			select {
			case <-w.stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	return w
}

func (w *readyWatch) Stop() ([]string, int) {
	close(w.stop)
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.changes...), w.not200
}

// TestPGSessionsTerminatedMidFlow: one postgres-mode bridge (5 s lease,
// debug log); 2,000 messages published with confirms over ~2 s, each due
// 1 s to 6 s after its publish. While it dispatches, every backend of the
// bridge (application_name 'delaybridge <owner>') is terminated three
// times, 1 s apart. pgx's pool reconnects; store calls that fail are retried
// by the bridge's own paths (requeue, lease expiry).
//
// Asserted: every message arrives, none early; no duplicates (nothing
// crashed, so docs/contract.md §3 allows none; each is reported with the dispatch
// log's forwarding/removed record for it); the bridge never exits; /readyz
// answers 200 afterwards; the table is empty at the end; a graceful stop
// exits 0 and leaves E.Timeouts and the error queue empty.
func TestPGSessionsTerminatedMidFlow(t *testing.T) {
	t.Parallel()
	const (
		n       = 2000
		batch   = 100
		every   = 100 * time.Millisecond
		dueFrom = time.Second
		dueTo   = 6 * time.Second
		lease   = 5 * time.Second
	)
	testStart := time.Now()
	pg := requirePostgres(t)
	b := startBridge(t, pgEnv(pg, map[string]string{
		"DELAYBRIDGE_LOCK_LEASE_DURATION": lease.String(),
		"DELAYBRIDGE_LOG_LEVEL":           "debug",
	}))
	owner := bridgeOwner(b)
	if owner == "" {
		t.Fatal("the bridge logged no owner")
	}
	if s := pg.bridgeSessions(t, owner); s == 0 {
		t.Fatalf("no backend with application_name %q in pg_stat_activity", "delaybridge "+owner)
	} else {
		t.Logf("bridge ready (owner %s, %d sessions named 'delaybridge %s')", owner, s, owner)
	}

	dests := []string{b.Endpoint + ".dst-a", b.Endpoint + ".dst-b"}
	_, c, pub := startFaultClients(t, "it-pg-terminate-publisher", dests...)
	defer func() {
		summarizeBridgeLog(t, "bridge", b)
		t.Logf("runtime %s", time.Since(testStart).Round(time.Millisecond))
	}()

	rw := watchReady(b.HTTPAddr)
	start := time.Now()
	pubDone := publishWaveAsync(pub, b.TimeoutsQueue(), dests, "pgterm-", n, batch, every, dueFrom, dueTo)

	var lastKill time.Time
	for i, off := range []time.Duration{2500 * time.Millisecond, 3500 * time.Millisecond, 4500 * time.Millisecond} {
		time.Sleep(time.Until(start.Add(off)))
		delivered := c.Count()
		k := pg.terminateBridgeSessions(t, owner)
		lastKill = time.Now()
		t.Logf("termination %d at +%s: %d backends of the bridge terminated (%d deliveries so far)",
			i+1, lastKill.Sub(start).Round(time.Millisecond), k, delivered)
		if k == 0 {
			t.Errorf("termination %d found no backend of the bridge to terminate", i+1)
		}
		if !b.Running() {
			t.Fatalf("the bridge exited (code %d) after termination %d", b.exitCode, i+1)
		}
	}

	res := awaitWave(t, pubDone)
	due := res.due
	t.Logf("published and confirmed %d messages in %s; the last one is due at +%s", len(due),
		time.Since(start).Round(time.Millisecond), latestDue(due).Sub(start).Round(time.Millisecond))

	if missing := c.waitAll(due, time.Until(latestDue(due).Add(lease+15*time.Second))); missing > 0 {
		t.Errorf("%d of %d messages still missing %s after the last due time", missing, len(due), lease+15*time.Second)
	}
	allIn := time.Now()
	// Anything forwarded whose removal failed comes back when its lease
	// expires: wait for the table to drain, then for late copies.
	left := pg.waitTableEmpty(t, lease+10*time.Second)
	time.Sleep(time.Second)
	got := c.All()
	rep := checkFaultRun(t, due, got)
	if left != 0 {
		t.Errorf("the store's table still holds %d rows %s after every message arrived, want 0", left, time.Since(allIn).Round(time.Millisecond))
	}

	changes, not200 := rw.Stop()
	t.Logf("/readyz answers during the run (%d polls not 200): %s", not200, strings.Join(changes, "; "))
	if !b.Running() {
		t.Fatalf("the bridge exited with code %d; it must survive terminated sessions", b.exitCode)
	}
	b.waitReady(10 * time.Second)
	t.Logf("/readyz answers 200 (checked %s after the last termination)", time.Since(lastKill).Round(time.Millisecond))

	// Store failures the bridge logged, and duplicates with the dispatch
	// log's evidence.
	dl := &dispatchLog{}
	dl.update(b.Stderr())
	var storeErrs []string
	removeFailed, removeFailedIDs := 0, 0
	for _, l := range bridgeLogLines(b.Stderr()) {
		if l.Level != "error" && l.Level != "warn" {
			continue
		}
		if strings.Contains(l.Message, "removing forwarded timeouts failed") {
			removeFailed++
			if n, ok := l.Fields["timeouts"].(float64); ok {
				removeFailedIDs += int(n)
			}
			t.Logf("  failed removal: %s", tail(l.Raw, 400))
		}
		if len(storeErrs) < 15 {
			storeErrs = append(storeErrs, tail(l.Raw, 400))
		}
	}
	for _, l := range storeErrs {
		t.Logf("  bridge: %s", l)
	}
	for i, id := range rep.dupIDs {
		if i == 10 {
			break
		}
		var at []string
		for _, a := range rep.arrivals[id] {
			at = append(at, a.At.Format("15:04:05.000"))
		}
		t.Errorf("DUPLICATE without a crash: %s (due %s) arrived %d times at %s; the dispatcher logged \"forwarding\" for it %d times and \"removed\" %d times",
			id, due[id].Format("15:04:05.000"), len(at), strings.Join(at, ", "), dl.forwarded[id], dl.removed[id])
	}
	if rep.dups > 0 {
		t.Errorf("%d duplicate deliveries (%d ids) although the bridge never died (docs/contract.md §3: without a crash, no duplicates); the bridge logged %d failed removals of forwarded timeouts (%d timeouts in all)",
			rep.dups, len(rep.dupIDs), removeFailed, removeFailedIDs)
	}
	t.Logf("FIGURES: %d messages, %d deliveries: %d lost, %d early, %d duplicates; latest first arrival %s after its due time; %d failed removals logged (%d timeouts)",
		len(due), len(got), rep.lost, rep.early, rep.dups, rep.worstLate.Round(time.Millisecond), removeFailed, removeFailedIDs)

	b.Stop()
	checkBridgeQueuesDrained(t, b)
	if _, total := pg.rows(t, 0); total != 0 {
		t.Errorf("after the stop the table holds %d rows, want 0", total)
	}
}

// pgHostPort is host:port of the test database.
func pgHostPort(t testing.TB, raw string) *url.URL {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		testenv.Unavailable(t, "DELAYBRIDGE_TEST_POSTGRES_URL is not a URL with a host (%v); the proxy test needs one", err)
	}
	if u.Port() == "" {
		u.Host = net.JoinHostPort(u.Hostname(), "5432")
	}
	return u
}

// proxiedPostgres starts a proxy to the test database (killed at cleanup)
// and returns it with the database URL through it.
func proxiedPostgres(t testing.TB, pg *pgTest) (*tcpproxy.Proxy, string) {
	t.Helper()
	u := pgHostPort(t, pg.URL)
	proxy := startProxy(t, u.Host)
	u.Host = proxy.Addr()
	return proxy, u.String()
}

// TestPGDatabaseSilentLongerThanBreakers: one bridge reaches PostgreSQL
// through a TCP proxy of the test's; store, fetch and dispatch breakers are
// 3 s, the lease 5 s. 300 messages (due 0.5 s to 28 s after their publish)
// are published and stored; then the proxy stalls (connections stay open,
// nothing passes) for 20 s, and 3 s into it 100 more messages arrive, due
// during the outage.
//
// Asserted: the bridge exits with code 1 within 30 s of the stall and its
// log names the breaker that triggered; the 100 messages that arrived
// during the outage are back in E.Timeouts after the exit (not acked, since
// nothing could be stored); after the proxy forwards again the bridge is
// restarted with the same variables, and every message arrives at least
// once, none early, none lost; at the end the table is empty. Measured:
// stall to trigger, stall to exit.
func TestPGDatabaseSilentLongerThanBreakers(t *testing.T) {
	t.Parallel()
	const (
		n1      = 300
		n2      = 100
		lease   = 5 * time.Second
		outage  = 20 * time.Second
		maxExit = 30 * time.Second
	)
	testStart := time.Now()
	pg := requirePostgres(t)
	proxy, viaProxy := proxiedPostgres(t, pg)
	b := startBridge(t, pgEnv(pg, map[string]string{
		"DELAYBRIDGE_POSTGRES_URL":                             viaProxy,
		"DELAYBRIDGE_LOCK_LEASE_DURATION":                      lease.String(),
		"DELAYBRIDGE_TIME_TO_TRIGGER_STORE_CIRCUIT_BREAKER":    "3s",
		"DELAYBRIDGE_TIME_TO_TRIGGER_FETCH_CIRCUIT_BREAKER":    "3s",
		"DELAYBRIDGE_TIME_TO_TRIGGER_DISPATCH_CIRCUIT_BREAKER": "3s",
		"DELAYBRIDGE_LOG_LEVEL":                                "debug",
	}))
	instances := []*bridgeProc{b}
	dests := []string{b.Endpoint + ".dst-a", b.Endpoint + ".dst-b"}
	setup, c, pub := startFaultClients(t, "it-pg-silent-publisher", dests...)
	defer func() {
		for i, inst := range instances {
			summarizeBridgeLog(t, fmt.Sprintf("instance %d", i), inst)
		}
		t.Logf("runtime %s", time.Since(testStart).Round(time.Millisecond))
	}()

	start := time.Now()
	due, err := publishWave(pub, b.TimeoutsQueue(), dests, "pgsilent-a-", n1, 100, 100*time.Millisecond, 500*time.Millisecond, 28*time.Second)
	if err != nil {
		t.Fatalf("publishing: %v", err)
	}
	// Wait until the bridge stored them all: rows in the table plus
	// messages already delivered.
	for deadline := time.Now().Add(10 * time.Second); ; {
		_, total := pg.rows(t, 0)
		delivered := map[string]bool{}
		for _, a := range c.All() {
			delivered[a.ID] = true
		}
		if total+len(delivered) >= n1 && queueDepth(t, setup, b.TimeoutsQueue()) == 0 {
			t.Logf("%d messages published; %d pending in the store, %d delivered before the stall", n1, total, len(delivered))
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the bridge did not store the %d messages within 10 s (%d rows, %d delivered)", n1, total, len(delivered))
		}
		time.Sleep(50 * time.Millisecond)
	}

	proxy.Stall()
	stallAt := time.Now()
	deliveredAtStall := c.Count()
	t.Logf("proxy stalled at +%s (%s)", stallAt.Sub(start).Round(time.Millisecond), stallAt.Format("15:04:05.000"))

	// Messages arriving during the outage, due during it.
	time.Sleep(3 * time.Second)
	outageDue, err := publishWave(pub, b.TimeoutsQueue(), dests, "pgsilent-b-", n2, 50, 100*time.Millisecond, time.Second, 10*time.Second)
	if err != nil {
		t.Fatalf("publishing during the outage: %v", err)
	}
	for id, d := range outageDue {
		due[id] = d
	}
	t.Logf("%d more messages published and confirmed by the broker at +%s into the outage", n2, time.Since(stallAt).Round(time.Millisecond))

	code := b.Wait(maxExit + 30*time.Second) // fails the test (and kills it) if it hangs
	exitAfter := time.Since(stallAt)
	deliveredDuringOutage := c.Count() - deliveredAtStall
	if code != 1 {
		t.Errorf("the bridge exited with code %d, want 1 (critical error)", code)
	}
	if exitAfter > maxExit {
		t.Errorf("the bridge exited %s after the database went silent, want within %s", exitAfter.Round(time.Millisecond), maxExit)
	}
	// Which breaker triggered, when, and the critical error line.
	var triggered, critical []string
	var firstTrigger, firstError time.Time
	for _, l := range bridgeLogLines(b.Stderr()) {
		if l.Time.Before(stallAt.Add(-time.Second)) {
			continue
		}
		if l.Level == "error" && firstError.IsZero() {
			firstError = l.Time
		}
		if strings.HasPrefix(l.Message, "circuit breaker") && l.Fields["state"] == "triggered" {
			triggered = append(triggered, fmt.Sprint(l.Fields["breaker"]))
			if firstTrigger.IsZero() {
				firstTrigger = l.Time
			}
		}
		if strings.Contains(l.Message, "critical error") {
			critical = append(critical, tail(l.Raw, 600))
		}
	}
	if len(triggered) == 0 {
		t.Errorf("no \"circuit breaker triggered\" line in the log after the stall")
	}
	if len(critical) == 0 {
		t.Errorf("no critical error line in the log after the stall")
	}
	for _, l := range critical {
		t.Logf("  critical: %s", l)
		if !strings.Contains(l, "breaker") {
			t.Errorf("the critical error line does not say which breaker triggered: %s", l)
		}
	}
	accepted, dropped := proxy.Accepted(), proxy.Swallowed()
	trig := "never"
	if !firstTrigger.IsZero() {
		trig = firstTrigger.Sub(stallAt).Round(time.Millisecond).String()
	}
	firstErr := "none"
	if !firstError.IsZero() {
		firstErr = firstError.Sub(stallAt).Round(time.Millisecond).String()
	}
	t.Logf("TIMING: stall → first store error logged %s, → breaker triggered %s (%v), → exit (code %d) %s; %d deliveries during the outage; proxy: %d connections accepted, %d bytes swallowed",
		firstErr, trig, triggered, code, exitAfter.Round(time.Millisecond), deliveredDuringOutage, accepted, dropped)

	// Nothing that arrived during the outage was acknowledged.
	d := queueDepth(t, setup, b.TimeoutsQueue())
	for deadline := time.Now().Add(5 * time.Second); d != n2 && time.Now().Before(deadline); d = queueDepth(t, setup, b.TimeoutsQueue()) {
		time.Sleep(50 * time.Millisecond)
	}
	if d != n2 {
		t.Errorf("after the exit %s holds %d messages, want the %d that arrived during the outage (none could be stored, so none may be acked)",
			b.TimeoutsQueue(), d, n2)
	} else {
		t.Logf("after the exit %s holds the %d messages that arrived during the outage", b.TimeoutsQueue(), d)
	}

	time.Sleep(time.Until(stallAt.Add(outage)))
	proxy.Resume() // closes the stalled connections, forwards new ones
	t.Logf("proxy forwards again at +%s after the stall", time.Since(stallAt).Round(time.Millisecond))
	restartAt := time.Now()
	b2 := b.Restart(nil)
	instances = append(instances, b2)
	t.Logf("restarted bridge ready %s later", time.Since(restartAt).Round(time.Millisecond))

	if missing := c.waitAll(due, max(time.Until(latestDue(due).Add(lease+10*time.Second)), lease+15*time.Second)); missing > 0 {
		t.Errorf("%d of %d messages still missing", missing, len(due))
	}
	left := pg.waitTableEmpty(t, lease+5*time.Second)
	time.Sleep(time.Second)
	got := c.All()
	rep := checkFaultRun(t, due, got)
	if left != 0 {
		t.Errorf("the store's table still holds %d rows after every message arrived, want 0", left)
	}
	// Duplicates are allowed here (the first bridge stopped with forwards it
	// could not remove); say where they came from.
	dl1, dl2 := &dispatchLog{}, &dispatchLog{}
	dl1.update(b.Stderr())
	dl2.update(b2.Stderr())
	for i, id := range rep.dupIDs {
		if i == 10 {
			break
		}
		t.Logf("duplicate %s: first bridge forwarded it %d times, removed %d; restarted bridge forwarded %d, removed %d",
			id, dl1.forwarded[id], dl1.removed[id], dl2.forwarded[id], dl2.removed[id])
	}
	unexplained := 0
	for _, id := range rep.dupIDs {
		if !(dl1.forwarded[id] > 0 && dl1.removed[id] == 0) {
			unexplained++
		}
	}
	if unexplained > 0 {
		t.Errorf("%d duplicated ids were not forwarded-but-not-removed by the first bridge", unexplained)
	}
	t.Logf("FIGURES: %d messages (%d during the outage), %d deliveries: %d lost, %d early, %d duplicates (%d ids; first bridge left %d forwards unremoved); latest first arrival %s after its due time",
		len(due), n2, len(got), rep.lost, rep.early, rep.dups, len(rep.dupIDs), len(dl1.inFlight()), rep.worstLate.Round(time.Millisecond))

	b2.Stop()
	checkBridgeQueuesDrained(t, b2)
}

// TestPGDatabaseRefusedAtStart: DELAYBRIDGE_POSTGRES_URL names a closed port
// (with the password "secret"): the bridge exits with code 1 within 15 s,
// its log says why in a line that names PostgreSQL, and the password
// appears nowhere in its output.
func TestPGDatabaseRefusedAtStart(t *testing.T) {
	t.Parallel()
	requireBroker(t)
	dead := freeAddr(t) // listened on, then closed: connection refused
	env := bridgeEnv(t, map[string]string{
		"DELAYBRIDGE_STORE":        "postgres",
		"DELAYBRIDGE_POSTGRES_URL": "postgres://delaybridge:secret@" + dead + "/app?sslmode=disable",
	})
	deleteQueuesOnCleanup(t, env["DELAYBRIDGE_ENDPOINT"]+".Timeouts", env["DELAYBRIDGE_ENDPOINT"]+".TimeoutsDispatcher", env["DELAYBRIDGE_ERROR_QUEUE"])
	began := time.Now()
	b := execBridge(t, env)
	code := b.Wait(15 * time.Second)
	took := time.Since(began)
	if code != 1 {
		t.Errorf("exit code %d, want 1", code)
	}
	out := b.Stderr() + b.stdout.String()
	if strings.Contains(out, "secret") {
		t.Errorf("the bridge's output contains the password:\n%s", out)
	}
	var errs []logLine
	for _, l := range bridgeLogLines(b.Stderr()) {
		if l.Level == "error" || l.Level == "fatal" || l.Level == "nonjson" {
			errs = append(errs, l)
		}
	}
	named := false
	for _, l := range errs {
		t.Logf("  %s", l.Raw)
		if strings.Contains(strings.ToLower(l.Raw), "postgres") && strings.Contains(l.Raw, dead) {
			named = true
		}
	}
	if !named {
		t.Errorf("no error line names PostgreSQL and the address %s", dead)
	}
	if len(errs) != 1 {
		t.Errorf("%d error lines, want one line with the reason", len(errs))
	}
	t.Logf("TIMING: exited with code %d after %s", code, took.Round(time.Millisecond))
}

// TestPGSchemaNewerThanBinary: a first bridge creates the schema and stops;
// the test records schema version 999 in schema_version; a bridge started
// on that schema exits with code 1 and says the schema is newer. A schema
// name that is not a plain identifier is a configuration error (exit 2,
// naming DELAYBRIDGE_POSTGRES_SCHEMA).
func TestPGSchemaNewerThanBinary(t *testing.T) {
	t.Parallel()
	pg := requirePostgres(t)
	b := startBridge(t, pgEnv(pg, nil))
	b.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var before int
	if err := pg.conn.QueryRow(ctx, `SELECT max(version) FROM `+pg.table("schema_version")).Scan(&before); err != nil {
		t.Fatalf("read the schema version: %v", err)
	}
	if _, err := pg.conn.Exec(ctx, `INSERT INTO `+pg.table("schema_version")+` (version) VALUES (999)`); err != nil {
		t.Fatalf("record version 999: %v", err)
	}
	began := time.Now()
	b2 := execBridge(t, b.Env)
	code := b2.Wait(20 * time.Second)
	if code != 1 {
		t.Errorf("exit code %d on a schema at version 999, want 1", code)
	}
	if found := refusalLine(t, b2.Stderr(), "newer", "says the schema is newer"); found != "" {
		t.Logf("schema was at version %d, set to 999: exit %d after %s: %s", before, code, time.Since(began).Round(time.Millisecond), found)
		if !strings.Contains(found, "999") {
			t.Errorf("the line does not give the schema's version (999): %s", found)
		}
	}
	// The refused bridge changed nothing.
	var now int
	if err := pg.conn.QueryRow(ctx, `SELECT max(version) FROM `+pg.table("schema_version")).Scan(&now); err != nil || now != 999 {
		t.Errorf("schema version after the refused start: %d (%v), want 999", now, err)
	}

	t.Run("bad schema name", func(t *testing.T) {
		env := bridgeEnv(t, pgEnv(pg, map[string]string{"DELAYBRIDGE_POSTGRES_SCHEMA": "Bad-Name"}))
		b := execBridge(t, env)
		if code := b.Wait(15 * time.Second); code != 2 {
			t.Errorf("exit code %d for DELAYBRIDGE_POSTGRES_SCHEMA=Bad-Name, want 2", code)
		}
		if !strings.Contains(b.Stderr(), "DELAYBRIDGE_POSTGRES_SCHEMA") {
			t.Errorf("the error does not name DELAYBRIDGE_POSTGRES_SCHEMA:\n%s", b.Stderr())
		}
		t.Logf("%s", strings.TrimSpace(b.Stderr()))
	})
}

// TestPGTwoEndpointsOneSchema: a bridge of endpoint A runs on a schema; a
// bridge of endpoint B on the same schema exits with code 1, names
// DELAYBRIDGE_POSTGRES_SCHEMA, and takes in nothing; A keeps running.
func TestPGTwoEndpointsOneSchema(t *testing.T) {
	t.Parallel()
	pg := requirePostgres(t)
	a := startBridge(t, pgEnv(pg, nil))
	envB := bridgeEnv(t, pgEnv(pg, nil)) // another unique endpoint
	deleteQueuesOnCleanup(t, envB["DELAYBRIDGE_ENDPOINT"]+".Timeouts", envB["DELAYBRIDGE_ENDPOINT"]+".TimeoutsDispatcher", envB["DELAYBRIDGE_ERROR_QUEUE"])
	if envB["DELAYBRIDGE_ENDPOINT"] == a.Endpoint {
		t.Fatal("the two bridges got the same endpoint")
	}
	began := time.Now()
	b := execBridge(t, envB)
	code := b.Wait(20 * time.Second)
	if code != 1 {
		t.Errorf("exit code %d for a second endpoint on schema %s, want 1", code, pg.Schema)
	}
	if found := refusalLine(t, b.Stderr(), "DELAYBRIDGE_POSTGRES_SCHEMA", "names DELAYBRIDGE_POSTGRES_SCHEMA"); found != "" {
		t.Logf("endpoint %s refused after %s: %s", b.Endpoint, time.Since(began).Round(time.Millisecond), found)
		if !strings.Contains(found, a.Endpoint) {
			t.Errorf("the line does not name the endpoint holding the schema (%s)", a.Endpoint)
		}
	}
	// The schema still belongs to A, and A still works.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var name string
	if err := pg.conn.QueryRow(ctx, `SELECT name FROM `+pgx.Identifier{pg.Schema, "endpoint"}.Sanitize()).Scan(&name); err != nil || name != a.Endpoint {
		t.Errorf("the schema's endpoint is %q (%v), want %q", name, err, a.Endpoint)
	}
	if !a.Running() {
		t.Fatalf("bridge A exited with code %d", a.exitCode)
	}
	a.waitReady(5 * time.Second)
	delayOne(t, a, "two-endpoints-1", 500*time.Millisecond, 15*time.Second)
	a.Stop()
}
