package testenv

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// PublishConfirmed publishes msg, mandatory, on ch in confirm mode and
// waits for the broker's ack.
func PublishConfirmed(t *testing.T, ch *amqp.Channel, exchange, key string, msg amqp.Publishing) {
	t.Helper()
	dc, err := ch.PublishWithDeferredConfirm(exchange, key, true, false, msg)
	if err != nil {
		t.Fatal(err)
	}
	if !dc.Wait() {
		t.Fatalf("publish of %s nacked", msg.MessageId)
	}
}

// QueueDepth is the number of messages ready in the queue q.
func QueueDepth(t testing.TB, ch *amqp.Channel, q string) int {
	t.Helper()
	st, err := ch.QueueDeclarePassive(q, false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	return st.Messages
}

// GetN gets exactly n messages from q, in order, and checks none is left.
func GetN(t *testing.T, ch *amqp.Channel, q string, n int) []amqp.Delivery {
	t.Helper()
	var got []amqp.Delivery
	deadline := time.Now().Add(10 * time.Second)
	for len(got) < n {
		d, ok, err := ch.Get(q, true)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			got = append(got, d)
			continue
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d of %d messages", q, len(got), n)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if d, ok, _ := ch.Get(q, true); ok {
		t.Fatalf("%s: an extra message %s (headers %v)", q, d.MessageId, d.Headers)
	}
	return got
}

// Channel opens a channel on conn, closed when the test ends.
func Channel(t testing.TB, conn *amqp.Connection) *amqp.Channel {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ch.Close() })
	return ch
}

// ConfirmChannel is Channel in confirm mode.
func ConfirmChannel(t testing.TB, conn *amqp.Connection) *amqp.Channel {
	t.Helper()
	ch := Channel(t, conn)
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	return ch
}
