package ingest

import (
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/internal/amqptest"
	"github.com/delaybridge/delaybridge/internal/brokertest"
	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/wire"
)

// TestRecurringIntakeCancelled: a schedule message the store refuses as
// cancelled (its id has a live tombstone, docs/contract.md §2.11) is acked
// and dropped like a cancelled one-shot: no schedule, no error copy, no
// requeue, no firer wake.
func TestRecurringIntakeCancelled(t *testing.T) {
	store, pub, a := &schedStore{fakeStore: &fakeStore{}}, &brokertest.Publisher{}, amqptest.New(t)
	store.putFail = fmt.Errorf("put: %w", storage.ErrScheduleCancelled)
	var woke []time.Time
	in := newIngester(store, pub, &woke)
	rec := &recorder{}
	in.opts.Metrics = rec
	wakes := 0
	in.opts.ScheduleWake = func() { wakes++ }
	h := amqp.Table{wire.HeaderDestination: "a", wire.HeaderCron: "0 0 * * * ?"}
	if err := in.take(pub, deliveries(a, h)); err != nil {
		t.Fatal(err)
	}
	if a.Outcome(1) != amqptest.Acked || len(store.puts) != 0 || wakes != 0 || len(pub.Sent()) != 0 || rec.dropped[DropCancelled] != 1 {
		t.Fatalf("outcome %s, puts %+v, wakes %d, error copies %d, dropped %v; want acked and dropped as cancelled",
			a.Outcome(1), store.puts, wakes, len(pub.Sent()), rec.dropped)
	}
}
