package ingest

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/rs/zerolog"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/broker/brokertest"
	"github.com/delaybridge/delaybridge/intake"
	"github.com/delaybridge/delaybridge/internal/amqptest"
	"github.com/delaybridge/delaybridge/internal/logtest"
	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/protocol/nsbtimeout"
	"github.com/delaybridge/delaybridge/wire"
)

// parseToy reads a made-up protocol: the body is "destination|delay in ms".
// It stands for any adapter: a parser and a source are all a protocol needs.
func parseToy(d *amqp.Delivery, receivedAt time.Time) intake.Intake {
	dest, ms, ok := strings.Cut(string(d.Body), "|")
	n, err := strconv.Atoi(ms)
	if !ok || err != nil {
		return intake.Reject(errors.New("toy: body must be destination|milliseconds"))
	}
	return intake.Intake{Op: intake.OpSchedule, ID: d.MessageId, Destination: dest,
		DueAt: receivedAt.Add(time.Duration(n) * time.Millisecond), Msg: amqp.Publishing{Body: d.Body}}
}

// Run consumes every source at once against the real broker: E.Timeouts'
// headers on one queue, another protocol on another, with the same rules,
// store and error queue, and nothing left unacknowledged.
func TestRunConsumesEverySource(t *testing.T) {
	ach := testChannel(t)
	prefix := "ingest-test-" + uuid.NewString()[:8]
	qHeaders, qToy := prefix+".Timeouts", prefix+".toy"
	declareTestQueues(t, ach, qHeaders, qToy)
	store, pub := &fakeStore{}, &brokertest.Publisher{}
	stop := runIngester(t, store, pub, Options{
		Sources: []intake.Source{nsbtimeout.TimeoutsSource(qHeaders), {Name: "toy", Queue: qToy, Parser: intake.ParserFunc(parseToy)}},
		Rules:   Rules{Reserved: []string{qHeaders}},
	})

	publish := func(q, id string, h amqp.Table, body string) {
		t.Helper()
		if err := ach.PublishWithContext(context.Background(), "", q, true, false, amqp.Publishing{MessageId: id, Headers: h, Body: []byte(body)}); err != nil {
			t.Fatal(err)
		}
	}
	publish(qHeaders, "h1", amqp.Table{wire.HeaderDestination: "orders", wire.HeaderDelay: int32(60000)}, "hello")
	publish(qToy, "t1", nil, "invoices|60000")
	publish(qToy, "t2", nil, "not the toy format")
	publish(qToy, "t3", nil, qHeaders+"|1") // the rules apply to every source

	stored := func() int {
		store.mu.Lock()
		defer store.mu.Unlock()
		return len(store.rows)
	}
	if !testenv.Eventually(20*time.Second, func() bool { return stored() == 2 && len(pub.Sent()) == 2 }) {
		t.Fatalf("stored %d of 2, error copies %d of 2", stored(), len(pub.Sent()))
	}
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}

	for id, dest := range map[string]string{"h1": "orders", "t1": "invoices"} {
		if row := store.rows[id]; row.Destination != dest {
			t.Errorf("%s stored for %q, want %q", id, row.Destination, dest)
		}
	}
	var reasons []string
	for _, m := range pub.Sent() {
		if m.Msg.Headers[wire.HeaderNSBFailedQ] != qToy {
			t.Errorf("error copy names %v as the failed queue, want %s", m.Msg.Headers[wire.HeaderNSBFailedQ], qToy)
		}
		reasons = append(reasons, m.Msg.Headers[wire.HeaderError].(string))
	}
	if got := strings.Join(reasons, "; "); !strings.Contains(got, "toy: body must be") || !strings.Contains(got, "one of the bridge's own queues") {
		t.Errorf("error reasons %q", got)
	}
	for _, q := range []string{qHeaders, qToy} {
		if n := testenv.QueueDepth(t, ach, q); n != 0 {
			t.Errorf("%s still holds %d messages: some delivery was not acknowledged", q, n)
		}
	}
}

// Ingest holds every parser to the id, destination and due-time rules: a
// parser that forgot them cannot hand the store what it refuses.
func TestIngestValidatesWhatAnyParserReturns(t *testing.T) {
	store, pub := &fakeStore{}, &brokertest.Publisher{}
	a := amqptest.New(t)
	var woke []time.Time
	in := newIngester(store, pub, &woke)
	careless := intake.Source{Name: "careless", Queue: "careless", Parser: intake.ParserFunc(func(d *amqp.Delivery, now time.Time) intake.Intake {
		switch d.MessageId {
		case "nul-cancel":
			return intake.Intake{Op: intake.OpCancel, CancelID: "a\x00b"}
		case "bad-utf8":
			return intake.Intake{Op: intake.OpSchedule, ID: "\xff", Destination: "q", DueAt: now}
		case "unknown-op":
			return intake.Intake{Op: intake.Op(9)}
		case "far":
			return intake.Intake{Op: intake.OpSchedule, ID: "far", Destination: "q", DueAt: time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC)}
		}
		return intake.Intake{Op: intake.OpSchedule, ID: d.MessageId, Destination: "q", DueAt: now}
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
	if len(pub.Sent()) != 4 {
		t.Fatalf("%d error copies, want 4", len(pub.Sent()))
	}
	for tag := uint64(1); tag <= 5; tag++ {
		if a.Outcome(tag) != amqptest.Acked {
			t.Errorf("tag %d %s", tag, a.Outcome(tag))
		}
	}
}

// Sources that name a gate wait for that queue together (one check, one
// log line for all) and then consume their own queues.
func TestSourcesWaitForTheirGate(t *testing.T) {
	ach := testChannel(t)
	prefix := "ingest-gate-" + uuid.NewString()[:8]
	qa, qb, gate := prefix+".a", prefix+".b", prefix+".gate"
	declareTestQueues(t, ach, qa, qb)
	t.Cleanup(func() { _, _ = ach.QueueDelete(gate, false, false, false) })
	for _, q := range []string{qa, qb} {
		if err := ach.PublishWithContext(context.Background(), "", q, true, false, amqp.Publishing{MessageId: q, Body: []byte("orders|60000")}); err != nil {
			t.Fatal(err)
		}
	}
	store, logs := &fakeStore{}, &logtest.Buffer{}
	var srcs []intake.Source
	for _, q := range []string{qa, qb} {
		srcs = append(srcs, intake.Source{Name: "gated", Queue: q, MustExist: true, Gate: gate, Parser: intake.ParserFunc(parseToy)})
	}
	stop := runIngester(t, store, &brokertest.Publisher{}, Options{Sources: srcs, Logger: zerolog.New(logs)})
	defer func() {
		if err := stop(); err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	stored := func() int {
		store.mu.Lock()
		defer store.mu.Unlock()
		return len(store.rows)
	}
	testenv.WaitFor(t, 20*time.Second, "a waiting line", func() bool { return logs.Count("waiting for the queue") > 0 })
	time.Sleep(300 * time.Millisecond)
	if n := stored(); n != 0 {
		t.Fatalf("stored %d messages before the gate queue existed", n)
	}
	if _, err := ach.QueueDeclare(gate, false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if !testenv.Eventually(30*time.Second, func() bool { return stored() == 2 }) {
		t.Fatalf("stored %d of 2 after the gate queue appeared", stored())
	}
	if n := logs.Count("waiting for the queue"); n != 1 {
		t.Errorf("%d waiting lines, want 1 for both sources:\n%s", n, logs.String())
	}
}

// testChannel is a channel on a connection of the test's own.
func testChannel(t *testing.T) *amqp.Channel {
	t.Helper()
	return testenv.Channel(t, testenv.DialAMQP(t))
}

// declareTestQueues declares transient queues, deleted when the test ends.
func declareTestQueues(t *testing.T, ch *amqp.Channel, names ...string) {
	t.Helper()
	for _, q := range names {
		if _, err := ch.QueueDeclare(q, false, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = ch.QueueDelete(q, false, false, false) })
	}
}

// runIngester runs an Ingester with opts on a connection to the test broker
// (with error queue "error", prefetch and batches of 10 and bodies up to
// 1 MiB unless opts says otherwise) and returns
// the function that stops it and returns Run's error.
func runIngester(t *testing.T, store Store, pub Publisher, opts Options) (stop func() error) {
	t.Helper()
	conn := broker.NewConn(broker.ConnOptions{URL: testenv.AMQPURL(t), Name: t.Name(), Logger: zerolog.Nop()})
	if err := conn.Connect(); err != nil {
		t.Fatal(err)
	}
	if opts.ErrorQueue == "" {
		opts.ErrorQueue = "error"
	}
	opts.Prefetch, opts.MaxBatch = max(opts.Prefetch, 10), max(opts.MaxBatch, 10)
	if opts.Rules.MaxMessageBytes == 0 {
		opts.Rules.MaxMessageBytes = 1 << 20
	}
	// The ingester stops before its connection, as the bridge stops them
	// (bridge.Run): an ingester stopped while an error copy's confirm is on
	// its way still acks the delivery, which a connection closed under it
	// would requeue instead, so that the copy would be made twice. (The
	// test's cleanups run last registered first.)
	stopConn := testenv.Start(t, conn.Run)
	in := New(conn, func(context.Context) (Publisher, error) { return pub, nil }, store, opts)
	stopIngest := testenv.Start(t, in.Run)
	return func() error {
		err := stopIngest()
		if cerr := stopConn(); cerr != nil {
			t.Errorf("connection Run: %v", cerr)
		}
		return err
	}
}
