package broker

import (
	"context"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/internal/testenv"
)

// testConn connects to the test broker (testenv.DialAMQP: skipped when it
// is unreachable, failed under CI=true) and closes it when the test ends.
func testConn(t *testing.T) *amqp.Connection {
	t.Helper()
	return testenv.DialAMQP(t)
}

// tempQueuePublisher declares a server-named, exclusive queue and opens a
// publisher (window 10) on the test broker; both go when the test ends.
func tempQueuePublisher(t *testing.T) (*amqp.Channel, amqp.Queue, *Publisher) {
	t.Helper()
	conn := testConn(t)
	ch := testenv.Channel(t, conn)
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := NewPublisher(conn, 10)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	return ch, q, pub
}

// A window's confirms are reported as they arrive, while later messages of
// the same window are still held for their NotBefore.
func TestConfirmedIsCalledBeforeTheWindowEnds(t *testing.T) {
	_, q, pub := tempQueuePublisher(t)

	var mu sync.Mutex
	confirmedAt := map[int]time.Time{}
	start := time.Now()
	hold := 300 * time.Millisecond
	msgs := make([]Outgoing, 3)
	for i := range msgs {
		msgs[i] = Outgoing{RoutingKey: q.Name, Mandatory: true, Msg: amqp.Publishing{MessageId: string(rune('a' + i))},
			Confirmed: func(latency time.Duration) {
				if latency <= 0 || latency > 10*time.Second {
					t.Errorf("message %d: confirm latency %s", i, latency)
				}
				mu.Lock()
				confirmedAt[i] = time.Now()
				mu.Unlock()
			}}
	}
	msgs[2].NotBefore = start.Add(hold)
	msgs[2].Confirmed = nil // not every message needs one
	unroutable := Outgoing{RoutingKey: "no-such-queue-" + q.Name, Mandatory: true, Msg: amqp.Publishing{MessageId: "r"}}
	msgs = append(msgs, unroutable)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	results := pub.Publish(ctx, msgs)
	if results[0] != nil || results[1] != nil || results[2] != nil {
		t.Fatalf("results %v", results)
	}
	if results[3] == nil {
		t.Fatal("an unroutable mandatory publish succeeded")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(confirmedAt) != 2 {
		t.Fatalf("Confirmed called for %d messages, want 2 (0 and 1)", len(confirmedAt))
	}
	for i, at := range confirmedAt {
		if at.Sub(start) >= hold {
			t.Errorf("message %d: confirm reported %s after the start, not before the held message left (%s)", i, at.Sub(start), hold)
		}
	}
}
