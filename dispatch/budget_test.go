package dispatch

import (
	"context"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/rs/zerolog"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/budget"
	"github.com/delaybridge/delaybridge/internal/amqptest"
)

// budgetFixture is a dispatcher reading batches (GetMany) under a byte
// budget; its publisher records what the budget held at each publish.
func budgetFixture(t *testing.T, total int64, outcome func(broker.Outgoing) error) (*fixture, *budget.Budget, *[]int64, *batchStore) {
	t.Helper()
	f := newFixture(t, 1)
	b := budget.New(total)
	var held []int64
	f.pub.Outcome = func(m broker.Outgoing) error {
		held = append(held, b.Held())
		if outcome != nil {
			return outcome(m)
		}
		return nil
	}
	bs := &batchStore{Store: f.store}
	f.d = New(nil, func(context.Context) (Publisher, error) { return f.pub, nil }, bs, Options{
		Queue: "e.TimeoutsDispatcher", TimeoutsQueue: "e.Timeouts", ErrorQueue: "error",
		NumberOfRetries: 1, Now: f.clock.Now, Logger: zerolog.Nop(), Budget: b, ExpectedRowBytes: 1 << 20,
	})
	return f, b, &held, bs
}

// A lease batch whose rows do not fit the budget together is forwarded in
// groups that do, all of it, and the budget is given back.
func TestRowsAreForwardedInGroupsThatFitTheBudget(t *testing.T) {
	const n, size = 10, 1000
	f, b, held, bs := budgetFixture(t, 5*size, nil)
	for i := range n {
		f.insert(fmt.Sprint("m", i), "orders", t0, amqp.Publishing{Body: make([]byte, size)})
	}
	if o, err := f.deliver(f.lease()...); err != nil || o != amqptest.Acked {
		t.Fatalf("err %v, dispatcher message %s", err, o)
	}
	if got := len(f.pub.To("orders")); got != n {
		t.Fatalf("forwarded %d of %d", got, n)
	}
	// Rows of about 1 KB, 2.5 KB for a group (half the budget): the first
	// group, planned for 1 MiB rows, is one row; then never more than two.
	if bs.maxIDs > 2 || bs.getManys < (n-1)/2 {
		t.Fatalf("%d GetMany calls of at most %d ids, want groups of at most 2", bs.getManys, bs.maxIDs)
	}
	for i, h := range *held {
		if h > b.Total() {
			t.Fatalf("publish %d: %d bytes held, over the budget %d", i, h, b.Total())
		}
	}
	if b.Held() != 0 {
		t.Fatalf("%d bytes still held", b.Held())
	}
}

// A row larger than the whole budget is forwarded alone.
func TestOversizedRowIsForwardedAlone(t *testing.T) {
	f, b, held, _ := budgetFixture(t, 1000, nil)
	f.insert("big", "orders", t0, amqp.Publishing{Body: make([]byte, 5000)})
	f.insert("small", "orders", t0, amqp.Publishing{Body: make([]byte, 10)})
	if o, err := f.deliver(f.lease()...); err != nil || o != amqptest.Acked {
		t.Fatalf("err %v, dispatcher message %s", err, o)
	}
	if got := len(f.pub.To("orders")); got != 2 {
		t.Fatalf("forwarded %d of 2", got)
	}
	if (*held)[0] != b.Total() || b.Held() != 0 {
		t.Fatalf("held %v during the publishes and %d after, want the whole budget then none", *held, b.Held())
	}
}

// Every outcome gives the bytes back: refused forwards (counted, then the
// error queue), and a broker failure that requeues the dispatcher message
// half-way through its groups.
func TestBudgetIsGivenBackOnEveryOutcome(t *testing.T) {
	for name, outcome := range map[string]func(broker.Outgoing) error{
		"returned then error queue": func(m broker.Outgoing) error {
			if m.RoutingKey == "orders" {
				return broker.ErrReturned
			}
			return nil
		},
		"broker failed": func(broker.Outgoing) error { return broker.ErrNotConfirmed },
	} {
		t.Run(name, func(t *testing.T) {
			f, b, _, _ := budgetFixture(t, 2500, outcome)
			for i := range 6 {
				f.insert(fmt.Sprint("m", i), "orders", t0, amqp.Publishing{Body: make([]byte, 1000)})
			}
			for range 3 { // the failures' retries too
				toks := f.lease()
				if len(toks) == 0 {
					break
				}
				_, _ = f.deliver(toks...)
				f.clock.Advance(10 * time.Minute)
				if b.Held() != 0 {
					t.Fatalf("%d bytes still held", b.Held())
				}
			}
		})
	}
}
