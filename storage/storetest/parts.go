package storetest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/wire"
)

// The parts of storage.Store beyond its core: every store has them.

// partCalls calls with ctx each method of the parts of storage.Store
// (Stater, LeaseCounter and the others) and returns the errors by method
// name.
func (e *env) partCalls(ctx context.Context) map[string]error {
	errs := map[string]error{}
	_, _, errs["Stats"] = e.s.Stats(ctx)
	_, errs["LeasedBy"] = e.s.LeasedBy(ctx, "o", 10)
	_, errs["GetMany"] = e.s.GetMany(ctx, []string{"a"})
	_, _, errs["CancelSaga"] = e.s.CancelSaga(ctx, "saga")
	_, _, _, errs["ReplaceGroups"] = e.s.ReplaceGroups(ctx, []string{"group"}, []storage.Timeout{newTimeout("r", at(0))})
	_, errs["CountByDestination"] = e.s.CountByDestination(ctx, T0, T0.Add(time.Minute))
	_, errs["Bulk"] = e.s.Bulk(ctx, storage.ListFilter{Destination: "q"}, storage.BulkAction{Kind: storage.BulkCancel})
	_, errs["Paused"] = e.s.Paused(ctx)
	_, errs["Pause"] = e.s.Pause(ctx, wire.Queue("q"), "")
	_, errs["Resume"] = e.s.Resume(ctx, wire.Queue("q"))
	return errs
}

// testStats follows both counts through every call that changes them.
func testStats(e *env) {
	expect := func(after string, pending, leased int) {
		e.Helper()
		p, l, err := e.s.Stats(e.ctx)
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
	if err := e.s.Cancel(e.ctx, "a", storage.CancelOrdered); err != nil {
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
	if err := e.s.Cancel(e.ctx, "d", storage.CancelOrdered); err != nil {
		e.Fatal(err)
	}
	expect("cancelling d after its lease expired", 0, 0)
}

// testLeasedBy counts each owner's leases apart, however many Lease calls
// made them, and no further than atMost.
func testLeasedBy(e *env) {
	expect := func(when, owner string, atMost, want int) {
		e.Helper()
		if n, err := e.s.LeasedBy(e.ctx, owner, atMost); err != nil || n != want {
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
		if n, err := e.s.LeasedBy(e.ctx, "host-1", atMost); err == nil {
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
	got, err := e.s.GetMany(e.ctx, nil)
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
	got, err = e.s.GetMany(e.ctx, ids)
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
		if got, err := e.s.GetMany(e.ctx, ids); err != nil || got == nil || len(got) != 0 {
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
	got, err = e.s.GetMany(e.ctx, ids)
	if err != nil || len(got) != len(many) {
		e.Fatalf("GetMany of %d ids returned %d rows, %v", len(many), len(got), err)
	}
	for _, t := range many {
		if diff := cmp.Diff(t, got[t.ID], cmpOpts); diff != "" {
			e.Fatalf("GetMany[%s] differs from the inserted row (-inserted +GetMany):\n%s", t.ID, diff)
		}
	}
}

// testCancelSaga: CancelSaga removes the saga's rows that are not leased,
// counts the leased ones and leaves them, touches no other saga (not one
// whose id its id begins with), and tombstones the ids it removed, not the
// saga.
func testCancelSaga(e *env) {
	mk := func(id, saga string, due time.Duration) storage.Timeout {
		t := newTimeout(id, at(due))
		t.SagaID = saga
		return t
	}
	rows := []storage.Timeout{
		mk("s1-leased", "s1", -2*time.Minute),
		mk("s1-due", "s1", -time.Minute),
		mk("s1-later", "s1", time.Hour),
		mk("s1x-row", "s1x", time.Hour),
		mk("s-row", "s", time.Hour),
		mk("plain", "", time.Hour),
	}
	e.insert(rows...)
	for _, want := range rows {
		if diff := cmp.Diff(want, e.get(want.ID), cmpOpts); diff != "" {
			e.Fatalf("Get(%q) after Insert differs (-inserted +got):\n%s", want.ID, diff)
		}
	}
	listed, _, err := e.s.List(e.ctx, storage.ListFilter{Limit: 10})
	if err != nil {
		e.Fatalf("List: %v", err)
	}
	if len(listed) != len(rows) {
		e.Fatalf("List returned %d rows, want %d", len(listed), len(rows))
	}
	for _, t := range listed {
		if want := e.get(t.ID).SagaID; t.SagaID != want {
			e.Fatalf("List row %q has saga %q, want %q", t.ID, t.SagaID, want)
		}
	}
	lease := e.lease("o", 1, time.Minute)
	if len(lease) != 1 || lease[0].ID != "s1-leased" {
		e.Fatalf("Lease = %v, want [s1-leased]", leaseIDs(lease))
	}
	cancelSaga := func(saga string, wantCancelled, wantLeased int) {
		e.Helper()
		c, l, err := e.s.CancelSaga(e.ctx, saga)
		if err != nil || c != wantCancelled || l != wantLeased {
			e.Fatalf("CancelSaga(%q) = %d cancelled, %d leased, %v; want %d, %d", saga, c, l, err, wantCancelled, wantLeased)
		}
	}
	cancelSaga("s1", 2, 1)
	e.expectMissing("s1-due")
	e.expectMissing("s1-later")
	for _, id := range []string{"s1-leased", "s1x-row", "s-row", "plain"} {
		e.get(id)
	}
	if p, l, err := e.s.Stats(e.ctx); err != nil || p != 4 || l != 1 {
		e.Fatalf("Stats after CancelSaga = %d pending, %d leased, %v; want 4, 1", p, l, err)
	}
	cancelSaga("s1", 0, 1)
	// The lease still holds the row: the dispatcher removes it.
	if res := e.remove(storage.Ref{ID: "s1-leased", Lock: lease[0].Lock}); res[0] != nil {
		e.Fatalf("Remove of the leased saga row: %v", res[0])
	}
	cancelSaga("s1", 0, 0)
	// A removed id stays cancelled for the window; the saga does not.
	if got := e.insert(mk("s1-due", "s1", time.Hour), mk("s1-new", "s1", time.Hour)); got[0] || !got[1] {
		e.Fatalf("Insert after CancelSaga = %v, want [false true]", got)
	}
	e.expectMissing("s1-due")
	cancelSaga("s1", 1, 0)
	e.clock.Set(at(window))
	if got := e.insert(mk("s1-due", "s1", time.Hour)); !got[0] {
		e.Fatal("a cancelled saga timeout's id is still cancelled when the window has passed")
	}
	cancelSaga("s1", 1, 0)
	// An expired lease does not hold a row back.
	e.insert(mk("s2-a", "s2", -time.Minute))
	e.leaseOne("s2-a", time.Minute)
	e.clock.Advance(time.Minute)
	cancelSaga("s2", 1, 0)
	e.expectMissing("s2-a")
	if _, _, err := e.s.CancelSaga(e.ctx, ""); err == nil {
		e.Fatal("CancelSaga of an empty saga id succeeded")
	}
	for _, id := range []string{"s1x-row", "s-row", "plain"} {
		e.get(id)
	}
}

// testReplaceGroups: ReplaceGroups cancels the groups' rows that are not
// leased (tombstoned, as CancelSaga's), spares the rows it inserts itself
// (a repeat changes nothing), touches no other row, inserts as Insert
// does, and does nothing at all when it fails.
func testReplaceGroups(e *env) {
	mk := func(id, group string, due time.Duration) storage.Timeout {
		t := newTimeout(id, at(due))
		t.SagaID = group
		return t
	}
	e.insert(mk("g1-leased", "g1", -time.Minute), mk("g1-old", "g1", time.Hour), mk("g2-old", "g2", time.Hour),
		mk("g10-row", "g10", time.Hour), mk("plain", "", time.Hour))
	lease := e.leaseOne("g1-leased", time.Minute)
	replace := func(groups []string, ts []storage.Timeout, wantInserted []bool, wantCancelled, wantLeased int) {
		e.Helper()
		outcomes, c, l, err := e.s.ReplaceGroups(e.ctx, groups, ts)
		got := make([]bool, len(outcomes))
		for i, o := range outcomes {
			got[i] = o == storage.Stored
		}
		if err != nil || !slices.Equal(got, wantInserted) || c != wantCancelled || l != wantLeased {
			e.Fatalf("ReplaceGroups(%v) = %v, %d cancelled, %d leased, %v; want %v, %d, %d",
				groups, got, c, l, err, wantInserted, wantCancelled, wantLeased)
		}
	}
	batch := []storage.Timeout{mk("g1-new", "g1", 2*time.Hour), mk("g2-new", "g2", 2*time.Hour),
		mk("other", "", 2*time.Hour), mk("g3-new", "g3", 2*time.Hour)}
	replace([]string{"g1", "g2", "g3"}, batch, []bool{true, true, true, true}, 2, 1)
	e.expectMissing("g1-old")
	e.expectMissing("g2-old")
	for _, want := range batch {
		if diff := cmp.Diff(want, e.get(want.ID), cmpOpts); diff != "" {
			e.Fatalf("Get(%q) after ReplaceGroups differs (-inserted +got):\n%s", want.ID, diff)
		}
	}
	for _, id := range []string{"g1-leased", "g10-row", "plain"} {
		e.get(id)
	}
	if p, l, err := e.s.Stats(e.ctx); err != nil || p != 7 || l != 1 {
		e.Fatalf("Stats after ReplaceGroups = %d pending, %d leased, %v; want 7, 1", p, l, err)
	}
	// A repeat (its first answer lost) finds its own rows: duplicates.
	replace([]string{"g1", "g2", "g3"}, batch, []bool{false, false, false, false}, 0, 1)
	for _, want := range batch {
		e.get(want.ID)
	}
	// The cancelled ids are tombstoned, as CancelSaga leaves them.
	replace([]string{"g2"}, []storage.Timeout{mk("g2-old", "g2", time.Hour), mk("g2-next", "g2", time.Hour)}, []bool{false, true}, 1, 0)
	e.expectMissing("g2-new")
	e.expectMissing("g2-old")
	// No groups: an Insert.
	replace(nil, []storage.Timeout{mk("solo", "g1", time.Hour)}, []bool{true}, 0, 0)
	e.get("g1-new")
	// A failure changes nothing: the groups' rows stay.
	bad := newTimeout("bad", at(time.Hour))
	bad.Destination = ""
	if _, _, _, err := e.s.ReplaceGroups(e.ctx, []string{"g1"}, []storage.Timeout{mk("g1-x", "g1", time.Hour), bad}); err == nil {
		e.Fatal("ReplaceGroups with a row without destination succeeded")
	}
	if _, _, _, err := e.s.ReplaceGroups(e.ctx, []string{"g1", ""}, nil); err == nil {
		e.Fatal("ReplaceGroups of an empty group succeeded")
	}
	for _, id := range []string{"g1-new", "solo", "g1-leased"} {
		e.get(id)
	}
	e.expectMissing("g1-x")
	// The leased row stays its lease's; once removed, the group empties.
	if res := e.remove(storage.Ref{ID: "g1-leased", Lock: lease.Lock}); res[0] != nil {
		e.Fatalf("Remove of the leased group row: %v", res[0])
	}
	replace([]string{"g1"}, nil, []bool{}, 2, 0)
	for _, id := range []string{"g10-row", "plain", "other", "g3-new", "g2-next"} {
		e.get(id)
	}
}

// testReleaseLeases: a store that is not shared is a storage.LeaseReleaser,
// and ReleaseLeases frees every lease, of every owner, expired or not: the
// rows are leasable at once, and no count holds them. A shared store has
// other processes' leases, which no one of them may free: nothing to check.
func testReleaseLeases(e *env) {
	if e.s.Properties().Shared {
		return
	}
	r, ok := e.s.(storage.LeaseReleaser)
	if !ok {
		e.Fatalf("%T is not shared but is no storage.LeaseReleaser", e.s)
	}
	e.insertDue("a", "b", "c")
	e.lease("o", 1, time.Minute)
	live := e.lease("p", 2, time.Hour)
	e.clock.Advance(time.Minute) // o's lease expired, not yet freed
	if n := r.ReleaseLeases(); n != 3 {
		e.Fatalf("ReleaseLeases = %d, want 3 (one expired)", n)
	}
	if _, l, err := e.s.Stats(e.ctx); err != nil || l != 0 {
		e.Fatalf("Stats after ReleaseLeases = %d leased, %v; want 0", l, err)
	}
	for _, owner := range []string{"o", "p"} {
		if n, err := e.s.LeasedBy(e.ctx, owner, 10); err != nil || n != 0 {
			e.Fatalf("LeasedBy(%q) after ReleaseLeases = %d, %v; want 0", owner, n, err)
		}
	}
	if err := e.s.Release(e.ctx, live[0].ID, live[0].Lock, time.Time{}); !errors.Is(err, storage.ErrConcurrency) {
		e.Fatalf("Release with a freed lease's lock = %v, want ErrConcurrency", err)
	}
	if got := e.lease("q", 10, time.Minute); len(got) != 3 {
		e.Fatalf("leased %d rows after ReleaseLeases, want all 3", len(got))
	}
	if n := r.ReleaseLeases(); n != 3 {
		e.Fatalf("ReleaseLeases again = %d, want 3", n)
	}
}
