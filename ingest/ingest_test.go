package ingest

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
	"github.com/delaybridge/delaybridge/message"
	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/wire"
)

// fakeStore records inserts; fail makes Insert fail. ids already present are
// reported as duplicates.
type fakeStore struct {
	mu     sync.Mutex
	rows   map[string]storage.Timeout
	leased map[string]bool
	fail   error
	calls  int
}

func (s *fakeStore) Insert(_ context.Context, ts []storage.Timeout) ([]bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	if s.fail != nil {
		return nil, s.fail
	}
	if s.rows == nil {
		s.rows = map[string]storage.Timeout{}
	}
	out := make([]bool, len(ts))
	for i, t := range ts {
		if _, dup := s.rows[t.ID]; !dup {
			s.rows[t.ID] = t
			out[i] = true
		}
	}
	return out, nil
}

// Cancel removes a row unless it is marked leased.
func (s *fakeStore) Cancel(_ context.Context, id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return s.fail
	}
	if s.leased[id] {
		return storage.ErrLeased
	}
	if _, ok := s.rows[id]; !ok {
		return storage.ErrNotFound
	}
	delete(s.rows, id)
	return nil
}

type fakePublisher struct {
	sent []broker.Outgoing
	fail error
}

func (p *fakePublisher) Publish(_ context.Context, msgs []broker.Outgoing) []error {
	res := make([]error, len(msgs))
	for i, m := range msgs {
		p.sent = append(p.sent, m)
		res[i] = p.fail
	}
	return res
}

// settle records what happened to each delivery tag.
type settle struct {
	mu      sync.Mutex
	acked   map[uint64]bool
	multi   []uint64
	nacked  map[uint64]bool
	requeue map[uint64]bool
}

func newSettle() *settle {
	return &settle{acked: map[uint64]bool{}, nacked: map[uint64]bool{}, requeue: map[uint64]bool{}}
}
func (s *settle) Ack(tag uint64, multiple bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if multiple {
		s.multi = append(s.multi, tag)
	}
	s.acked[tag] = true
	return nil
}
func (s *settle) Nack(tag uint64, _ bool, requeue bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nacked[tag], s.requeue[tag] = true, requeue
	return nil
}
func (s *settle) Reject(uint64, bool) error { return errors.New("unexpected") }

// ackedTag reports whether tag was acked on its own or by a multiple ack.
func (s *settle) ackedTag(tag uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range s.multi {
		if m >= tag {
			return true
		}
	}
	return s.acked[tag]
}

var now0 = time.Date(2026, 11, 21, 20, 0, 0, 0, time.UTC)

func newIngester(store Store, _ Publisher, woke *[]time.Time) *Ingester {
	all, _ := CompileGlobs([]string{"*"})
	return New(nil, nil, store, Options{
		Queue: "e.Timeouts", ErrorQueue: "error", MaxBatch: 100, RetryDelay: time.Millisecond,
		Rules: Rules{MaxMessageBytes: 1 << 20, Allowed: all, Reserved: []string{"e.Timeouts", "e.TimeoutsDispatcher"}},
		Wake:  func(t time.Time) { *woke = append(*woke, t) },
		Now:   func() time.Time { return now0 }, Logger: zerolog.Nop(),
	})
}

func deliveries(s *settle, hs ...amqp.Table) []amqp.Delivery {
	out := make([]amqp.Delivery, len(hs))
	for i, h := range hs {
		out[i] = amqp.Delivery{Acknowledger: s, DeliveryTag: uint64(i + 1), Headers: h,
			MessageId: fmt.Sprint("m", i), Body: []byte(fmt.Sprint("body", i)), UserId: "guest"}
	}
	return out
}

func TestValidBatchIsStoredThenAckedOnce(t *testing.T) {
	store, pub, s := &fakeStore{}, &fakePublisher{}, newSettle()
	var woke []time.Time
	in := newIngester(store, pub, &woke)
	batch := deliveries(s,
		amqp.Table{wire.HeaderDestination: "a", wire.HeaderDelay: int32(5000), "keep": "me"},
		amqp.Table{wire.HeaderDestination: "b", wire.HeaderDueAt: "2026-11-21T20:00:01Z"},
	)
	if err := in.handle(context.Background(), pub, batch); err != nil {
		t.Fatal(err)
	}
	if store.calls != 1 || len(store.rows) != 2 {
		t.Fatalf("want one commit of 2 rows, got %d commits, %d rows", store.calls, len(store.rows))
	}
	if len(s.multi) != 1 || s.multi[0] != 2 {
		t.Fatalf("want one multiple-ack of the last tag, got %v", s.multi)
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

func TestStoreFailureRequeuesAndAcksNothing(t *testing.T) {
	store, pub, s := &fakeStore{fail: errors.New("disk full")}, &fakePublisher{}, newSettle()
	var woke []time.Time
	in := newIngester(store, pub, &woke)
	batch := deliveries(s, amqp.Table{wire.HeaderDestination: "a", wire.HeaderDelay: int32(1)}, amqp.Table{})
	if err := in.handle(context.Background(), pub, batch); err != nil {
		t.Fatal(err)
	}
	if len(s.acked) != 0 {
		t.Fatalf("acked %v before any commit", s.acked)
	}
	if !s.requeue[1] || !s.requeue[2] {
		t.Fatalf("want both requeued, got %v", s.requeue)
	}
	if len(pub.sent) != 0 || len(woke) != 0 {
		t.Fatal("nothing may leave for the error queue or wake the poller without a commit")
	}
}

func TestInvalidGoesToErrorQueueAndIsAckedAfterConfirm(t *testing.T) {
	store, pub, s := &fakeStore{}, &fakePublisher{}, newSettle()
	var woke []time.Time
	in := newIngester(store, pub, &woke)
	batch := deliveries(s,
		amqp.Table{wire.HeaderDestination: "a", wire.HeaderDelay: int32(1)},
		amqp.Table{wire.HeaderDelay: int32(1), "orig": int64(7)},                               // no destination
		amqp.Table{wire.HeaderDestination: "e.TimeoutsDispatcher", wire.HeaderDelay: int32(1)}, // own queue
		amqp.Table{wire.HeaderDestination: "a", wire.HeaderDelay: int32(1), wire.HeaderCancel: "m0"},
	)
	if err := in.handle(context.Background(), pub, batch); err != nil {
		t.Fatal(err)
	}
	if len(store.rows) != 1 {
		t.Fatalf("stored %d, want 1", len(store.rows))
	}
	for tag := uint64(1); tag <= 4; tag++ {
		if !s.acked[tag] {
			t.Errorf("tag %d not acked", tag)
		}
	}
	if len(s.multi) != 0 {
		t.Fatal("a multiple ack would be wrong with rejects in the batch")
	}
	if len(pub.sent) != 3 {
		t.Fatalf("%d on the error queue, want 3", len(pub.sent))
	}
	m := pub.sent[0]
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
	store, pub, s := &fakeStore{}, &fakePublisher{fail: broker.ErrNacked}, newSettle()
	var woke []time.Time
	in := newIngester(store, pub, &woke)
	if err := in.handle(context.Background(), pub, deliveries(s, amqp.Table{})); err != nil {
		t.Fatal(err)
	}
	if s.acked[1] || !s.requeue[1] {
		t.Fatal("an invalid message must stay on E.Timeouts until its error copy is confirmed")
	}
}

func TestDuplicateIsAckedNotStoredTwice(t *testing.T) {
	store, pub, s := &fakeStore{}, &fakePublisher{}, newSettle()
	var woke []time.Time
	in := newIngester(store, pub, &woke)
	h := amqp.Table{wire.HeaderDestination: "a", wire.HeaderDelay: int32(1)}
	b := deliveries(s, h, h)
	b[1].MessageId = "m0"
	if err := in.handle(context.Background(), pub, b); err != nil {
		t.Fatal(err)
	}
	if len(store.rows) != 1 || !s.acked[2] {
		t.Fatalf("rows %d, acked %v", len(store.rows), s.acked)
	}
}

func TestGeneratedIDIsForwarded(t *testing.T) {
	store, pub, s := &fakeStore{}, &fakePublisher{}, newSettle()
	var woke []time.Time
	in := newIngester(store, pub, &woke)
	b := deliveries(s, amqp.Table{wire.HeaderDestination: "a", wire.HeaderDelay: int32(1)})
	b[0].MessageId = ""
	if err := in.handle(context.Background(), pub, b); err != nil {
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
	store, pub, s := &fakeStore{}, &fakePublisher{fail: fmt.Errorf("%w: connection lost", broker.ErrNotConfirmed)}, newSettle()
	var woke []time.Time
	in := newIngester(store, pub, &woke)
	b := deliveries(s, amqp.Table{wire.HeaderDestination: "a", wire.HeaderDelay: int32(1)}, amqp.Table{})
	if err := in.handle(context.Background(), pub, b); !errors.Is(err, broker.ErrNotConfirmed) {
		t.Fatalf("want the connection failure reported, got %v", err)
	}
	if !s.acked[1] {
		t.Fatal("a committed message was left unacked: it would be redelivered and stored again")
	}
	if s.acked[2] {
		t.Fatal("the invalid message was acked without its error-queue copy")
	}
}

func TestCancelOverAMQP(t *testing.T) {
	store, pub, s := &fakeStore{leased: map[string]bool{"busy": true}}, &fakePublisher{}, newSettle()
	var woke []time.Time
	in := newIngester(store, pub, &woke)
	// A message, then a cancel of it in the same batch (cancels end a batch).
	b := deliveries(s, amqp.Table{wire.HeaderDestination: "a", wire.HeaderDelay: int32(60000)}, amqp.Table{wire.HeaderCancel: "m0"})
	b[1].Body = nil
	if err := in.handle(context.Background(), pub, b); err != nil {
		t.Fatal(err)
	}
	if _, ok := store.rows["m0"]; ok {
		t.Fatal("the cancelled message is still pending")
	}
	if !s.ackedTag(1) || !s.ackedTag(2) || len(pub.sent) != 0 {
		t.Fatalf("acked %v (multiple %v), error queue %d", s.acked, s.multi, len(pub.sent))
	}

	// Nothing pending, or too late: settled (acked), not an error.
	s2 := newSettle()
	b2 := deliveries(s2, amqp.Table{wire.HeaderCancel: "gone"}, amqp.Table{wire.HeaderCancel: []byte("busy")})
	b2[0].Body, b2[1].Body = nil, nil
	store.rows["busy"] = storage.Timeout{ID: "busy"}
	if err := in.handle(context.Background(), pub, b2); err != nil {
		t.Fatal(err)
	}
	if !s2.ackedTag(1) || !s2.ackedTag(2) || len(pub.sent) != 0 {
		t.Fatalf("acked %v, error queue %d", s2.acked, len(pub.sent))
	}
	if _, ok := store.rows["busy"]; !ok {
		t.Fatal("a message being dispatched was cancelled")
	}

	// Malformed cancels go to the error queue with a reason.
	s3 := newSettle()
	b3 := deliveries(s3, amqp.Table{wire.HeaderCancel: ""}, amqp.Table{wire.HeaderCancel: "x"}, amqp.Table{wire.HeaderCancel: int32(5)})
	b3[0].Body, b3[2].Body = nil, nil // b3[1] keeps a body
	if err := in.handle(context.Background(), pub, b3); err != nil {
		t.Fatal(err)
	}
	if len(pub.sent) != 3 {
		t.Fatalf("%d on the error queue, want 3", len(pub.sent))
	}
	for i, want := range []string{"is empty", "must have no body", "must be a string"} {
		if r := pub.sent[i].Msg.Headers[wire.HeaderError].(string); !strings.Contains(r, want) {
			t.Errorf("reason %q, want it to mention %q", r, want)
		}
	}

	// A store failure requeues the cancel.
	store.fail = errors.New("disk")
	s4 := newSettle()
	b4 := deliveries(s4, amqp.Table{wire.HeaderCancel: "m9"})
	b4[0].Body = nil
	if err := in.handle(context.Background(), pub, b4); err != nil {
		t.Fatal(err)
	}
	if s4.acked[1] || !s4.requeue[1] {
		t.Fatal("a cancel whose store call failed must be requeued, not acked")
	}
}

// A store that repeated an insert after a lost connection reports its own
// rows as already pending: the poller is still woken for them, or a message
// due now would wait for the next poll interval.
func TestWakesEvenWhenEveryRowIsReportedDuplicate(t *testing.T) {
	store, pub, s := &fakeStore{rows: map[string]storage.Timeout{"m0": {}, "m1": {}}}, &fakePublisher{}, newSettle()
	var woke []time.Time
	in := newIngester(store, pub, &woke)
	batch := deliveries(s,
		amqp.Table{wire.HeaderDestination: "a", wire.HeaderDelay: int32(3000)},
		amqp.Table{wire.HeaderDestination: "b", wire.HeaderDelay: int32(1000)},
	)
	if err := in.handle(context.Background(), pub, batch); err != nil {
		t.Fatal(err)
	}
	if !s.ackedTag(1) || !s.ackedTag(2) {
		t.Fatal("duplicates must be acked: they are stored")
	}
	if len(woke) != 1 || !woke[0].Equal(now0.Add(time.Second)) {
		t.Fatalf("poller woken with %v, want once with the earliest due time", woke)
	}
}

