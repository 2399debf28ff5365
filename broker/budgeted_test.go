package broker

import (
	"context"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/rs/zerolog"

	"github.com/delaybridge/delaybridge/budget"
	"github.com/delaybridge/delaybridge/internal/testenv"
)

// budgetQueue declares a server-named queue holding n messages of size
// bytes; it goes when the test ends.
func budgetQueue(t *testing.T, conn *amqp.Connection, n, size int) (*amqp.Channel, string) {
	t.Helper()
	ch, queue := sessionQueue(t, conn)
	body := make([]byte, size)
	for range n {
		if err := ch.Publish("", queue, false, false, amqp.Publishing{Body: body}); err != nil {
			t.Fatal(err)
		}
	}
	return ch, queue
}

// next waits for a delivery; quiet reports that none comes for a while.
func next(t *testing.T, s *Session) amqp.Delivery {
	t.Helper()
	select {
	case d, ok := <-s.Deliveries:
		if !ok {
			t.Fatal("deliveries closed")
		}
		return d
	case <-time.After(30 * time.Second):
		t.Fatal("no delivery in 30 s")
	}
	return amqp.Delivery{}
}

func quiet(t *testing.T, s *Session, b *budget.Budget) {
	t.Helper()
	select {
	case d := <-s.Deliveries:
		t.Fatalf("a delivery of %d bytes came with %d of %d bytes held", len(d.Body), b.Held(), b.Total())
	case <-time.After(300 * time.Millisecond):
	}
}

func runBudgeted(t *testing.T, conn *amqp.Connection, opts ConsumeOptions, handle func(*Session)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	opts.Name, opts.Logger = "test", zerolog.Nop()
	err := Consume(ctx, fixedConn{conn}, opts, func(_ context.Context, s *Session) error {
		handle(s)
		cancel()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n := opts.Budget.Held(); n != 0 {
		t.Fatalf("%d bytes still held after the session ended", n)
	}
}

// The bytes handed over never exceed the budget, the broker pushes no more
// than fit (the prefetch follows the message size), and every way of
// settling gives the bytes back, as does the end of the session.
func TestBudgetedConsumeBoundsBytesAndReleasesOnEverySettle(t *testing.T) {
	const size, fit, n = 64 << 10, 4, 20
	conn := testConn(t)
	ch, queue := budgetQueue(t, conn, n, size)
	b := budget.New(fit * size)
	runBudgeted(t, conn, ConsumeOptions{Queue: queue, Prefetch: 100, Budget: b, ExpectedBytes: size}, func(s *Session) {
		var held []amqp.Delivery
		for range fit {
			held = append(held, next(t, s))
		}
		quiet(t, s, b)
		if got := testenv.QueueDepth(t, ch, queue); got != n-fit {
			t.Fatalf("%d messages ready at the broker, want %d: it pushed more than the budget holds", got, n-fit)
		}
		// Each settle lets exactly one more in.
		settles := []func(d amqp.Delivery) error{
			func(d amqp.Delivery) error { return d.Ack(false) },
			func(d amqp.Delivery) error { return d.Nack(false, true) },
			func(d amqp.Delivery) error { return d.Reject(true) },
			func(d amqp.Delivery) error { return d.Nack(false, false) },
		}
		for i, settle := range settles {
			if err := settle(held[0]); err != nil {
				t.Fatal(err)
			}
			held = append(held[1:], next(t, s))
			if b.Held() != fit*size {
				t.Fatalf("settle %d: %d bytes held, want %d", i, b.Held(), fit*size)
			}
			quiet(t, s, b)
		}
		// A multiple ack gives back every delivery up to it.
		if err := held[fit-1].Ack(true); err != nil {
			t.Fatal(err)
		}
		for range fit {
			next(t, s)
		}
		quiet(t, s, b)
		// Ending with deliveries unsettled: the session gives them back.
	})
}

// A message larger than the whole budget is handed over alone, each in
// turn, and none is lost.
func TestBudgetedConsumeAdmitsAnOversizedMessageAlone(t *testing.T) {
	const size, n = 256 << 10, 3
	conn := testConn(t)
	_, queue := budgetQueue(t, conn, n, size)
	b := budget.New(1000)
	runBudgeted(t, conn, ConsumeOptions{Queue: queue, Prefetch: 100, Budget: b, ExpectedBytes: size}, func(s *Session) {
		for range n {
			d := next(t, s)
			if b.Held() != b.Total() {
				t.Fatalf("%d bytes held, want the whole budget %d", b.Held(), b.Total())
			}
			quiet(t, s, b)
			if err := d.Ack(false); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// Small messages after a large expected size: the prefetch grows, so all
// come without a single ack (the first consumer's prefetch was 1).
func TestBudgetedConsumeGrowsThePrefetchForSmallMessages(t *testing.T) {
	const n = 50
	conn := testConn(t)
	_, queue := budgetQueue(t, conn, n, 10)
	b := budget.New(1 << 20)
	runBudgeted(t, conn, ConsumeOptions{Queue: queue, Prefetch: 100, Budget: b, ExpectedBytes: 1 << 20}, func(s *Session) {
		for range n {
			next(t, s)
		}
		if b.Held() != n*10 {
			t.Fatalf("%d bytes held, want %d", b.Held(), n*10)
		}
	})
}
