package dispatch

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/rs/zerolog"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/internal/amqptest"
	"github.com/delaybridge/delaybridge/internal/logtest"
	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/storage/faultstore"
	"github.com/delaybridge/delaybridge/wire"
)

// rebuild gives the fixture a dispatcher on store with opts (queues and
// clock filled in).
func (f *fixture) rebuild(store Store, opts Options) {
	opts.Queue, opts.TimeoutsQueue, opts.ErrorQueue, opts.Now = "e.TimeoutsDispatcher", "e.Timeouts", "error", f.clock.Now
	if opts.Metrics == nil {
		opts.Metrics = &recorder{}
	}
	f.d = New(nil, func(context.Context) (Publisher, error) { return f.pub, nil }, store, opts)
}

// returnedFor answers the forwards to dest as the broker returns a
// publish to a missing queue, and confirms the others.
func returnedFor(dest string) func(broker.Outgoing) error {
	return func(m broker.Outgoing) error {
		if m.RoutingKey == dest {
			return fmt.Errorf("%w: 312 NO_ROUTE", broker.ErrReturned)
		}
		return nil
	}
}

// run leases everything due and hands it to the dispatcher in dispatcher
// messages of batch tokens, as the poller does, until nothing is due.
func (f *fixture) run(batch int) {
	f.t.Helper()
	for {
		toks := f.lease()
		if len(toks) == 0 {
			return
		}
		for len(toks) > 0 {
			n := min(batch, len(toks))
			if _, err := f.deliver(toks[:n]...); err != nil {
				f.t.Fatal(err)
			}
			toks = toks[n:]
		}
	}
}

// TestUnroutableDestinationDoesNotStorm: 300 messages due to a
// queue that does not exist, default retries. Every attempt counts, so each
// message reaches the error queue after its retries on the documented
// backoff; the destination is probed with one forward instead of one
// publish per message; the warnings are one per destination per interval;
// attempts and the last error are in the store at once.
func TestUnroutableDestinationDoesNotStorm(t *testing.T) {
	const msgs, retries = 300, 5
	f := newFixture(t, retries)
	logs := &logtest.Buffer{}
	f.rebuild(f.store, Options{
		NumberOfRetries: retries, Logger: zerolog.New(logs).Level(zerolog.InfoLevel),
	})
	f.pub.Outcome = returnedFor("nowhere")
	for i := range msgs {
		id := fmt.Sprintf("m-%03d", i)
		f.insert(id, "nowhere", t0, amqp.Publishing{MessageId: id, Body: []byte(id)})
	}

	f.run(100)
	for i := range msgs {
		row, ok := f.pending(fmt.Sprintf("m-%03d", i))
		if !ok || row.Attempts != 1 || !strings.Contains(row.LastError, "312 NO_ROUTE") || row.Lock != "" {
			t.Fatalf("after the first attempt, want attempts 1 and the cause recorded at once: %+v (pending %v)", row, ok)
		}
	}
	// Retries come on the backoff, 1 s, 2 s, 4 s … and never earlier.
	for round := 1; round <= 40; round++ {
		at, ok, err := f.store.NextDue(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		f.clock.Set(at)
		f.run(100)
	}
	if _, ok, _ := f.store.NextDue(context.Background()); ok {
		t.Fatal("messages still pending after every retry")
	}
	if elapsed := f.clock.Now().Sub(t0); elapsed < 31*time.Second {
		t.Errorf("all on the error queue %s after due; 5 retries back off 1+2+4+8+16 = 31 s", elapsed)
	}

	eq := f.pub.To("error")
	if len(eq) != msgs {
		t.Fatalf("%d copies on the error queue, want %d", len(eq), msgs)
	}
	seen := map[string]bool{}
	for _, m := range eq {
		seen[m.Msg.MessageId] = true
		if got := m.Msg.Headers[wire.HeaderAttempts]; got != int32(retries+1) {
			t.Fatalf("copy of %s: attempts %v, want %d", m.Msg.MessageId, got, retries+1)
		}
	}
	if len(seen) != msgs {
		t.Fatalf("%d distinct messages on the error queue, want %d", len(seen), msgs)
	}
	// At most one publish per message on its first attempt (nothing is
	// known about the destination yet) and one on its last (no message goes
	// to the error queue on another's refusal), and a probe per retry round.
	publishes := len(f.pub.To("nowhere"))
	t.Logf("%d publish attempts, %d log lines (%d warnings) for %d messages", publishes, len(logs.LinesAt("")), len(logs.LinesAt("warn")), msgs)
	if publishes > 2*msgs+2*retries {
		t.Errorf("%d publish attempts to the unroutable destination; want at most %d (first and last attempts, and a probe per round)", publishes, 2*msgs+2*retries)
	}
	if c := f.counted(); c.failed != msgs*(retries+1) {
		t.Errorf("%d failures counted, want %d: every attempt counts", c.failed, msgs*(retries+1))
	}
	if w := len(logs.LinesAt("warn")); w > 2*(retries+1) {
		t.Errorf("%d warning lines; want the failures to one destination summarised, at most %d", w, 2*(retries+1))
	}
	// The error-queue moves: one line per message, once in its life.
	if n := len(logs.LinesAt("")); n > msgs+2*(retries+1) {
		t.Errorf("%d log lines for %d messages", n, msgs)
	}
}

// A destination that refused a forward is probed once its interval is
// over: one forward goes, the rest of the window waits for its answer and
// goes too when it was taken; a healthy destination is never held back.
func TestRefusingDestinationIsProbed(t *testing.T) {
	f := newFixture(t, 5)
	f.pub.Outcome = returnedFor("late")
	f.insert("first", "late", t0, amqp.Publishing{MessageId: "first"})
	f.run(100)
	if n := len(f.pub.To("late")); n != 1 {
		t.Fatalf("%d publishes, want 1", n)
	}

	// Within the interval: no publish, but the attempt counts.
	for i := range 5 {
		id := fmt.Sprint("within-", i)
		f.insert(id, "late", t0, amqp.Publishing{MessageId: id})
	}
	f.insert("healthy", "orders", t0, amqp.Publishing{MessageId: "healthy"})
	f.clock.Advance(500 * time.Millisecond)
	f.run(100)
	if n := len(f.pub.To("late")); n != 1 {
		t.Fatalf("%d publishes to the refusing destination within its probe interval, want still 1", n)
	}
	if n := len(f.pub.To("orders")); n != 1 {
		t.Fatalf("healthy destination: %d forwards, want 1", n)
	}
	row, ok := f.pending("within-0")
	if !ok || row.Attempts != 1 || !strings.Contains(row.LastError, "312 NO_ROUTE") || !strings.Contains(row.LastError, "not published") {
		t.Fatalf("held-back attempt not counted with its cause: %+v", row)
	}

	// The queue appears; the next round's probe is taken, and the rest of
	// its window is forwarded after it.
	f.pub.Outcome = nil
	f.clock.Advance(2 * time.Second)
	f.run(100)
	if n := len(f.pub.To("late")); n != 1+6 {
		t.Fatalf("%d publishes, want 7 (the first attempt, then one probe and five after it)", n)
	}
	for _, id := range []string{"first", "within-0", "within-4"} {
		if _, ok := f.pending(id); ok {
			t.Errorf("%s still pending after the destination took its probe", id)
		}
	}
}

// The probe's answer decides the rest of its window: refused again, they
// count their attempt without a publish.
func TestProbeRefusedAgainCountsTheWindow(t *testing.T) {
	f := newFixture(t, 5)
	f.pub.Outcome = returnedFor("nowhere")
	f.insert("a", "nowhere", t0, amqp.Publishing{MessageId: "a"})
	f.run(100)
	for _, id := range []string{"b", "c", "d"} {
		f.insert(id, "nowhere", t0, amqp.Publishing{MessageId: id})
	}
	f.clock.Advance(time.Second) // a's retry and the probe interval are over
	f.run(100)
	if n := len(f.pub.To("nowhere")); n != 2 {
		t.Fatalf("%d publishes, want 2 (the first attempt and one probe)", n)
	}
	for _, id := range []string{"a", "b", "c", "d"} {
		row, ok := f.pending(id)
		want := 1
		if id == "a" {
			want = 2
		}
		if !ok || row.Attempts != want || row.Lock != "" {
			t.Errorf("%s: %+v, want attempts %d and released", id, row, want)
		}
	}
}

// A retry handed over a little before its hold ends (the poller leases
// ahead) is judged at the time it goes out: it probes the destination
// rather than failing without a publish.
func TestEarlyHandedRetryProbes(t *testing.T) {
	f := newFixture(t, 5)
	f.pub.Outcome = returnedFor("nowhere")
	f.insert("a", "nowhere", t0, amqp.Publishing{MessageId: "a"})
	f.run(100)
	row, _ := f.pending("a")
	ls, err := f.store.Lease(context.Background(), "me", row.NotBefore, 10, time.Minute)
	if err != nil || len(ls) != 1 {
		t.Fatalf("lease: %v %v", ls, err)
	}
	f.clock.Set(row.NotBefore.Add(-50 * time.Millisecond))
	if _, err := f.deliver(wire.Token{ID: ls[0].ID, Lock: ls[0].Lock}); err != nil {
		t.Fatal(err)
	}
	if n := len(f.pub.To("nowhere")); n != 2 {
		t.Fatalf("%d publishes, want 2: the retry probes", n)
	}
}

// incrementHook runs a check before each IncrementFailureCount.
type incrementHook struct {
	Store
	before func()
}

func (s incrementHook) IncrementFailureCount(ctx context.Context, id, lock, reason string) (int, error) {
	s.before()
	return s.Store.IncrementFailureCount(ctx, id, lock, reason)
}

// A window's refusals are known before its failures are handled (store
// commits, slow): other workers meanwhile hold their forwards back. And an
// answer older than what is known does not undo it.
func TestRefusalIsKnownBeforeFailuresAreHandled(t *testing.T) {
	f := newFixture(t, 5)
	var unknownDuringHandling int
	f.rebuild(incrementHook{Store: f.store, before: func() {
		if _, refused := f.d.dests.refused(wire.Queue("nowhere"), f.clock.Now()); !refused {
			unknownDuringHandling++
		}
	}}, Options{NumberOfRetries: 5, Logger: zerolog.Nop()})
	f.pub.Outcome = returnedFor("nowhere")
	for _, id := range []string{"a", "b", "c"} {
		f.insert(id, "nowhere", t0, amqp.Publishing{MessageId: id})
	}
	f.run(100)
	if unknownDuringHandling != 0 {
		t.Fatalf("the refusal was unknown while %d of 3 failures were handled", unknownDuringHandling)
	}

	s := newDestinations(time.Second, time.Minute, func(item) bool { return false })
	returned := fmt.Errorf("%w: 312 NO_ROUTE", broker.ErrReturned)
	s.record(wire.Queue("q"), returned, t0.Add(2*time.Second), true)
	s.record(wire.Queue("q"), returned, t0.Add(time.Second), false) // a slower worker's older answer
	if _, refused := s.refused(wire.Queue("q"), t0.Add(2500*time.Millisecond)); !refused {
		t.Fatal("an older answer moved the refusal back")
	}
}

// A message's last attempt is published even while its destination
// refuses: a queue declared meanwhile (say, before replaying the error
// queue) gets it, and no message reaches the error queue without the
// broker refusing it.
func TestLastAttemptIsAlwaysPublished(t *testing.T) {
	f := newFixture(t, 0)
	f.pub.Outcome = returnedFor("late")
	f.insert("a", "late", t0, amqp.Publishing{MessageId: "a"})
	f.run(100)
	if n := len(f.pub.To("error")); n != 1 {
		t.Fatalf("%d on the error queue, want a", n)
	}
	f.pub.Outcome = nil // the queue is declared
	f.insert("b", "late", t0, amqp.Publishing{MessageId: "b"})
	f.clock.Advance(100 * time.Millisecond) // within the probe interval
	f.run(100)
	if n := len(f.pub.To("late")); n != 2 {
		t.Fatalf("%d publishes, want 2: b's only attempt is published", n)
	}
	if _, ok := f.pending("b"); ok || len(f.pub.To("error")) != 1 {
		t.Fatal("b was not delivered")
	}
}

// A lost connection during a probe is no answer: the held forwards are
// released without a count, and the next forward probes again.
func TestProbeLostWithTheConnectionIsNotCounted(t *testing.T) {
	f := newFixture(t, 5)
	f.pub.Outcome = returnedFor("nowhere")
	f.insert("a", "nowhere", t0, amqp.Publishing{MessageId: "a"})
	f.run(100)
	f.insert("b", "nowhere", t0, amqp.Publishing{MessageId: "b"})
	f.clock.Advance(time.Second)
	f.pub.Outcome = func(broker.Outgoing) error { return fmt.Errorf("%w: channel closed", broker.ErrNotConfirmed) }
	toks := f.lease()
	if len(toks) != 2 {
		t.Fatalf("leased %d", len(toks))
	}
	if _, err := f.deliver(toks...); !errors.Is(err, broker.ErrNotConfirmed) {
		t.Fatalf("want the connection failure reported, got %v", err)
	}
	for id, want := range map[string]int{"a": 1, "b": 0} {
		if row, ok := f.pending(id); !ok || row.Attempts != want || row.Lock != "" {
			t.Errorf("%s: %+v, want attempts %d and released", id, row, want)
		}
	}
	// The next forward is a probe again, not held back.
	f.pub.Outcome = nil
	before := len(f.pub.To("nowhere"))
	f.run(100)
	if n := len(f.pub.To("nowhere")) - before; n != 2 {
		t.Fatalf("%d publishes after the lost probe, want 2 (probe, then the one it held)", n)
	}
}

// removeFailsOnce fails the first Remove (a faultstore fault healed after
// one call).
type removeFailsOnce struct {
	*faultstore.Store
}

func (s removeFailsOnce) Remove(ctx context.Context, refs []storage.Ref) ([]error, error) {
	res, err := s.Store.Remove(ctx, refs)
	s.Heal()
	return res, err
}

// A removal that fails once is tried again while the
// lease holds, so the forward is not forwarded again a lease later.
func TestForwardWhoseRemoveFailsOnceIsNotForwardedAgain(t *testing.T) {
	f := newFixture(t, 3)
	fs := faultstore.Wrap(f.store)
	fs.FailRemove(errors.New("disk full"))
	f.rebuild(removeFailsOnce{fs}, Options{
		NumberOfRetries: 3, Logger: zerolog.Nop(),
	})
	f.insert("a", "orders", t0, amqp.Publishing{MessageId: "a"})
	f.run(100)
	f.clock.Advance(2 * time.Minute) // past the lease: an unremoved row is leased again
	f.run(100)
	if n := len(f.pub.To("orders")); n != 1 {
		t.Fatalf("forwarded %d times, want once", n)
	}
	if _, ok := f.pending("a"); ok {
		t.Fatal("still pending")
	}
	if n := fs.Calls(faultstore.Remove); n != 2 {
		t.Fatalf("%d Remove calls, want 2 (the failure and its retry)", n)
	}
	if c := f.counted(); c.dispatched != 1 {
		t.Fatalf("dispatched %d, want 1", c.dispatched)
	}
}

// A removal that keeps failing is tried a bounded number of times, and not
// at all once the lease is too short for another commit; the row stays
// pending (a possible duplicate, never a loss).
func TestRemoveRetriesAreBoundedByTheLease(t *testing.T) {
	for _, tc := range []struct {
		name string
		// publishTakes is how long the forward's confirm took, of a
		// one-minute lease.
		publishTakes time.Duration
		wantCalls    int
	}{
		{"lease holds", 0, removeAttempts},
		{"lease nearly over", 59500 * time.Millisecond, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, 3)
			fs := faultstore.Wrap(f.store)
			fs.FailRemove(errors.New("disk full"))
			f.rebuild(fs, Options{
				NumberOfRetries: 3, Logger: zerolog.Nop(),
			})
			f.d.removeWait = time.Millisecond
			f.pub.Outcome = func(broker.Outgoing) error {
				f.clock.Advance(tc.publishTakes)
				return nil
			}
			f.insert("a", "orders", t0, amqp.Publishing{MessageId: "a"})
			if _, err := f.deliver(f.lease()...); err != nil {
				t.Fatal(err)
			}
			if n := len(f.pub.To("orders")); n != 1 {
				t.Fatalf("forwarded %d times", n)
			}
			if n := fs.Calls(faultstore.Remove); n != tc.wantCalls {
				t.Fatalf("%d Remove calls, want %d", n, tc.wantCalls)
			}
			if _, ok := f.pending("a"); !ok {
				t.Fatal("row lost")
			}
		})
	}
}

// unpublishable answers as broker.Publisher does for a message AMQP cannot
// carry.
func unpublishable(m broker.Outgoing) error {
	return broker.Publishable(m.Exchange, m.RoutingKey, &m.Msg, 0)
}

// A forward the client cannot encode (a destination over
// 255 bytes) is that message's failure, counted and moved to the error
// queue; the other forwards of its window go out and are removed, and the
// dispatcher message is acked (no connection failure).
func TestUnpublishableForwardFailsAlone(t *testing.T) {
	f := newFixture(t, 0)
	f.pub.Outcome = unpublishable
	long := strings.Repeat("q", 300)
	f.insert("a", "orders", t0, amqp.Publishing{MessageId: "a"})
	f.insert("bad", long, t0, amqp.Publishing{MessageId: "bad", Body: []byte("keep")})
	f.insert("c", "orders", t0, amqp.Publishing{MessageId: "c"})
	o, err := f.deliver(f.lease()...)
	if err != nil || o != amqptest.Acked {
		t.Fatalf("err %v, dispatcher message %s; an unencodable forward is no connection failure", err, o)
	}
	for _, id := range []string{"a", "bad", "c"} {
		if _, ok := f.pending(id); ok {
			t.Errorf("%s still pending", id)
		}
	}
	if n := len(f.pub.To("orders")); n != 2 {
		t.Fatalf("%d forwards to orders, want 2", n)
	}
	eq := f.pub.To("error")
	if len(eq) != 1 || eq[0].Msg.MessageId != "bad" || string(eq[0].Msg.Body) != "keep" {
		t.Fatalf("error queue: %+v", eq)
	}
	if r, _ := eq[0].Msg.Headers[wire.HeaderError].(string); !strings.Contains(r, "routing key is 300 bytes") {
		t.Fatalf("reason %q", r)
	}
}

// When the message's own headers cannot be encoded, its error copy cannot
// either: the copy then carries the stored record as its body, so the
// message leaves the store instead of looping.
func TestUnpublishableErrorCopyCarriesTheRecord(t *testing.T) {
	f := newFixture(t, 0)
	f.pub.Outcome = unpublishable
	longKey := strings.Repeat("k", 300)
	f.insert("bad", "orders", t0, amqp.Publishing{MessageId: "bad", Headers: amqp.Table{longKey: "v"}, Body: []byte("keep")})
	row, _ := f.pending("bad")
	if _, err := f.deliver(f.lease()...); err != nil {
		t.Fatal(err)
	}
	if _, ok := f.pending("bad"); ok {
		t.Fatal("still pending")
	}
	eq := f.pub.To("error")
	if len(eq) != 2 { // the copy as is (refused), then the record
		t.Fatalf("%d error-queue publishes, want 2", len(eq))
	}
	m := eq[1].Msg
	if m.MessageId != "bad" || string(m.Body) != string(row.Message) {
		t.Fatalf("fallback copy %+v; want the stored record as body", m)
	}
	if r, _ := m.Headers[wire.HeaderError].(string); !strings.Contains(r, "stored record") || !strings.Contains(r, "over AMQP's 255") {
		t.Fatalf("reason %q", r)
	}
}

// DELAYBRIDGE_MAXIMUM_RECOVERY_FAILURES_PER_SECOND, as in NServiceBus:
// failure handling that itself fails more than that many times a second
// (over 30 s) is a critical error, once; below it, it is not.
func TestRecoveryFailuresOverTheRateAreCritical(t *testing.T) {
	for _, tc := range []struct {
		msgs     int
		critical bool
	}{{30, false}, {31, true}, {60, true}} {
		t.Run(fmt.Sprint(tc.msgs), func(t *testing.T) {
			f := newFixture(t, 5)
			fs := faultstore.Wrap(f.store)
			fs.FailIncrement(errors.New("disk full"))
			var mu sync.Mutex
			var critical []error
			f.rebuild(fs, Options{
				NumberOfRetries: 5, Logger: zerolog.Nop(),
				RecoveryFailuresPerSecond: 1,
				OnCritical:                func(err error) { mu.Lock(); critical = append(critical, err); mu.Unlock() },
			})
			f.pub.Outcome = returnedFor("nowhere")
			for i := range tc.msgs {
				f.insert(fmt.Sprint("m", i), "nowhere", t0, amqp.Publishing{})
			}
			f.run(1000)
			mu.Lock()
			defer mu.Unlock()
			if got := len(critical) > 0; got != tc.critical {
				t.Fatalf("%d failed recordings: critical %v, want %v (%v)", tc.msgs, got, tc.critical, critical)
			}
			if len(critical) > 1 {
				t.Fatalf("critical error reported %d times, want once", len(critical))
			}
			if tc.critical && !strings.Contains(critical[0].Error(), "MAXIMUM_RECOVERY_FAILURES_PER_SECOND") {
				t.Fatalf("critical error %q does not name the variable", critical[0])
			}
		})
	}
}

// The failure summaries: the first failure to a destination is logged at
// once, later ones once per interval with their count, and what is left
// when the dispatcher stops is written then.
func TestFailureWarningsAreSummarised(t *testing.T) {
	logs := &logtest.Buffer{}
	l := newFailureLog(10*time.Second, zerolog.New(logs))
	for i := range 50 {
		l.note("nowhere", fmt.Sprint("m", i), "returned", 1, t0.Add(time.Second), t0.Add(time.Duration(i)*100*time.Millisecond))
	}
	l.note("elsewhere", "x", "nacked", 2, t0, t0)
	if n := len(logs.LinesAt("warn")); n != 2 {
		t.Fatalf("%d lines for the first failures of two destinations, want 2", n)
	}
	l.flush(t0.Add(9*time.Second), false)
	if n := len(logs.LinesAt("warn")); n != 2 {
		t.Fatalf("a summary written before its interval was over")
	}
	l.flush(t0.Add(10*time.Second), false)
	lines := logs.LinesAt("warn")
	if len(lines) != 3 || lines[2]["destination"] != "nowhere" || lines[2]["failures"] != float64(49) || lines[2]["last_id"] != "m49" {
		t.Fatalf("summary %v", lines[len(lines)-1])
	}
	l.note("nowhere", "late", "returned", 2, t0, t0.Add(12*time.Second))
	l.flush(t0.Add(13*time.Second), true) // the dispatcher stops
	lines = logs.LinesAt("warn")
	if len(lines) != 4 || lines[3]["failures"] != float64(1) || lines[3]["last_id"] != "late" {
		t.Fatalf("final summary %v", lines[len(lines)-1])
	}
	// Quiet for an interval: forgotten, so its next failure logs at once.
	l.flush(t0.Add(30*time.Second), false)
	l.note("nowhere", "again", "returned", 1, t0, t0.Add(31*time.Second))
	if lines = logs.LinesAt("warn"); len(lines) != 5 || lines[4]["id"] != "again" {
		t.Fatalf("after a quiet interval: %v", lines[len(lines)-1])
	}
}

// Thousands of distinct failing destinations at once (hostile, or a mass
// outage) keep both the refusal map and the log bounded.
func TestManyFailingDestinationsStayBounded(t *testing.T) {
	logs := &logtest.Buffer{}
	l := newFailureLog(10*time.Second, zerolog.New(logs))
	s := newDestinations(time.Second, time.Minute, func(item) bool { return false })
	returned := fmt.Errorf("%w: 312 NO_ROUTE", broker.ErrReturned)
	for i := range 5 * maxRefusals {
		dest := fmt.Sprint("q", i)
		s.record(wire.Queue(dest), returned, t0, false)
		l.note(dest, "m", "returned", 1, t0, t0)
	}
	if n := len(s.m); n > maxRefusals {
		t.Errorf("%d refusing destinations kept, want at most %d", n, maxRefusals)
	}
	if n := len(logs.LinesAt("warn")); n > maxRefusals+1 {
		t.Errorf("%d warnings for %d destinations, want at most %d", n, 5*maxRefusals, maxRefusals+1)
	}
	l.flush(t0.Add(10*time.Second), false)
	var other map[string]any
	for _, line := range logs.LinesAt("warn") {
		if line["destination"] == otherDestinations && line["failures"] != nil {
			other = line
		}
	}
	if other == nil || other["failures"] != float64(4*maxRefusals-1) {
		t.Errorf("summary of the other destinations: %v", other)
	}
}
