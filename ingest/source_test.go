package ingest

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/rs/zerolog"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/internal/amqptest"
	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/wire"
)

// parseToy reads a made-up protocol: the body is "destination|delay in ms".
// It stands for any adapter: a parser and a source are all a protocol needs.
func parseToy(d *amqp.Delivery, receivedAt time.Time) Intake {
	dest, ms, ok := strings.Cut(string(d.Body), "|")
	n, err := strconv.Atoi(ms)
	if !ok || err != nil {
		return Reject(errors.New("toy: body must be destination|milliseconds"))
	}
	return Intake{Op: OpSchedule, ID: d.MessageId, Destination: dest,
		DueAt: receivedAt.Add(time.Duration(n) * time.Millisecond), Msg: amqp.Publishing{Body: d.Body}}
}

// lockedPublisher is a fakePublisher for concurrent sessions.
type lockedPublisher struct {
	mu sync.Mutex
	fakePublisher
}

func (p *lockedPublisher) Publish(ctx context.Context, msgs []broker.Outgoing) []error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.fakePublisher.Publish(ctx, msgs)
}

func (p *lockedPublisher) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.sent)
}

// Run consumes every source at once against the real broker: E.Timeouts'
// headers on one queue, another protocol on another, with the same rules,
// store and error queue, and nothing left unacknowledged.
func TestRunConsumesEverySource(t *testing.T) {
	url := testenv.AMQPURL(t)
	admin := testenv.DialAMQP(t)
	ach, err := admin.Channel()
	if err != nil {
		t.Fatal(err)
	}
	prefix := "ingest-test-" + uuid.NewString()[:8]
	qHeaders, qToy := prefix+".Timeouts", prefix+".toy"
	for _, q := range []string{qHeaders, qToy} {
		if _, err := ach.QueueDeclare(q, false, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = ach.QueueDelete(q, false, false, false) })
	}

	conn := broker.NewConn(broker.ConnOptions{URL: url, Name: t.Name(), Logger: zerolog.Nop()})
	if err := conn.Connect(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	connDone := make(chan error, 1)
	go func() { connDone <- conn.Run(ctx) }()

	store, pub := &fakeStore{}, &lockedPublisher{}
	all, _ := CompileGlobs([]string{"*"})
	in := New(conn, func(context.Context) (Publisher, error) { return pub, nil }, store, Options{
		Sources:    []Source{TimeoutsSource(qHeaders), {Name: "toy", Queue: qToy, Parser: ParserFunc(parseToy)}},
		ErrorQueue: "error", Prefetch: 10, MaxBatch: 10,
		Rules:  Rules{MaxMessageBytes: 1 << 20, Allowed: all, Reserved: []string{qHeaders}},
		Logger: zerolog.Nop(),
	})
	runDone := make(chan error, 1)
	go func() { runDone <- in.Run(ctx) }()

	publish := func(q, id string, h amqp.Table, body string) {
		t.Helper()
		if err := ach.PublishWithContext(ctx, "", q, true, false, amqp.Publishing{MessageId: id, Headers: h, Body: []byte(body)}); err != nil {
			t.Fatal(err)
		}
	}
	publish(qHeaders, "h1", amqp.Table{wire.HeaderDestination: "orders", wire.HeaderDelay: int32(60000)}, "hello")
	publish(qToy, "t1", nil, "invoices|60000")
	publish(qToy, "t2", nil, "not the toy format")
	publish(qToy, "t3", nil, qHeaders+"|1") // the rules apply to every source

	deadline := time.Now().Add(20 * time.Second)
	for {
		store.mu.Lock()
		n := len(store.rows)
		store.mu.Unlock()
		if n == 2 && pub.count() == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("stored %d of 2, error copies %d of 2", n, pub.count())
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-runDone; err != nil {
		t.Fatalf("Run: %v", err)
	}
	<-connDone

	for id, dest := range map[string]string{"h1": "orders", "t1": "invoices"} {
		if row := store.rows[id]; row.Destination != dest {
			t.Errorf("%s stored for %q, want %q", id, row.Destination, dest)
		}
	}
	var reasons []string
	for _, m := range pub.sent {
		if m.Msg.Headers[wire.HeaderNSBFailedQ] != qToy {
			t.Errorf("error copy names %v as the failed queue, want %s", m.Msg.Headers[wire.HeaderNSBFailedQ], qToy)
		}
		reasons = append(reasons, m.Msg.Headers[wire.HeaderError].(string))
	}
	if got := strings.Join(reasons, "; "); !strings.Contains(got, "toy: body must be") || !strings.Contains(got, "one of the bridge's own queues") {
		t.Errorf("error reasons %q", got)
	}
	for _, q := range []string{qHeaders, qToy} {
		st, err := ach.QueueDeclarePassive(q, false, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		if st.Messages != 0 {
			t.Errorf("%s still holds %d messages: some delivery was not acknowledged", q, st.Messages)
		}
	}
}

// Ingest holds every parser to the id, destination and due-time rules: a
// parser that forgot them cannot hand the store what it refuses.
func TestIngestValidatesWhatAnyParserReturns(t *testing.T) {
	store, pub := &fakeStore{}, &fakePublisher{}
	a := amqptest.New(t)
	var woke []time.Time
	in := newIngester(store, pub, &woke)
	careless := Source{Name: "careless", Queue: "careless", Parser: ParserFunc(func(d *amqp.Delivery, now time.Time) Intake {
		switch d.MessageId {
		case "nul-cancel":
			return Intake{Op: OpCancel, CancelID: "a\x00b"}
		case "bad-utf8":
			return Intake{Op: OpSchedule, ID: "\xff", Destination: "q", DueAt: now}
		case "unknown-op":
			return Intake{Op: Op(9)}
		case "far":
			return Intake{Op: OpSchedule, ID: "far", Destination: "q", DueAt: time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC)}
		}
		return Intake{Op: OpSchedule, ID: d.MessageId, Destination: "q", DueAt: now}
	})}
	var batch []entry
	for _, id := range []string{"bad-utf8", "far", "unknown-op", "ok", "nul-cancel"} {
		batch = append(batch, in.classify(careless, a.Deliver(amqp.Delivery{MessageId: id})))
	}
	if held, err := in.handle(context.Background(), careless, pub, batch, nil); err != nil || len(held) != 0 {
		t.Fatal(held, err)
	}
	if len(store.rows) != 1 || store.rows["ok"].ID != "ok" {
		t.Fatalf("stored %v, want only ok", store.rows)
	}
	if len(pub.sent) != 4 {
		t.Fatalf("%d error copies, want 4", len(pub.sent))
	}
	for tag := uint64(1); tag <= 5; tag++ {
		if a.Outcome(tag) != amqptest.Acked {
			t.Errorf("tag %d %s", tag, a.Outcome(tag))
		}
	}
}
