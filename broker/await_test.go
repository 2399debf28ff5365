package broker

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/rs/zerolog"

	"github.com/delaybridge/delaybridge/internal/logtest"
	"github.com/delaybridge/delaybridge/internal/testenv"
)

// oneConn is a Waiter that always hands out c.
type oneConn struct{ c *amqp.Connection }

func (w oneConn) Wait(context.Context) (*amqp.Connection, error) { return w.c, nil }

func declare(t *testing.T, conn *amqp.Connection, q string) {
	t.Helper()
	ch := testenv.Channel(t, conn)
	if _, err := ch.QueueDeclare(q, false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
}

func deleteQueue(t *testing.T, conn *amqp.Connection, q string) {
	t.Helper()
	ch := testenv.Channel(t, conn)
	if _, err := ch.QueueDelete(q, false, false, false); err != nil {
		t.Fatal(err)
	}
}

// dropQueue deletes q if it exists, on a connection of its own.
func dropQueue(q string) {
	conn, err := amqp.Dial(testURL())
	if err != nil {
		return
	}
	defer conn.Close()
	if ch, err := conn.Channel(); err == nil {
		_, _ = ch.QueueDelete(q, false, false, false)
	}
}

// AwaitQueue checks a queue someone else declares until it exists, on
// channels of its own (the connection survives every 404), with one log
// line when it is missing and one when it appears.
func TestAwaitQueueWaitsForTheQueue(t *testing.T) {
	conn := testConn(t)
	q := "await-test-" + uuid.NewString()[:8]
	t.Cleanup(func() { dropQueue(q) })
	logs := &logtest.Buffer{}
	done := make(chan bool, 1)
	go func() {
		done <- AwaitQueue(context.Background(), oneConn{conn}, AwaitOptions{Queue: q, Name: "test",
			MinBackoff: 5 * time.Millisecond, MaxBackoff: 20 * time.Millisecond, Logger: zerolog.New(logs).Level(zerolog.DebugLevel)})
	}()
	deadline := time.Now().Add(20 * time.Second)
	for logs.Count("still missing") < 3 {
		select {
		case <-done:
			t.Fatal("AwaitQueue returned before the queue existed")
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("no checks logged within 20 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	declare(t, conn, q)
	select {
	case ok := <-done:
		if !ok {
			t.Fatal("AwaitQueue returned false")
		}
	case <-time.After(20 * time.Second):
		t.Fatal("AwaitQueue did not return within 20 s of the declaration")
	}
	if conn.IsClosed() {
		t.Error("the connection was closed by the checks")
	}
	if w, f := logs.Count(`"level":"info"`, "waiting for the queue"), logs.Count(`"level":"info"`, "queue found"); w != 1 || f != 1 {
		t.Errorf("%d waiting and %d found lines at info, want 1 and 1:\n%s", w, f, logs.String())
	}
	if n := logs.Count(`"level":"warn"`); n != 0 {
		t.Errorf("%d warnings", n)
	}

	// An existing queue: no line at all.
	quiet := &logtest.Buffer{}
	if !AwaitQueue(context.Background(), oneConn{conn}, AwaitOptions{Queue: q, Logger: zerolog.New(quiet)}) || quiet.String() != "" {
		t.Errorf("existing queue: logged %q", quiet.String())
	}
	// It ends with its context.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if AwaitQueue(ctx, oneConn{conn}, AwaitOptions{Queue: q + "-never", Logger: zerolog.Nop()}) {
		t.Error("AwaitQueue reported a queue that was never declared")
	}
}

// With MustExist, Consume starts a session only once the queue exists, and
// when the queue goes away mid-session it waits for it again.
func TestConsumeMustExist(t *testing.T) {
	conn := testConn(t)
	q := "mustexist-test-" + uuid.NewString()[:8]
	t.Cleanup(func() { dropQueue(q) })
	sessions := make(chan *Session)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Consume(ctx, oneConn{conn}, ConsumeOptions{Queue: q, Name: "test", MustExist: true,
			MinBackoff: 5 * time.Millisecond, MaxBackoff: 20 * time.Millisecond, MissingMaxBackoff: 20 * time.Millisecond,
			Logger: zerolog.Nop()},
			func(ctx context.Context, s *Session) error {
				sessions <- s
				select {
				case <-ctx.Done():
				case <-s.Closed:
				case <-waitClosed(s.Deliveries):
				}
				return nil
			})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Consume: %v", err)
		}
	}()
	select {
	case <-sessions:
		t.Fatal("a session started on a missing queue")
	case <-time.After(300 * time.Millisecond):
	}
	for round := 1; round <= 2; round++ {
		declare(t, conn, q)
		select {
		case <-sessions:
		case <-time.After(20 * time.Second):
			t.Fatalf("round %d: no session within 20 s of the declaration", round)
		}
		deleteQueue(t, conn, q) // the broker cancels the consumer
		select {
		case <-sessions:
			t.Fatalf("round %d: a session started on the deleted queue", round)
		case <-time.After(300 * time.Millisecond):
		}
	}
}

// waitClosed is closed once ch is.
func waitClosed(ch <-chan amqp.Delivery) <-chan struct{} {
	c := make(chan struct{})
	go func() {
		for range ch {
		}
		close(c)
	}()
	return c
}
