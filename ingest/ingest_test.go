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
)

// fakeStore records inserts; fail makes Insert fail. ids already present are
// reported as duplicates.
type fakeStore struct {
	mu    sync.Mutex
	rows  map[string]storage.Timeout
	fail  error
	calls int
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
		amqp.Table{HeaderDestination: "a", HeaderDelay: int32(5000), "keep": "me"},
		amqp.Table{HeaderDestination: "b", HeaderDueAt: "2026-11-21T20:00:01Z"},
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
	if _, has := p.Headers[HeaderDelay]; has || p.Headers["keep"] != "me" || p.UserId != "" || string(p.Body) != "body0" {
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
	batch := deliveries(s, amqp.Table{HeaderDestination: "a", HeaderDelay: int32(1)}, amqp.Table{})
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
		amqp.Table{HeaderDestination: "a", HeaderDelay: int32(1)},
		amqp.Table{HeaderDelay: int32(1), "orig": int64(7)},                          // no destination
		amqp.Table{HeaderDestination: "e.TimeoutsDispatcher", HeaderDelay: int32(1)}, // own queue
		amqp.Table{HeaderDestination: "a", HeaderDelay: int32(1), HeaderCancel: "m0"},
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
	if !strings.Contains(h[broker.HeaderError].(string), "no destination") || h[broker.HeaderStage] != "ingest" ||
		h[broker.HeaderAttempts] != int32(0) || h[broker.HeaderNSBFailedQ] != "e.Timeouts" ||
		h[broker.HeaderNSBException] != h[broker.HeaderError] || h[broker.HeaderFailedAt] != now0.Format(time.RFC3339Nano) {
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
	h := amqp.Table{HeaderDestination: "a", HeaderDelay: int32(1)}
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
	b := deliveries(s, amqp.Table{HeaderDestination: "a", HeaderDelay: int32(1)})
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
	b := deliveries(s, amqp.Table{HeaderDestination: "a", HeaderDelay: int32(1)}, amqp.Table{})
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
