package integration

// Crash safety under load (docs/contract.md §3 "Nothing lost", "Never early", "At
// least once"): the real binary is killed with SIGKILL several times while
// messages are being ingested and dispatched, and restarted on the same
// store each time.
//
// The helpers here (a confirming publisher and a consumer that survives
// connection loss, the delivery ledger check, bridge log summaries) are also
// used by connection_test.go. They never call t.Fatal from a goroutine.

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/internal/confirmed"
	"github.com/delaybridge/delaybridge/wire"
)

// TestCrashSafetyRepeatedKill: one store file; ~5,000 messages (unique ids,
// x-due-at from 0.5 s to 8 s after their publish, millisecond precision) are
// published with confirms over ~3.5 s while the bridge is killed with
// SIGKILL four times at irregular moments and restarted on the same store
// each time. Every confirmed message arrives at least once, none before its
// due time; duplicates are reported, and each must be explained by a kill:
// between its first and second arrival (the window between the forward's
// confirm and the removal from the store), or between the commit of its
// intake and the ack on E.Timeouts, when the bridge's debug log proves a
// second commit (see restoredAfterKills). E.Timeouts and the error queue
// are empty at the end.
func TestCrashSafetyRepeatedKill(t *testing.T) {
	t.Parallel()
	const (
		n     = 5000
		batch = 100
		every = 70 * time.Millisecond // 50 batches: ~3.5 s of publishing
	)
	testStart := time.Now()
	// Debug logs name what each instance stored and forwarded: the evidence
	// for duplicates from a second commit (restoredAfterKills).
	b := startBridge(t, map[string]string{"DELAYBRIDGE_LOG_LEVEL": "debug"})
	instances := []*bridgeProc{b}
	dests := []string{b.Endpoint + ".dst-a", b.Endpoint + ".dst-b"}
	_, c, pub := startFaultClients(t, "it-crash-publisher", dests...)
	defer func() { // also after a t.Fatal
		disrupted := 0
		for i, inst := range instances {
			disrupted += summarizeBridgeLog(t, fmt.Sprintf("instance %d", i), inst)
		}
		if disrupted > 0 || c.Reconnects() > 0 {
			t.Logf("WARNING: broker connections were lost during this test (%d bridge log lines, %d consumer reconnects) although it only kills the bridge: something else disrupted the shared broker", disrupted, c.Reconnects())
		}
		t.Logf("runtime %s", time.Since(testStart).Round(time.Millisecond))
	}()

	start := time.Now()
	pubDone := publishWaveAsync(pub, b.TimeoutsQueue(), dests, "crash-", n, batch, every, 500*time.Millisecond, 8*time.Second)

	// Irregular kill moments, after the publishing started.
	killAt := []time.Duration{700 * time.Millisecond, 1900 * time.Millisecond, 3100 * time.Millisecond, 4600 * time.Millisecond}
	var kills []killEvent
	for i, off := range killAt {
		if d := time.Until(start.Add(off)); d > 0 {
			time.Sleep(d)
		} else {
			t.Logf("kill %d: the previous restart took long; killing %s later than planned", i+1, (-d).Round(time.Millisecond))
		}
		delivered := c.Count()
		b.Kill()
		k := time.Now()
		b = b.Restart(nil)
		instances = append(instances, b)
		running := bridgeRunningSince(b)
		if running.IsZero() {
			running = time.Now()
		}
		kills = append(kills, killEvent{At: k, Running: running})
		t.Logf("kill %d at +%s (%s, %d deliveries so far); restarted and ready after %s",
			i+1, k.Sub(start).Round(time.Millisecond), k.Format("15:04:05.000"), delivered, time.Since(k).Round(time.Millisecond))
	}

	res := awaitWave(t, pubDone)
	due := res.due
	t.Logf("published and confirmed %d messages in %s", len(due), time.Since(start).Round(time.Millisecond))

	got, rep := collectWave(t, c, due, 25*time.Second, 2*time.Second)
	logs := make([]string, len(instances))
	for i, inst := range instances {
		logs[i] = inst.Stderr()
	}
	checkDuplicatesExplainedByKills(t, rep, due, kills, restoredAfterKills(logs))
	logWaveReport(t, c, due, got, rep)

	if !b.Running() {
		t.Fatalf("the last bridge exited with code %d", b.exitCode)
	}
	b.Stop()
	checkBridgeQueuesDrained(t, b)
}

// ---------------------------------------------------------------------------
// Publishing

// delayedMessage is a persistent message for the bridge, due at due (which
// the caller truncated to the precision it wants).
func delayedMessage(id, dest string, due time.Time) amqp.Publishing {
	return amqp.Publishing{
		MessageId: id, Body: []byte(id), DeliveryMode: amqp.Persistent, ContentType: "text/plain",
		Headers: amqp.Table{"x-destination": dest, "x-due-at": due.UTC().Format(time.RFC3339Nano)},
	}
}

// faultPublisher publishes with confirms and mandatory on a connection of its
// own. Unlike the harness's publisher it returns errors, so it can run in a
// goroutine.
type faultPublisher struct {
	conn *amqp.Connection
	*confirmed.Publisher
}

func newFaultPublisher(name string) (*faultPublisher, error) {
	return newFaultPublisherAt(amqpURL, name)
}

// newFaultPublisherAt is newFaultPublisher on the broker at url.
func newFaultPublisherAt(url, name string) (*faultPublisher, error) {
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName(name)
	conn, err := amqp.DialConfig(url, amqp.Config{Properties: props, Dial: amqp.DefaultDial(5 * time.Second)})
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	pub, err := confirmed.NewPublisher(conn)
	if err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("confirm channel: %w", err)
	}
	return &faultPublisher{conn: conn, Publisher: pub}, nil
}

func (p *faultPublisher) Close() { _ = p.conn.Close() }

// publishWave publishes n messages to queue in batches of batch, one batch
// every every, round-robin over dests. Each message is due a uniformly random
// [from, to) after the moment its batch is built, truncated to the
// millisecond. It returns the due time of every confirmed message (a failed
// batch is not in it) and the first error, after which it stops.
func publishWave(p *faultPublisher, queue string, dests []string, prefix string, n, batch int, every, from, to time.Duration) (map[string]time.Time, error) {
	due := make(map[string]time.Time, n)
	tick := time.NewTicker(every)
	defer tick.Stop()
	for sent := 0; sent < n; {
		now := time.Now()
		k := min(batch, n-sent)
		msgs := make([]amqp.Publishing, k)
		dues := make([]time.Time, k)
		for i := range msgs {
			id := prefix + strconv.Itoa(sent+i)
			dues[i] = now.Add(from + time.Duration(rand.Int64N(int64(to-from)))).UTC().Truncate(time.Millisecond)
			msgs[i] = delayedMessage(id, dests[(sent+i)%len(dests)], dues[i])
		}
		if err := p.Publish("", queue, msgs...); err != nil {
			return due, err
		}
		for i, m := range msgs {
			due[m.MessageId] = dues[i]
		}
		sent += k
		if sent < n {
			<-tick.C
		}
	}
	return due, nil
}

// waveResult is what a wave published in the background came to.
type waveResult struct {
	due map[string]time.Time // every confirmed message and its due time
	err error                // the error publishWave stopped at
	end time.Time            // when publishing ended
}

// publishWaveAsync runs publishWave in a goroutine, so that a test can
// disrupt the bridge meanwhile; the channel carries its one result.
func publishWaveAsync(p *faultPublisher, queue string, dests []string, prefix string, n, batch int, every, from, to time.Duration) <-chan waveResult {
	done := make(chan waveResult, 1)
	go func() {
		due, err := publishWave(p, queue, dests, prefix, n, batch, every, from, to)
		done <- waveResult{due, err, time.Now()}
	}()
	return done
}

// awaitWave waits for the wave of publishWaveAsync and fails the test if it
// did not publish everything.
func awaitWave(t testing.TB, wave <-chan waveResult) waveResult {
	t.Helper()
	res := <-wave
	if res.err != nil {
		t.Fatalf("publishing: %v (%d messages confirmed before that)", res.err, len(res.due))
	}
	return res
}

// collectWave waits until every message of due arrived, failing the test
// for any still missing grace after the last due time, then settle more for
// late duplicates, and checks the run (checkFaultRun).
func collectWave(t *testing.T, c *faultConsumer, due map[string]time.Time, grace, settle time.Duration) ([]faultArrival, faultReport) {
	t.Helper()
	if missing := c.waitAll(due, time.Until(latestDue(due).Add(grace))); missing > 0 {
		t.Errorf("%d of %d messages still missing %s after the last due time", missing, len(due), grace)
	}
	time.Sleep(settle)
	got := c.All()
	return got, checkFaultRun(t, due, got)
}

// publishMore publishes another wave (publishWave's arguments) and adds its
// messages to due; it fails the test if the wave fails.
func publishMore(t *testing.T, due map[string]time.Time, p *faultPublisher, queue string, dests []string, prefix string, n, batch int, every, from, to time.Duration) {
	t.Helper()
	more, err := publishWave(p, queue, dests, prefix, n, batch, every, from, to)
	if err != nil {
		t.Fatalf("publishing the wave %s: %v", prefix, err)
	}
	maps.Copy(due, more)
}

// logWaveReport logs what checkFaultRun found for a wave.
func logWaveReport(t *testing.T, c *faultConsumer, due map[string]time.Time, got []faultArrival, rep faultReport) {
	t.Helper()
	t.Logf("%d deliveries of %d messages: %d lost, %d early, %d duplicate deliveries (%d ids), %d unknown; latest %s after its due time; consumer reconnects %d",
		len(got), len(due), rep.lost, rep.early, rep.dups, len(rep.dupIDs), rep.unknown, rep.worstLate.Round(time.Millisecond), c.Reconnects())
}

// checkReadyAndStop fails the test unless the bridge survived the disruption
// and is ready at the end; then it stops the bridge.
func checkReadyAndStop(t *testing.T, b *bridgeProc) {
	t.Helper()
	if !b.Running() {
		t.Fatalf("the bridge exited with code %d", b.exitCode)
	}
	if code, err := getReadyz(b.HTTPAddr); code != http.StatusOK {
		t.Errorf("at the end /readyz answers %d (%v), want 200", code, err)
	}
	b.Stop()
}

// startFaultClients declares the destination queues dests and starts a
// faultConsumer on them and a faultPublisher named name, both closed at the
// test's cleanup. setup is a connection for the test's own checks.
func startFaultClients(t testing.TB, name string, dests ...string) (setup *amqp.Connection, c *faultConsumer, pub *faultPublisher) {
	t.Helper()
	setup = dial(t)
	for _, q := range dests {
		declareQueue(t, setup, q)
	}
	c = startFaultConsumer(t, dests...)
	pub, err := newFaultPublisher(name)
	if err != nil {
		t.Fatalf("publisher: %v", err)
	}
	t.Cleanup(pub.Close)
	return setup, c, pub
}

func latestDue(due map[string]time.Time) time.Time {
	var l time.Time
	for _, d := range due {
		if d.After(l) {
			l = d
		}
	}
	return l
}

// ---------------------------------------------------------------------------
// Consuming

// faultArrival is one delivery seen on a destination queue.
type faultArrival struct {
	ID    string
	Queue string
	At    time.Time
	// Echo marks the broker redelivering to the test's consumer a message it
	// had already handed over (the consumer's ack was lost with its
	// connection): not a delivery by the bridge, so not a duplicate.
	Echo bool
}

// faultConsumer consumes destination queues with manual acks (record first,
// then ack, so nothing is lost in a dying connection) and reconnects when
// its connection is lost, e.g. while the broker restarts.
type faultConsumer struct {
	url        string
	queues     []string
	mu         sync.Mutex
	got        []faultArrival
	seen       map[string]bool // queue + "\x00" + id
	reconnects int
	lastErr    error
}

// startFaultConsumer starts consuming the (existing) queues and returns once
// the first subscription is in place. It stops at the test's cleanup.
func startFaultConsumer(t testing.TB, queues ...string) *faultConsumer {
	t.Helper()
	return startFaultConsumerAt(t, amqpURL, queues...)
}

// startFaultConsumerAt is startFaultConsumer on the broker at url.
func startFaultConsumerAt(t testing.TB, url string, queues ...string) *faultConsumer {
	t.Helper()
	c := &faultConsumer{url: url, queues: queues, seen: map[string]bool{}}
	ctx, cancel := context.WithCancel(context.Background())
	first := make(chan error, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.run(ctx, first)
	}()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case err := <-first:
		if err != nil {
			t.Fatalf("consume %v: %v", queues, err)
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("consume %v: no subscription within 15 s", queues)
	}
	return c
}

func (c *faultConsumer) run(ctx context.Context, first chan<- error) {
	subscribed := false
	for ctx.Err() == nil {
		err := c.session(ctx, func() {
			if !subscribed {
				subscribed = true
				first <- nil
				return
			}
			c.mu.Lock()
			c.reconnects++
			c.mu.Unlock()
		})
		if ctx.Err() != nil {
			return
		}
		if !subscribed {
			first <- err // the first subscription failed: report it, do not retry
			return
		}
		c.mu.Lock()
		c.lastErr = err
		c.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// session runs one connection until it is lost or ctx ends; subscribed is
// called once every queue is being consumed.
func (c *faultConsumer) session(ctx context.Context, subscribed func()) error {
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName("it-fault-consumer")
	conn, err := amqp.DialConfig(c.url, amqp.Config{Properties: props, Dial: amqp.DefaultDial(2 * time.Second)})
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close()
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	var wg sync.WaitGroup
	defer wg.Wait()
	for _, q := range c.queues {
		ch, err := conn.Channel()
		if err == nil {
			err = ch.Qos(1000, 0, false)
		}
		var deliveries <-chan amqp.Delivery
		if err == nil {
			deliveries, err = ch.Consume(q, "", false, false, false, false, nil)
		}
		if err != nil {
			_ = conn.Close() // ends the goroutines already started
			return fmt.Errorf("consume %q: %w", q, err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for d := range deliveries {
				c.record(q, d)
				_ = d.Ack(false)
			}
		}()
	}
	subscribed()
	select {
	case <-ctx.Done():
		_ = conn.Close()
		return nil
	case e := <-closed:
		return fmt.Errorf("connection lost: %v", e)
	}
}

func (c *faultConsumer) record(queue string, d amqp.Delivery) {
	now := time.Now()
	key := queue + "\x00" + d.MessageId
	c.mu.Lock()
	defer c.mu.Unlock()
	c.got = append(c.got, faultArrival{ID: d.MessageId, Queue: queue, At: now, Echo: d.Redelivered && c.seen[key]})
	c.seen[key] = true
}

// All returns every delivery so far.
func (c *faultConsumer) All() []faultArrival {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.got)
}

// Count is the number of deliveries so far.
func (c *faultConsumer) Count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.got)
}

// Reconnects is how often the consumer had to reconnect.
func (c *faultConsumer) Reconnects() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.reconnects
}

// waitAll waits up to timeout until every id in due arrived at least once
// and returns how many have not.
func (c *faultConsumer) waitAll(due map[string]time.Time, timeout time.Duration) int {
	deadline := time.Now().Add(timeout)
	for {
		seen := map[string]bool{}
		for _, a := range c.All() {
			seen[a.ID] = true
		}
		missing := 0
		for id := range due {
			if !seen[id] {
				missing++
			}
		}
		if missing == 0 || time.Now().After(deadline) {
			return missing
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// ---------------------------------------------------------------------------
// Checking

// faultReport summarizes a run's deliveries against what was published.
type faultReport struct {
	lost, early, dups, unknown int
	dupIDs                     []string
	// arrivals per id, in arrival order, echoes left out.
	arrivals  map[string][]faultArrival
	worstLate time.Duration
}

// checkFaultRun asserts zero lost, zero early and nothing unknown; it logs
// the duplicates (allowed under faults) and returns the counts.
func checkFaultRun(t *testing.T, due map[string]time.Time, got []faultArrival) faultReport {
	t.Helper()
	rep := faultReport{arrivals: map[string][]faultArrival{}}
	echoes := 0
	for _, a := range got {
		d, ok := due[a.ID]
		if !ok {
			rep.unknown++
			if rep.unknown <= 5 {
				t.Errorf("unexpected delivery with message-id %q on %s", a.ID, a.Queue)
			}
			continue
		}
		if a.At.Before(d) {
			rep.early++
			if rep.early <= 5 {
				t.Errorf("message %s delivered EARLY by %s (arrived %s, due %s)", a.ID, d.Sub(a.At),
					a.At.Format(time.RFC3339Nano), d.Format(time.RFC3339Nano))
			}
		}
		if a.Echo {
			echoes++
			continue
		}
		if len(rep.arrivals[a.ID]) == 0 {
			rep.worstLate = max(rep.worstLate, a.At.Sub(d))
		}
		rep.arrivals[a.ID] = append(rep.arrivals[a.ID], a)
	}
	ids := make([]string, 0, len(due))
	for id := range due {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		switch as := rep.arrivals[id]; {
		case len(as) == 0:
			rep.lost++
			if rep.lost <= 10 {
				t.Errorf("LOST: message %s (due %s) never arrived", id, due[id].Format(time.RFC3339Nano))
			}
		case len(as) > 1:
			rep.dups += len(as) - 1
			rep.dupIDs = append(rep.dupIDs, id)
		}
	}
	if rep.lost > 0 {
		var first, last time.Time
		for _, id := range ids {
			if len(rep.arrivals[id]) == 0 {
				if first.IsZero() || due[id].Before(first) {
					first = due[id]
				}
				if due[id].After(last) {
					last = due[id]
				}
			}
		}
		t.Logf("the lost messages were due between %s and %s", first.Format("15:04:05.000"), last.Format("15:04:05.000"))
	}
	for i, id := range rep.dupIDs {
		if i == 20 {
			t.Logf("… and %d more duplicated ids", len(rep.dupIDs)-i)
			break
		}
		var at []string
		for _, a := range rep.arrivals[id] {
			at = append(at, a.At.Format("15:04:05.000"))
		}
		t.Logf("duplicate: %s due %s arrived %d times at %s", id, due[id].Format("15:04:05.000"), len(at), strings.Join(at, ", "))
	}
	// Lateness is allowed, but the latest arrivals say where the bridge was slow.
	type lateOne struct {
		id   string
		late time.Duration
	}
	var lates []lateOne
	for id, as := range rep.arrivals {
		if late := as[0].At.Sub(due[id]); late > time.Second {
			lates = append(lates, lateOne{id, late})
		}
	}
	if len(lates) > 0 {
		sort.Slice(lates, func(i, j int) bool { return lates[i].late > lates[j].late })
		var worst []string
		for _, l := range lates[:min(5, len(lates))] {
			worst = append(worst, fmt.Sprintf("%s due %s +%s", l.id, due[l.id].Format("15:04:05.000"), l.late.Round(time.Millisecond)))
		}
		t.Logf("%d messages first arrived more than 1 s after their due time; the latest: %s", len(lates), strings.Join(worst, "; "))
	}
	if echoes > 0 {
		t.Logf("%d redeliveries to the test's own consumer after it lost its connection (not counted as duplicates)", echoes)
	}
	if rep.lost+rep.early+rep.unknown > 0 {
		t.Errorf("of %d messages: %d lost, %d early, %d unknown deliveries (%d duplicate deliveries)",
			len(due), rep.lost, rep.early, rep.unknown, rep.dups)
	}
	return rep
}

// killEvent is one SIGKILL: when it came and when the bridge started after
// it was running again (its "delaybridge running" log line, else ready).
type killEvent struct {
	At, Running time.Time
}

// bridgeRunningSince is the time of the bridge's first "delaybridge running"
// log line, or zero.
func bridgeRunningSince(b *bridgeProc) time.Time {
	for _, line := range strings.Split(b.Stderr(), "\n") {
		var m struct{ Message, Time string }
		if json.Unmarshal([]byte(line), &m) == nil && m.Message == "delaybridge running" {
			if ts, err := time.Parse(time.RFC3339Nano, m.Time); err == nil {
				return ts
			}
		}
	}
	return time.Time{}
}

// reporter is the part of *testing.T the checks below use, so that their
// verdicts can be tested on made-up runs.
type reporter interface {
	Helper()
	Logf(format string, args ...any)
	Errorf(format string, args ...any)
}

// checkDuplicatesExplainedByKills checks that every duplicate is explained by
// a kill, one of two ways (docs/contract.md §3.3):
//
//   - The copy delivered first was forwarded (at or after its due time,
//     since nothing is early) by a process killed before it could remove
//     the message from its store, and the next copy came from a later
//     process: a kill K such that due <= K, first arrival <= K + 1 s and
//     K < next arrival.
//   - A kill came between the commit of the message's intake and its ack on
//     E.Timeouts, and a later process took in the redelivery after the
//     stored copy was delivered, so stored it again: restored[id] counts
//     such second commits the logs prove (restoredAfterKills), and each
//     explains one extra delivery, whenever it arrived.
//
// It fails the test for every other duplicate. It logs, without failing,
// the first kind whose first copy arrived only after the next bridge was
// already running (a forward in flight at the kill that reached the test
// late, or a duplicate made by the restarted bridge itself, e.g. from a
// stale dispatcher message), and how long after the first copy the kill
// came (a measure of the confirm-to-removal window).
func checkDuplicatesExplainedByKills(t reporter, rep faultReport, due map[string]time.Time, kills []killEvent, restored map[string]int) {
	t.Helper()
	const latency = time.Second
	var gaps []time.Duration
	unexplained, late, recommitted := 0, 0, 0
	for _, id := range rep.dupIDs {
		as := rep.arrivals[id]
		second := restored[id]
		for i := 1; i < len(as); i++ {
			prev, next := as[i-1].At, as[i].At
			ok := false
			for _, k := range kills { // in time order: the first that fits is the one right after the forward
				if !due[id].After(k.At) && !prev.After(k.At.Add(latency)) && next.After(k.At) {
					ok = true
					gaps = append(gaps, k.At.Sub(prev))
					if prev.After(k.Running) {
						late++
						if late <= 5 {
							t.Logf("note: duplicate of %s (due %s): its first copy arrived at %s, %s after the kill, when the restarted bridge was already running",
								id, due[id].Format("15:04:05.000"), prev.Format("15:04:05.000"), prev.Sub(k.At).Round(time.Millisecond))
						}
					}
					break
				}
			}
			if !ok && second > 0 {
				ok = true
				second--
				recommitted++
				if recommitted <= 5 {
					t.Logf("note: duplicate of %s (due %s), arrivals at %s and %s: a bridge started after a kill stored its redelivery from E.Timeouts again after it had been forwarded",
						id, due[id].Format("15:04:05.000"), prev.Format("15:04:05.000"), next.Format("15:04:05.000"))
				}
			}
			if !ok {
				unexplained++
				if unexplained <= 5 {
					t.Errorf("duplicate of %s (due %s) with no kill to explain it: arrivals at %s and %s", id,
						due[id].Format("15:04:05.000"), prev.Format("15:04:05.000"), next.Format("15:04:05.000"))
				}
			}
		}
	}
	if unexplained > 0 {
		t.Errorf("%d duplicate deliveries not explained by a kill (docs/contract.md §3.3: after a crash, a duplicate only when the bridge dies between the forward's confirm and the removal, or between the commit and the ack of the message's intake)", unexplained)
	}
	if late > 0 {
		t.Logf("note: %d duplicates whose first copy arrived after the restarted bridge was running", late)
	}
	if recommitted > 0 {
		t.Logf("note: %d duplicates from a redelivery on E.Timeouts stored a second time after a kill", recommitted)
	}
	if len(gaps) > 0 {
		slices.Sort(gaps)
		t.Logf("duplicates: the kill came between %s and %s (median %s) after the first copy arrived",
			gaps[0].Round(time.Millisecond), gaps[len(gaps)-1].Round(time.Millisecond), gaps[len(gaps)/2].Round(time.Millisecond))
	}
}

// restoredAfterKills reads the debug logs of a run's bridge processes, one
// per process in start order, each started after a kill of the one before,
// and counts per id the commits that stored a message a second time: a
// process after the first stored it from a redelivery on E.Timeouts
// (ingest's "stored" line, redelivered) after a process had forwarded it
// (the dispatcher's "forwarding" line, earlier). The test publishes each id
// once, so the row forwarded earlier came from an earlier commit, and the
// broker redelivers only what a channel closed on without the ack. Each
// "forwarding" line proves at most one such commit. So does a redelivery
// stored as another send of its id (ingest's "stored" line with a send
// above 1): the restarted process had leased its first commit, to forward
// it, when the redelivery came (docs/contract.md §2.4, §3.3). Forwards name
// row keys, counted for their message id.
func restoredAfterKills(logs []string) map[string]int {
	type event struct {
		at     time.Time
		stored bool // else forwarding
	}
	events := map[string][]event{}
	leasedAgain := map[string]int{}
	for i, log := range logs {
		for _, line := range strings.Split(log, "\n") {
			var m struct {
				Message, Time, ID string
				IDs               []string
				Redelivered       bool
				Send              int
			}
			if json.Unmarshal([]byte(line), &m) != nil {
				continue
			}
			at, err := time.Parse(time.RFC3339Nano, m.Time)
			if err != nil {
				continue
			}
			switch {
			case m.Message == "forwarding":
				for _, key := range m.IDs {
					id := wire.KeyID(key)
					events[id] = append(events[id], event{at: at})
				}
			case m.Message == "stored" && m.Redelivered && i > 0 && m.Send > 1:
				leasedAgain[m.ID]++
			case m.Message == "stored" && m.Redelivered && i > 0:
				events[m.ID] = append(events[m.ID], event{at: at, stored: true})
			}
		}
	}
	restored := leasedAgain
	for id, evs := range events {
		slices.SortFunc(evs, func(a, b event) int {
			if c := a.at.Compare(b.at); c != 0 || a.stored == b.stored {
				return c
			}
			if a.stored { // a tie proves no order: the store goes first
				return -1
			}
			return 1
		})
		forwarded := 0
		for _, e := range evs {
			switch {
			case !e.stored:
				forwarded++
			case forwarded > 0:
				forwarded--
				restored[id]++
			}
		}
	}
	return restored
}

// checkBridgeQueuesDrained asserts that E.Timeouts and the error queue hold
// no messages; call it after the bridge stopped (so nothing is unacked). It
// logs the dispatcher queue's depth.
func checkBridgeQueuesDrained(t *testing.T, b *bridgeProc) {
	t.Helper()
	conn, err := amqp.DialConfig(amqpURL, amqp.Config{Dial: amqp.DefaultDial(10 * time.Second)})
	if err != nil {
		t.Errorf("connect to check the queues: %v", err)
		return
	}
	defer conn.Close()
	if n := queueDepth(t, conn, b.TimeoutsQueue()); n != 0 {
		t.Errorf("%s holds %d messages at the end, want 0", b.TimeoutsQueue(), n)
	}
	if n := queueDepth(t, conn, b.ErrorQ); n != 0 {
		t.Errorf("the error queue %s holds %d messages at the end, want 0", b.ErrorQ, n)
	}
	if n := queueDepth(t, conn, b.DispatcherQueue()); n != 0 {
		t.Logf("note: %s holds %d messages at the end", b.DispatcherQueue(), n)
	}
}

// summarizeBridgeLog logs one bridge's exit code and recovered leases, then
// its error lines (and anything not JSON) and its warning lines, at most 12
// of each, leaving out repeated failed reconnect attempts (only counted). It
// returns how many lines report a lost broker connection.
func summarizeBridgeLog(t *testing.T, label string, b *bridgeProc) (connLost int) {
	t.Helper()
	const maxLines = 12
	exit := "running"
	if !b.Running() {
		exit = fmt.Sprintf("exit code %d", b.exitCode)
	}
	var recovered, errs, warns []string
	nErrs, nWarns, retries := 0, 0, 0
	for _, line := range strings.Split(b.Stderr(), "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) != nil {
			m = map[string]any{"level": "error"} // a panic, a race report: never leave it out
		}
		if strings.Contains(line, "CONNECTION_FORCED") || strings.Contains(strings.ToLower(line), "connection lost") {
			connLost++
		}
		if v, ok := m["recovered_leases"]; ok {
			recovered = append(recovered, fmt.Sprint(v))
		}
		switch m["level"] {
		case "error", "fatal", "panic":
			if nErrs++; len(errs) < maxLines {
				errs = append(errs, line)
			}
		case "warn":
			if strings.Contains(fmt.Sprint(m["message"]), "reconnecting to the broker failed") {
				retries++
				continue
			}
			if nWarns++; len(warns) < maxLines {
				warns = append(warns, line)
			}
		}
	}
	t.Logf("bridge %s (%s): recovered_leases=%s, %d error lines, %d warnings, %d failed reconnect attempts",
		label, exit, strings.Join(recovered, ","), nErrs, nWarns, retries)
	for _, l := range append(errs, warns...) {
		t.Logf("  %s", tail(l, 600))
	}
	return connLost
}
