package dispatch

import (
	"context"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/internal/testenv"
)

// Reconnected runs at the start of every consuming session but the first,
// before the session's workers start: the bridge frees its leases there,
// whose transient tokens a broker restart may have lost.
func TestReconnectedRunsOnEverySessionButTheFirst(t *testing.T) {
	f := newFixture(t, 3)
	opened := 0
	newPub := f.d.newPub
	f.d.newPub = func(ctx context.Context) (Publisher, error) {
		opened++
		return newPub(ctx)
	}
	var calls, pubsAtCall []int
	f.d.opts.Reconnected = func() int {
		calls = append(calls, len(calls))
		pubsAtCall = append(pubsAtCall, opened)
		return 0
	}
	conn := testenv.DialAMQP(t)
	for i := range 3 {
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		deliveries := make(chan amqp.Delivery)
		close(deliveries) // the consumer was cancelled: the session ends
		s := &broker.Session{Deliveries: deliveries, Closed: make(chan *amqp.Error), Channel: ch}
		if err := f.d.session(context.Background(), s); err != nil {
			t.Fatalf("session %d: %v", i+1, err)
		}
		_ = ch.Close()
	}
	if len(calls) != 2 {
		t.Fatalf("Reconnected called %d times in 3 sessions, want 2", len(calls))
	}
	for i, n := range pubsAtCall {
		if want := (i + 1) * f.d.opts.Workers; n != want {
			t.Errorf("call %d: %d publishers opened before it, want %d (the earlier sessions' only)", i+1, n, want)
		}
	}
}
