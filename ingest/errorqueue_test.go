package ingest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/rs/zerolog"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/errorqueue"
	"github.com/delaybridge/delaybridge/intake"
	"github.com/delaybridge/delaybridge/internal/logtest"
	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/protocol/nsbtimeout"
	"github.com/delaybridge/delaybridge/wire"
)

// countingPublisher publishes with a real publisher and records, for each
// call, how many messages it carried and how many the broker refused.
type countingPublisher struct {
	*broker.Publisher
	mu    sync.Mutex
	calls []publishCall
}

type publishCall struct{ sent, refused int }

func (p *countingPublisher) Publish(ctx context.Context, msgs []broker.Outgoing) []error {
	res := p.Publisher.Publish(ctx, msgs)
	c := publishCall{sent: len(msgs)}
	for _, err := range res {
		if errors.Is(err, broker.ErrReturned) || errors.Is(err, broker.ErrNacked) {
			c.refused++
		}
	}
	p.mu.Lock()
	p.calls = append(p.calls, c)
	p.mu.Unlock()
	return res
}

func (p *countingPublisher) snapshot() []publishCall {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]publishCall(nil), p.calls...)
}

// errorQueueEnv is an ingester on the real broker, consuming its own
// E.Timeouts, with its own error queue, a counting publisher and a gate
// that declares the error queue with errArgs when it is gone.
type errorQueueEnv struct {
	t              *testing.T
	conn           *amqp.Connection
	ch             *amqp.Channel
	timeouts, errQ string
	store          *fakeStore
	pub            *countingPublisher
	gate           *errorqueue.Sender
	logs           *logtest.Buffer
	stop           func()
}

func newErrorQueueEnv(t *testing.T, errArgs amqp.Table) *errorQueueEnv {
	t.Helper()
	conn := testenv.DialAMQP(t)
	ch := testenv.ConfirmChannel(t, conn)
	prefix := "ingest-errq-" + uuid.NewString()[:8]
	e := &errorQueueEnv{t: t, conn: conn, ch: ch, timeouts: prefix + ".Timeouts", errQ: prefix + ".error", store: &fakeStore{}, logs: &logtest.Buffer{}}
	declare := func(ch *amqp.Channel, q string, args amqp.Table) error {
		_, err := ch.QueueDeclare(q, false, false, false, false, args)
		return err
	}
	for q, args := range map[string]amqp.Table{e.timeouts: nil, e.errQ: errArgs} {
		if err := declare(ch, q, args); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if c, err := conn.Channel(); err == nil {
				_, _ = c.QueueDelete(q, false, false, false)
				_ = c.Close()
			}
		})
	}
	pubConn := testenv.DialAMQP(t)
	p, err := broker.NewPublisher(pubConn, 100)
	if err != nil {
		t.Fatal(err)
	}
	e.pub = &countingPublisher{Publisher: p}
	log := zerolog.New(e.logs)
	e.gate = errorqueue.New(errorqueue.Options{Queue: e.errQ, MinBackoff: 50 * time.Millisecond, MaxBackoff: 200 * time.Millisecond,
		// No summary within a test: the lines are counted exactly.
		WarnInterval: time.Hour, Logger: log,
		Declare: func(context.Context) error {
			c, err := pubConn.Channel()
			if err != nil {
				return err
			}
			defer c.Close()
			return declare(c, e.errQ, errArgs)
		}})
	all, _ := CompileGlobs([]string{"*"})
	stop := runIngester(t, e.store, e.pub, Options{
		Sources: []intake.Source{nsbtimeout.TimeoutsSource(e.timeouts)}, Errors: e.gate, Prefetch: 20, MaxBatch: 20,
		Rules:  Rules{Allowed: all, Reserved: []string{e.timeouts, e.errQ}},
		Logger: log,
	})
	e.stop = func() {
		if err := stop(); err != nil {
			t.Errorf("Run: %v", err)
		}
	}
	return e
}

// publish puts n invalid messages (no destination), then m valid ones, on
// E.Timeouts.
func (e *errorQueueEnv) publish(invalid, valid int) {
	e.t.Helper()
	var msgs []amqp.Publishing
	for i := range invalid {
		msgs = append(msgs, amqp.Publishing{MessageId: fmt.Sprintf("bad-%02d", i), Body: []byte("no destination")})
	}
	for i := range valid {
		msgs = append(msgs, amqp.Publishing{MessageId: fmt.Sprintf("ok-%02d", i),
			Headers: amqp.Table{wire.HeaderDestination: "orders", wire.HeaderDelay: int32(60000)}})
	}
	for _, m := range msgs {
		testenv.PublishConfirmed(e.t, e.ch, "", e.timeouts, m)
	}
}

func (e *errorQueueEnv) stored() int {
	e.store.mu.Lock()
	defer e.store.mu.Unlock()
	return len(e.store.rows)
}

// copyIDs takes every copy off the error queue and counts them by id.
func (e *errorQueueEnv) takeCopies(into map[string]int) {
	e.t.Helper()
	for {
		d, ok, err := e.ch.Get(e.errQ, true)
		if err != nil {
			e.t.Fatal(err)
		}
		if !ok {
			return
		}
		into[d.MessageId]++
	}
}

const firstRefusal = "the error queue refuses copies; the messages stay where they are and are tried again with backoff (further refusals are summarised once per interval)"

// The error queue is full (x-overflow reject-publish): the invalid messages
// are held while the valid ones behind them are stored; while it refuses,
// each try publishes one copy, and one line says so; once there is room
// every invalid message reaches it exactly once and E.Timeouts is empty.
func TestIngestWhileTheErrorQueueIsFull(t *testing.T) {
	e := newErrorQueueEnv(t, amqp.Table{"x-max-length": int32(2), "x-overflow": "reject-publish"})
	const invalid, valid = 15, 5
	e.publish(invalid, valid)
	// Five refused tries after the first refusal, and the valid ones in.
	testenv.WaitFor(t, time.Minute, "the valid messages stored and five refused tries", func() bool {
		refused := 0
		for _, c := range e.pub.snapshot() {
			if c.refused > 0 {
				refused++
			}
		}
		return e.stored() == valid && refused >= 6
	})
	calls := e.pub.snapshot()
	first := -1
	for i, c := range calls {
		if c.refused > 0 && first < 0 {
			first = i
		}
		if first >= 0 && i > first && c.sent != 1 {
			t.Fatalf("call %d published %d copies after the queue refused; want one probe per try (%v)", i, c.sent, calls)
		}
	}
	if n := e.logs.CountMessage(firstRefusal); n != 1 {
		t.Errorf("%d lines saying the error queue refuses copies, want 1", n)
	}
	if n := e.logs.CountMessage("could not move invalid message to the error queue; requeued"); n != 0 {
		t.Errorf("%d lines, one per refused copy; want none", n)
	}
	if refusing, _, _ := e.gate.Refusing(); !refusing {
		t.Error("the gate does not report the refusal")
	}

	got := map[string]int{}
	testenv.WaitFor(t, time.Minute, "every invalid message on the error queue", func() bool {
		e.takeCopies(got)
		return len(got) == invalid
	})
	e.stop()
	e.takeCopies(got)
	for id, n := range got {
		if n != 1 || !strings.HasPrefix(id, "bad-") {
			t.Errorf("%s on the error queue %d times", id, n)
		}
	}
	if n := testenv.QueueDepth(t, e.ch, e.timeouts); n != 0 {
		t.Errorf("E.Timeouts holds %d messages after the error queue took them all", n)
	}
	if n := e.logs.CountMessage("the error queue takes copies again"); n != 1 {
		t.Errorf("%d lines saying the error queue takes copies again, want 1", n)
	}
}

// The error queue was deleted after start: the first copy comes back as
// unroutable, the queue is declared again and every copy lands there, with
// no operator and no per-message line.
func TestIngestDeclaresADeletedErrorQueueAgain(t *testing.T) {
	e := newErrorQueueEnv(t, nil)
	if _, err := e.ch.QueueDelete(e.errQ, false, false, false); err != nil {
		t.Fatal(err)
	}
	const invalid, valid = 10, 3
	e.publish(invalid, valid)
	testenv.WaitFor(t, time.Minute, "the valid messages stored", func() bool { return e.stored() == valid })
	got := map[string]int{}
	testenv.WaitFor(t, time.Minute, "every invalid message on the error queue", func() bool {
		if _, err := e.ch.QueueDeclarePassive(e.errQ, false, false, false, false, nil); err != nil {
			// Not declared yet: the failed passive declaration closed the
			// channel.
			if e.ch, err = e.conn.Channel(); err != nil {
				t.Fatal(err)
			}
			return false
		}
		e.takeCopies(got)
		return len(got) == invalid
	})
	e.stop()
	for id, n := range got {
		if n != 1 {
			t.Errorf("%s on the error queue %d times", id, n)
		}
	}
	if n := testenv.QueueDepth(t, e.ch, e.timeouts); n != 0 {
		t.Errorf("E.Timeouts holds %d messages", n)
	}
	if n := e.logs.CountMessage("the error queue was missing (a copy came back as unroutable); declared it again"); n != 1 {
		t.Errorf("%d lines saying the error queue was declared again, want 1", n)
	}
	if n := e.logs.CountMessage("could not move invalid message to the error queue; requeued"); n != 0 {
		t.Errorf("%d lines, one per refused copy; want none", n)
	}
}
