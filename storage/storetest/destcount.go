package storetest

import (
	"errors"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/wire"
)

// testCountByDestination: pending and due-soon counts per destination
// follow inserts, leases, removals, cancels (one, by saga, in bulk) and
// reschedules; a queue and an exchange routing key of one name are apart.
func testCountByDestination(e *env) {
	_, err := e.s.CountByDestination(e.ctx, T0, T0.Add(time.Minute))
	// A store may count after Open (boltstore does, in the background).
	for deadline := time.Now().Add(30 * time.Second); errors.Is(err, storage.ErrNotYet) && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
		_, err = e.s.CountByDestination(e.ctx, T0, T0.Add(time.Minute))
	}
	type counts = map[wire.Destination]storage.DestinationCount
	dc := func(pending, dueSoon int) storage.DestinationCount {
		return storage.DestinationCount{Pending: pending, DueSoon: dueSoon}
	}
	expect := func(after string, want counts) {
		e.Helper()
		got, err := e.s.CountByDestination(e.ctx, T0, T0.Add(time.Minute))
		if err != nil {
			e.Fatalf("CountByDestination after %s: %v", after, err)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			e.Fatalf("CountByDestination after %s (-want +got):\n%s", after, diff)
		}
	}
	expect("nothing", counts{})
	mk := func(id, exchange, dest string, due time.Duration) storage.Timeout {
		t := newTimeout(id, at(due))
		t.Exchange, t.Destination = exchange, dest
		return t
	}
	q, q2, xk, xe := wire.Queue("q"), wire.Queue("q2"), wire.Destination{Exchange: "x", Key: "q"}, wire.Destination{Exchange: "x"}
	e.insert(mk("q-a", "", "q", -time.Minute), mk("q-b", "", "q", 10*time.Second), mk("q-c", "", "q", 2*time.Minute),
		mk("q2-a", "", "q2", 30*time.Second), mk("x-a", "x", "q", 5*time.Second), mk("x-b", "x", "q", time.Hour),
		mk("xe-a", "x", "", time.Minute))
	e.insert(mk("q-a", "", "q", 0)) // pending already: no change
	expect("inserts", counts{q: dc(3, 1), q2: dc(1, 1), xk: dc(2, 1), xe: dc(1, 0)})
	l := e.leaseOne("q-a", time.Minute)
	expect("a lease", counts{q: dc(3, 1), q2: dc(1, 1), xk: dc(2, 1), xe: dc(1, 0)})
	e.remove(storage.Ref{ID: "q-a", Lock: l.Lock})
	if err := e.s.Cancel(e.ctx, "q2-a", storage.CancelOrdered); err != nil {
		e.Fatal(err)
	}
	if err := e.s.Reschedule(e.ctx, "q-c", at(20*time.Second)); err != nil {
		e.Fatal(err)
	}
	expect("a removal, a cancel and a reschedule", counts{q: dc(2, 2), xk: dc(2, 1), xe: dc(1, 0)})
	if _, err := e.s.Bulk(e.ctx, storage.ListFilter{Exchange: "x", Destination: "q"}, storage.BulkAction{Kind: storage.BulkCancel}); err != nil {
		e.Fatal(err)
	}
	expect("a bulk cancel", counts{q: dc(2, 2), xe: dc(1, 0)})
}
