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
)

// The suite opens stores with the default cancel window.
const window = storage.DefaultCancelWindow

// testCancelTombstone: a Cancel that finds nothing cancels the id for the
// window (every copy inserted in it), and only then.
func testCancelTombstone(e *env) {
	e.expectErr("Cancel of an id never stored", e.s.Cancel(e.ctx, "early"), storage.ErrNotFound)
	if got := e.insert(newTimeout("early", at(time.Hour)), newTimeout("other", at(time.Hour))); !slices.Equal(got, []bool{false, true}) {
		e.Fatalf("Insert after the cancel = %v, want [false true]: the cancelled id is not stored", got)
	}
	e.expectMissing("early")
	e.clock.Set(at(window - time.Microsecond))
	if got := e.insert(newTimeout("early", at(time.Hour))); got[0] {
		e.Fatal("a second copy inside the window was stored")
	}
	e.expectMissing("early")
	e.clock.Set(at(window))
	if got := e.insert(newTimeout("early", at(time.Hour))); !got[0] {
		e.Fatal("the id is still cancelled when the window has passed")
	}
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
	if err := e.s.Cancel(e.ctx, "p"); err != nil {
		e.Fatalf("Cancel(p): %v", err)
	}
	if got := e.insert(newTimeout("p", at(time.Hour))); got[0] {
		e.Fatal("the message a Cancel removed was stored again by a repeated insert")
	}
	e.expectMissing("p")
	e.clock.Set(at(window))
	if got := e.insert(newTimeout("p", at(time.Hour))); !got[0] {
		e.Fatal("the id is still cancelled when the window has passed")
	}
	lease := e.leaseOne("l", time.Minute)
	e.expectErr("Cancel of a leased row", e.s.Cancel(e.ctx, "l"), storage.ErrLeased)
	if res := e.remove(storage.Ref{ID: "l", Lock: lease.Lock}); res[0] != nil {
		e.Fatalf("Remove: %v", res[0])
	}
	if got := e.insert(newTimeout("l", at(time.Hour))); !got[0] {
		e.Fatal("a Cancel that came too late (leased) cancelled the id's next message")
	}
}

// testCancelTombstoneRepeated: a second cancel of a missing id restarts the
// window.
func testCancelTombstoneRepeated(e *env) {
	e.expectErr("first Cancel", e.s.Cancel(e.ctx, "r"), storage.ErrNotFound)
	e.clock.Set(at(window / 2))
	e.expectErr("second Cancel", e.s.Cancel(e.ctx, "r"), storage.ErrNotFound)
	e.clock.Set(at(window + time.Minute))
	if got := e.insert(newTimeout("r", at(time.Hour))); got[0] {
		e.Fatal("the second cancel's window was not applied")
	}
	e.clock.Set(at(window/2 + window))
	if got := e.insert(newTimeout("r", at(time.Hour))); !got[0] {
		e.Fatal("the id is still cancelled after the second cancel's window")
	}
}

// testCancelTombstoneSurvivesReap: Reap leaves live tombstones alone.
func testCancelTombstoneSurvivesReap(e *env) {
	e.expectErr("Cancel", e.s.Cancel(e.ctx, "k"), storage.ErrNotFound)
	e.clock.Set(at(window - time.Second))
	if _, err := e.s.Reap(e.ctx); err != nil {
		e.Fatalf("Reap: %v", err)
	}
	if got := e.insert(newTimeout("k", at(time.Hour))); got[0] {
		e.Fatal("Reap removed a live tombstone")
	}
	e.clock.Set(at(window + time.Second))
	if _, err := e.s.Reap(e.ctx); err != nil {
		e.Fatalf("Reap: %v", err)
	}
	if got := e.insert(newTimeout("k", at(time.Hour))); !got[0] {
		e.Fatal("the id is cancelled after Reap purged its expired tombstone")
	}
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
			if err := can.Cancel(ctx, id); err != nil && !errors.Is(err, storage.ErrNotFound) {
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
