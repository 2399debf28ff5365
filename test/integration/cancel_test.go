package integration

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// TestCancelOverAMQP: a message with x-delaybridge-cancel and no body
// cancels the pending message it names; the others are still delivered;
// a malformed cancel lands on the error queue.
func TestCancelOverAMQP(t *testing.T) {
	t.Parallel()
	b, conn, pub, dest, c := startWithDest(t)

	due := time.Now().Add(2 * time.Second).UTC().Format(time.RFC3339Nano)
	for _, id := range []string{"keep", "drop"} {
		pub.Publish(b.TimeoutsQueue(), amqp.Publishing{MessageId: id, Body: []byte(id),
			Headers: amqp.Table{"x-destination": dest, "x-due-at": due}})
	}
	pub.Publish(b.TimeoutsQueue(), amqp.Publishing{Headers: amqp.Table{"x-delaybridge-cancel": "drop"}})
	pub.Publish(b.TimeoutsQueue(), amqp.Publishing{Body: []byte("oops"), Headers: amqp.Table{"x-delaybridge-cancel": "keep"}})

	c.WaitFor(1, 10*time.Second)
	time.Sleep(1500 * time.Millisecond) // would "drop" still come?
	got := c.All()
	if len(got) != 1 || got[0].Delivery.MessageId != "keep" {
		ids := []string{}
		for _, a := range got {
			ids = append(ids, a.Delivery.MessageId)
		}
		t.Fatalf("delivered %v, want only keep", ids)
	}
	errs := declareAndConsume(t, conn, b.ErrorQ)
	bad := errs.WaitFor(1, 10*time.Second)
	if r, _ := bad[0].Delivery.Headers["x-delaybridge-error"].(string); bad[0].Delivery.Headers["x-delaybridge-cancel"] != "keep" || r == "" {
		t.Fatalf("the cancel with a body must land on the error queue with a reason, got %v", bad[0].Delivery.Headers)
	}
}
