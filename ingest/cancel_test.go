package ingest

import (
	"context"
	"errors"
	"maps"
	"slices"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/broker/brokertest"
	"github.com/delaybridge/delaybridge/internal/amqptest"
	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/wire"
)

// cancelOf is the headers of a cancel of id (its delivery needs no body).
func cancelOf(id string) amqp.Table { return amqp.Table{wire.HeaderCancel: id} }

// noBodies drops the bodies of the deliveries at is (cancels).
func noBodies(ds []amqp.Delivery, is ...int) []amqp.Delivery {
	for _, i := range is {
		ds[i].Body = nil
	}
	return ds
}

// A batch keeps its cancels: messages and cancels are one InsertAndCancel
// call, each cancel placed after the messages received before it, and
// every delivery is acked once, after the commit. As one by one: a
// message its later cancel reaches is stored (counted) and removed; a
// message after the cancel of its id is dropped as cancelled; an invalid
// one goes to the error queue beside them.
func TestCancelsCommitWithTheirBatch(t *testing.T) {
	store, pub, s := &fakeStore{}, &brokertest.Publisher{}, amqptest.New(t)
	var woke []time.Time
	in := newIngester(store, pub, &woke)
	rec := &recorder{}
	in.opts.Metrics = rec
	send := func(ms int32) amqp.Table { return amqp.Table{wire.HeaderDestination: "a", wire.HeaderDelay: ms} }
	// Message ids m0, m1, ... by position.
	b := noBodies(deliveries(s, send(60000), cancelOf("m0"), cancelOf("m3"), send(3000), send(2000), amqp.Table{}, cancelOf("m9")), 1, 2, 6)
	if err := in.take(pub, b); err != nil {
		t.Fatal(err)
	}
	want := []storage.OrderedCancel{{At: 1, ID: "m0"}, {At: 1, ID: "m3"}, {At: 3, ID: "m9"}}
	if len(store.batches) != 1 || !slices.Equal(store.batches[0], want) || store.calls != 0 {
		t.Fatalf("InsertAndCancel calls %v, Insert calls %d; want one call with %v", store.batches, store.calls, want)
	}
	if _, ok := store.rows["m4"]; !ok || len(store.rows) != 1 {
		t.Fatalf("pending %v, want m4 alone", slices.Collect(maps.Keys(store.rows)))
	}
	if len(s.Multiple()) != 1 || s.Multiple()[0] != 7 {
		t.Fatalf("want one multiple-ack of the last tag after the commit, got %v (tag 7: %s)", s.Multiple(), s.Outcome(7))
	}
	if len(pub.Sent()) != 1 {
		t.Fatalf("%d error copies, want 1", len(pub.Sent()))
	}
	if rec.ingested != 2 || rec.duplicates != 1 || rec.dropped[DropCancelled] != 1 || rec.commits != 1 {
		t.Fatalf("metrics %+v, want 2 ingested (m0, then cancelled, and m4), m3 dropped as cancelled, one commit", rec)
	}
	if len(woke) != 1 || !woke[0].Equal(now0.Add(2*time.Second)) {
		t.Fatalf("woken with %v, want the earliest due time", woke)
	}
}

// Over a store that keeps schedules, each cancel also ends the AMQP
// schedule of its id, in the same commit.
func TestCancelsEndTheirSchedules(t *testing.T) {
	store, pub, s := &schedStore{fakeStore: &fakeStore{}}, &brokertest.Publisher{}, amqptest.New(t)
	var woke []time.Time
	in := newIngester(store, pub, &woke)
	if err := in.take(pub, noBodies(deliveries(s, cancelOf("x"), cancelOf("y")), 0, 1)); err != nil {
		t.Fatal(err)
	}
	want := []storage.OrderedCancel{{At: 0, ID: "x", Schedule: "amqp:x"}, {At: 0, ID: "y", Schedule: "amqp:y"}}
	if len(store.batches) != 1 || !slices.Equal(store.batches[0], want) {
		t.Fatalf("InsertAndCancel calls %v, want one with %v", store.batches, want)
	}
	if s.Outcome(1) != amqptest.Acked || s.Outcome(2) != amqptest.Acked {
		t.Fatalf("%s, %s; want both acked", s.Outcome(1), s.Outcome(2))
	}
}

// A failed commit requeues the whole batch, its cancels too, counts no
// drop and acks nothing; the next batch commits them.
func TestCancelsOfAFailedCommitAreRequeued(t *testing.T) {
	store, pub, s := &fakeStore{fail: errors.New("disk full")}, &brokertest.Publisher{}, amqptest.New(t)
	var woke []time.Time
	in := newIngester(store, pub, &woke)
	rec := &recorder{}
	in.opts.Metrics = rec
	b := noBodies(deliveries(s, cancelOf("m1"), amqp.Table{wire.HeaderDestination: "a", wire.HeaderDelay: int32(1)}, cancelOf("z")), 0, 2)
	if err := in.take(pub, b); err != nil {
		t.Fatal(err)
	}
	for tag := uint64(1); tag <= 3; tag++ {
		if s.Outcome(tag) != amqptest.Requeued {
			t.Errorf("tag %d %s, want requeued", tag, s.Outcome(tag))
		}
	}
	if rec.ingested != 0 || len(rec.dropped) != 0 || rec.commits != 0 || len(woke) != 0 {
		t.Fatalf("after a failed commit: metrics %+v, woken %v", rec, woke)
	}
	if len(store.batches) != 1 {
		t.Fatalf("%d InsertAndCancel calls, want 1", len(store.batches))
	}
}

// Over the broker: a cancel neither ends its batch, nor, in a held batch
// (Hold), starts a commit at once: it ends the hold, and what arrives
// within Linger joins the batch. So a stream of messages and their cancels
// commits in batches, not one commit per cancel.
func TestCancelsDoNotEndTheBatch(t *testing.T) {
	// The hold outlasts the wait below: a batch held after a cancel fails
	// the test rather than its commit ending it late.
	for _, hold := range []time.Duration{0, 30 * time.Second} {
		t.Run("hold "+hold.String(), func(t *testing.T) {
			// A long Linger: everything published below arrives within it.
			ach, q, store, stop := runOnFake(t, Options{Prefetch: 50, MaxBatch: 50, Linger: 3 * time.Second, Hold: hold, Urgent: time.Second})
			later := amqp.Table{wire.HeaderDestination: "orders", wire.HeaderDelay: int32(3600_000)}
			msgs := []amqp.Publishing{{MessageId: "a", Headers: later, Body: []byte("b")}, {Headers: cancelOf("a")},
				{MessageId: "b", Headers: later, Body: []byte("b")}, {Headers: cancelOf("c")}, {MessageId: "c", Headers: later, Body: []byte("b")}}
			for _, m := range msgs {
				if err := ach.PublishWithContext(context.Background(), "", q, true, false, m); err != nil {
					t.Fatal(err)
				}
			}
			batches := func() [][]storage.OrderedCancel {
				store.mu.Lock()
				defer store.mu.Unlock()
				return slices.Clone(store.batches)
			}
			cancels := func() (n int) {
				for _, b := range batches() {
					n += len(b)
				}
				return n
			}
			if !testenv.Eventually(20*time.Second, func() bool { return cancels() == 2 }) {
				t.Fatalf("within 20 s, commits with cancels %v", batches())
			}
			if err := stop(); err != nil {
				t.Fatalf("Run: %v", err)
			}
			want := []storage.OrderedCancel{{At: 1, ID: "a"}, {At: 2, ID: "c"}}
			if got := batches(); len(got) != 1 || !slices.Equal(got[0], want) || store.calls != 0 {
				t.Fatalf("commits with cancels %v and %d without; want one, with %v", got, store.calls, want)
			}
			store.mu.Lock()
			_, stored := store.rows["b"]
			n := len(store.rows)
			store.mu.Unlock()
			if !stored || n != 1 {
				t.Fatalf("%d rows pending, want b alone", n)
			}
			if n := testenv.QueueDepth(t, ach, q); n != 0 {
				t.Errorf("%s holds %d messages: a delivery was not acknowledged", q, n)
			}
		})
	}
}
