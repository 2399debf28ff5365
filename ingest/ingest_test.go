package ingest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/rs/zerolog"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/broker/brokertest"
	"github.com/delaybridge/delaybridge/errorqueue"
	"github.com/delaybridge/delaybridge/intake"
	"github.com/delaybridge/delaybridge/internal/amqptest"
	"github.com/delaybridge/delaybridge/message"
	"github.com/delaybridge/delaybridge/protocol/nsbtimeout"
	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/wire"
)

// fakeStore records inserts as the store contract says (storage.PlaceSend:
// a send matching a pending one that is not leased is a duplicate, any
// other send of a pending id is stored under a later send's key); fail
// makes every call fail. cancelled ids are refused. It cancels by saga and
// replaces groups, leaving the rows marked leased, without tombstones; its
// cancels by id (InsertAndCancel) leave them as Cancel does.
type fakeStore struct {
	mu        sync.Mutex
	rows      map[string]storage.Timeout // by key
	leased    map[string]bool            // by key
	cancelled map[string]bool            // by id
	fail      error
	calls     int                       // Insert calls
	sagaCalls []string                  // CancelSaga calls
	replaces  [][]string                // ReplaceGroups calls
	batches   [][]storage.OrderedCancel // InsertAndCancel calls
}

func (s *fakeStore) Insert(_ context.Context, ts []storage.Timeout) ([]storage.Outcome, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	if s.fail != nil {
		return nil, s.fail
	}
	return s.insert(ts), nil
}

// insert is Insert; the caller holds mu.
func (s *fakeStore) insert(ts []storage.Timeout) []storage.Outcome {
	if s.rows == nil {
		s.rows = map[string]storage.Timeout{}
	}
	out := make([]storage.Outcome, len(ts))
	for i := range ts {
		t := &ts[i]
		if s.cancelled[t.ID] {
			out[i] = storage.Cancelled
			continue
		}
		var pending []storage.PendingSend
		for k, r := range s.rows {
			if wire.IsKeyOf(k, t.ID) {
				pending = append(pending, storage.PendingSend{Key: k, Fingerprint: r.Fingerprint, Leased: s.leased[k]})
			}
		}
		key, o := storage.PlaceSend(t.ID, t.Fingerprint, pending)
		if out[i] = o; o == storage.Stored {
			t.ID = key
			s.rows[key] = *t
		}
	}
	return out
}

func (s *fakeStore) CancelSaga(_ context.Context, saga string) (cancelled, leased int, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sagaCalls = append(s.sagaCalls, saga)
	if s.fail != nil {
		return 0, 0, s.fail
	}
	cancelled, leased = s.cancelSaga(saga, nil)
	return cancelled, leased, nil
}

// cancelSaga removes the rows of saga not marked leased, but for the ids
// in spared; the caller holds mu.
func (s *fakeStore) cancelSaga(saga string, spared map[string]bool) (cancelled, leased int) {
	for key, r := range s.rows {
		id, _ := wire.SplitKey(key)
		switch {
		case r.SagaID != saga || spared[id]:
		case s.leased[key]:
			leased++
		default:
			delete(s.rows, key)
			cancelled++
		}
	}
	return cancelled, leased
}

func (s *fakeStore) ReplaceGroups(_ context.Context, groups []string, ts []storage.Timeout) ([]storage.Outcome, int, int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.replaces = append(s.replaces, slices.Clone(groups))
	if s.fail != nil {
		return nil, 0, 0, s.fail
	}
	spared := storage.Spared(groups, ts)
	var cancelled, leased int
	for _, g := range groups {
		c, l := s.cancelSaga(g, spared)
		cancelled, leased = cancelled+c, leased+l
	}
	return s.insert(ts), cancelled, leased, nil
}

func (s *fakeStore) InsertAndCancel(_ context.Context, ts []storage.Timeout, cancels []storage.OrderedCancel) ([]storage.Outcome, []storage.CancelResult, error) {
	return s.insertAndCancel(ts, cancels, nil)
}

// insertAndCancel applies ts and cancels in order; end, when set, ends a
// cancel's schedule first.
func (s *fakeStore) insertAndCancel(ts []storage.Timeout, cancels []storage.OrderedCancel, end func(key string) bool) ([]storage.Outcome, []storage.CancelResult, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.batches = append(s.batches, slices.Clone(cancels))
	if s.fail != nil {
		return nil, nil, s.fail
	}
	if err := storage.CheckCancels(len(ts), cancels); err != nil {
		return nil, nil, err
	}
	out, res := make([]storage.Outcome, len(ts)), make([]storage.CancelResult, len(cancels))
	next := 0
	for i, c := range cancels {
		copy(out[next:c.At], s.insert(ts[next:c.At]))
		next = c.At
		if c.Schedule != "" && end != nil {
			res[i].ScheduleFound = end(c.Schedule)
		}
		res[i].Err = s.cancel(c.ID)
	}
	copy(out[next:], s.insert(ts[next:]))
	return out, res, nil
}

// cancel removes the sends of id that are not marked leased and leaves a
// tombstone as Cancel (CancelOrdered) does; the caller holds mu.
func (s *fakeStore) cancel(id string) error {
	found, removed := 0, 0
	for k := range s.rows {
		if !wire.IsKeyOf(k, id) {
			continue
		}
		found++
		if !s.leased[k] {
			delete(s.rows, k)
			removed++
		}
	}
	if removed > 0 || found == 0 {
		if s.cancelled == nil {
			s.cancelled = map[string]bool{}
		}
		s.cancelled[id] = true
	}
	return storage.FoundErr(found, removed)
}

var now0 = time.Date(2026, 11, 21, 20, 0, 0, 0, time.UTC)

func newIngester(store Store, _ Publisher, woke *[]time.Time) *Ingester {
	all, _ := CompileGlobs([]string{"*"})
	return New(nil, nil, store, Options{
		Sources: []intake.Source{testSource}, ErrorQueue: "error", MaxBatch: 100,
		Rules: Rules{MaxMessageBytes: 1 << 20, Allowed: all, Reserved: []string{"e.Timeouts", "e.TimeoutsDispatcher"}},
		Wake:  func(t time.Time) { *woke = append(*woke, t) },
		Now:   func() time.Time { return now0 }, Logger: zerolog.Nop(),
	})
}

// deliveries hands out one delivery per header table, in order on a's channel.
func deliveries(a *amqptest.Acker, hs ...amqp.Table) []amqp.Delivery {
	out := make([]amqp.Delivery, len(hs))
	for i, h := range hs {
		out[i] = a.Deliver(amqp.Delivery{Headers: h,
			MessageId: fmt.Sprint("m", i), Body: []byte(fmt.Sprint("body", i)), UserId: "guest"})
	}
	return out
}

var testSource = nsbtimeout.TimeoutsSource("e.Timeouts")

// take runs ds through ingest as one batch of testSource; the deliveries it
// holds go back to the queue afterwards, as when the session ends.
func (in *Ingester) take(pub Publisher, ds []amqp.Delivery) error {
	return in.takeFrom(testSource, pub, ds)
}

// takeHolding runs ds through ingest as one batch of testSource, in a
// session that holds held already; it returns what the session holds then.
func (in *Ingester) takeHolding(pub Publisher, ds []amqp.Delivery, held []entry) ([]entry, error) {
	return in.takeFromHolding(testSource, pub, ds, held)
}

// takeFrom runs ds through ingest as one batch of src, as take does.
func (in *Ingester) takeFrom(src intake.Source, pub Publisher, ds []amqp.Delivery) error {
	held, err := in.takeFromHolding(src, pub, ds, nil)
	if rerr := requeueHeld(held); err == nil {
		err = rerr
	}
	return err
}

// takeFromHolding is takeHolding with deliveries of src.
func (in *Ingester) takeFromHolding(src intake.Source, pub Publisher, ds []amqp.Delivery, held []entry) ([]entry, error) {
	batch := make([]entry, len(ds))
	for i, d := range ds {
		batch[i] = in.classify(src, d)
	}
	return in.handle(context.Background(), src, pub, batch, held)
}

func TestValidBatchIsStoredThenAckedOnce(t *testing.T) {
	store, pub, s := &fakeStore{}, &brokertest.Publisher{}, amqptest.New(t)
	var woke []time.Time
	in := newIngester(store, pub, &woke)
	batch := deliveries(s,
		amqp.Table{wire.HeaderDestination: "a", wire.HeaderDelay: int32(5000), "keep": "me"},
		amqp.Table{wire.HeaderDestination: "b", wire.HeaderDueAt: "2026-11-21T20:00:01Z"},
	)
	if err := in.take(pub, batch); err != nil {
		t.Fatal(err)
	}
	if store.calls != 1 || len(store.rows) != 2 {
		t.Fatalf("want one commit of 2 rows, got %d commits, %d rows", store.calls, len(store.rows))
	}
	if len(s.Multiple()) != 1 || s.Multiple()[0] != 2 {
		t.Fatalf("want one multiple-ack of the last tag, got %v", s.Multiple())
	}
	if len(woke) != 1 || !woke[0].Equal(now0.Add(time.Second)) {
		t.Fatalf("poller woken with %v, want the earliest due time", woke)
	}
	row := store.rows["m0"]
	p, err := message.Decode(row.Message)
	if err != nil {
		t.Fatal(err)
	}
	if _, has := p.Headers[wire.HeaderDelay]; has || p.Headers["keep"] != "me" || p.UserId != "" || string(p.Body) != "body0" {
		t.Fatalf("stored message: %+v", p)
	}
	if row.Destination != "a" || !row.DueAt.Equal(now0.Add(5*time.Second)) || !row.ReceivedAt.Equal(now0) {
		t.Fatalf("row %+v", row)
	}
}

// A store failure requeues every message to schedule and wakes nothing. An
// invalid message in the same batch does not depend on the store: its copy
// goes to the error queue before the commit, so a broken store neither keeps
// it on E.Timeouts nor copies it again on every redelivery.
func TestStoreFailureRequeuesWhatItCouldNotStore(t *testing.T) {
	store, pub, s := &fakeStore{fail: errors.New("disk full")}, &brokertest.Publisher{}, amqptest.New(t)
	var woke []time.Time
	in := newIngester(store, pub, &woke)
	batch := deliveries(s, amqp.Table{wire.HeaderDestination: "a", wire.HeaderDelay: int32(1)}, amqp.Table{},
		amqp.Table{wire.HeaderDestination: "b", wire.HeaderDelay: int32(1)})
	if err := in.take(pub, batch); err != nil {
		t.Fatal(err)
	}
	for tag, want := range map[uint64]amqptest.Outcome{1: amqptest.Requeued, 2: amqptest.Acked, 3: amqptest.Requeued} {
		if got := s.Outcome(tag); got != want {
			t.Errorf("tag %d %s, want %s", tag, got, want)
		}
	}
	if len(s.Multiple()) != 0 {
		t.Errorf("multiple acks %v with requeued deliveries in the batch", s.Multiple())
	}
	if len(pub.Sent()) != 1 || string(pub.Sent()[0].Msg.Body) != "body1" {
		t.Fatalf("error queue got %d copies, want the invalid message's only", len(pub.Sent()))
	}
	if len(woke) != 0 {
		t.Fatal("the poller was woken without a commit")
	}
}

func TestInvalidGoesToErrorQueueAndIsAckedAfterConfirm(t *testing.T) {
	store, pub, s := &fakeStore{}, &brokertest.Publisher{}, amqptest.New(t)
	var woke []time.Time
	in := newIngester(store, pub, &woke)
	batch := deliveries(s,
		amqp.Table{wire.HeaderDestination: "a", wire.HeaderDelay: int32(1)},
		amqp.Table{wire.HeaderDelay: int32(1), "orig": int64(7)},                               // no destination
		amqp.Table{wire.HeaderDestination: "e.TimeoutsDispatcher", wire.HeaderDelay: int32(1)}, // own queue
		amqp.Table{wire.HeaderDestination: "a", wire.HeaderDelay: int32(1), wire.HeaderCancel: "m0"},
	)
	if err := in.take(pub, batch); err != nil {
		t.Fatal(err)
	}
	if len(store.rows) != 1 {
		t.Fatalf("stored %d, want 1", len(store.rows))
	}
	for tag := uint64(1); tag <= 4; tag++ {
		if !(s.Outcome(tag) == amqptest.Acked) {
			t.Errorf("tag %d not acked", tag)
		}
	}
	if len(pub.Sent()) != 3 {
		t.Fatalf("%d on the error queue, want 3", len(pub.Sent()))
	}
	m := pub.Sent()[0]
	if m.RoutingKey != "error" || !m.Mandatory {
		t.Fatalf("sent to %q mandatory=%v", m.RoutingKey, m.Mandatory)
	}
	h := m.Msg.Headers
	if h["orig"] != int64(7) || string(m.Msg.Body) != "body1" || m.Msg.MessageId != "m1" || m.Msg.UserId != "" {
		t.Fatalf("error copy lost the original: %+v", m.Msg)
	}
	if !strings.Contains(h[wire.HeaderError].(string), "no destination") || h[wire.HeaderStage] != "ingest" ||
		h[wire.HeaderAttempts] != int32(0) || h[wire.HeaderNSBFailedQ] != "e.Timeouts" ||
		h[wire.HeaderNSBException] != h[wire.HeaderError] || h[wire.HeaderFailedAt] != now0.Format(time.RFC3339Nano) {
		t.Fatalf("error headers %v", h)
	}
}

func TestInvalidIsRequeuedWhenTheErrorQueueDoesNotConfirm(t *testing.T) {
	store, pub, s := &fakeStore{}, &brokertest.Publisher{Outcome: brokertest.Always(broker.ErrNacked)}, amqptest.New(t)
	var woke []time.Time
	in := newIngester(store, pub, &woke)
	if err := in.take(pub, deliveries(s, amqp.Table{})); err != nil {
		t.Fatal(err)
	}
	if (s.Outcome(1) == amqptest.Acked) || !(s.Outcome(1) == amqptest.Requeued) {
		t.Fatal("an invalid message must stay on E.Timeouts until its error copy is confirmed")
	}
}

// An invalid message whose error copy the error queue refused is held, not
// requeued (it would come straight back first, ahead of everything else);
// valid messages go on meanwhile, never acked over a held one; the held ones
// are tried again when the gate allows, one probe first, and acked once
// their copies are confirmed.
func TestRefusedInvalidMessagesAreHeldAndTriedAgain(t *testing.T) {
	clock := now0
	store, pub, s := &fakeStore{}, &brokertest.Publisher{Outcome: brokertest.Always(broker.ErrNacked)}, amqptest.New(t)
	var woke []time.Time
	in := newIngester(store, pub, &woke)
	in.opts.Now = func() time.Time { return clock }
	in.opts.Errors = errorqueue.New(errorqueue.Options{Queue: "error", MinBackoff: time.Second, MaxBackoff: time.Second,
		Now: in.opts.Now, Logger: zerolog.Nop()})
	valid := amqp.Table{wire.HeaderDestination: "a", wire.HeaderDelay: int32(1)}
	ds := deliveries(s, amqp.Table{}, valid, amqp.Table{}, amqp.Table{}, valid)
	outcomes := func() []amqptest.Outcome {
		var out []amqptest.Outcome
		for tag := uint64(1); tag <= 5; tag++ {
			out = append(out, s.Outcome(tag))
		}
		return out
	}
	held, err := in.takeHolding(pub, ds[:2], nil)
	if err != nil || len(held) != 1 || len(pub.Sent()) != 1 || s.Outcome(1) != amqptest.Unsettled || s.Outcome(2) != amqptest.Acked {
		t.Fatalf("first batch: %d held, %d sent, %v, %v", len(held), len(pub.Sent()), outcomes(), err)
	}
	// While the queue refuses, new invalid messages are held without a
	// publish, and the valid one is stored and acked alone.
	held, err = in.takeHolding(pub, ds[2:], held)
	if err != nil || len(held) != 3 || len(pub.Sent()) != 1 || s.Outcome(5) != amqptest.Acked || len(store.rows) != 2 {
		t.Fatalf("second batch: %d held, %d sent, %v, %d stored, %v", len(held), len(pub.Sent()), outcomes(), len(store.rows), err)
	}
	if m := s.Multiple(); len(m) != 0 {
		t.Fatalf("multiple acks %v over held deliveries", m)
	}
	if held, err = in.retryHeld(context.Background(), testSource, pub, held); err != nil || len(held) != 3 || len(pub.Sent()) != 1 {
		t.Fatalf("a try before the backoff: %d held, %d sent, %v", len(held), len(pub.Sent()), err)
	}
	clock = clock.Add(time.Second)
	if held, err = in.retryHeld(context.Background(), testSource, pub, held); err != nil || len(held) != 3 || len(pub.Sent()) != 2 {
		t.Fatalf("a refused probe: %d held, %d sent, %v", len(held), len(pub.Sent()), err)
	}
	pub.Outcome = nil
	clock = clock.Add(time.Second)
	if held, err = in.retryHeld(context.Background(), testSource, pub, held); err != nil || len(held) != 0 || len(pub.Sent()) != 5 {
		t.Fatalf("once the queue takes copies: %d held, %d sent, %v", len(held), len(pub.Sent()), err)
	}
	for tag, o := range outcomes() {
		if o != amqptest.Acked {
			t.Errorf("tag %d %s", tag+1, o)
		}
	}
}

// A redelivery of a pending send (the same delivery again: after a lost
// ack, or repeated by its publisher after a lost confirm) is acked and not
// stored, with a warning that says so; another send of the id (anything
// differs, here the body) is stored as send 2.
func TestRedeliveryIsAckedNotStoredTwice(t *testing.T) {
	store, pub, s := &fakeStore{}, &brokertest.Publisher{}, amqptest.New(t)
	var woke []time.Time
	in := newIngester(store, pub, &woke)
	var logs strings.Builder
	in.log = zerolog.New(&logs)
	in.drops = newDropLog(in.log)
	h := amqp.Table{wire.HeaderDestination: "a", wire.HeaderDelay: int32(1)}
	b := deliveries(s, h, h, h)
	b[1].MessageId, b[1].Body = "m0", b[0].Body
	b[1].Headers = amqp.Table{wire.HeaderDestination: "a", wire.HeaderDelay: int32(1), "x-delivery-count": int64(1)} // a quorum queue's count
	b[2].MessageId = "m0"
	if err := in.take(pub, b); err != nil {
		t.Fatal(err)
	}
	if len(store.rows) != 2 || s.Outcome(2) != amqptest.Acked || s.Outcome(3) != amqptest.Acked {
		t.Fatalf("rows %d, tags 2 and 3 %s, %s; want 2 rows, both acked", len(store.rows), s.Outcome(2), s.Outcome(3))
	}
	if r, ok := store.rows[wire.SendKey("m0", 2)]; !ok || string(r.Message) == string(store.rows["m0"].Message) {
		t.Fatalf("send 2 of m0 = %+v, %v; want the third delivery", r, ok)
	}
	if !strings.Contains(logs.String(), `"level":"warn","reason":"duplicate"`) || !strings.Contains(logs.String(), `"id":"m0"`) {
		t.Fatalf("log:\n%s\nwant a warning for the duplicate of m0", logs.String())
	}
}

// A send that matches one being dispatched (leased: forwarded, its removal
// to come) is another send, stored: a client that sends a message again
// the moment the first arrives, with the same id, headers and body, gets
// it delivered again (docs/contract.md §2.4).
func TestSendMatchingALeasedOneIsStored(t *testing.T) {
	store, pub, s := &fakeStore{}, &brokertest.Publisher{}, amqptest.New(t)
	var woke []time.Time
	in := newIngester(store, pub, &woke)
	h := amqp.Table{wire.HeaderDestination: "a", wire.HeaderDelay: int32(1)}
	if err := in.take(pub, deliveries(s, h)); err != nil {
		t.Fatal(err)
	}
	store.leased = map[string]bool{"m0": true}
	if err := in.take(pub, deliveries(amqptest.New(t), h)); err != nil {
		t.Fatal(err)
	}
	if _, ok := store.rows[wire.SendKey("m0", 2)]; !ok || len(store.rows) != 2 {
		t.Fatalf("rows %v; want m0 and its send 2", slices.Collect(maps.Keys(store.rows)))
	}
}

// A delivery its parser calls a new send (a delayed exchange's, as the
// plugin delivers each publish) is stored each time: the same message
// published twice is delivered twice, even while the first is pending
// (docs/contract.md §2.7).
func TestNewSendsAreAllStored(t *testing.T) {
	store, pub := &fakeStore{}, &brokertest.Publisher{}
	var woke []time.Time
	in := newIngester(store, pub, &woke)
	src := intake.Source{Name: "new sends", Queue: "e.Timeouts", Parser: intake.ParserFunc(func(d *amqp.Delivery, receivedAt time.Time) intake.Intake {
		return intake.Intake{Op: intake.OpSchedule, ID: d.MessageId, Exchange: "dx.route", Destination: d.RoutingKey, DueAt: receivedAt.Add(time.Minute),
			Msg: amqp.Publishing{MessageId: d.MessageId, Body: d.Body}, NewSend: true}
	})}
	in.opts.Sources = []intake.Source{src}
	for range 2 {
		a := amqptest.New(t)
		d := a.Deliver(amqp.Delivery{Exchange: "dx", RoutingKey: "k", MessageId: "same", Body: []byte("same")})
		if err := in.takeFrom(src, pub, []amqp.Delivery{d}); err != nil {
			t.Fatal(err)
		}
	}
	if len(store.rows) != 2 {
		t.Fatalf("rows %v; want both publishes stored", slices.Collect(maps.Keys(store.rows)))
	}
}

// A redelivery of a message whose stored copy was delivered (and removed)
// meanwhile finds its id free and is stored again: a second delivery
// (docs/contract.md §3.3). The debug log says the stored one was a
// redelivery, which is how a crash test tells this duplicate apart.
func TestRedeliveryAfterTheDeliveryIsStoredAgain(t *testing.T) {
	store, pub, s := &fakeStore{}, &brokertest.Publisher{}, amqptest.New(t)
	var woke []time.Time
	in := newIngester(store, pub, &woke)
	var logs strings.Builder
	in.log = zerolog.New(&logs).Level(zerolog.DebugLevel)
	h := amqp.Table{wire.HeaderDestination: "a", wire.HeaderDelay: int32(1)}
	if err := in.take(pub, deliveries(s, h)); err != nil {
		t.Fatal(err)
	}
	delete(store.rows, "m0") // forwarded and removed; the ack was lost with a crash
	again := deliveries(s, h)
	again[0].Redelivered = true
	if err := in.take(pub, again); err != nil {
		t.Fatal(err)
	}
	if store.calls != 2 || len(store.rows) != 1 || s.Outcome(2) != amqptest.Acked {
		t.Fatalf("commits %d, rows %d, tag 2 %s; want the redelivery stored again and acked", store.calls, len(store.rows), s.Outcome(2))
	}
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], `"redelivered":false`) || !strings.Contains(lines[1], `"redelivered":true`) ||
		!strings.Contains(lines[1], `"id":"m0"`) || !strings.Contains(lines[1], `"message":"stored"`) {
		t.Fatalf("debug log:\n%s\nwant two stored lines for m0, the second redelivered", logs.String())
	}
}

func TestGeneratedIDIsForwarded(t *testing.T) {
	store, pub, s := &fakeStore{}, &brokertest.Publisher{}, amqptest.New(t)
	var woke []time.Time
	in := newIngester(store, pub, &woke)
	b := deliveries(s, amqp.Table{wire.HeaderDestination: "a", wire.HeaderDelay: int32(1)})
	b[0].MessageId = ""
	if err := in.take(pub, b); err != nil {
		t.Fatal(err)
	}
	for id, row := range store.rows {
		p, _ := message.Decode(row.Message)
		if len(id) != 36 || p.MessageId != id {
			t.Fatalf("id %q, forwarded message-id %q", id, p.MessageId)
		}
	}
}

func TestStoredAreAckedEvenWhenTheErrorQueueConnectionFails(t *testing.T) {
	store, pub, s := &fakeStore{}, &brokertest.Publisher{Outcome: brokertest.Always(fmt.Errorf("%w: connection lost", broker.ErrNotConfirmed))}, amqptest.New(t)
	var woke []time.Time
	in := newIngester(store, pub, &woke)
	b := deliveries(s, amqp.Table{wire.HeaderDestination: "a", wire.HeaderDelay: int32(1)}, amqp.Table{})
	if err := in.take(pub, b); !errors.Is(err, broker.ErrNotConfirmed) {
		t.Fatalf("want the connection failure reported, got %v", err)
	}
	if !(s.Outcome(1) == amqptest.Acked) {
		t.Fatal("a committed message was left unacked: it would be redelivered and stored again")
	}
	if s.Outcome(2) == amqptest.Acked {
		t.Fatal("the invalid message was acked without its error-queue copy")
	}
}

func TestCancelOverAMQP(t *testing.T) {
	store, pub, s := &fakeStore{leased: map[string]bool{"busy": true}}, &brokertest.Publisher{}, amqptest.New(t)
	var woke []time.Time
	in := newIngester(store, pub, &woke)
	// A message, then a cancel of it in the same batch.
	b := deliveries(s, amqp.Table{wire.HeaderDestination: "a", wire.HeaderDelay: int32(60000)}, amqp.Table{wire.HeaderCancel: "m0"})
	b[1].Body = nil
	if err := in.take(pub, b); err != nil {
		t.Fatal(err)
	}
	if _, ok := store.rows["m0"]; ok {
		t.Fatal("the cancelled message is still pending")
	}
	if !(s.Outcome(1) == amqptest.Acked) || !(s.Outcome(2) == amqptest.Acked) || len(pub.Sent()) != 0 {
		t.Fatalf("%s, %s (multiple %v), error queue %d", s.Outcome(1), s.Outcome(2), s.Multiple(), len(pub.Sent()))
	}

	// Nothing pending, or too late: settled (acked), not an error.
	s2 := amqptest.New(t)
	b2 := deliveries(s2, amqp.Table{wire.HeaderCancel: "gone"}, amqp.Table{wire.HeaderCancel: []byte("busy")})
	b2[0].Body, b2[1].Body = nil, nil
	store.rows["busy"] = storage.Timeout{ID: "busy"}
	if err := in.take(pub, b2); err != nil {
		t.Fatal(err)
	}
	if !(s2.Outcome(1) == amqptest.Acked) || !(s2.Outcome(2) == amqptest.Acked) || len(pub.Sent()) != 0 {
		t.Fatalf("%s, %s, error queue %d", s2.Outcome(1), s2.Outcome(2), len(pub.Sent()))
	}
	if _, ok := store.rows["busy"]; !ok {
		t.Fatal("a message being dispatched was cancelled")
	}

	// Malformed cancels go to the error queue with a reason.
	s3 := amqptest.New(t)
	b3 := deliveries(s3, amqp.Table{wire.HeaderCancel: ""}, amqp.Table{wire.HeaderCancel: "x"}, amqp.Table{wire.HeaderCancel: int32(5)})
	b3[0].Body, b3[2].Body = nil, nil // b3[1] keeps a body
	if err := in.take(pub, b3); err != nil {
		t.Fatal(err)
	}
	if len(pub.Sent()) != 3 {
		t.Fatalf("%d on the error queue, want 3", len(pub.Sent()))
	}
	for i, want := range []string{"is empty", "must have no body", "must be a string"} {
		if r := pub.Sent()[i].Msg.Headers[wire.HeaderError].(string); !strings.Contains(r, want) {
			t.Errorf("reason %q, want it to mention %q", r, want)
		}
	}

	// A store failure requeues the cancel.
	store.fail = errors.New("disk")
	s4 := amqptest.New(t)
	b4 := deliveries(s4, amqp.Table{wire.HeaderCancel: "m9"})
	b4[0].Body = nil
	if err := in.take(pub, b4); err != nil {
		t.Fatal(err)
	}
	if (s4.Outcome(1) == amqptest.Acked) || !(s4.Outcome(1) == amqptest.Requeued) {
		t.Fatal("a cancel whose store call failed must be requeued, not acked")
	}
}

// A store that repeated an insert after a lost connection reports its own
// rows as already pending: the poller is still woken for them, or a message
// due now would wait for the next poll interval.
func TestWakesEvenWhenEveryRowIsReportedDuplicate(t *testing.T) {
	store, pub, s := &fakeStore{rows: map[string]storage.Timeout{"m0": {}, "m1": {}}}, &brokertest.Publisher{}, amqptest.New(t)
	var woke []time.Time
	in := newIngester(store, pub, &woke)
	batch := deliveries(s,
		amqp.Table{wire.HeaderDestination: "a", wire.HeaderDelay: int32(3000)},
		amqp.Table{wire.HeaderDestination: "b", wire.HeaderDelay: int32(1000)},
	)
	if err := in.take(pub, batch); err != nil {
		t.Fatal(err)
	}
	if !(s.Outcome(1) == amqptest.Acked) || !(s.Outcome(2) == amqptest.Acked) {
		t.Fatal("duplicates must be acked: they are stored")
	}
	if len(woke) != 1 || !woke[0].Equal(now0.Add(time.Second)) {
		t.Fatalf("poller woken with %v, want once with the earliest due time", woke)
	}
}

// A cancel commits with its batch. When that commit fails, the cancel must
// be requeued with the messages: left unsettled, it would be acked by the
// next batch's multiple ack and lost, and the message it names delivered.
func TestCancelAfterAFailedCommitIsRequeuedNotLost(t *testing.T) {
	store, pub := &fakeStore{fail: errors.New("disk full")}, &brokertest.Publisher{}
	a := amqptest.New(t)
	var woke []time.Time
	in := newIngester(store, pub, &woke)
	msg := a.Deliver(amqp.Delivery{MessageId: "m0", Headers: amqp.Table{wire.HeaderDestination: "a", wire.HeaderDelay: int32(60000)}, Body: []byte("x")})
	cancel := a.Deliver(amqp.Delivery{Headers: amqp.Table{wire.HeaderCancel: "m0"}})
	if err := in.take(pub, []amqp.Delivery{msg, cancel}); err != nil {
		t.Fatal(err)
	}
	store.fail = nil
	next := a.Deliver(amqp.Delivery{MessageId: "m1", Headers: amqp.Table{wire.HeaderDestination: "a", wire.HeaderDelay: int32(1)}, Body: []byte("y")})
	if err := in.take(pub, []amqp.Delivery{next}); err != nil {
		t.Fatal(err)
	}
	for tag, want := range map[uint64]amqptest.Outcome{1: amqptest.Requeued, 2: amqptest.Requeued, 3: amqptest.Acked} {
		if got := a.Outcome(tag); got != want {
			t.Errorf("tag %d %s, want %s", tag, got, want)
		}
	}
}

// unpublishableOnce refuses, as AMQP cannot carry it, every copy that still
// has the original's "huge" header, and takes the rest.
func unpublishableOnce(m broker.Outgoing) error {
	if _, huge := m.Msg.Headers["huge"]; huge {
		return fmt.Errorf("%w: headers exceed the frame size", broker.ErrUnpublishable)
	}
	return nil
}

// An invalid message whose error copy AMQP cannot carry still reaches the
// error queue, whole, in another form; it is not requeued forever.
func TestUnpublishableErrorCopyIsSentWhole(t *testing.T) {
	store, pub, a := &fakeStore{}, &brokertest.Publisher{Outcome: unpublishableOnce}, amqptest.New(t)
	var woke []time.Time
	in := newIngester(store, pub, &woke)
	b := deliveries(a, amqp.Table{"huge": "x"}) // no destination: invalid
	if err := in.take(pub, b); err != nil {
		t.Fatal(err)
	}
	if a.Outcome(1) != amqptest.Acked || len(pub.Sent()) != 2 {
		t.Fatalf("tag 1 %s after %d publishes; want acked after a second form", a.Outcome(1), len(pub.Sent()))
	}
	second := pub.Sent()[1].Msg
	orig, err := message.Decode(second.Body)
	if err != nil || orig.Headers["huge"] != "x" || string(orig.Body) != "body0" || orig.MessageId != "m0" {
		t.Fatalf("the second copy's body is not the original message: %+v, %v", orig, err)
	}
	if r := second.Headers[wire.HeaderError].(string); !strings.Contains(r, "no destination") || !strings.Contains(r, "frame size") {
		t.Errorf("reason %q", r)
	}
}

// nsbTimeout is a timeout as NServiceBus's timeout manager clients send it.
func nsbTimeout(saga string) amqp.Table {
	h := amqp.Table{wire.HeaderNSBDestination: "Sales", wire.HeaderNSBExpire: "2026-11-21 20:00:05:000000 Z"}
	if saga != "" {
		h[wire.HeaderNSBSagaID] = saga
	}
	return h
}

// NServiceBus.ClearTimeouts with NServiceBus.SagaId cancels the saga's
// pending timeouts, those of its own batch included (it comes after them),
// and no other saga's; it is acked, also when some were too late.
func TestClearTimeoutsOverAMQP(t *testing.T) {
	const saga, other = "5b7c1d2e-0f3a-4b5c-8d9e-0a1b2c3d4e5f", "6c8d2e3f-1a4b-4c6d-9e0f-1b2c3d4e5f60"
	store, pub, s := &fakeStore{}, &brokertest.Publisher{}, amqptest.New(t)
	store.leased = map[string]bool{"m1": true}
	var woke []time.Time
	in := newIngester(store, pub, &woke)
	b := deliveries(s, nsbTimeout(saga), nsbTimeout(saga), nsbTimeout(other), nsbTimeout(""),
		amqp.Table{wire.HeaderNSBClearTimeouts: "True", wire.HeaderNSBSagaID: []byte(saga)})
	b[4].Body = nil
	if err := in.take(pub, b); err != nil {
		t.Fatal(err)
	}
	if got := store.rows["m2"].SagaID; got != other {
		t.Fatalf("stored saga id %q, want %q", got, other)
	}
	if _, ok := store.rows["m0"]; ok {
		t.Fatal("the saga's timeout is still pending")
	}
	if _, ok := store.rows["m1"]; !ok {
		t.Fatal("the saga's leased timeout was removed")
	}
	for _, id := range []string{"m2", "m3"} {
		if _, ok := store.rows[id]; !ok {
			t.Fatalf("%s, not of the saga, was cancelled", id)
		}
	}
	if len(store.sagaCalls) != 1 || store.sagaCalls[0] != saga {
		t.Fatalf("CancelSaga calls %q, want one for %s", store.sagaCalls, saga)
	}
	for tag := uint64(1); tag <= 5; tag++ {
		if s.Outcome(tag) != amqptest.Acked {
			t.Fatalf("tag %d %s, want acked", tag, s.Outcome(tag))
		}
	}
	if len(pub.Sent()) != 0 {
		t.Fatalf("%d on the error queue, want none", len(pub.Sent()))
	}
	if !intake.OpCancelSaga.EndsBatch() || intake.OpCancel.EndsBatch() || intake.OpSchedule.EndsBatch() {
		t.Fatal("a saga cancel must end its batch; a cancel (committed in it) and a message must not")
	}

	// A store failure requeues it.
	store.fail = errors.New("disk")
	s2 := amqptest.New(t)
	if err := in.take(pub, deliveries(s2, amqp.Table{wire.HeaderNSBClearTimeouts: "True", wire.HeaderNSBSagaID: saga})); err != nil {
		t.Fatal(err)
	}
	if s2.Outcome(1) != amqptest.Requeued {
		t.Fatalf("a saga cancel whose store call failed is %s, want requeued", s2.Outcome(1))
	}
}

// A ClearTimeouts that names no saga instance, or a saga id no store can
// hold, goes to the error queue with a reason; so does a timeout whose saga
// id is not text.
func TestClearTimeoutsRefused(t *testing.T) {
	pub, s := &brokertest.Publisher{}, amqptest.New(t)
	var woke []time.Time
	in := newIngester(&fakeStore{}, pub, &woke)
	clearReq := func(saga any) amqp.Table {
		h := amqp.Table{wire.HeaderNSBClearTimeouts: "True"}
		if saga != nil {
			h[wire.HeaderNSBSagaID] = saga
		}
		return h
	}
	bad := nsbTimeout("")
	bad[wire.HeaderNSBSagaID] = int64(7)
	b := deliveries(s, clearReq(nil), clearReq(""), clearReq("00000000-0000-0000-0000-000000000000"), clearReq(int32(1)), clearReq("a\x00b"), bad)
	if err := in.take(pub, b); err != nil {
		t.Fatal(err)
	}
	want := []string{"needs header NServiceBus.SagaId", "needs header NServiceBus.SagaId", "needs header NServiceBus.SagaId",
		"must be a string", "control characters", "must be a string"}
	if len(pub.Sent()) != len(want) {
		t.Fatalf("%d on the error queue, want %d", len(pub.Sent()), len(want))
	}
	for i, w := range want {
		if r := pub.Sent()[i].Msg.Headers[wire.HeaderError].(string); !strings.Contains(r, w) {
			t.Errorf("copy %d: reason %q, want it to mention %q", i, r, w)
		}
	}
}

// replaceSource reads each delivery as a replacement of group "g" by a
// message for queue "a", under the delivery's message-id.
var replaceSource = intake.Source{Name: "replace", Queue: "q", Parser: intake.ParserFunc(func(d *amqp.Delivery, now time.Time) intake.Intake {
	return intake.Intake{Op: intake.OpReplace, ID: d.MessageId, SagaID: "g", Destination: "a", DueAt: now.Add(time.Minute),
		Msg: amqp.Publishing{MessageId: d.MessageId, Body: d.Body}}
})}

// An intake.OpReplace cancels every pending message of its group that is not
// leased, not those of other groups, then stores its own in that group, in
// one ReplaceGroups, and is acked; a store failure requeues it.
func TestReplace(t *testing.T) {
	store, pub, s := &fakeStore{}, &brokertest.Publisher{}, amqptest.New(t)
	store.rows = map[string]storage.Timeout{"old": {ID: "old", SagaID: "g"}, "busy": {ID: "busy", SagaID: "g"}, "other": {ID: "other", SagaID: "h"}}
	store.leased = map[string]bool{"busy": true}
	var woke []time.Time
	in := newIngester(store, pub, &woke)
	run := func(in *Ingester, ds ...amqp.Delivery) {
		t.Helper()
		handleAll(t, in, replaceSource, pub, ds)
	}
	run(in, deliveries(s, amqp.Table{})...)
	if s.Outcome(1) != amqptest.Acked || len(pub.Sent()) != 0 {
		t.Fatalf("outcome %s, %d error copies; want acked, none", s.Outcome(1), len(pub.Sent()))
	}
	if r, ok := store.rows["m0"]; !ok || r.SagaID != "g" || r.Destination != "a" {
		t.Fatalf("the new message is not stored in its group: %+v", r)
	}
	if _, ok := store.rows["old"]; ok {
		t.Fatal("the group's earlier message is still pending")
	}
	for _, id := range []string{"busy", "other"} {
		if _, ok := store.rows[id]; !ok {
			t.Fatalf("%s (leased, or of another group) was removed", id)
		}
	}
	if fmt.Sprint(store.replaces) != "[[g]]" || store.calls != 0 || len(store.sagaCalls) != 0 {
		t.Fatalf("ReplaceGroups %v, %d Insert, %d CancelSaga; want one ReplaceGroups of g and nothing else",
			store.replaces, store.calls, len(store.sagaCalls))
	}
	if len(woke) != 1 {
		t.Fatalf("%d wakes, want one", len(woke))
	}
	if intake.OpReplace.EndsBatch() || !intake.OpReplace.Stores() || intake.OpCancelSaga.Stores() {
		t.Fatal("a replace must store, and not end its batch")
	}

	// A store failure requeues it.
	store.fail = errors.New("disk")
	s2 := amqptest.New(t)
	run(in, deliveries(s2, amqp.Table{})...)
	if s2.Outcome(1) != amqptest.Requeued {
		t.Fatalf("a replace whose commit failed is %s, want requeued", s2.Outcome(1))
	}
}

// handleAll runs ds through in as one batch of src and fails t when a
// delivery is held or handle fails.
func handleAll(t *testing.T, in *Ingester, src intake.Source, pub Publisher, ds []amqp.Delivery) {
	t.Helper()
	batch := make([]entry, len(ds))
	for i, d := range ds {
		batch[i] = in.classify(src, d)
	}
	held, err := in.handle(context.Background(), src, pub, batch, nil)
	if err != nil || len(held) != 0 {
		t.Fatalf("handle: %v, %d held", err, len(held))
	}
}
