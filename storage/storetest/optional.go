package storetest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/delaybridge/delaybridge/storage"
)

// The optional interfaces of package storage are checked on stores that have
// them; the others skip these tests, saying which interface they lack.

// optional returns the store under test as I, or skips the test when it is
// no I.
func optional[I any](e *env) I {
	e.Helper()
	i, ok := e.s.(I)
	if !ok {
		e.Skipf("%T has no %v", e.s, reflect.TypeFor[I]())
	}
	return i
}

// skipUnsupported skips the test when err says that the store, a wrapper,
// lacks the method after all.
func (e *env) skipUnsupported(err error) {
	e.Helper()
	if errors.Is(err, storage.ErrUnsupported) {
		e.Skipf("%T answers ErrUnsupported: %v", e.s, err)
	}
}

// optionalCalls calls with ctx each optional method the store has and
// returns the errors by method name, leaving out ErrUnsupported answers.
func (e *env) optionalCalls(ctx context.Context) map[string]error {
	errs := map[string]error{}
	if st, ok := e.s.(storage.Stater); ok {
		_, _, errs["Stats"] = st.Stats(ctx)
	}
	if lc, ok := e.s.(storage.LeaseCounter); ok {
		_, errs["LeasedBy"] = lc.LeasedBy(ctx, "o", 10)
	}
	if mg, ok := e.s.(storage.MultiGetter); ok {
		_, errs["GetMany"] = mg.GetMany(ctx, []string{"a"})
	}
	maps.DeleteFunc(errs, func(_ string, err error) bool { return errors.Is(err, storage.ErrUnsupported) })
	return errs
}

// testStats follows both counts through every call that changes them.
func testStats(e *env) {
	st := optional[storage.Stater](e)
	_, _, err := st.Stats(e.ctx)
	e.skipUnsupported(err)
	expect := func(after string, pending, leased int) {
		e.Helper()
		p, l, err := st.Stats(e.ctx)
		if err != nil || p != pending || l != leased {
			e.Fatalf("Stats after %s = %d pending, %d leased, %v; want %d, %d", after, p, l, err, pending, leased)
		}
	}
	expect("nothing", 0, 0)
	e.insertDue("a", "b", "c")
	e.insert(newTimeout("d", at(-time.Second)), newTimeout("later", at(time.Hour)))
	expect("inserting 5", 5, 0)
	if e.insert(newTimeout("a", at(0)))[0] {
		e.Fatal("Insert of a pending id returned true")
	}
	expect("inserting a pending id again", 5, 0)

	lock := map[string]string{}
	for _, l := range e.lease("o", 3, time.Minute) {
		lock[l.ID] = l.Lock
	}
	if len(lock) != 3 || lock["d"] != "" {
		e.Fatalf("leased %v, want a, b and c", lock)
	}
	expect("leasing 3", 5, 3)
	if _, err := e.s.IncrementFailureCount(e.ctx, "a", lock["a"], "x"); err != nil {
		e.Fatal(err)
	}
	expect("a failure count (the lease is kept)", 5, 3)
	if err := e.s.Release(e.ctx, "a", lock["a"], time.Time{}); err != nil {
		e.Fatal(err)
	}
	expect("releasing a", 5, 2)
	e.remove(storage.Ref{ID: "b", Lock: lock["b"]}, storage.Ref{ID: "later"}, storage.Ref{ID: "missing"})
	expect("removing leased b, unleased later and a missing row", 3, 1)
	e.remove(storage.Ref{ID: "c"})
	expect("removing leased c without its lock", 2, 0)
	if err := e.s.Cancel(e.ctx, "a"); err != nil {
		e.Fatal(err)
	}
	expect("cancelling a", 1, 0)

	// Expiry: a lease counts until something frees it.
	e.leaseOne("d", time.Minute)
	expect("leasing d", 1, 1)
	e.clock.Advance(time.Minute)
	expect("d's lease expired", 1, 1)
	if n, err := e.s.Reap(e.ctx); err != nil || n != 1 {
		e.Fatalf("Reap = %d, %v; want 1", n, err)
	}
	expect("reaping d", 1, 0)
	e.leaseOne("d", time.Minute)
	e.clock.Advance(time.Minute)
	e.leaseOne("d", time.Minute)
	expect("leasing d again after its lease expired", 1, 1)
	e.clock.Advance(time.Minute)
	if err := e.s.Reschedule(e.ctx, "d", at(-time.Minute)); err != nil {
		e.Fatal(err)
	}
	expect("rescheduling d after its lease expired", 1, 0)
	e.leaseOne("d", time.Minute)
	e.clock.Advance(time.Minute)
	if err := e.s.Cancel(e.ctx, "d"); err != nil {
		e.Fatal(err)
	}
	expect("cancelling d after its lease expired", 0, 0)
}

// testLeasedBy counts each owner's leases apart, however many Lease calls
// made them, and no further than atMost.
func testLeasedBy(e *env) {
	lc := optional[storage.LeaseCounter](e)
	_, err := lc.LeasedBy(e.ctx, "host-1", 10)
	e.skipUnsupported(err)
	expect := func(when, owner string, atMost, want int) {
		e.Helper()
		if n, err := lc.LeasedBy(e.ctx, owner, atMost); err != nil || n != want {
			e.Fatalf("%s: LeasedBy(%q, %d) = %d, %v; want %d", when, owner, atMost, n, err, want)
		}
	}
	e.insertDue("r1", "r2", "r3", "r4", "r5", "r6", "r7", "r8")
	expect("before any lease", "host-1", 10, 0)
	mine := e.lease("host-1", 1, time.Minute)
	mine = append(mine, e.lease("host-1", 1, time.Minute)...)
	// host-1 is a prefix of host-12, and host of both.
	theirs := e.lease("host-12", 3, time.Hour)
	e.lease("other", 1, time.Minute)
	if len(mine) != 2 || len(theirs) != 3 {
		e.Fatalf("leased %d and %d rows, want 2 and 3", len(mine), len(theirs))
	}
	for owner, want := range map[string]int{"host-1": 2, "host-12": 3, "other": 1, "host": 0, "nobody": 0} {
		expect("after leasing", owner, 10, want)
	}
	expect("atMost above the count", "host-1", 3, 2)
	expect("atMost at the count", "host-12", 3, 3)
	expect("atMost below the count", "host-12", 2, 2)
	expect("atMost below the count", "host-12", 1, 1)
	for _, atMost := range []int{0, -1} {
		if n, err := lc.LeasedBy(e.ctx, "host-1", atMost); err == nil {
			e.Errorf("LeasedBy with atMost %d = %d, no error", atMost, n)
		}
	}

	if err := e.s.Release(e.ctx, theirs[0].ID, theirs[0].Lock, time.Time{}); err != nil {
		e.Fatal(err)
	}
	expect("a release", "host-12", 10, 2)
	e.remove(storage.Ref{ID: mine[0].ID, Lock: mine[0].Lock})
	expect("a removal", "host-1", 10, 1)
	e.clock.Advance(time.Minute)
	expect("the lease expired", "host-1", 10, 1)
	if n, err := e.s.Reap(e.ctx); err != nil || n != 2 {
		e.Fatalf("Reap = %d, %v; want 2", n, err)
	}
	expect("Reap", "host-1", 10, 0)
	expect("Reap", "other", 10, 0)
	expect("Reap", "host-12", 10, 2)
	e.clock.Advance(time.Hour)
	if ls := e.lease("other", 10, time.Minute); len(ls) != 7 {
		e.Fatalf("other leased %d rows, want all 7", len(ls))
	}
	expect("other took the expired leases", "host-12", 10, 0)
	expect("other took the expired leases", "other", 10, 7)
}

// testGetMany reads exactly the pending rows named, each as Get reads it.
func testGetMany(e *env) {
	mg := optional[storage.MultiGetter](e)
	got, err := mg.GetMany(e.ctx, nil)
	e.skipUnsupported(err)
	if err != nil || got == nil || len(got) != 0 {
		e.Fatalf("GetMany(nil) = %v, %v; want an empty map", got, err)
	}
	full := storage.Timeout{
		ID:          "full",
		Destination: "orders.billing",
		DueAt:       at(-time.Hour + 123456*time.Microsecond),
		ReceivedAt:  at(-2 * time.Hour),
		Message:     []byte{0, 1, 2, 0xff, 'h', 'i', 0},
		Attempts:    2,
		LastError:   "NO_ROUTE",
		NotBefore:   at(time.Hour),
	}
	e.insert(full)
	e.insertDue("leased", "failed", "unasked", "gone")
	lock := map[string]string{}
	for _, l := range e.lease("o", 10, time.Minute) {
		lock[l.ID] = l.Lock
	}
	if _, err := e.s.IncrementFailureCount(e.ctx, "failed", lock["failed"], "boom"); err != nil {
		e.Fatal(err)
	}
	if err := e.s.Release(e.ctx, "failed", lock["failed"], at(time.Minute)); err != nil {
		e.Fatal(err)
	}
	e.remove(storage.Ref{ID: "gone"})

	ids := []string{"full", "leased", "missing", "failed", "full", "gone"}
	got, err = mg.GetMany(e.ctx, ids)
	if err != nil {
		e.Fatalf("GetMany(%q): %v", ids, err)
	}
	if keys := slices.Sorted(maps.Keys(got)); !slices.Equal(keys, []string{"failed", "full", "leased"}) {
		e.Fatalf("GetMany(%q) returned %q, want failed, full and leased", ids, keys)
	}
	for id, row := range got {
		if diff := cmp.Diff(e.get(id), row, cmpOpts); diff != "" {
			e.Fatalf("GetMany[%s] differs from Get (-Get +GetMany):\n%s", id, diff)
		}
	}
	if got["leased"].Lock != lock["leased"] || got["failed"].Attempts != 1 {
		e.Fatalf("GetMany rows are not the current ones: %+v", got)
	}
	// Copies, one of each row: a caller's change reaches neither the store
	// nor another row.
	copy(got["full"].Message, "XXXXXXX")
	if row := e.get("full"); !slices.Equal(row.Message, full.Message) {
		e.Fatalf("GetMany returns the store's own Message: Get now reads %q", row.Message)
	}
	if string(got["leased"].Message) != "body of leased" {
		e.Fatalf("rows of one GetMany share a Message: %q", got["leased"].Message)
	}

	for _, ids := range [][]string{{}, {"missing", "gone"}} {
		if got, err := mg.GetMany(e.ctx, ids); err != nil || got == nil || len(got) != 0 {
			e.Fatalf("GetMany(%q) = %v, %v; want an empty map", ids, got, err)
		}
	}

	// A dispatcher message's worth of ids.
	var many []storage.Timeout
	for i := range 250 {
		many = append(many, newTimeout(fmt.Sprintf("m%03d", i), at(time.Duration(i)*time.Second)))
	}
	e.insert(many...)
	ids = nil
	for _, t := range many {
		ids = append(ids, t.ID)
	}
	got, err = mg.GetMany(e.ctx, ids)
	if err != nil || len(got) != len(many) {
		e.Fatalf("GetMany of %d ids returned %d rows, %v", len(many), len(got), err)
	}
	for _, t := range many {
		if diff := cmp.Diff(t, got[t.ID], cmpOpts); diff != "" {
			e.Fatalf("GetMany[%s] differs from the inserted row (-inserted +GetMany):\n%s", t.ID, diff)
		}
	}
}
