package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/wire"
)

// The suite opens stores with the default cancel window.
const window = storage.DefaultCancelWindow

// expectRefused inserts a new copy of id, due in an hour, and fails with
// msg unless Insert refuses it (the id is cancelled) when refused, or stores
// it when not.
func (e *env) expectRefused(id string, refused bool, msg string) {
	e.Helper()
	if got := e.insert(newTimeout(id, at(time.Hour))); got[0] == refused {
		e.Fatal(msg)
	}
}

// testCancelTombstone: a Cancel that finds nothing cancels the id for the
// window (every copy inserted in it), and only then.
func testCancelTombstone(e *env) {
	e.expectErr("Cancel of an id never stored", e.s.Cancel(e.ctx, "early", storage.CancelOrdered), storage.ErrNotFound)
	if got := e.insert(newTimeout("early", at(time.Hour)), newTimeout("other", at(time.Hour))); !slices.Equal(got, []bool{false, true}) {
		e.Fatalf("Insert after the cancel = %v, want [false true]: the cancelled id is not stored", got)
	}
	e.expectMissing("early")
	e.clock.Set(at(window - time.Microsecond))
	e.expectRefused("early", true, "a second copy inside the window was stored")
	e.expectMissing("early")
	e.clock.Set(at(window))
	e.expectRefused("early", false, "the id is still cancelled when the window has passed")
	e.get("early")
}

// testCancelTombstoneAfterRemoval: a Cancel that removed a row leaves a
// tombstone too: the message's insert may have committed with its answer
// lost (a cut connection), and the repeat of that insert, by the store's
// retry or by a requeue, must not store it again. A Cancel that found the
// row leased (too late) leaves none: the id is free again once the
// message has been forwarded.
func testCancelTombstoneAfterRemoval(e *env) {
	e.insertDue("p", "l")
	if err := e.s.Cancel(e.ctx, "p", storage.CancelOrdered); err != nil {
		e.Fatalf("Cancel(p): %v", err)
	}
	e.expectRefused("p", true, "the message a Cancel removed was stored again by a repeated insert")
	e.expectMissing("p")
	e.clock.Set(at(window))
	e.expectRefused("p", false, "the id is still cancelled when the window has passed")
	lease := e.leaseOne("l", time.Minute)
	e.expectErr("Cancel of a leased row", e.s.Cancel(e.ctx, "l", storage.CancelOrdered), storage.ErrLeased)
	if res := e.remove(storage.Ref{ID: "l", Lock: lease.Lock}); res[0] != nil {
		e.Fatalf("Remove: %v", res[0])
	}
	e.expectRefused("l", false, "a Cancel that came too late (leased) cancelled the id's next message")
}

// testCancelTombstoneRepeated: a second cancel of a missing id restarts the
// window.
func testCancelTombstoneRepeated(e *env) {
	e.expectErr("first Cancel", e.s.Cancel(e.ctx, "r", storage.CancelOrdered), storage.ErrNotFound)
	e.clock.Set(at(window / 2))
	e.expectErr("second Cancel", e.s.Cancel(e.ctx, "r", storage.CancelOrdered), storage.ErrNotFound)
	e.clock.Set(at(window + time.Minute))
	e.expectRefused("r", true, "the second cancel's window was not applied")
	e.clock.Set(at(window/2 + window))
	e.expectRefused("r", false, "the id is still cancelled after the second cancel's window")
}

// testCancelTombstoneSurvivesReap: Reap leaves live tombstones alone.
func testCancelTombstoneSurvivesReap(e *env) {
	e.expectErr("Cancel", e.s.Cancel(e.ctx, "k", storage.CancelOrdered), storage.ErrNotFound)
	e.clock.Set(at(window - time.Second))
	if _, err := e.s.Reap(e.ctx); err != nil {
		e.Fatalf("Reap: %v", err)
	}
	e.expectRefused("k", true, "Reap removed a live tombstone")
	e.clock.Set(at(window + time.Second))
	if _, err := e.s.Reap(e.ctx); err != nil {
		e.Fatalf("Reap: %v", err)
	}
	e.expectRefused("k", false, "the id is cancelled after Reap purged its expired tombstone")
}

// testCancelInsertConcurrent: a Cancel and an Insert of one id running at
// the same time end with no row, whichever goes first: the Cancel removes
// the row, or the Insert finds the tombstone. So do a Cancel of a pending
// row and a repeated Insert of it.
func testCancelInsertConcurrent(e *env) {
	RaceCancelInsert(e.T, e.s, e.s, 100)
	RaceCancelReinsert(e.T, e.s, e.s, 100)
}

// RaceCancelInsert inserts n new ids through ins while can cancels each one
// at the same moment, and fails t if any is left pending. A backend that
// several instances share runs it with two stores on one database, as two
// bridges consuming one E.Timeouts (docs/contract.md §2.5).
func RaceCancelInsert(t testing.TB, ins, can storage.Store, n int) {
	t.Helper()
	raceCancelInsert(t, ins, can, n, "race-", false)
}

// RaceCancelReinsert is RaceCancelInsert for ids already pending: ins
// inserts each one again (as after an insert whose answer was lost) while
// can cancels it.
func RaceCancelReinsert(t testing.TB, ins, can storage.Store, n int) {
	t.Helper()
	raceCancelInsert(t, ins, can, n, "again-", true)
}

func raceCancelInsert(t testing.TB, ins, can storage.Store, n int, prefix string, pending bool) {
	t.Helper()
	ctx := context.Background()
	id := func(i int) string { return fmt.Sprintf("%s%04d", prefix, i) }
	if pending {
		rows := make([]storage.Timeout, n)
		for i := range rows {
			rows[i] = newTimeout(id(i), at(time.Hour))
		}
		if _, err := ins.Insert(ctx, rows); err != nil {
			t.Fatalf("Insert: %v", err)
		}
	}
	var wg sync.WaitGroup
	for i := range n {
		id := id(i)
		start := make(chan struct{})
		wg.Go(func() {
			<-start
			if _, err := ins.Insert(ctx, []storage.Timeout{newTimeout(id, at(time.Hour))}); err != nil {
				t.Errorf("Insert(%s): %v", id, err)
			}
		})
		wg.Go(func() {
			<-start
			if err := can.Cancel(ctx, id, storage.CancelOrdered); err != nil && !errors.Is(err, storage.ErrNotFound) {
				t.Errorf("Cancel(%s): %v", id, err)
			}
		})
		close(start)
	}
	wg.Wait()
	left := 0
	for i := range n {
		if _, err := can.Get(ctx, id(i)); !errors.Is(err, storage.ErrNotFound) {
			left++
			if left <= 5 {
				t.Errorf("%s: a Cancel and an Insert ran together and the row is pending (%v)", id(i), err)
			}
		}
	}
	if left > 0 {
		t.Errorf("%d of %d ids cancelled while being inserted are pending", left, n)
	}
}

// testRescheduleRange: a due time after storage.MaxDueAt is refused and
// leaves the row as it was; MaxDueAt itself (to the second) is kept.
func testRescheduleRange(e *env) {
	e.insert(newTimeout("a", at(time.Hour)))
	err := e.s.Reschedule(e.ctx, "a", storage.MaxDueAt.Add(time.Nanosecond))
	e.expectErr("Reschedule after MaxDueAt", err, storage.ErrDueOutOfRange)
	if row := e.get("a"); !row.DueAt.Equal(at(time.Hour)) {
		e.Fatalf("a refused Reschedule changed the due time to %s", row.DueAt)
	}
	last := storage.MaxDueAt.Truncate(time.Second)
	if err := e.s.Reschedule(e.ctx, "a", last); err != nil {
		e.Fatalf("Reschedule to %s: %v", last, err)
	}
	if row := e.get("a"); !row.DueAt.Equal(last) {
		e.Fatalf("rescheduled to %s, Get says %s", last, row.DueAt)
	}
}

// sendsOf stores sends 1 to n of id, due at due, each with a fingerprint
// of its own, and returns their keys.
func (e *env) sendsOf(id string, n int, due time.Duration, saga string) []string {
	e.Helper()
	var keys []string
	for i := 1; i <= n; i++ {
		t := newTimeout(id, at(due))
		t.Fingerprint = []byte(fmt.Sprintf("send %d", i))
		t.SagaID = saga
		if got := e.insertOutcomes(t); got[0] != storage.Stored {
			e.Fatalf("Insert of send %d of %q = %v", i, id, got[0])
		}
		keys = append(keys, wire.SendKey(id, i))
	}
	return keys
}

// testCancelSends: a cancel by id removes every send of it that is not
// leased; one leased send is left (delivered) and the cancel still
// succeeds and leaves the tombstone, which holds for every later send of
// the id; with every send leased, the cancel is refused and leaves none.
// Other ids, even those that start with it, are untouched.
func testCancelSends(e *env) {
	keys := e.sendsOf("c", 3, -time.Minute, "")
	e.insert(newTimeout("c2", at(time.Hour)), newTimeout("c ", at(time.Hour)))
	e.leaseFirst(keys[0]) // c2 and "c " are not due
	if err := e.s.Cancel(e.ctx, "c", storage.CancelOrdered); err != nil {
		e.Fatalf("Cancel(c) with one of 3 sends leased: %v", err)
	}
	e.get(keys[0])
	e.expectMissing(keys[1])
	e.expectMissing(keys[2])
	e.get("c2")
	e.get("c ")
	another := newTimeout("c", at(time.Hour))
	another.Fingerprint = []byte("another")
	if got := e.insertOutcomes(another); got[0] != storage.Cancelled {
		e.Fatalf("a send of a cancelled id = %v, want cancelled", got[0])
	}
	e.expectErr("Cancel with every send leased", e.s.Cancel(e.ctx, "c", storage.CancelOrdered), storage.ErrLeased)

	// Every send leased, no tombstone before: the refused cancel leaves none.
	d := e.sendsOf("d", 2, -time.Minute, "")
	e.lease("o", 10, time.Minute)
	e.expectErr("Cancel with both sends leased", e.s.Cancel(e.ctx, "d", storage.CancelOrdered), storage.ErrLeased)
	e.get(d[0])
	e.get(d[1])
	if got := e.insertOutcomes(newTimeout("d", at(time.Hour))); got[0] != storage.Stored {
		e.Fatalf("a send after a refused cancel = %v, want stored", got[0])
	}
}

// testCancelFound: with storage.CancelFound a cancel that finds nothing
// leaves no tombstone (the id stays free: an operator's cancel of an id
// never stored must not drop the next message with it), and one that
// removed a send leaves one, as CancelOrdered does.
func testCancelFound(e *env) {
	e.expectErr("Cancel(CancelFound) of an id never stored", e.s.Cancel(e.ctx, "never", storage.CancelFound), storage.ErrNotFound)
	if got := e.insertOutcomes(newTimeout("never", at(time.Hour))); got[0] != storage.Stored {
		e.Fatalf("Insert after a cancel that found nothing = %v, want stored", got[0])
	}
	if err := e.s.Cancel(e.ctx, "never", storage.CancelFound); err != nil {
		e.Fatalf("Cancel(CancelFound) of a pending id: %v", err)
	}
	if got := e.insertOutcomes(newTimeout("never", at(time.Hour))); got[0] != storage.Cancelled {
		e.Fatalf("Insert after a cancel that removed the id = %v, want cancelled", got[0])
	}
}

// testRescheduleSends: a reschedule by id moves every send of it that is
// not leased; with every send leased it is refused.
func testRescheduleSends(e *env) {
	keys := e.sendsOf("r", 3, -time.Minute, "")
	e.leaseFirst(keys[0])
	if err := e.s.Reschedule(e.ctx, "r", at(time.Hour)); err != nil {
		e.Fatalf("Reschedule(r): %v", err)
	}
	for i, key := range keys {
		want := at(time.Hour)
		if i == 0 {
			want = at(-time.Minute) // leased: left
		}
		if row := e.get(key); !row.DueAt.Equal(want) {
			e.Fatalf("%q due %s, want %s", key, row.DueAt, want)
		}
	}
	e.sendsOf("q", 1, -time.Minute, "")
	e.leaseOne("q", time.Minute)
	e.expectErr("Reschedule with every send leased", e.s.Reschedule(e.ctx, "q", at(time.Hour)), storage.ErrLeased)
}

// testCancelSagaSends: a saga's cancel removes every send of its ids and
// tombstones the ids, not their keys.
func testCancelSagaSends(e *env) {
	keys := e.sendsOf("m", 2, time.Hour, "saga")
	if c, l, err := e.s.CancelSaga(e.ctx, "saga"); err != nil || c != 2 || l != 0 {
		e.Fatalf("CancelSaga = %d, %d, %v; want 2 cancelled", c, l, err)
	}
	e.expectMissing(keys[0])
	e.expectMissing(keys[1])
	late := newTimeout("m", at(time.Hour))
	late.Fingerprint = []byte("late")
	if got := e.insertOutcomes(late); got[0] != storage.Cancelled {
		e.Fatalf("a send of a saga-cancelled id = %v, want cancelled", got[0])
	}
}

// testBulkCancelSends: a bulk cancel tombstones the ids of the sends it
// removed.
func testBulkCancelSends(e *env) {
	e.sendsOf("b", 2, time.Hour, "")
	res, err := e.s.Bulk(e.ctx, storage.ListFilter{IDPrefix: "b"}, storage.BulkAction{Kind: storage.BulkCancel})
	if err != nil || res.Changed != 2 {
		e.Fatalf("Bulk cancel = %+v, %v; want 2 changed", res, err)
	}
	if got := e.insertOutcomes(newTimeout("b", at(time.Hour))); got[0] != storage.Cancelled {
		e.Fatalf("a send of a bulk-cancelled id = %v, want cancelled", got[0])
	}
}

// leaseFirst leases one row, which must be key: the first in due order
// (ties by key).
func (e *env) leaseFirst(key string) {
	e.Helper()
	if ls := e.lease("o", 1, time.Minute); len(ls) != 1 || ls[0].ID != key {
		e.Fatalf("Lease(1) = %v, want [%q]", leaseIDs(ls), key)
	}
}
