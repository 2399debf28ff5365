package broker

import (
	"context"
	"reflect"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/internal/testenv"
)

type fixedConn struct{ c *amqp.Connection }

func (f fixedConn) Wait(context.Context) (*amqp.Connection, error) { return f.c, nil }

// closeListeners counts the connection's NotifyClose listeners (the
// library keeps them until the connection closes).
func closeListeners(c *amqp.Connection) int {
	return reflect.ValueOf(c).Elem().FieldByName("closes").Len()
}

// Sessions that end while their connection stays up (a cancelled
// consumer, a channel error) do not each leave a close listener behind.
func TestSessionsOnOneConnectionShareOneCloseListener(t *testing.T) {
	conn := testConn(t)
	_, queue := sessionQueue(t, conn)
	before := closeListeners(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sessions := 0
	err := Consume(ctx, fixedConn{conn}, ConsumeOptions{Queue: queue, Prefetch: 1, Name: "test",
		MinBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond},
		func(_ context.Context, s *Session) error {
			sessions++
			if sessions == 20 {
				cancel()
			}
			return nil // the session ends; its channel closes, the connection stays
		})
	if err != nil {
		t.Fatal(err)
	}
	if sessions < 20 {
		t.Fatalf("%d sessions", sessions)
	}
	if n := closeListeners(conn) - before; n > 1 {
		t.Fatalf("%d close listeners added by 20 sessions on one connection, want at most 1", n)
	}
}

// sessionQueue declares a server-named queue on a channel of its own; both
// go when the test ends. Not auto-delete: the queue must outlive each
// session's consumer.
func sessionQueue(t *testing.T, conn *amqp.Connection) (*amqp.Channel, string) {
	t.Helper()
	ch := testenv.Channel(t, conn)
	q, err := ch.QueueDeclare("", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = ch.QueueDelete(q.Name, false, false, false) })
	return ch, q.Name
}
