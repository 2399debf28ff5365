package dispatch

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/rs/zerolog"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/broker/brokertest"
	"github.com/delaybridge/delaybridge/internal/amqptest"
	"github.com/delaybridge/delaybridge/message"
	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/storage/boltstore"
	"github.com/delaybridge/delaybridge/storage/faultstore"
	"github.com/delaybridge/delaybridge/storage/storetest"
	"github.com/delaybridge/delaybridge/wire"
)

var t0 = time.Date(2026, 11, 21, 20, 0, 0, 0, time.UTC)

type fixture struct {
	t     *testing.T
	clock *storetest.Clock
	store *boltstore.Store
	pub   *brokertest.Publisher
	d     *Dispatcher
}

func newFixture(t *testing.T, retries int) *fixture {
	t.Helper()
	clock := storetest.NewClock(t0)
	store, err := boltstore.Open(filepath.Join(t.TempDir(), "s.db"), boltstore.Options{Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	pub := &brokertest.Publisher{}
	d := New(nil, func(context.Context) (Publisher, error) { return pub, nil }, store, Options{
		Queue: "e.TimeoutsDispatcher", TimeoutsQueue: "e.Timeouts", ErrorQueue: "error",
		NumberOfRetries: retries, Now: clock.Now, Logger: zerolog.Nop(), Metrics: &recorder{},
	})
	return &fixture{t: t, clock: clock, store: store, pub: pub, d: d}
}

// counted is what the dispatcher told its Metrics (a recorder) so far.
func (f *fixture) counted() counts {
	f.t.Helper()
	r, ok := f.d.opts.Metrics.(*recorder)
	if !ok {
		f.t.Fatalf("the dispatcher's Metrics are a %T, not a recorder", f.d.opts.Metrics)
	}
	return r.counts()
}

func (f *fixture) insert(id, dest string, due time.Time, p amqp.Publishing) {
	f.t.Helper()
	enc, err := message.Encode(nil, &p)
	if err != nil {
		f.t.Fatal(err)
	}
	if _, err := f.store.Insert(context.Background(), []storage.Timeout{{ID: id, Destination: dest, DueAt: due, ReceivedAt: t0, Message: enc}}); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) lease() []wire.Token {
	f.t.Helper()
	ls, err := f.store.Lease(context.Background(), "me", time.Time{}, 100, time.Minute)
	if err != nil {
		f.t.Fatal(err)
	}
	toks := make([]wire.Token, len(ls))
	for i, l := range ls {
		toks[i] = wire.Token{ID: l.ID, Lock: l.Lock}
	}
	return toks
}

// deliver runs one dispatcher message through the dispatcher.
// It returns how the message was settled, checked to be exactly once.
func (f *fixture) deliver(toks ...wire.Token) (amqptest.Outcome, error) {
	f.t.Helper()
	body, err := wire.EncodeTokens(toks)
	if err != nil {
		f.t.Fatal(err)
	}
	return f.deliverBody(body)
}

// deliverBody runs a dispatcher message with this body through a worker and
// the removal loop, as a consuming session does, and returns how it was
// settled and the worker's error.
func (f *fixture) deliverBody(body []byte) (amqptest.Outcome, error) {
	f.t.Helper()
	a := amqptest.New(f.t)
	deliveries := make(chan amqp.Delivery, 1)
	deliveries <- a.Deliver(amqp.Delivery{Body: body})
	close(deliveries)
	removals := make(chan owed, 1)
	removed := make(chan error, 1)
	go func() { removed <- f.d.removeLoop(context.Background(), removals) }()
	err := f.d.work(context.Background(), nil, deliveries, f.pub, removals)
	close(removals)
	if rerr := <-removed; rerr != nil {
		f.t.Fatal(rerr)
	}
	return a.Outcome(1), err
}

func (f *fixture) pending(id string) (storage.Timeout, bool) {
	row, err := f.store.Get(context.Background(), id)
	if errors.Is(err, storage.ErrNotFound) {
		return row, false
	}
	if err != nil {
		f.t.Fatal(err)
	}
	return row, true
}

func TestForwardsThenRemoves(t *testing.T) {
	f := newFixture(t, 3)
	msg := amqp.Publishing{MessageId: "a", Headers: amqp.Table{"k": "v"}, Body: []byte("hello")}
	f.insert("a", "orders", t0, msg)
	a, err := f.deliver(f.lease()...)
	if err != nil || a != amqptest.Acked {
		t.Fatalf("err %v, dispatcher message %s", err, a)
	}
	sent := f.pub.To("orders")
	if len(sent) != 1 || !sent[0].Mandatory || string(sent[0].Msg.Body) != "hello" || sent[0].Msg.Headers["k"] != "v" {
		t.Fatalf("forwarded %+v", sent)
	}
	if _, ok := f.pending("a"); ok {
		t.Fatal("row still pending after a confirmed forward")
	}
	if c := f.counted(); c.dispatched != 1 {
		t.Fatalf("dispatched %d, want 1", c.dispatched)
	}
}

func TestStaleTokensAreNotForwarded(t *testing.T) {
	f := newFixture(t, 3)
	f.insert("a", "orders", t0, amqp.Publishing{})
	old := f.lease()
	if err := f.store.Release(context.Background(), "a", old[0].Lock, time.Time{}); err != nil {
		t.Fatal(err)
	}
	current := f.lease() // leased again under a new lock
	a, err := f.deliver(old...)
	if err != nil || a != amqptest.Acked {
		t.Fatalf("err %v, dispatcher message %s", err, a)
	}
	if n := len(f.pub.Sent()); n != 0 {
		t.Fatalf("a stale token was forwarded %d times", n)
	}
	// The current token still works, exactly once.
	if _, err := f.deliver(current...); err != nil {
		t.Fatal(err)
	}
	if _, err := f.deliver(current...); err != nil { // redelivered dispatcher message
		t.Fatal(err)
	}
	if n := len(f.pub.To("orders")); n != 1 {
		t.Fatalf("forwarded %d times, want 1", n)
	}
	if c := f.counted(); c.stale != 2 {
		t.Fatalf("stale = %d, want 2", c.stale)
	}
}

func TestExpiredLeaseIsNotForwarded(t *testing.T) {
	f := newFixture(t, 3)
	f.insert("a", "orders", t0, amqp.Publishing{})
	toks := f.lease()
	f.clock.Advance(time.Minute) // lease was for a minute
	if _, err := f.deliver(toks...); err != nil {
		t.Fatal(err)
	}
	if len(f.pub.Sent()) != 0 {
		t.Fatal("forwarded under an expired lease")
	}
	if _, ok := f.pending("a"); !ok {
		t.Fatal("row lost")
	}
}

func TestEarlyTokenIsHeldUntilDue(t *testing.T) {
	f := newFixture(t, 3)
	due := t0.Add(time.Second)
	f.insert("a", "orders", due, amqp.Publishing{})
	// The poller leases a little ahead of the due time; the forward must
	// carry the due time so the publisher holds it until then.
	toks, err := f.store.Lease(context.Background(), "me", due, 10, time.Minute)
	if err != nil || len(toks) != 1 {
		t.Fatalf("lease: %v %v", toks, err)
	}
	f.clock.Set(due.Add(-20 * time.Millisecond))
	if _, err := f.deliver(wire.Token{ID: toks[0].ID, Lock: toks[0].Lock}); err != nil {
		t.Fatal(err)
	}
	sent := f.pub.To("orders")
	if len(sent) != 1 || !sent[0].NotBefore.Equal(due) {
		t.Fatalf("forwarded %+v; want one forward held until %s", sent, due)
	}
}

func TestFarTooEarlyTokenIsReleased(t *testing.T) {
	f := newFixture(t, 3)
	due := t0.Add(time.Minute)
	f.insert("a", "orders", due, amqp.Publishing{})
	// A token for a row due far later (another instance's clock ran ahead):
	// it is given back, not held, and certainly not forwarded.
	toks, err := f.store.Lease(context.Background(), "me", due, 10, 5*time.Minute)
	if err != nil || len(toks) != 1 {
		t.Fatalf("lease: %v %v", toks, err)
	}
	if _, err := f.deliver(wire.Token{ID: toks[0].ID, Lock: toks[0].Lock}); err != nil {
		t.Fatal(err)
	}
	if len(f.pub.Sent()) != 0 {
		t.Fatal("forwarded a minute before its due time")
	}
	row, ok := f.pending("a")
	if !ok || row.Lock != "" || row.NotBefore.Before(due) {
		t.Fatalf("row not released until due: %+v ok=%v", row, ok)
	}
}

func TestFailuresRetryWithBackoffThenErrorQueue(t *testing.T) {
	f := newFixture(t, 2)
	f.pub.Outcome = returnedFor("nowhere")
	f.insert("a", "nowhere", t0, amqp.Publishing{MessageId: "a", Body: []byte("keep me"), Headers: amqp.Table{"h": int16(3)}})
	var lastFail time.Time
	for attempt := 1; attempt <= 3; attempt++ {
		toks := f.lease()
		if len(toks) != 1 {
			t.Fatalf("attempt %d: leased %d rows", attempt, len(toks))
		}
		if attempt > 1 && f.clock.Now().Sub(lastFail) < time.Second {
			t.Fatalf("retry %d came %s after the failure; each retry waits at least 1s", attempt, f.clock.Now().Sub(lastFail))
		}
		if _, err := f.deliver(toks...); err != nil {
			t.Fatal(err)
		}
		lastFail = f.clock.Now()
		if attempt < 3 {
			row, ok := f.pending("a")
			if !ok || row.Attempts != attempt || !strings.Contains(row.LastError, "NO_ROUTE") {
				t.Fatalf("after attempt %d: %+v", attempt, row)
			}
			if again := f.lease(); len(again) != 0 {
				t.Fatal("retried without backoff")
			}
			f.clock.Set(row.NotBefore)
		}
	}
	if _, ok := f.pending("a"); ok {
		t.Fatal("row still pending after moving to the error queue")
	}
	eq := f.pub.To("error")
	if len(eq) != 1 {
		t.Fatalf("%d error-queue messages, want 1", len(eq))
	}
	m := eq[0].Msg
	if string(m.Body) != "keep me" || m.MessageId != "a" || m.Headers["h"] != int16(3) {
		t.Fatalf("error copy lost content: %+v", m)
	}
	for k, want := range map[string]any{
		wire.HeaderStage: "dispatch", wire.HeaderAttempts: int32(3), wire.HeaderNSBFailedQ: "e.Timeouts",
	} {
		if m.Headers[k] != want {
			t.Errorf("header %s = %v, want %v", k, m.Headers[k], want)
		}
	}
	if r, _ := m.Headers[wire.HeaderError].(string); !strings.Contains(r, "NO_ROUTE") {
		t.Errorf("reason %q", r)
	}
	if _, err := time.Parse(time.RFC3339Nano, m.Headers[wire.HeaderFailedAt].(string)); err != nil {
		t.Errorf("failed-at: %v", err)
	}
}

func TestBrokerFailureDoesNotBurnRetries(t *testing.T) {
	f := newFixture(t, 0)
	f.pub.Outcome = func(broker.Outgoing) error { return fmt.Errorf("%w: channel closed", broker.ErrNotConfirmed) }
	f.insert("a", "orders", t0, amqp.Publishing{})
	a, err := f.deliver(f.lease()...)
	if !errors.Is(err, broker.ErrNotConfirmed) {
		t.Fatalf("want the connection failure reported, got %v", err)
	}
	if a != amqptest.Requeued {
		t.Fatal("dispatcher message not requeued")
	}
	row, ok := f.pending("a")
	if !ok || row.Attempts != 0 || row.Lock != "" {
		t.Fatalf("want the row released with no failure counted: %+v", row)
	}
	if len(f.pub.To("error")) != 0 {
		t.Fatal("a broker outage sent a message to the error queue")
	}
}

func TestDisallowedAndCorruptGoToErrorQueue(t *testing.T) {
	f := newFixture(t, 5)
	f.d.opts.Allowed = matchFunc(func(q string) bool { return q == "orders" })
	f.insert("bad-dest", "secret", t0, amqp.Publishing{Body: []byte("x")})
	if _, err := f.store.Insert(context.Background(), []storage.Timeout{{ID: "corrupt", Destination: "orders", DueAt: t0, Message: []byte{99, 1, 2}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.deliver(f.lease()...); err != nil {
		t.Fatal(err)
	}
	if len(f.pub.To("secret")) != 0 || len(f.pub.To("orders")) != 0 {
		t.Fatal("forwarded a message that must not leave the bridge")
	}
	eq := f.pub.To("error")
	if len(eq) != 2 {
		t.Fatalf("%d on the error queue, want 2", len(eq))
	}
	for _, id := range []string{"bad-dest", "corrupt"} {
		if _, ok := f.pending(id); ok {
			t.Errorf("%s still pending", id)
		}
	}
	var corrupt amqp.Publishing
	for _, m := range eq {
		if m.Msg.MessageId == "corrupt" {
			corrupt = m.Msg
		}
	}
	if string(corrupt.Body) != string([]byte{99, 1, 2}) {
		t.Fatalf("corrupt record's bytes not kept: %q", corrupt.Body)
	}
}

func TestUnreadableDispatcherMessageIsSettled(t *testing.T) {
	f := newFixture(t, 3)
	a, err := f.deliverBody([]byte("{nope"))
	if err != nil {
		t.Fatal(err)
	}
	if a != amqptest.Acked {
		t.Fatalf("an unreadable dispatcher message was %s; nobody can read it, so it is dropped", a)
	}
}

func TestDefaultBackoff(t *testing.T) {
	for n, want := range map[int]time.Duration{0: time.Second, 1: time.Second, 2: 2 * time.Second, 3: 4 * time.Second, 10: 5 * time.Minute, 1000: 5 * time.Minute} {
		if got := DefaultBackoff(n); got != want {
			t.Errorf("DefaultBackoff(%d) = %s, want %s", n, got, want)
		}
	}
}

type matchFunc func(string) bool

func (m matchFunc) Allows(d wire.Destination) bool { return m(d.AllowName()) }

func TestNearlyExpiredLeaseIsReleasedNotForwarded(t *testing.T) {
	f := newFixture(t, 3)
	f.insert("a", "orders", t0, amqp.Publishing{})
	toks := f.lease() // a one-minute lease
	f.clock.Advance(50 * time.Second)
	if _, err := f.deliver(toks...); err != nil {
		t.Fatal(err)
	}
	if len(f.pub.Sent()) != 0 {
		t.Fatal("forwarded with too little lease left to remove it afterwards")
	}
	row, ok := f.pending("a")
	if !ok || row.Lock != "" {
		t.Fatalf("want the row released for a fresh lease: %+v ok=%v", row, ok)
	}
}

func TestRetryIsHeldUntilItsNotBefore(t *testing.T) {
	f := newFixture(t, 3)
	f.insert("a", "orders", t0, amqp.Publishing{})
	toks := f.lease()
	hold := t0.Add(2 * time.Second)
	if err := f.store.Release(context.Background(), "a", toks[0].Lock, hold); err != nil {
		t.Fatal(err)
	}
	// The poller leases 50 ms ahead of the hold's end.
	ls, err := f.store.Lease(context.Background(), "me", hold, 10, time.Minute)
	if err != nil || len(ls) != 1 {
		t.Fatalf("lease: %v %v", ls, err)
	}
	f.clock.Set(hold.Add(-50 * time.Millisecond))
	if _, err := f.deliver(wire.Token{ID: ls[0].ID, Lock: ls[0].Lock}); err != nil {
		t.Fatal(err)
	}
	if sent := f.pub.To("orders"); len(sent) != 1 || !sent[0].NotBefore.Equal(hold) {
		t.Fatalf("forward %+v; want it held until the retry hold ends at %s", sent, hold)
	}
}

// batchStore counts the reads of a store, and fails GetMany while failMany
// is set.
type batchStore struct {
	*boltstore.Store
	gets, getManys int
	maxIDs         int // the most ids one GetMany asked for
	failMany       error
}

func (s *batchStore) Get(ctx context.Context, id string) (storage.Timeout, error) {
	s.gets++
	return s.Store.Get(ctx, id)
}

func (s *batchStore) GetMany(ctx context.Context, ids []string) (map[string]storage.Timeout, error) {
	s.getManys++
	s.maxIDs = max(s.maxIDs, len(ids))
	if s.failMany != nil {
		return nil, s.failMany
	}
	return s.Store.GetMany(ctx, ids)
}

// The store is asked for a batch of rows once per dispatcher message, not
// once per token; if that fails, each token is read on its own.
func TestBatchOfTokensIsReadInOneCall(t *testing.T) {
	for _, failMany := range []error{nil, errors.New("batch read failed")} {
		f := newFixture(t, 3)
		bs := &batchStore{Store: f.store, failMany: failMany}
		f.d = New(nil, func(context.Context) (Publisher, error) { return f.pub, nil }, bs, Options{
			Queue: "e.TimeoutsDispatcher", TimeoutsQueue: "e.Timeouts", ErrorQueue: "error",
			NumberOfRetries: 3, Now: f.clock.Now, Logger: zerolog.Nop(), Metrics: &recorder{},
		})
		for _, id := range []string{"a", "b", "c"} {
			f.insert(id, "orders", t0, amqp.Publishing{MessageId: id})
		}
		toks := append(f.lease(), wire.Token{ID: "gone", Lock: "me:999"})
		if _, err := f.deliver(toks...); err != nil {
			t.Fatal(err)
		}
		if n := len(f.pub.To("orders")); n != 3 {
			t.Fatalf("failMany=%v: forwarded %d, want 3", failMany, n)
		}
		wantGets := 0
		if failMany != nil {
			wantGets = 4
		}
		if bs.getManys != 1 || bs.gets != wantGets {
			t.Fatalf("failMany=%v: %d GetMany and %d Get calls, want 1 and %d", failMany, bs.getManys, bs.gets, wantGets)
		}
		if c := f.counted(); c.stale != 1 {
			t.Fatalf("failMany=%v: stale = %d, want 1 (the missing row)", failMany, c.stale)
		}
	}
}

// Forwarding leaves the removal (and so the ack) to removeLoop, which
// removes the rows of every message queued meanwhile and only then acks
// each message, once.
func TestRemoveLoopRemovesThenAcks(t *testing.T) {
	f := newFixture(t, 3)
	for i := range 6 {
		f.insert(fmt.Sprint("r", i), "q", t0, amqp.Publishing{Body: []byte("b")})
	}
	toks := f.lease()
	a := amqptest.New(t)
	in := make(chan owed, 3)
	var tags []uint64
	for i := 0; i < len(toks); i += 2 {
		body, err := wire.EncodeTokens(toks[i : i+2])
		if err != nil {
			t.Fatal(err)
		}
		del := a.Deliver(amqp.Delivery{Body: body})
		o, rm, err := f.d.forwardAll(context.Background(), &del, f.pub)
		if err != nil || o != ack || rm == nil || len(rm.refs) != 2 {
			t.Fatalf("forwardAll = %v, %+v, %v; want the removal of 2 rows left to the caller", o, rm, err)
		}
		if a.Outcome(del.DeliveryTag) != amqptest.Unsettled {
			t.Fatalf("message %d settled before its removal", del.DeliveryTag)
		}
		in <- owed{del: del, rm: rm}
		tags = append(tags, del.DeliveryTag)
	}
	for _, tok := range toks {
		if _, ok := f.pending(tok.ID); !ok {
			t.Fatalf("%s removed by forwardAll; the removal is removeLoop's", tok.ID)
		}
	}
	close(in)
	if err := f.d.removeLoop(context.Background(), in); err != nil {
		t.Fatal(err)
	}
	for _, tok := range toks {
		if _, ok := f.pending(tok.ID); ok {
			t.Errorf("%s still pending after removeLoop", tok.ID)
		}
	}
	for _, tag := range tags {
		if o := a.Outcome(tag); o != amqptest.Acked {
			t.Errorf("message %d: %v, want acked", tag, o)
		}
	}
	if got := len(f.pub.To("q")); got != 6 {
		t.Errorf("%d forwards, want 6", got)
	}
	if c := f.counted(); c.dispatched != 6 {
		t.Errorf("dispatched %d, want 6", c.dispatched)
	}
}

// A token whose row's destination was paused after the lease is released,
// not forwarded: the row is held with the others and goes out on resume.
func TestPausedAfterLeaseIsReleasedNotForwarded(t *testing.T) {
	f := newFixture(t, 3)
	f.insert("a", "orders", t0, amqp.Publishing{})
	f.insert("b", "orders", t0, amqp.Publishing{})
	toks := f.lease()
	if _, err := f.store.Pause(context.Background(), wire.Queue("orders"), ""); err != nil {
		t.Fatal(err)
	}
	if a, err := f.deliver(toks...); err != nil || a != amqptest.Acked {
		t.Fatalf("err %v, dispatcher message %s", err, a)
	}
	if n := len(f.pub.To("orders")); n != 0 {
		t.Fatalf("forwarded %d rows of a paused destination", n)
	}
	for _, id := range []string{"a", "b"} {
		if row, ok := f.pending(id); !ok || row.Lock != "" || !row.Paused {
			t.Fatalf("row %s after the pause: %+v, pending %v; want released and paused", id, row, ok)
		}
	}
	if toks := f.lease(); len(toks) != 0 {
		t.Fatalf("leased %d rows of a paused destination", len(toks))
	}
	if _, err := f.store.Resume(context.Background(), wire.Queue("orders")); err != nil {
		t.Fatal(err)
	}
	if _, err := f.deliver(f.lease()...); err != nil {
		t.Fatal(err)
	}
	if n := len(f.pub.To("orders")); n != 2 {
		t.Fatalf("forwarded %d after resume, want 2", n)
	}
}

// stampFunc is a Stamper of one function.
type stampFunc func(amqp.Publishing, string, time.Time) amqp.Publishing

func (f stampFunc) Stamp(m amqp.Publishing, id string, at time.Time) amqp.Publishing {
	return f(m, id, at)
}

// Stampers has each of its own finish the forward, in order, with the id
// and the time of the send.
func TestStampers(t *testing.T) {
	at := time.Date(2026, 11, 21, 20, 0, 0, 0, time.UTC)
	add := func(s string) Stamper {
		return stampFunc(func(m amqp.Publishing, id string, when time.Time) amqp.Publishing {
			if id != "row-1" || !when.Equal(at) {
				t.Errorf("stamper %s got id %q at %v", s, id, when)
			}
			m.Body = append(m.Body, s...)
			return m
		})
	}
	got := Stampers{add("a"), add("b")}.Stamp(amqp.Publishing{Body: []byte(">")}, "row-1", at)
	if string(got.Body) != ">ab" {
		t.Fatalf("stamped %q, want >ab", got.Body)
	}
}

// A lost connection fails a whole window of forwards: their leases are
// released together (storage.ReleaseEach), not one store commit after
// another, so the worker, and the rows, are free again in about the time
// of one release (here a store whose every Release takes 100 ms).
func TestBrokerFailureReleasesTheWindowTogether(t *testing.T) {
	f := newFixture(t, 3)
	slow := faultstore.Wrap(f.store)
	f.d.store = slow
	const n = 20
	for i := range n {
		f.insert(fmt.Sprint("m", i), "orders", t0, amqp.Publishing{})
	}
	toks := f.lease()
	f.pub.Outcome = brokertest.Always(fmt.Errorf("%w: %w", broker.ErrNotConfirmed, broker.ErrChannelClosed))
	const each = 100 * time.Millisecond
	slow.Delay(faultstore.Release, each)
	began := time.Now()
	a, err := f.deliver(toks...)
	took := time.Since(began)
	if !errors.Is(err, broker.ErrNotConfirmed) || a != amqptest.Requeued {
		t.Fatalf("err %v, dispatcher message %s; want the failure reported and the message requeued", err, a)
	}
	if c := slow.Calls(faultstore.Release); c != n {
		t.Fatalf("%d releases, want %d", c, n)
	}
	for i := range n {
		if row, ok := f.pending(fmt.Sprint("m", i)); !ok || row.Lock != "" || row.Attempts != 0 {
			t.Fatalf("m%d: %+v, want released uncounted", i, row)
		}
	}
	if took > n*each/4 {
		t.Errorf("the window's %d releases took %s, want about one release's %s (they are released together)", n, took.Round(time.Millisecond), each)
	}
}
