package dispatch

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/rs/zerolog"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/message"
	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/wire"
)

// recorder is a Metrics that remembers what it was told.
type recorder struct {
	mu                        sync.Mutex
	dispatched, failed, stale int
	errorQueued               map[string]int
	lateness, confirms        []time.Duration
}

func (r *recorder) Dispatched(n int) { r.mu.Lock(); r.dispatched += n; r.mu.Unlock() }
func (r *recorder) DispatchFailed()  { r.mu.Lock(); r.failed++; r.mu.Unlock() }
func (r *recorder) StaleToken()      { r.mu.Lock(); r.stale++; r.mu.Unlock() }
func (r *recorder) ErrorQueued(stage string, n int) {
	r.mu.Lock()
	if r.errorQueued == nil {
		r.errorQueued = map[string]int{}
	}
	r.errorQueued[stage] += n
	r.mu.Unlock()
}
func (r *recorder) ObserveLateness(d time.Duration) {
	r.mu.Lock()
	r.lateness = append(r.lateness, d)
	r.mu.Unlock()
}
func (r *recorder) ObserveDispatchConfirm(d time.Duration) {
	r.mu.Lock()
	r.confirms = append(r.confirms, d)
	r.mu.Unlock()
}

// counts are a recorder's counters.
type counts struct{ dispatched, failed, stale int }

func (r *recorder) counts() counts {
	r.mu.Lock()
	defer r.mu.Unlock()
	return counts{r.dispatched, r.failed, r.stale}
}

func TestMetrics(t *testing.T) {
	f := newFixture(t, 0)
	rec := &recorder{}
	f.rebuild(f.store, Options{NumberOfRetries: 0, Metrics: rec, Logger: zerolog.Nop()})
	// The fake broker confirms each forward 3 ms after the previous one, as
	// a real one does while the window's later forwards are still held:
	// each lateness is measured at its own confirm, not at Publish's return.
	f.pub.Outcome = func(m broker.Outgoing) error {
		f.clock.Advance(3 * time.Millisecond)
		if m.Confirmed != nil {
			m.Confirmed(time.Millisecond)
		}
		if m.RoutingKey == "nowhere" {
			return fmt.Errorf("%w: 312 NO_ROUTE", broker.ErrReturned)
		}
		return nil
	}
	f.insert("a", "orders", t0, amqp.Publishing{MessageId: "a"})
	f.insert("b", "orders", t0, amqp.Publishing{MessageId: "b"})
	f.insert("c", "nowhere", t0, amqp.Publishing{MessageId: "c"})
	toks := f.lease()
	if _, err := f.deliver(toks...); err != nil {
		t.Fatal(err)
	}
	if _, err := f.deliver(toks...); err != nil { // redelivered: all stale now
		t.Fatal(err)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if rec.dispatched != 2 || rec.failed != 1 || rec.stale != 3 || rec.errorQueued[wire.StageDispatch] != 1 {
		t.Errorf("dispatched %d, failed %d, stale %d, error queued %v; want 2, 1, 3, dispatch:1",
			rec.dispatched, rec.failed, rec.stale, rec.errorQueued)
	}
	want := []time.Duration{3 * time.Millisecond, 6 * time.Millisecond}
	if fmt.Sprint(rec.lateness) != fmt.Sprint(want) {
		t.Errorf("lateness %v, want %v (forwards confirmed, the returned one not)", rec.lateness, want)
	}
	// Every broker ack is a confirm, the returned forward's too (not the
	// error-queue copy: that is not a forward).
	if len(rec.confirms) != 3 {
		t.Errorf("%d confirm latencies, want 3", len(rec.confirms))
	}
}

func TestLatenessWithoutConfirmCallbacks(t *testing.T) {
	// A Publisher that never calls Confirmed: lateness is taken when
	// Publish returns.
	f := newFixture(t, 3)
	rec := &recorder{}
	f.d.opts.Metrics = rec
	f.pub.Outcome = func(broker.Outgoing) error { return nil }
	f.insert("a", "orders", t0, amqp.Publishing{MessageId: "a"})
	toks := f.lease()
	f.clock.Advance(7 * time.Millisecond)
	if _, err := f.deliver(toks...); err != nil {
		t.Fatal(err)
	}
	if len(rec.lateness) != 1 || rec.lateness[0] != 7*time.Millisecond || rec.dispatched != 1 {
		t.Errorf("lateness %v, dispatched %d; want [7ms], 1", rec.lateness, rec.dispatched)
	}
}

// TestLatenessFromEffectiveDue: lateness counts from when a message could
// first be forwarded, not from a due time long past when it was stored or
// while it was held back for a retry (else such messages read as minutes
// late on the status page).
func TestLatenessFromEffectiveDue(t *testing.T) {
	f := newFixture(t, 3)
	rec := &recorder{}
	f.d.opts.Metrics = rec
	f.pub.Outcome = func(broker.Outgoing) error { return nil }
	f.clock.Advance(time.Hour)
	now := f.clock.Now()
	// Stored now (ReceivedAt) with a due time an hour ago.
	enc, err := message.Encode(nil, &amqp.Publishing{MessageId: "late"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.Insert(context.Background(), []storage.Timeout{{ID: "late", Destination: "orders", DueAt: t0, ReceivedAt: now, Message: enc}}); err != nil {
		t.Fatal(err)
	}
	// Due an hour ago too, stored then, but held back for a retry until now.
	f.insert("retried", "orders", t0, amqp.Publishing{MessageId: "retried"})
	if err := f.store.Release(context.Background(), "retried", "", now); err != nil {
		t.Fatal(err)
	}
	toks := f.lease()
	if len(toks) != 2 {
		t.Fatalf("leased %d, want 2", len(toks))
	}
	f.clock.Advance(5 * time.Millisecond)
	if _, err := f.deliver(toks...); err != nil {
		t.Fatal(err)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if fmt.Sprint(rec.lateness) != fmt.Sprint([]time.Duration{5 * time.Millisecond, 5 * time.Millisecond}) {
		t.Errorf("lateness %v, want [5ms 5ms] (from when each became leasable, not an hour)", rec.lateness)
	}
}
