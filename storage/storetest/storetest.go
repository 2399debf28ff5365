// Package storetest is the conformance suite of storage.Store: every backend
// runs Run from its own tests.
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T, clock *storetest.Clock) storage.Store {
//			s, err := mystore.Open(..., clock.Now)
//			if err != nil {
//				t.Fatal(err)
//			}
//			return s
//		})
//	}
//
// Beyond the comments in package storage, the suite pins down:
//
//   - A row is due when DueAt <= now and NotBefore <= now; a lease is valid
//     while now < LockExpiresAt, and a row whose lease reached LockExpiresAt
//     is leasable again. All times come from the injected clock.
//   - Insert stores ID, Destination, Exchange, DueAt, ReceivedAt, Message,
//     Attempts, LastError and NotBefore; it ignores Lock and LockExpiresAt (a
//     new row is never leased). What storage.CheckInsert refuses (an empty
//     ID, an empty Destination without an Exchange, a saga id with a NUL...)
//     fails the whole call; with an Exchange, an empty Destination (routing
//     key) is stored as such.
//   - List's filter tells queues from exchanges: a Destination alone
//     selects the rows for that queue only, never an exchange's rows with
//     that routing key.
//   - Lease with limit <= 0 or a duration <= 0 is an error. Each lease gets a
//     lock token no other lease ever had, even for the same owner.
//   - A non-empty lock given to Remove, Release or IncrementFailureCount must
//     be the row's current lock and the lease must not have expired, else
//     ErrConcurrency. Release and IncrementFailureCount of a missing row give
//     ErrNotFound whatever the lock.
//   - Get returns times that are Equal to those stored; the suite stores
//     whole microseconds only, so backends with microsecond precision pass.
//     nil and empty Message are not told apart.
//   - Every method returns ErrClosed after Close, and a call racing Close
//     either completes or returns ErrClosed; Close twice is no error. A
//     cancelled context fails the call with an error wrapping ctx.Err().
//   - A Cancel that finds no row, or removes one, leaves a tombstone for
//     storage.DefaultCancelWindow (stores are opened with the default):
//     Insert then reports the id false and stores nothing, until the window
//     has passed. A Cancel that found the row leased leaves none. Reap keeps
//     live tombstones.
//   - Every method of the parts of storage.Store (Stater, LeaseCounter,
//     MultiGetter and the others) is checked on every store. LeasedBy with
//     atMost <= 0 is an error.
//   - A store that is not shared (storage.Properties) is a
//     storage.LeaseReleaser, whose ReleaseLeases frees every lease.
package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/wire"
)

// T0 is the time every fake clock of the suite starts at.
var T0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// Run runs the conformance suite. open must return a fresh, empty store that
// reads time from clock.Now; the suite closes it when the subtest ends.
func Run(t *testing.T, open func(t *testing.T, clock *Clock) storage.Store) {
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clock := NewClock(T0)
			s := open(t, clock)
			if s == nil {
				t.Fatal("open returned a nil store")
			}
			t.Cleanup(func() { _ = s.Close() })
			tc.fn(&env{T: t, s: s, clock: clock, ctx: context.Background()})
		})
	}
}

var tests = []struct {
	name string
	fn   func(e *env)
}{
	{"InsertGetRoundTrip", testInsertGetRoundTrip},
	{"InsertGetMinimalRow", testInsertGetMinimalRow},
	{"InsertGetExchange", testInsertGetExchange},
	{"InsertAndGetCopy", testInsertAndGetCopy},
	{"InsertIgnoresLockFields", testInsertIgnoresLockFields},
	{"InsertLargeAndOddValues", testInsertLargeAndOddValues},
	{"GetMissing", testGetMissing},
	{"InsertEmptyBatch", testInsertEmptyBatch},
	{"InsertIdempotent", testInsertIdempotent},
	{"InsertIdempotentWithinBatch", testInsertIdempotentWithinBatch},
	{"InsertIdempotentWhileLeased", testInsertIdempotentWhileLeased},
	{"InsertSends", testInsertSends},
	{"InsertSetsKeys", testInsertSetsKeys},
	{"InsertConcurrentSameIDs", testInsertConcurrentSameIDs},
	{"InsertValidation", testInsertValidation},
	{"ReinsertAfterRemove", testReinsertAfterRemove},
	{"LeaseEmptyStore", testLeaseEmptyStore},
	{"LeaseDueOrder", testLeaseDueOrder},
	{"LeaseOrderAcrossBatches", testLeaseOrderAcrossBatches},
	{"LeaseDueExactlyNow", testLeaseDueExactlyNow},
	{"LeaseSubMicrosecondNeverEarly", testLeaseSubMicrosecondNeverEarly},
	{"LeaseInsertedNotBefore", testLeaseInsertedNotBefore},
	{"LeaseDueBy", testLeaseDueBy},
	{"LeaseLimit", testLeaseLimit},
	{"LeaseInvalidArguments", testLeaseInvalidArguments},
	{"LeaseRecordsLockOnRow", testLeaseRecordsLockOnRow},
	{"LeaseLocksUnique", testLeaseLocksUnique},
	{"LeaseExclusiveConcurrent", testLeaseExclusiveConcurrent},
	{"LeaseRemoveConcurrent", testLeaseRemoveConcurrent},
	{"LeaseExpiry", testLeaseExpiry},
	{"ExpiredLockRejected", testExpiredLockRejected},
	{"Remove", testRemove},
	{"RemoveMixedBatch", testRemoveMixedBatch},
	{"Release", testRelease},
	{"ReleaseNotBefore", testReleaseNotBefore},
	{"ReleaseNotBeforeEarlierThanDue", testReleaseNotBeforeEarlierThanDue},
	{"ReleaseErrors", testReleaseErrors},
	{"ReleaseUnconditional", testReleaseUnconditional},
	{"ReleaseEach", testReleaseEach},
	{"ReleaseEachMany", testReleaseEachMany},
	{"IncrementFailureCount", testIncrementFailureCount},
	{"IncrementFailureCountErrors", testIncrementFailureCountErrors},
	{"NextDue", testNextDue},
	{"NextDueExtremeTimes", testNextDueExtremeTimes},
	{"Reap", testReap},
	{"List", testList},
	{"ListFilters", testListFilters},
	{"ListFiltersExchange", testListFiltersExchange},
	{"ListFiltersSaga", testListFiltersSaga},
	{"Cancel", testCancel},
	{"CancelTombstone", testCancelTombstone},
	{"CancelTombstoneAfterRemoval", testCancelTombstoneAfterRemoval},
	{"CancelTombstoneRepeated", testCancelTombstoneRepeated},
	{"CancelTombstoneSurvivesReap", testCancelTombstoneSurvivesReap},
	{"CancelInsertConcurrent", testCancelInsertConcurrent},
	{"CancelSends", testCancelSends},
	{"CancelFound", testCancelFound},
	{"RescheduleSends", testRescheduleSends},
	{"CancelSagaSends", testCancelSagaSends},
	{"BulkCancelSends", testBulkCancelSends},
	{"Reschedule", testReschedule},
	{"RescheduleRange", testRescheduleRange},
	{"Stats", testStats},
	{"LeasedBy", testLeasedBy},
	{"ReleaseLeases", testReleaseLeases},
	{"GetMany", testGetMany},
	{"CancelSaga", testCancelSaga},
	{"ReplaceGroups", testReplaceGroups},
	{"BulkCancel", testBulkCancel},
	{"BulkReschedule", testBulkReschedule},
	{"ListFiltersIDPrefixHeader", testListFiltersIDPrefixHeader},
	{"CountByDestination", testCountByDestination},
	{"Pause", testPause},
	{"PauseMany", testPauseMany},
	{"PauseInsertConcurrent", testPauseInsertConcurrent},
	{"Closed", testClosed},
	{"CloseDuringCalls", testCloseDuringCalls},
	{"ContextCancelled", testContextCancelled},
}

// env is one subtest's store and clock.
type env struct {
	*testing.T
	s     storage.Store
	clock *Clock
	ctx   context.Context
}

// cmpOpts compare timeouts: times with Equal (cmp's default for types with
// an Equal method), nil and empty slices alike.
var cmpOpts = cmp.Options{cmpopts.EquateEmpty()}

// at is T0 plus d; the suite stores whole microseconds only.
func at(d time.Duration) time.Time { return T0.Add(d) }

func newTimeout(id string, due time.Time) storage.Timeout {
	return storage.Timeout{
		ID:          id,
		Destination: "dest." + id,
		DueAt:       due,
		ReceivedAt:  T0.Add(-time.Hour),
		Message:     []byte("body of " + id),
	}
}

// MustInsert inserts ts into s and fails the test unless every row is
// stored: for a backend's own tests.
func MustInsert(t testing.TB, s storage.Store, ts ...storage.Timeout) {
	t.Helper()
	got, err := s.Insert(context.Background(), ts)
	if err != nil {
		t.Fatalf("Insert: %v", err)
	}
	for i, o := range got {
		if o != storage.Stored {
			t.Fatalf("Insert of %q returned %v", ts[i].ID, o)
		}
	}
}

// insert inserts ts and reports for each whether it was stored.
func (e *env) insert(ts ...storage.Timeout) []bool {
	e.Helper()
	got := e.insertOutcomes(ts...)
	stored := make([]bool, len(got))
	for i, o := range got {
		stored[i] = o == storage.Stored
	}
	return stored
}

// insertOutcomes inserts ts and returns Insert's outcomes.
func (e *env) insertOutcomes(ts ...storage.Timeout) []storage.Outcome {
	e.Helper()
	got, err := e.s.Insert(e.ctx, ts)
	return oneEach(e, "Insert", len(ts), got, err)
}

// oneEach fails the test when call, a call about n items, failed or did not
// answer each item once; it returns the answers.
func oneEach[R any](e *env, call string, n int, got []R, err error) []R {
	e.Helper()
	if err != nil {
		e.Fatalf("%s: %v", call, err)
	}
	if len(got) != n {
		e.Fatalf("%s returned %d results for %d items", call, len(got), n)
	}
	return got
}

func (e *env) insertDue(ids ...string) {
	e.Helper()
	var ts []storage.Timeout
	for _, id := range ids {
		ts = append(ts, newTimeout(id, at(-time.Minute)))
	}
	for i, ok := range e.insert(ts...) {
		if !ok {
			e.Fatalf("Insert of new id %q returned false", ids[i])
		}
	}
}

func (e *env) lease(owner string, limit int, d time.Duration) []storage.Lease {
	e.Helper()
	ls, err := e.s.Lease(e.ctx, owner, time.Time{}, limit, d)
	if err != nil {
		e.Fatalf("Lease(%q, %d, %s): %v", owner, limit, d, err)
	}
	if len(ls) > limit {
		e.Fatalf("Lease(limit %d) returned %d rows", limit, len(ls))
	}
	for _, l := range ls {
		if l.Lock == "" {
			e.Fatalf("Lease returned row %q with an empty lock", l.ID)
		}
	}
	return ls
}

// leaseOne leases exactly the row id.
func (e *env) leaseOne(id string, d time.Duration) storage.Lease {
	e.Helper()
	ls := e.lease("owner", 1000, d)
	if len(ls) != 1 || ls[0].ID != id {
		e.Fatalf("Lease: got %v, want exactly [%s]", leaseIDs(ls), id)
	}
	return ls[0]
}

func (e *env) expectNoLease() {
	e.Helper()
	if ls := e.lease("probe", 1000, time.Minute); len(ls) != 0 {
		e.Fatalf("at %s Lease returned %v, want nothing", e.clock.Now().Format(time.RFC3339Nano), leaseIDs(ls))
	}
}

func (e *env) get(id string) storage.Timeout {
	e.Helper()
	got, err := e.s.Get(e.ctx, id)
	if err != nil {
		e.Fatalf("Get(%q): %v", id, err)
	}
	return got
}

func (e *env) expectMissing(id string) {
	e.Helper()
	_, err := e.s.Get(e.ctx, id)
	if !errors.Is(err, storage.ErrNotFound) {
		e.Fatalf("Get(%q) = %v, want ErrNotFound", id, err)
	}
}

func (e *env) remove(refs ...storage.Ref) []error {
	e.Helper()
	res, err := e.s.Remove(e.ctx, refs)
	return oneEach(e, "Remove", len(refs), res, err)
}

func (e *env) nextDue() (time.Time, bool) {
	e.Helper()
	t, ok, err := e.s.NextDue(e.ctx)
	if err != nil {
		e.Fatalf("NextDue: %v", err)
	}
	return t, ok
}

func (e *env) expectNextDue(want time.Time) {
	e.Helper()
	got, ok := e.nextDue()
	if !ok || !got.Equal(want) {
		e.Fatalf("NextDue = %s, %v; want %s, true", got.Format(time.RFC3339Nano), ok, want.Format(time.RFC3339Nano))
	}
}

func (e *env) expectErr(what string, err, want error) {
	e.Helper()
	if !errors.Is(err, want) {
		e.Fatalf("%s: got error %v, want %v", what, err, want)
	}
}

func leaseIDs(ls []storage.Lease) []string {
	ids := make([]string, len(ls))
	for i, l := range ls {
		ids[i] = l.ID
	}
	return ids
}

func rowIDs(ts []storage.Timeout) []string {
	ids := make([]string, len(ts))
	for i := range ts {
		ids[i] = ts[i].ID
	}
	return ids
}

func sortedIDs(ls []storage.Lease) []string {
	ids := leaseIDs(ls)
	slices.Sort(ids)
	return ids
}

// --- insert and get ---

func testInsertGetRoundTrip(e *env) {
	zone := time.FixedZone("IST", 5*3600+1800)
	in := storage.Timeout{
		ID:          "rt-1",
		Destination: "orders.billing",
		DueAt:       time.Date(2026, 3, 1, 17, 35, 1, 123456000, zone), // 12:05:01.123456Z
		ReceivedAt:  time.Date(2026, 3, 1, 11, 59, 58, 999999000, time.UTC),
		Message:     []byte{0, 1, 2, 0xff, 'h', 'i', 0},
		Attempts:    2,
		LastError:   "broker returned the message: NO_ROUTE",
		NotBefore:   time.Date(2026, 3, 1, 12, 10, 0, 1000, time.UTC),
		SagaID:      "2f0a7b3e-52c1-4d7e-8a9b-0c1d2e3f4a5b",
	}
	if got := e.insert(in); !got[0] {
		e.Fatal("Insert of a new id returned false")
	}
	got := e.get("rt-1")
	if diff := cmp.Diff(in, got, cmpOpts); diff != "" {
		e.Fatalf("Get after Insert differs (-inserted +got):\n%s", diff)
	}
}

func testInsertGetMinimalRow(e *env) {
	in := storage.Timeout{ID: "min", Destination: "d", DueAt: at(time.Hour)}
	e.insert(in)
	got := e.get("min")
	if diff := cmp.Diff(in, got, cmpOpts); diff != "" {
		e.Fatalf("Get after Insert differs (-inserted +got):\n%s", diff)
	}
	for name, tm := range map[string]time.Time{
		"ReceivedAt": got.ReceivedAt, "LockExpiresAt": got.LockExpiresAt, "NotBefore": got.NotBefore,
	} {
		if !tm.IsZero() {
			e.Errorf("%s = %s, want the zero time", name, tm)
		}
	}
	if len(got.Message) != 0 || got.Attempts != 0 || got.LastError != "" || got.Lock != "" {
		e.Errorf("zero fields came back set: %+v", got)
	}
}

// exchangeRows go to exchanges, and one to a queue named like their
// routing key; due in this order.
func exchangeRows() []storage.Timeout {
	mk := func(id, exchange, dest string, due time.Duration) storage.Timeout {
		t := newTimeout(id, at(due))
		t.Exchange, t.Destination = exchange, dest
		return t
	}
	return []storage.Timeout{
		mk("queue", "", "orders", time.Minute),
		mk("routed", "events", "orders", 2*time.Minute),
		mk("no-key", "events", "", 3*time.Minute),
		mk("topic", "amq.topic", "orders.created", 4*time.Minute),
		mk("other-key", "events", "billing", 5*time.Minute),
	}
}

// testInsertGetExchange: Exchange, and a routing key, even an empty one,
// come back from Get, List and GetMany as inserted.
func testInsertGetExchange(e *env) {
	in := exchangeRows()
	for i, ok := range e.insert(in...) {
		if !ok {
			e.Fatalf("Insert of new id %q returned false", in[i].ID)
		}
	}
	for _, want := range in {
		if diff := cmp.Diff(want, e.get(want.ID), cmpOpts); diff != "" {
			e.Fatalf("Get(%q) after Insert differs (-inserted +got):\n%s", want.ID, diff)
		}
	}
	rows, next, err := e.s.List(e.ctx, storage.ListFilter{Limit: 10})
	if err != nil || next != "" {
		e.Fatalf("List = %v, %q, %v", rows, next, err)
	}
	want := make([]storage.Timeout, len(in))
	for i, t := range in {
		t.Message = nil
		want[i] = t
	}
	if diff := cmp.Diff(want, rows, cmpOpts); diff != "" {
		e.Fatalf("List after Insert differs (-inserted +listed):\n%s", diff)
	}
	ids := make([]string, len(in))
	for i, t := range in {
		ids[i] = t.ID
	}
	got, err := e.s.GetMany(e.ctx, ids)
	if err != nil {
		e.Fatalf("GetMany(%q): %v", ids, err)
	}
	for _, t := range in {
		if diff := cmp.Diff(t, got[t.ID], cmpOpts); diff != "" {
			e.Fatalf("GetMany[%s] after Insert differs (-inserted +got):\n%s", t.ID, diff)
		}
	}
}

func testInsertAndGetCopy(e *env) {
	body := []byte("original")
	e.insert(storage.Timeout{ID: "c", Destination: "d", DueAt: at(time.Hour), Message: body})
	copy(body, "XXXXXXXX")
	got := e.get("c")
	if string(got.Message) != "original" {
		e.Fatalf("store shares the caller's Message: got %q", got.Message)
	}
	copy(got.Message, "YYYYYYYY")
	if again := e.get("c"); string(again.Message) != "original" {
		e.Fatalf("Get returns the store's own Message: got %q", again.Message)
	}
}

func testInsertIgnoresLockFields(e *env) {
	in := newTimeout("locked-in", at(-time.Minute))
	in.Lock = "someone:1"
	in.LockExpiresAt = at(time.Hour)
	e.insert(in)
	got := e.get("locked-in")
	if got.Lock != "" || !got.LockExpiresAt.IsZero() {
		e.Fatalf("inserted row is leased: Lock %q, LockExpiresAt %s", got.Lock, got.LockExpiresAt)
	}
	l := e.leaseOne("locked-in", time.Minute)
	if l.Lock == in.Lock {
		e.Fatalf("lease reused the lock %q given to Insert", l.Lock)
	}
}

func testInsertLargeAndOddValues(e *env) {
	big := make([]byte, 1<<20)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range big {
		big[i] = byte(rng.Uint32())
	}
	ids := []string{
		"big",
		"ünïcødé-✓-ключ",
		"with spaces and : colons / slashes",
		"x€",
		fmt.Sprintf("long-%0500d", 7),
	}
	var ts []storage.Timeout
	for i, id := range ids {
		tm := newTimeout(id, at(time.Duration(i)*time.Second))
		if id == "big" {
			tm.Message = big
		}
		tm.Destination = "dest-" + id
		ts = append(ts, tm)
	}
	e.insert(ts...)
	for _, want := range ts {
		got := e.get(want.ID)
		if !bytes.Equal(got.Message, want.Message) {
			e.Fatalf("row %q: Message of %d bytes came back as %d different bytes", want.ID, len(want.Message), len(got.Message))
		}
		// cmp walks a byte slice element by element: compare the rest only.
		got.Message, want.Message = nil, nil
		if diff := cmp.Diff(want, got, cmpOpts); diff != "" {
			e.Fatalf("row %q differs (-inserted +got):\n%s", want.ID, diff)
		}
	}
}

func testGetMissing(e *env) {
	e.expectMissing("nope")
	e.insertDue("other")
	e.expectMissing("nope")
	e.expectMissing("othe")
	e.expectMissing("other2")
}

func testInsertEmptyBatch(e *env) {
	got, err := e.s.Insert(e.ctx, nil)
	if err != nil || len(got) != 0 {
		e.Fatalf("Insert(nil) = %v, %v; want empty, nil", got, err)
	}
	if _, ok := e.nextDue(); ok {
		e.Fatal("NextDue ok after inserting nothing")
	}
}

func testInsertIdempotent(e *env) {
	first := newTimeout("dup", at(-time.Minute))
	if got := e.insert(first); !got[0] {
		e.Fatal("first Insert returned false")
	}
	second := newTimeout("dup", at(time.Hour))
	second.Destination = "elsewhere"
	second.Message = []byte("other body")
	second.Attempts = 9
	third := newTimeout("fresh", at(time.Hour))
	if got := e.insert(second, third); got[0] || !got[1] {
		e.Fatalf("Insert(dup, fresh) = %v, want [false true]", got)
	}
	if diff := cmp.Diff(first, e.get("dup"), cmpOpts); diff != "" {
		e.Fatalf("second Insert changed the row (-first +got):\n%s", diff)
	}
	// Still due at the first row's time, not the second's.
	e.leaseOne("dup", time.Minute)
}

func testInsertIdempotentWithinBatch(e *env) {
	a := newTimeout("same", at(-time.Minute))
	b := newTimeout("same", at(time.Hour))
	b.Message = []byte("second copy")
	got := e.insert(a, newTimeout("x", at(time.Hour)), b)
	if diff := cmp.Diff([]bool{true, true, false}, got); diff != "" {
		e.Fatalf("Insert results (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(a, e.get("same"), cmpOpts); diff != "" {
		e.Fatalf("row differs from the first copy (-first +got):\n%s", diff)
	}
	e.leaseOne("same", time.Minute) // exactly one row for the id
}

// testInsertIdempotentWhileLeased: a send that matches a leased one (being
// dispatched: forwarded, its removal still to come) is another send, stored
// under the key of send 2, not a redelivery: the leased row may be gone any
// moment (docs/contract.md §2.4). The lease is untouched.
func testInsertIdempotentWhileLeased(e *env) {
	e.insertDue("l")
	l := e.leaseOne("l", time.Hour)
	again := newTimeout("l", at(-time.Hour))
	if got := e.insertOutcomes(again); got[0] != storage.Stored {
		e.Fatalf("Insert of the send of a leased row = %v, want stored (another send)", got[0])
	}
	key := wire.SendKey("l", 2)
	row := e.get("l")
	if row.Lock != l.Lock {
		e.Fatalf("Insert of a leased id changed the lock to %q", row.Lock)
	}
	if got := e.get(key); !got.DueAt.Equal(at(-time.Hour)) || got.Lock != "" {
		e.Fatalf("send 2 = due %s, lock %q; want due %s, no lock", got.DueAt, got.Lock, at(-time.Hour))
	}
	if ls := e.lease("other", 1000, time.Minute); len(ls) != 1 || ls[0].ID != key {
		e.Fatalf("Lease = %v, want exactly send 2 (%q)", leaseIDs(ls), key)
	}
	if res := e.remove(storage.Ref{ID: "l", Lock: l.Lock}); res[0] != nil {
		e.Fatalf("Remove with the lease's lock after a second send: %v", res[0])
	}
	e.get(key)
}

// testInsertSends: sends of one id that differ (their fingerprints) are
// all stored, under the id and then the lowest free key of a later send;
// a redelivery of any of them (same fingerprint, not leased) is a
// duplicate wherever it is, also once the id's own key is free again.
func testInsertSends(e *env) {
	send := func(id string, fp string, due time.Duration) storage.Timeout {
		t := newTimeout(id, at(due))
		t.Fingerprint = []byte(fp)
		return t
	}
	got := e.insertOutcomes(send("s", "one", time.Hour), send("s", "two", 2*time.Hour), send("s", "one", time.Hour),
		send("s", "three", -time.Minute))
	want := []storage.Outcome{storage.Stored, storage.Stored, storage.Duplicate, storage.Stored}
	if !slices.Equal(got, want) {
		e.Fatalf("Insert outcomes = %v, want %v", got, want)
	}
	for key, fp := range map[string]string{"s": "one", wire.SendKey("s", 2): "two", wire.SendKey("s", 3): "three"} {
		if row := e.get(key); string(row.Fingerprint) != fp {
			e.Fatalf("Get(%q) holds fingerprint %q, want %q", key, row.Fingerprint, fp)
		}
	}
	rows, _, err := e.s.List(e.ctx, storage.ListFilter{ID: "s", Limit: 10})
	if err != nil {
		e.Fatalf("List(ID s): %v", err)
	}
	if diff := cmp.Diff([]string{wire.SendKey("s", 3), "s", wire.SendKey("s", 2)}, rowIDs(rows)); diff != "" {
		e.Fatalf("List(ID s) keys, due order (-want +got):\n%s", diff)
	}
	// A cursor may end on a later send's key: pages go on from it.
	for _, f := range []storage.ListFilter{{Limit: 1}, {ID: "s", Limit: 1}} {
		if got := e.listAll(f); !slices.Equal(got, []string{wire.SendKey("s", 3), "s", wire.SendKey("s", 2)}) {
			e.Fatalf("List(%+v) pages = %q", f, got)
		}
	}
	// Send 3 is due: leased, it is being forwarded; its redelivery is then
	// a new send, under the lowest free key.
	l := e.leaseOne(wire.SendKey("s", 3), time.Minute)
	if got := e.insertOutcomes(send("s", "three", time.Hour)); got[0] != storage.Stored {
		e.Fatalf("a send matching a leased one = %v, want stored", got[0])
	}
	e.get(wire.SendKey("s", 4))
	if res := e.remove(storage.Ref{ID: l.ID, Lock: l.Lock}); res[0] != nil {
		e.Fatalf("Remove(%q): %v", l.ID, res[0])
	}
	// The id's own key is taken by nothing once "s" goes, yet a
	// redelivery of send 2 still finds it and is a duplicate.
	if res := e.remove(storage.Ref{ID: "s"}); res[0] != nil {
		e.Fatalf("Remove(s): %v", res[0])
	}
	if got := e.insertOutcomes(send("s", "two", time.Hour)); got[0] != storage.Duplicate {
		e.Fatalf("redelivery of send 2 with the id's key free = %v, want duplicate", got[0])
	}
	e.expectMissing("s")
	// A new send takes the lowest free key: the id's own.
	if got := e.insertOutcomes(send("s", "five", time.Hour)); got[0] != storage.Stored {
		e.Fatalf("a new send = %v, want stored", got[0])
	}
	if row := e.get("s"); string(row.Fingerprint) != "five" {
		e.Fatalf("the new send is not under the id's key: %q", row.Fingerprint)
	}
	// Ids that share a prefix are not sends of one another.
	if got := e.insertOutcomes(send("s2", "two", time.Hour), send("s ", "two", time.Hour)); got[0] != storage.Stored || got[1] != storage.Stored {
		e.Fatalf("ids s2 and \"s \" = %v, want both stored", got)
	}
	e.get("s2")
	e.get("s ")
	// An id holding the separator is a key, not an id: refused.
	if _, err := e.s.Insert(e.ctx, []storage.Timeout{newTimeout(wire.SendKey("s", 2), at(time.Hour))}); err == nil {
		e.Fatal("Insert of an id holding wire.SendSep succeeded")
	}
}

// testInsertSetsKeys: Insert sets the ID of each row it stored to its key,
// and leaves the others.
func testInsertSetsKeys(e *env) {
	a, b, c := newTimeout("k", at(time.Hour)), newTimeout("k", at(time.Hour)), newTimeout("k", at(time.Hour))
	b.Fingerprint = []byte("b")
	ts := []storage.Timeout{a, b, c}
	if _, err := e.s.Insert(e.ctx, ts); err != nil {
		e.Fatalf("Insert: %v", err)
	}
	if diff := cmp.Diff([]string{"k", wire.SendKey("k", 2), "k"}, rowIDs(ts)); diff != "" {
		e.Fatalf("ids after Insert (-want +got):\n%s", diff)
	}
}

func testInsertConcurrentSameIDs(e *env) {
	const workers, n = 8, 50
	var mu sync.Mutex
	wins := map[string]int{}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 99))
			ts := make([]storage.Timeout, n)
			for i, j := range rng.Perm(n) {
				ts[i] = newTimeout(fmt.Sprintf("c-%02d", j), at(-time.Minute))
			}
			got, err := e.s.Insert(e.ctx, ts)
			if err != nil {
				e.Errorf("Insert: %v", err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			for i, o := range got {
				if o == storage.Stored {
					wins[ts[i].ID]++
				}
			}
		})
	}
	wg.Wait()
	e.checkEachOnce(wins, n, "stored by Insert")
	if ls := e.lease("o", 1000, time.Minute); len(ls) != n {
		e.Fatalf("leased %d rows, want %d", len(ls), n)
	}
}

// testInsertValidation: every store refuses what storage.CheckInsert
// refuses, the whole call, before writing anything; ReplaceGroups too.
func testInsertValidation(e *env) {
	cases := map[string]storage.Timeout{
		"empty id":          {ID: "", Destination: "d", DueAt: at(-time.Minute)},
		"empty destination": {ID: "x", Destination: "", DueAt: at(-time.Minute)},
		"id over the limit": {ID: strings.Repeat("i", storage.MaxStoredIDBytes+1), Destination: "d", DueAt: at(-time.Minute)},
		"saga id with NUL":  {ID: "x", Destination: "d", SagaID: "s\x00", DueAt: at(-time.Minute)},
		"saga key too long": {ID: "x", Destination: "d", SagaID: strings.Repeat("s", storage.MaxStoreKeyBytes-1), DueAt: at(-time.Minute)},
	}
	for name, bad := range cases {
		if storage.CheckInsert([]storage.Timeout{bad}) == nil {
			e.Fatalf("storage.CheckInsert takes a timeout with %s", name)
		}
		good := newTimeout("good", at(-time.Minute))
		got, err := e.s.Insert(e.ctx, []storage.Timeout{good, bad})
		if err == nil {
			e.Fatalf("Insert with %s: got %v and no error", name, got)
		}
		if got, _, _, err := e.s.ReplaceGroups(e.ctx, []string{"g"}, []storage.Timeout{good, bad}); err == nil {
			e.Fatalf("ReplaceGroups with %s: got %v and no error", name, got)
		}
		e.expectMissing("good")
		if bad.ID != "" {
			e.expectMissing(bad.ID)
		}
	}
	if _, ok := e.nextDue(); ok {
		e.Fatal("NextDue ok after failed Inserts: something was written")
	}
	e.expectNoLease()
}

func testReinsertAfterRemove(e *env) {
	e.insertDue("r")
	if res := e.remove(storage.Ref{ID: "r"}); res[0] != nil {
		e.Fatal(res[0])
	}
	again := newTimeout("r", at(time.Hour))
	again.Message = []byte("second life")
	if got := e.insert(again); !got[0] {
		e.Fatal("Insert after Remove returned false")
	}
	if diff := cmp.Diff(again, e.get("r"), cmpOpts); diff != "" {
		e.Fatalf("re-inserted row differs (-inserted +got):\n%s", diff)
	}
	e.expectNoLease() // due in an hour now
}

// --- lease ---

func testLeaseEmptyStore(e *env) {
	e.expectNoLease()
	if _, ok := e.nextDue(); ok {
		e.Fatal("NextDue ok on an empty store")
	}
}

func testLeaseDueOrder(e *env) {
	rows := []struct {
		id  string
		due time.Time
	}{
		{"y1600", time.Date(1600, 6, 1, 0, 0, 0, 0, time.UTC)},
		{"y1960", time.Date(1960, 5, 1, 8, 30, 0, 0, time.UTC)},
		{"y1969", time.Date(1969, 12, 31, 23, 59, 59, 999999000, time.UTC)},
		{"epoch", time.Unix(0, 0).UTC()},
		{"hour-ago-a", at(-time.Hour)},
		{"hour-ago-b", at(-time.Hour)},
		{"hour-ago-c", at(-time.Hour)},
		{"us-ago", at(-time.Microsecond)},
		{"now", at(0)},
		{"us-ahead", at(time.Microsecond)},
		{"hour-ahead", at(time.Hour)},
		{"y2200", time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC)},
	}
	due := map[string]time.Time{}
	var ts []storage.Timeout
	for _, r := range rows {
		due[r.id] = r.due
		ts = append(ts, newTimeout(r.id, r.due))
	}
	rng := rand.New(rand.NewPCG(7, 11))
	rng.Shuffle(len(ts), func(i, j int) { ts[i], ts[j] = ts[j], ts[i] })
	// Half in one batch, the rest one by one.
	e.insert(ts[:len(ts)/2]...)
	for _, t := range ts[len(ts)/2:] {
		e.insert(t)
	}

	check := func(ls []storage.Lease, want ...string) {
		e.Helper()
		if len(ls) != len(want) {
			e.Fatalf("at %s leased %v, want %v (in any order among equal due times)", e.clock.Now(), leaseIDs(ls), want)
		}
		for i, l := range ls {
			if !l.DueAt.Equal(due[l.ID]) {
				e.Errorf("lease of %s has DueAt %s, row is due %s", l.ID, l.DueAt, due[l.ID])
			}
			if !due[l.ID].Equal(due[want[i]]) {
				e.Fatalf("at %s leased %v, want %v (in any order among equal due times)", e.clock.Now(), leaseIDs(ls), want)
			}
		}
		got := sortedIDs(ls)
		w := slices.Clone(want)
		slices.Sort(w)
		if !slices.Equal(got, w) {
			e.Fatalf("leased %v, want %v", leaseIDs(ls), want)
		}
	}

	check(e.lease("o", 100, 48*time.Hour),
		"y1600", "y1960", "y1969", "epoch", "hour-ago-a", "hour-ago-b", "hour-ago-c", "us-ago", "now")
	e.expectNoLease()
	e.clock.Set(at(time.Microsecond - time.Nanosecond))
	e.expectNoLease()
	e.clock.Set(at(time.Microsecond))
	check(e.lease("o", 100, 48*time.Hour), "us-ahead")
	e.clock.Set(at(time.Hour - time.Nanosecond))
	e.expectNoLease()
	e.clock.Set(at(time.Hour))
	check(e.lease("o", 100, 48*time.Hour), "hour-ahead")
	e.clock.Set(time.Date(2199, 12, 31, 23, 59, 59, 999999999, time.UTC))
	// The leases above (48h) expired long ago: those rows come back,
	// but y2200 is still not due.
	rest := e.lease("o", 100, time.Hour)
	if slices.Contains(leaseIDs(rest), "y2200") {
		e.Fatal("row due in 2200 leased in 2199")
	}
	if len(rest) != len(rows)-1 {
		e.Fatalf("after every lease expired, leased %d rows, want %d", len(rest), len(rows)-1)
	}
	e.clock.Set(time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC))
	check(e.lease("o", 100, time.Hour), "y2200")
	e.expectNoLease()
}

func testLeaseOrderAcrossBatches(e *env) {
	rng := rand.New(rand.NewPCG(3, 4))
	const n = 200
	due := map[string]time.Time{}
	var ts []storage.Timeout
	for i := range n {
		id := fmt.Sprintf("o-%03d", i)
		// Many collisions: only 50 distinct due times.
		d := at(-time.Duration(rng.IntN(50)) * time.Second)
		due[id] = d
		ts = append(ts, newTimeout(id, d))
	}
	e.insert(ts...)
	var all []storage.Lease
	for {
		ls := e.lease("o", 7, time.Hour)
		if len(ls) == 0 {
			break
		}
		if len(ls) != 7 && len(all)+len(ls) != n {
			e.Fatalf("Lease(limit 7) returned %d rows with more due", len(ls))
		}
		all = append(all, ls...)
	}
	if len(all) != n {
		e.Fatalf("leased %d rows in total, want %d", len(all), n)
	}
	for i := 1; i < len(all); i++ {
		if due[all[i].ID].Before(due[all[i-1].ID]) {
			e.Fatalf("lease %d (%s due %s) came after %s due %s", i, all[i].ID, due[all[i].ID], all[i-1].ID, due[all[i-1].ID])
		}
	}
	seen := map[string]bool{}
	for _, l := range all {
		if seen[l.ID] {
			e.Fatalf("row %s leased twice", l.ID)
		}
		seen[l.ID] = true
	}
}

func testLeaseDueExactlyNow(e *env) {
	e.insert(newTimeout("exact", at(time.Minute)))
	e.clock.Set(at(time.Minute - time.Nanosecond))
	e.expectNoLease()
	e.clock.Set(at(time.Minute))
	e.leaseOne("exact", time.Minute)
}

// A backend that keeps whole microseconds must round due times and holds
// up, never down: a row due at T+900ns is not leasable at T+100ns, nor is
// its stored due time earlier than the one given (the dispatcher holds a
// forward until it).
func testLeaseSubMicrosecondNeverEarly(e *env) {
	due := at(time.Minute + 900*time.Nanosecond)
	e.insert(newTimeout("sub", due))
	held := newTimeout("subheld", at(-time.Hour))
	held.NotBefore = due
	e.insert(held)
	e.clock.Set(at(time.Minute + 100*time.Nanosecond))
	e.expectNoLease()
	if got := e.get("sub").DueAt; got.Before(due) {
		e.Fatalf("stored due time %s is earlier than the %s given", got, due)
	}
	if got := e.get("subheld").NotBefore; got.Before(due) {
		e.Fatalf("stored hold %s is earlier than the %s given", got, due)
	}
	e.clock.Set(at(time.Minute + time.Microsecond))
	if ls := e.lease("o", 10, time.Minute); len(ls) != 2 {
		e.Fatalf("leased %d rows once due, want 2", len(ls))
	}
}

func testLeaseInsertedNotBefore(e *env) {
	tm := newTimeout("held", at(-time.Hour))
	tm.NotBefore = at(time.Hour)
	e.insert(tm)
	e.expectNextDue(at(time.Hour))
	e.clock.Set(at(time.Hour - time.Nanosecond))
	e.expectNoLease()
	e.clock.Set(at(time.Hour))
	e.leaseOne("held", time.Minute)
}

func testLeaseLimit(e *env) {
	var ids []string
	for i := range 10 {
		ids = append(ids, fmt.Sprintf("lim-%d", i))
	}
	e.insertDue(ids...)
	var got []string
	for _, want := range []int{3, 3, 3, 1, 0} {
		ls := e.lease("o", 3, time.Hour)
		if len(ls) != want {
			e.Fatalf("Lease(limit 3) returned %d rows, want %d", len(ls), want)
		}
		got = append(got, leaseIDs(ls)...)
	}
	slices.Sort(got)
	if !slices.Equal(got, ids) {
		e.Fatalf("leased %v, want %v", got, ids)
	}
	e.clock.Advance(time.Hour)
	if ls := e.lease("o", 1, time.Hour); len(ls) != 1 {
		e.Fatalf("Lease(limit 1) returned %d rows", len(ls))
	}
}

func testLeaseInvalidArguments(e *env) {
	e.insertDue("a", "b")
	for _, limit := range []int{0, -1, -1000} {
		if ls, err := e.s.Lease(e.ctx, "o", time.Time{}, limit, time.Minute); err == nil {
			e.Fatalf("Lease(limit %d) = %v and no error", limit, leaseIDs(ls))
		}
	}
	for _, d := range []time.Duration{0, -time.Second} {
		if ls, err := e.s.Lease(e.ctx, "o", time.Time{}, 10, d); err == nil {
			e.Fatalf("Lease(d %s) = %v and no error", d, leaseIDs(ls))
		}
	}
	// The failed calls leased nothing.
	if ls := e.lease("o", 10, time.Minute); len(ls) != 2 {
		e.Fatalf("after invalid Lease calls, leased %v, want both rows", leaseIDs(ls))
	}
}

func testLeaseRecordsLockOnRow(e *env) {
	in := newTimeout("row", at(-time.Minute))
	e.insert(in)
	l := e.leaseOne("row", 90*time.Second)
	if !l.DueAt.Equal(in.DueAt) {
		e.Errorf("Lease.DueAt = %s, want %s", l.DueAt, in.DueAt)
	}
	got := e.get("row")
	want := in
	want.Lock = l.Lock
	want.LockExpiresAt = at(90 * time.Second)
	if diff := cmp.Diff(want, got, cmpOpts); diff != "" {
		e.Fatalf("leased row (-want +got):\n%s", diff)
	}
}

func testLeaseLocksUnique(e *env) {
	e.insertDue("u1", "u2", "u3")
	locks := map[string]string{}
	add := func(ls []storage.Lease) {
		for _, l := range ls {
			if prev, dup := locks[l.Lock]; dup {
				e.Fatalf("lock %q handed out twice (%s and %s)", l.Lock, prev, l.ID)
			}
			locks[l.Lock] = l.ID
		}
	}
	add(e.lease("same-owner", 1, time.Minute))
	add(e.lease("same-owner", 1, time.Minute))
	add(e.lease("same-owner", 1, time.Minute))
	for range 3 { // the same rows again after expiry, same owner
		e.clock.Advance(time.Minute)
		ls := e.lease("same-owner", 10, time.Minute)
		if len(ls) != 3 {
			e.Fatalf("after expiry leased %d rows, want 3", len(ls))
		}
		add(ls)
	}
}

func testLeaseExclusiveConcurrent(e *env) {
	const n, workers, limit = 2000, 16, 7
	ids := make([]string, n)
	ts := make([]storage.Timeout, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("ex-%04d", i)
		ts[i] = newTimeout(ids[i], at(-time.Duration(i%13)*time.Second))
	}
	e.insert(ts...)
	var mu sync.Mutex
	got := map[string]int{}
	locks := map[string]bool{}
	e.leaseUntilEmpty(workers, limit, func(owner string, ls []storage.Lease) {
		if len(ls) > limit {
			e.Errorf("%s: Lease(limit %d) returned %d rows", owner, limit, len(ls))
		}
		mu.Lock()
		defer mu.Unlock()
		for _, l := range ls {
			got[l.ID]++
			if locks[l.Lock] {
				e.Errorf("lock %q handed out twice", l.Lock)
			}
			locks[l.Lock] = true
		}
	})
	e.checkEachOnce(got, n, "leased")
	e.expectNoLease()
}

func testLeaseRemoveConcurrent(e *env) {
	const n, workers = 600, 8
	ts := make([]storage.Timeout, n)
	for i := range ts {
		ts[i] = newTimeout(fmt.Sprintf("lr-%03d", i), at(-time.Second))
	}
	e.insert(ts...)
	var mu sync.Mutex
	removed := map[string]int{}
	e.leaseUntilEmpty(workers, 5, func(_ string, ls []storage.Lease) {
		refs := make([]storage.Ref, len(ls))
		for i, l := range ls {
			refs[i] = storage.Ref{ID: l.ID, Lock: l.Lock}
		}
		res, err := e.s.Remove(e.ctx, refs)
		if err != nil {
			e.Errorf("Remove: %v", err)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		for i, r := range res {
			if r != nil {
				e.Errorf("Remove(%s) with its own valid lock: %v", refs[i].ID, r)
			}
			removed[refs[i].ID]++
		}
	})
	e.checkEachOnce(removed, n, "removed")
	if _, ok := e.nextDue(); ok {
		e.Fatal("NextDue ok after every row was removed")
	}
}

// leaseUntilEmpty runs workers goroutines, each leasing up to limit due rows
// (for an hour) under an owner of its own until a lease comes back empty,
// and hands every non-empty lease to handle, concurrently. A Lease error
// fails the test and stops that worker.
func (e *env) leaseUntilEmpty(workers, limit int, handle func(owner string, ls []storage.Lease)) {
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			owner := fmt.Sprintf("worker-%d", w)
			for {
				ls, err := e.s.Lease(e.ctx, owner, time.Time{}, limit, time.Hour)
				if err != nil {
					e.Errorf("%s: Lease: %v", owner, err)
					return
				}
				if len(ls) == 0 {
					return
				}
				handle(owner, ls)
			}
		})
	}
	wg.Wait()
}

// checkEachOnce fails the test unless counts holds n ids, each counted once.
func (e *env) checkEachOnce(counts map[string]int, n int, what string) {
	e.Helper()
	if len(counts) != n {
		e.Fatalf("%d distinct rows %s, want %d", len(counts), what, n)
	}
	for id, c := range counts {
		if c != 1 {
			e.Errorf("row %s %s %d times", id, what, c)
		}
	}
}

func testLeaseExpiry(e *env) {
	e.insertDue("exp")
	old := e.leaseOne("exp", time.Minute)
	e.expectNoLease()
	e.clock.Set(at(time.Minute - time.Nanosecond))
	e.expectNoLease()
	e.clock.Set(at(time.Minute))
	fresh := e.leaseOne("exp", time.Minute)
	if fresh.Lock == old.Lock {
		e.Fatalf("re-lease after expiry kept the lock %q", old.Lock)
	}
	if row := e.get("exp"); row.Lock != fresh.Lock || !row.LockExpiresAt.Equal(at(2*time.Minute)) {
		e.Fatalf("row after re-lease: Lock %q LockExpiresAt %s; want %q, %s", row.Lock, row.LockExpiresAt, fresh.Lock, at(2*time.Minute))
	}
	e.expectErr("Remove with the old lock", e.remove(storage.Ref{ID: "exp", Lock: old.Lock})[0], storage.ErrConcurrency)
	e.expectErr("Release with the old lock", e.s.Release(e.ctx, "exp", old.Lock, time.Time{}), storage.ErrConcurrency)
	_, err := e.s.IncrementFailureCount(e.ctx, "exp", old.Lock, "late")
	e.expectErr("IncrementFailureCount with the old lock", err, storage.ErrConcurrency)
	row := e.get("exp")
	if row.Lock != fresh.Lock || row.Attempts != 0 || row.LastError != "" {
		e.Fatalf("calls with the old lock changed the row: %+v", row)
	}
	e.expectNoLease()
	// The new lock works.
	if n, err := e.s.IncrementFailureCount(e.ctx, "exp", fresh.Lock, "boom"); err != nil || n != 1 {
		e.Fatalf("IncrementFailureCount with the new lock = %d, %v", n, err)
	}
	if res := e.remove(storage.Ref{ID: "exp", Lock: fresh.Lock}); res[0] != nil {
		e.Fatalf("Remove with the new lock: %v", res[0])
	}
	e.expectMissing("exp")
}

func testExpiredLockRejected(e *env) {
	// Nobody took the row after the lease expired; the lock still must not
	// work, since another caller could lease the row at any moment.
	e.insertDue("a", "b", "c")
	ls := e.lease("o", 3, time.Minute)
	lock := map[string]string{}
	for _, l := range ls {
		lock[l.ID] = l.Lock
	}
	e.clock.Set(at(time.Minute))
	e.expectErr("Remove with an expired lock", e.remove(storage.Ref{ID: "a", Lock: lock["a"]})[0], storage.ErrConcurrency)
	e.expectErr("Release with an expired lock", e.s.Release(e.ctx, "b", lock["b"], time.Time{}), storage.ErrConcurrency)
	_, err := e.s.IncrementFailureCount(e.ctx, "c", lock["c"], "x")
	e.expectErr("IncrementFailureCount with an expired lock", err, storage.ErrConcurrency)
	e.get("a")
	if got := sortedIDs(e.lease("o", 10, time.Minute)); !slices.Equal(got, []string{"a", "b", "c"}) {
		e.Fatalf("after expiry leased %v, want [a b c]", got)
	}
}

// --- remove ---

func testRemove(e *env) {
	e.insertDue("ok", "wrong", "uncond", "unleased")
	lock := map[string]string{}
	for _, l := range e.lease("o", 3, time.Hour) {
		lock[l.ID] = l.Lock
	}
	if len(lock) != 3 {
		e.Fatalf("leased %d rows, want 3", len(lock))
	}
	// Leasing took three of the four; find the one left unleased.
	var free string
	for _, id := range []string{"ok", "wrong", "uncond", "unleased"} {
		if _, ok := lock[id]; !ok {
			free = id
		}
	}
	var leased []string
	for id := range lock {
		leased = append(leased, id)
	}
	slices.Sort(leased)
	okID, wrongID, uncondID := leased[0], leased[1], leased[2]

	if res := e.remove(storage.Ref{ID: okID, Lock: lock[okID]}); res[0] != nil {
		e.Fatalf("Remove with the right lock: %v", res[0])
	}
	e.expectMissing(okID)
	e.expectErr("second Remove with the same lock", e.remove(storage.Ref{ID: okID, Lock: lock[okID]})[0], storage.ErrNotFound)

	e.expectErr("Remove with another row's lock", e.remove(storage.Ref{ID: wrongID, Lock: lock[uncondID]})[0], storage.ErrConcurrency)
	e.expectErr("Remove with a made-up lock", e.remove(storage.Ref{ID: wrongID, Lock: "o:999999"})[0], storage.ErrConcurrency)
	if row := e.get(wrongID); row.Lock != lock[wrongID] {
		e.Fatalf("failed Remove changed the lock to %q", row.Lock)
	}

	e.expectErr("Remove of an unleased row with a lock", e.remove(storage.Ref{ID: free, Lock: lock[wrongID]})[0], storage.ErrConcurrency)
	e.get(free)

	if res := e.remove(storage.Ref{ID: uncondID}); res[0] != nil {
		e.Fatalf("unconditional Remove of a leased row: %v", res[0])
	}
	e.expectMissing(uncondID)
	if res := e.remove(storage.Ref{ID: free}); res[0] != nil {
		e.Fatalf("unconditional Remove of an unleased row: %v", res[0])
	}
	e.expectMissing(free)

	if res := e.remove(storage.Ref{ID: "never"}); res[0] != nil {
		e.Fatalf("unconditional Remove of a missing row = %v, want nil", res[0])
	}
	e.expectErr("locked Remove of a missing row", e.remove(storage.Ref{ID: "never", Lock: "o:1"})[0], storage.ErrNotFound)

	if res, err := e.s.Remove(e.ctx, nil); err != nil || len(res) != 0 {
		e.Fatalf("Remove(nil) = %v, %v; want empty, nil", res, err)
	}
	// Only the row with the wrong lock is left, still leased.
	e.expectNoLease()
	e.expectNextDue(at(time.Hour))
	if res := e.remove(storage.Ref{ID: wrongID, Lock: lock[wrongID]}); res[0] != nil {
		e.Fatal(res[0])
	}
	if _, ok := e.nextDue(); ok {
		e.Fatal("NextDue ok on an emptied store")
	}
}

func testRemoveMixedBatch(e *env) {
	e.insertDue("a", "b", "c", "d")
	lock := map[string]string{}
	for _, l := range e.lease("o", 10, time.Hour) {
		lock[l.ID] = l.Lock
	}
	refs := []storage.Ref{
		{ID: "a", Lock: lock["a"]},     // ok
		{ID: "b", Lock: lock["a"]},     // wrong lock
		{ID: "ghost"},                  // missing, unconditional
		{ID: "ghost2", Lock: "o:1234"}, // missing, locked
		{ID: "c"},                      // unconditional
		{ID: "a", Lock: lock["a"]},     // already removed by this batch
		{ID: "d", Lock: lock["d"]},     // ok
	}
	want := []error{nil, storage.ErrConcurrency, nil, storage.ErrNotFound, nil, storage.ErrNotFound, nil}
	res := e.remove(refs...)
	for i := range refs {
		if (want[i] == nil) != (res[i] == nil) || (want[i] != nil && !errors.Is(res[i], want[i])) {
			e.Errorf("result %d (%+v) = %v, want %v", i, refs[i], res[i], want[i])
		}
	}
	for _, id := range []string{"a", "c", "d"} {
		e.expectMissing(id)
	}
	if row := e.get("b"); row.Lock != lock["b"] {
		e.Fatalf("row b lost its lease: %q", row.Lock)
	}
}

// --- release ---

func testRelease(e *env) {
	e.insertDue("r")
	first := e.leaseOne("r", time.Hour)
	if n, err := e.s.IncrementFailureCount(e.ctx, "r", first.Lock, "nack"); err != nil || n != 1 {
		e.Fatalf("IncrementFailureCount = %d, %v", n, err)
	}
	if err := e.s.Release(e.ctx, "r", first.Lock, time.Time{}); err != nil {
		e.Fatalf("Release: %v", err)
	}
	row := e.get("r")
	if row.Lock != "" || !row.LockExpiresAt.IsZero() || !row.NotBefore.IsZero() {
		e.Fatalf("released row still leased: Lock %q LockExpiresAt %s NotBefore %s", row.Lock, row.LockExpiresAt, row.NotBefore)
	}
	if row.Attempts != 1 || row.LastError != "nack" {
		e.Fatalf("Release lost the failure count: Attempts %d LastError %q", row.Attempts, row.LastError)
	}
	e.expectNextDue(at(-time.Minute))
	second := e.leaseOne("r", time.Hour) // due again at once
	if second.Lock == first.Lock {
		e.Fatalf("lease after release reused lock %q", first.Lock)
	}
	e.expectErr("Remove with the lock released before", e.remove(storage.Ref{ID: "r", Lock: first.Lock})[0], storage.ErrConcurrency)
	e.expectErr("Release with the lock released before", e.s.Release(e.ctx, "r", first.Lock, time.Time{}), storage.ErrConcurrency)
	if res := e.remove(storage.Ref{ID: "r", Lock: second.Lock}); res[0] != nil {
		e.Fatal(res[0])
	}
}

func testReleaseNotBefore(e *env) {
	e.insertDue("nb", "other")
	ls := e.lease("o", 10, time.Hour)
	lock := map[string]string{}
	for _, l := range ls {
		lock[l.ID] = l.Lock
	}
	notBefore := at(10 * time.Minute)
	if err := e.s.Release(e.ctx, "nb", lock["nb"], notBefore); err != nil {
		e.Fatal(err)
	}
	if row := e.get("nb"); !row.NotBefore.Equal(notBefore) || row.Lock != "" {
		e.Fatalf("released row: NotBefore %s Lock %q; want %s, \"\"", row.NotBefore, row.Lock, notBefore)
	}
	e.expectNoLease()
	e.expectNextDue(notBefore)
	e.clock.Set(notBefore.Add(-time.Nanosecond))
	e.expectNoLease()
	e.clock.Set(notBefore)
	e.leaseOne("nb", time.Hour)
	e.expectNextDue(at(time.Hour)) // "other" lease expiry
	e.get("other")
}

func testReleaseNotBeforeEarlierThanDue(e *env) {
	e.insert(newTimeout("future", at(time.Hour)))
	// Unconditional release of a row that is not leased only sets NotBefore;
	// a NotBefore before DueAt does not make the row due early.
	if err := e.s.Release(e.ctx, "future", "", at(time.Minute)); err != nil {
		e.Fatal(err)
	}
	e.expectNextDue(at(time.Hour))
	e.clock.Set(at(30 * time.Minute))
	e.expectNoLease()
	e.clock.Set(at(time.Hour))
	e.leaseOne("future", time.Minute)
}

func testReleaseErrors(e *env) {
	e.insertDue("r")
	l := e.leaseOne("r", time.Minute)
	e.expectErr("Release with a wrong lock", e.s.Release(e.ctx, "r", l.Lock+"x", time.Time{}), storage.ErrConcurrency)
	if row := e.get("r"); row.Lock != l.Lock {
		e.Fatalf("failed Release changed the lock to %q", row.Lock)
	}
	e.expectNoLease()
	e.expectErr("Release of a missing row with a lock", e.s.Release(e.ctx, "missing", l.Lock, time.Time{}), storage.ErrNotFound)
	e.expectErr("Release of a missing row without a lock", e.s.Release(e.ctx, "missing", "", time.Time{}), storage.ErrNotFound)
	e.clock.Set(at(time.Minute))
	e.expectErr("Release with an expired lock", e.s.Release(e.ctx, "r", l.Lock, time.Time{}), storage.ErrConcurrency)
	e.insertDue("unleased")
	e.expectErr("Release of an unleased row with a lock", e.s.Release(e.ctx, "unleased", l.Lock, time.Time{}), storage.ErrConcurrency)
}

func testReleaseUnconditional(e *env) {
	e.insertDue("u")
	l := e.leaseOne("u", time.Hour)
	if err := e.s.Release(e.ctx, "u", "", time.Time{}); err != nil {
		e.Fatal(err)
	}
	if row := e.get("u"); row.Lock != "" {
		e.Fatalf("unconditional Release left lock %q", row.Lock)
	}
	e.expectErr("Remove with the lock of the released lease", e.remove(storage.Ref{ID: "u", Lock: l.Lock})[0], storage.ErrConcurrency)
	e.leaseOne("u", time.Hour)
}

// testReleaseEach: storage.ReleaseEach answers each ref as Release would,
// in ref order, and a refused ref spoils none of the others.
func testReleaseEach(e *env) {
	e.insertDue("a", "b", "c", "d")
	lock := map[string]string{}
	for _, l := range e.lease("o", 10, time.Hour) {
		lock[l.ID] = l.Lock
	}
	notBefore := at(10 * time.Minute)
	refs := []storage.Ref{
		{ID: "a", Lock: lock["a"]},
		{ID: "b", Lock: lock["b"] + "x"},
		{ID: "missing", Lock: lock["a"]},
		{ID: "c", Lock: lock["c"]},
		{ID: "d"}, // unconditional
	}
	res := storage.ReleaseEach(e.ctx, e.s, refs, notBefore)
	if len(res) != len(refs) {
		e.Fatalf("ReleaseEach returned %d results for %d refs", len(res), len(refs))
	}
	for i, want := range []error{nil, storage.ErrConcurrency, storage.ErrNotFound, nil, nil} {
		if want == nil && res[i] != nil {
			e.Fatalf("ReleaseEach of %q: %v", refs[i].ID, res[i])
		}
		e.expectErr(fmt.Sprintf("ReleaseEach of %q", refs[i].ID), res[i], want)
	}
	for _, id := range []string{"a", "c", "d"} {
		if row := e.get(id); row.Lock != "" || !row.NotBefore.Equal(notBefore) {
			e.Fatalf("%s after ReleaseEach: Lock %q NotBefore %s; want \"\", %s", id, row.Lock, row.NotBefore, notBefore)
		}
	}
	if row := e.get("b"); row.Lock != lock["b"] {
		e.Fatalf("b, refused by ReleaseEach: Lock %q, want %q", row.Lock, lock["b"])
	}
	e.expectNoLease()
	e.clock.Set(notBefore)
	if got := leaseIDs(e.lease("o", 10, time.Hour)); !slices.Equal(got, []string{"a", "c", "d"}) {
		e.Fatalf("leased %v once the hold ended, want [a c d]", got)
	}
	if res := storage.ReleaseEach(e.ctx, e.s, nil, time.Time{}); len(res) != 0 {
		e.Fatalf("ReleaseEach of no refs = %v", res)
	}
}

// testReleaseEachMany: more refs than ReleaseEach runs at once are each
// released, and leasable again at once without a hold.
func testReleaseEachMany(e *env) {
	const n = 150
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("m%03d", i)
	}
	e.insertDue(ids...)
	ls := e.lease("o", n, time.Hour)
	if len(ls) != n {
		e.Fatalf("leased %d rows, want %d", len(ls), n)
	}
	refs := make([]storage.Ref, n)
	for i, l := range ls {
		refs[i] = storage.Ref{ID: l.ID, Lock: l.Lock}
	}
	for i, err := range storage.ReleaseEach(e.ctx, e.s, refs, time.Time{}) {
		if err != nil {
			e.Fatalf("ReleaseEach of %q: %v", refs[i].ID, err)
		}
	}
	if got := e.lease("o", n+1, time.Hour); len(got) != n {
		e.Fatalf("leased %d rows after ReleaseEach, want all %d", len(got), n)
	}
}

// --- failure count ---

func testIncrementFailureCount(e *env) {
	e.insertDue("f")
	l := e.leaseOne("f", time.Minute)
	for i := 1; i <= 3; i++ {
		n, err := e.s.IncrementFailureCount(e.ctx, "f", l.Lock, fmt.Sprint("error ", i))
		if err != nil || n != i {
			e.Fatalf("IncrementFailureCount #%d = %d, %v", i, n, err)
		}
	}
	row := e.get("f")
	if row.Attempts != 3 || row.LastError != "error 3" {
		e.Fatalf("Get: Attempts %d LastError %q; want 3, \"error 3\"", row.Attempts, row.LastError)
	}
	if row.Lock != l.Lock || !row.LockExpiresAt.Equal(at(time.Minute)) {
		e.Fatalf("IncrementFailureCount changed the lease: Lock %q LockExpiresAt %s", row.Lock, row.LockExpiresAt)
	}
	e.expectNoLease() // still leased
	e.expectNextDue(at(time.Minute))
	e.clock.Set(at(time.Minute - time.Nanosecond))
	if res := e.remove(storage.Ref{ID: "f", Lock: l.Lock}); res[0] != nil {
		e.Fatalf("Remove with the lease still valid: %v", res[0])
	}

	// Unconditional, on a row that is not leased: counts, leaves it unleased.
	in := newTimeout("g", at(-time.Minute))
	in.Attempts = 5
	e.insert(in)
	if n, err := e.s.IncrementFailureCount(e.ctx, "g", "", ""); err != nil || n != 6 {
		e.Fatalf("unconditional IncrementFailureCount = %d, %v; want 6", n, err)
	}
	if row := e.get("g"); row.Attempts != 6 || row.LastError != "" || row.Lock != "" {
		e.Fatalf("row g: %+v", row)
	}
	e.leaseOne("g", time.Minute)
}

func testIncrementFailureCountErrors(e *env) {
	e.insertDue("f")
	l := e.leaseOne("f", time.Minute)
	_, err := e.s.IncrementFailureCount(e.ctx, "f", "not-the-lock", "x")
	e.expectErr("IncrementFailureCount with a wrong lock", err, storage.ErrConcurrency)
	if row := e.get("f"); row.Attempts != 0 || row.LastError != "" {
		e.Fatalf("failed IncrementFailureCount changed the row: %+v", row)
	}
	_, err = e.s.IncrementFailureCount(e.ctx, "missing", l.Lock, "x")
	e.expectErr("IncrementFailureCount of a missing row with a lock", err, storage.ErrNotFound)
	_, err = e.s.IncrementFailureCount(e.ctx, "missing", "", "x")
	e.expectErr("IncrementFailureCount of a missing row without a lock", err, storage.ErrNotFound)
}

// --- next due ---

func testNextDue(e *env) {
	if _, ok := e.nextDue(); ok {
		e.Fatal("NextDue ok on an empty store")
	}
	e.insert(newTimeout("y", at(10*time.Minute)))
	e.expectNextDue(at(10 * time.Minute))
	e.insert(newTimeout("x", at(-time.Minute)))
	e.expectNextDue(at(-time.Minute)) // in the past: due now
	e.insert(newTimeout("z", at(time.Hour)))
	e.expectNextDue(at(-time.Minute))

	x := e.leaseOne("x", 5*time.Minute)
	e.expectNextDue(at(5 * time.Minute)) // lease expiry before y
	if err := e.s.Release(e.ctx, "x", x.Lock, time.Time{}); err != nil {
		e.Fatal(err)
	}
	e.expectNextDue(at(-time.Minute))
	x = e.leaseOne("x", 30*time.Minute)
	e.expectNextDue(at(10 * time.Minute)) // y before the lease expiry
	if err := e.s.Release(e.ctx, "x", x.Lock, at(20*time.Minute)); err != nil {
		e.Fatal(err)
	}
	e.expectNextDue(at(10 * time.Minute))
	if res := e.remove(storage.Ref{ID: "y"}); res[0] != nil {
		e.Fatal(res[0])
	}
	e.expectNextDue(at(20 * time.Minute)) // x's NotBefore
	e.clock.Set(at(20 * time.Minute))
	e.leaseOne("x", 24*time.Hour)
	e.expectNextDue(at(time.Hour)) // z
	if res := e.remove(storage.Ref{ID: "z"}); res[0] != nil {
		e.Fatal(res[0])
	}
	e.expectNextDue(at(20*time.Minute + 24*time.Hour))
	if res := e.remove(storage.Ref{ID: "x"}); res[0] != nil {
		e.Fatal(res[0])
	}
	if _, ok := e.nextDue(); ok {
		e.Fatal("NextDue ok after every row was removed")
	}
}

func testNextDueExtremeTimes(e *env) {
	far := time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC)
	e.insert(newTimeout("far", far))
	e.expectNextDue(far)
	old := time.Date(1950, 6, 1, 0, 0, 0, 123456000, time.UTC)
	older := time.Date(1950, 6, 1, 0, 0, 0, 123455000, time.UTC)
	e.insert(newTimeout("old", old))
	e.expectNextDue(old)
	e.insert(newTimeout("older", older))
	e.expectNextDue(older)
	ls := e.lease("o", 10, time.Hour)
	if got := leaseIDs(ls); !slices.Equal(got, []string{"older", "old"}) {
		e.Fatalf("leased %v, want [older old]", got)
	}
	e.expectNextDue(at(time.Hour))
}

// --- reap ---

func testReap(e *env) {
	e.insertDue("s1", "s2", "s3")
	short := e.lease("o", 3, time.Minute)
	e.insertDue("l1", "l2")
	long := e.lease("o", 2, time.Hour)
	if len(short) != 3 || len(long) != 2 {
		e.Fatalf("leased %d and %d rows, want 3 and 2", len(short), len(long))
	}
	if n, err := e.s.Reap(e.ctx); err != nil || n != 0 {
		e.Fatalf("Reap with no expired lease = %d, %v; want 0", n, err)
	}
	e.clock.Set(at(time.Minute))
	if n, err := e.s.Reap(e.ctx); err != nil || n != 3 {
		e.Fatalf("Reap = %d, %v; want 3", n, err)
	}
	if n, err := e.s.Reap(e.ctx); err != nil || n != 0 {
		e.Fatalf("second Reap = %d, %v; want 0", n, err)
	}
	for _, l := range short {
		if row := e.get(l.ID); row.Lock != "" || !row.LockExpiresAt.IsZero() {
			e.Fatalf("reaped row %s still leased: %q %s", l.ID, row.Lock, row.LockExpiresAt)
		}
		e.expectErr("Remove with a reaped lock", e.remove(storage.Ref{ID: l.ID, Lock: l.Lock})[0], storage.ErrConcurrency)
	}
	e.expectNextDue(at(-time.Minute))
	if got := sortedIDs(e.lease("o", 10, time.Hour)); !slices.Equal(got, []string{"s1", "s2", "s3"}) {
		e.Fatalf("after Reap leased %v, want [s1 s2 s3]", got)
	}
	for _, l := range long {
		if row := e.get(l.ID); row.Lock != l.Lock {
			e.Fatalf("Reap touched valid lease of %s: lock %q", l.ID, row.Lock)
		}
		if n, err := e.s.IncrementFailureCount(e.ctx, l.ID, l.Lock, "still mine"); err != nil || n != 1 {
			e.Fatalf("valid lease after Reap: IncrementFailureCount = %d, %v", n, err)
		}
	}
}

// --- lifecycle ---

func testClosed(e *env) {
	e.insertDue("a")
	if err := e.s.Close(); err != nil {
		e.Fatalf("Close: %v", err)
	}
	if err := e.s.Close(); err != nil {
		e.Fatalf("second Close: %v", err)
	}
	closed := func(what string, err error) {
		e.Helper()
		if !errors.Is(err, storage.ErrClosed) {
			e.Errorf("%s after Close: %v, want ErrClosed", what, err)
		}
	}
	_, err := e.s.Insert(e.ctx, []storage.Timeout{newTimeout("b", at(0))})
	closed("Insert", err)
	_, err = e.s.Lease(e.ctx, "o", time.Time{}, 1, time.Minute)
	closed("Lease", err)
	_, err = e.s.Get(e.ctx, "a")
	closed("Get", err)
	_, err = e.s.Remove(e.ctx, []storage.Ref{{ID: "a"}})
	closed("Remove", err)
	closed("Release", e.s.Release(e.ctx, "a", "", time.Time{}))
	_, err = e.s.IncrementFailureCount(e.ctx, "a", "", "x")
	closed("IncrementFailureCount", err)
	_, _, err = e.s.NextDue(e.ctx)
	closed("NextDue", err)
	_, err = e.s.Reap(e.ctx)
	closed("Reap", err)
	for what, err := range e.partCalls(e.ctx) {
		closed(what, err)
	}
}

// testCloseDuringCalls: calls racing Close either finish or see ErrClosed.
func testCloseDuringCalls(e *env) {
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := 0; ; i++ {
				_, err := e.s.Insert(e.ctx, []storage.Timeout{newTimeout(fmt.Sprintf("w%d-%d", w, i), at(0))})
				if err == nil {
					_, err = e.s.Lease(e.ctx, "o", time.Time{}, 2, time.Minute)
				}
				if err == nil {
					_, _, err = e.s.NextDue(e.ctx)
				}
				if err != nil {
					if !errors.Is(err, storage.ErrClosed) {
						e.Errorf("call racing Close: %v", err)
					}
					return
				}
			}
		})
	}
	time.Sleep(50 * time.Millisecond)
	if err := e.s.Close(); err != nil {
		e.Fatal(err)
	}
	wg.Wait()
}

func testContextCancelled(e *env) {
	e.insertDue("a")
	ctx, cancel := context.WithCancel(e.ctx)
	cancel()
	cancelled := func(what string, err error) {
		e.Helper()
		if !errors.Is(err, context.Canceled) {
			e.Errorf("%s with a cancelled context: %v, want context.Canceled", what, err)
		}
	}
	_, err := e.s.Insert(ctx, []storage.Timeout{newTimeout("b", at(-time.Minute))})
	cancelled("Insert", err)
	_, err = e.s.Lease(ctx, "o", time.Time{}, 10, time.Minute)
	cancelled("Lease", err)
	_, err = e.s.Get(ctx, "a")
	cancelled("Get", err)
	_, err = e.s.Remove(ctx, []storage.Ref{{ID: "a"}})
	cancelled("Remove", err)
	cancelled("Release", e.s.Release(ctx, "a", "", at(time.Hour)))
	_, err = e.s.IncrementFailureCount(ctx, "a", "", "x")
	cancelled("IncrementFailureCount", err)
	_, _, err = e.s.NextDue(ctx)
	cancelled("NextDue", err)
	_, err = e.s.Reap(ctx)
	cancelled("Reap", err)
	for what, err := range e.partCalls(ctx) {
		cancelled(what, err)
	}
	// None of them did anything.
	e.expectMissing("b")
	if row := e.get("a"); row.Attempts != 0 || !row.NotBefore.IsZero() {
		e.Fatalf("a cancelled call changed the row: %+v", row)
	}
	e.leaseOne("a", time.Minute)
}

// testLeaseDueBy: a dueBy ahead of now leases rows due up to it and not one
// after, in due order; lease expiry still follows the store's own clock.
func testLeaseDueBy(e *env) {
	e.insert(newTimeout("now", at(0)), newTimeout("10ms", at(10*time.Millisecond)),
		newTimeout("20ms", at(20*time.Millisecond)), newTimeout("21ms", at(21*time.Millisecond)))
	ls, err := e.s.Lease(e.ctx, "o", at(20*time.Millisecond), 10, 5*time.Millisecond)
	if err != nil {
		e.Fatal(err)
	}
	if got := leaseIDs(ls); !slices.Equal(got, []string{"now", "10ms", "20ms"}) {
		e.Fatalf("Lease(dueBy now+20ms) = %v, want now, 10ms, 20ms in due order", got)
	}
	for _, l := range ls {
		row := e.get(l.ID)
		if !row.LockExpiresAt.Equal(at(5 * time.Millisecond)) {
			e.Fatalf("%s: lease expires %s, want the store's now + d", l.ID, row.LockExpiresAt)
		}
	}
	// A dueBy beyond the leases' expiry does not free them: expiry is by
	// the store's clock, not the caller's horizon.
	if ls, err := e.s.Lease(e.ctx, "p", at(time.Hour), 10, time.Minute); err != nil || !slices.Equal(leaseIDs(ls), []string{"21ms"}) {
		e.Fatalf("Lease(dueBy +1h) = %v, %v; want only 21ms (the others are leased)", leaseIDs(ls), err)
	}
	e.clock.Advance(5 * time.Millisecond)
	if ls, err := e.s.Lease(e.ctx, "q", at(20*time.Millisecond), 10, time.Minute); err != nil || len(ls) != 3 {
		e.Fatalf("after expiry: %v, %v; want the 3 expired leases back", leaseIDs(ls), err)
	}
}

// listAll pages through List with the given page size and returns the ids.
func (e *env) listAll(f storage.ListFilter) []string {
	e.Helper()
	var ids []string
	for pages := 0; ; pages++ {
		if pages > 1000 {
			e.Fatal("List cursor does not advance")
		}
		rows, next, err := e.s.List(e.ctx, f)
		if err != nil {
			e.Fatalf("List(%+v): %v", f, err)
		}
		if len(rows) > f.Limit {
			e.Fatalf("List(limit %d) returned %d rows", f.Limit, len(rows))
		}
		for _, r := range rows {
			if r.Message != nil {
				e.Fatalf("List returned the message of %q; it must leave it to Get", r.ID)
			}
			ids = append(ids, r.ID)
		}
		if next == "" {
			return ids
		}
		f.After = next
	}
}

// testList: every pending row, leased or not, in due order (ties by id),
// across pages of every size.
func testList(e *env) {
	if rows, next, err := e.s.List(e.ctx, storage.ListFilter{Limit: 10}); err != nil || len(rows) != 0 || next != "" {
		e.Fatalf("List on an empty store = %v, %q, %v", rows, next, err)
	}
	e.insert(newTimeout("c", at(2*time.Hour)), newTimeout("a", at(-time.Hour)), newTimeout("b2", at(time.Hour)),
		newTimeout("b1", at(time.Hour)), newTimeout("d", at(3*time.Hour)))
	e.lease("o", 1, time.Minute) // "a" is leased: still listed
	want := []string{"a", "b1", "b2", "c", "d"}
	for _, size := range []int{1, 2, 3, 5, 10} {
		if got := e.listAll(storage.ListFilter{Limit: size}); !slices.Equal(got, want) {
			e.Fatalf("List pages of %d = %v, want %v", size, got, want)
		}
	}
	rows, _, err := e.s.List(e.ctx, storage.ListFilter{Limit: 1})
	if err != nil || len(rows) != 1 || rows[0].Lock == "" || rows[0].Destination != "dest.a" || !rows[0].DueAt.Equal(at(-time.Hour)) {
		e.Fatalf("List row = %+v, %v; want a's fields, lock included", rows, err)
	}
	if _, _, err := e.s.List(e.ctx, storage.ListFilter{Limit: 0}); err == nil {
		e.Fatal("List with limit 0 must fail")
	}
	if _, _, err := e.s.List(e.ctx, storage.ListFilter{Limit: 1, After: "not a cursor"}); err == nil {
		e.Fatal("List with a garbage cursor must fail")
	}
	// Removed and inserted rows between pages: the cursor still advances.
	rows, next, _ := e.s.List(e.ctx, storage.ListFilter{Limit: 2})
	e.removeUnconditional(rows[0].ID, "c")
	e.insert(newTimeout("e", at(4*time.Hour)))
	if got := e.listAll(storage.ListFilter{Limit: 2, After: next}); !slices.Equal(got, []string{"b2", "d", "e"}) {
		e.Fatalf("List after changes = %v, want b2, d, e", got)
	}
}

func (e *env) removeUnconditional(ids ...string) {
	e.Helper()
	refs := make([]storage.Ref, len(ids))
	for i, id := range ids {
		refs[i] = storage.Ref{ID: id}
	}
	if _, err := e.s.Remove(e.ctx, refs); err != nil {
		e.Fatal(err)
	}
}

// testListFilters: destination and due range [from, to).
func testListFilters(e *env) {
	mk := func(id, dest string, due time.Time) storage.Timeout {
		t := newTimeout(id, due)
		t.Destination = dest
		return t
	}
	e.insert(mk("o1", "orders", at(time.Minute)), mk("b1", "billing", at(2*time.Minute)),
		mk("o2", "orders", at(3*time.Minute)), mk("o3", "orders", at(4*time.Minute)), mk("b2", "billing", at(5*time.Minute)))
	for _, c := range []struct {
		f    storage.ListFilter
		want []string
	}{
		{storage.ListFilter{Destination: "orders"}, []string{"o1", "o2", "o3"}},
		{storage.ListFilter{Destination: "nobody"}, nil},
		{storage.ListFilter{DueFrom: at(2 * time.Minute)}, []string{"b1", "o2", "o3", "b2"}},
		{storage.ListFilter{DueTo: at(3 * time.Minute)}, []string{"o1", "b1"}},
		{storage.ListFilter{DueFrom: at(2 * time.Minute), DueTo: at(4 * time.Minute), Destination: "orders"}, []string{"o2"}},
		{storage.ListFilter{DueFrom: at(time.Hour)}, nil},
	} {
		for _, size := range []int{1, 2, 10} {
			c.f.Limit = size
			if got := e.listAll(c.f); !slices.Equal(got, c.want) {
				e.Fatalf("List(%+v) = %v, want %v", c.f, got, c.want)
			}
		}
	}
}

// testListFiltersExchange: a Destination alone selects a queue's rows, not
// those of an exchange with that routing key; an Exchange selects its rows,
// all of them or, with a Destination, those of one routing key.
func testListFiltersExchange(e *env) {
	e.insert(exchangeRows()...)
	for _, c := range []struct {
		f    storage.ListFilter
		want []string
	}{
		{storage.ListFilter{}, []string{"queue", "routed", "no-key", "topic", "other-key"}},
		{storage.ListFilter{Destination: "orders"}, []string{"queue"}},
		{storage.ListFilter{Destination: "billing"}, nil},
		{storage.ListFilter{Destination: "events"}, nil},
		{storage.ListFilter{Exchange: "events"}, []string{"routed", "no-key", "other-key"}},
		{storage.ListFilter{Exchange: "events", Destination: "orders"}, []string{"routed"}},
		{storage.ListFilter{Exchange: "events", Destination: "billing"}, []string{"other-key"}},
		{storage.ListFilter{Exchange: "events", Destination: "orders.created"}, nil},
		{storage.ListFilter{Exchange: "amq.topic"}, []string{"topic"}},
		{storage.ListFilter{Exchange: "orders"}, nil},
		{storage.ListFilter{Exchange: "events", DueFrom: at(2*time.Minute + time.Second), DueTo: at(5 * time.Minute)}, []string{"no-key"}},
	} {
		for _, size := range []int{1, 2, 10} {
			c.f.Limit = size
			if got := e.listAll(c.f); !slices.Equal(got, c.want) {
				e.Fatalf("List(%+v) = %v, want %v", c.f, got, c.want)
			}
		}
	}
}

// testListFiltersSaga: a SagaID selects that saga's rows exactly (not
// those of a saga whose id it begins), in due order with ties by id,
// leased ones too, across pages of every size, with the other filters;
// the cursor still advances when rows change between pages.
func testListFiltersSaga(e *env) {
	mk := func(id, saga, dest string, due time.Time) storage.Timeout {
		t := newTimeout(id, due)
		t.SagaID, t.Destination = saga, dest
		return t
	}
	e.insert(mk("s-late", "s", "orders", at(3*time.Minute)), mk("s-b", "s", "billing", at(time.Minute)),
		mk("s-a", "s", "orders", at(time.Minute)), mk("s-early", "s", "orders", at(-time.Minute)),
		mk("s1-x", "s1", "orders", at(2*time.Minute)), mk("none", "", "orders", at(2*time.Minute)),
		mk("t-y", "t", "orders", at(time.Minute)))
	e.leaseOne("s-early", time.Minute) // leased: still listed
	for _, c := range []struct {
		f    storage.ListFilter
		want []string
	}{
		{storage.ListFilter{SagaID: "s"}, []string{"s-early", "s-a", "s-b", "s-late"}},
		{storage.ListFilter{SagaID: "s1"}, []string{"s1-x"}},
		{storage.ListFilter{SagaID: "nobody"}, nil},
		{storage.ListFilter{SagaID: "s", Destination: "orders"}, []string{"s-early", "s-a", "s-late"}},
		{storage.ListFilter{SagaID: "s", Exchange: "events"}, nil},
		{storage.ListFilter{SagaID: "s", DueFrom: at(time.Minute), DueTo: at(3 * time.Minute)}, []string{"s-a", "s-b"}},
		{storage.ListFilter{SagaID: "s", DueFrom: at(time.Minute)}, []string{"s-a", "s-b", "s-late"}},
	} {
		for _, size := range []int{1, 2, 10} {
			c.f.Limit = size
			if got := e.listAll(c.f); !slices.Equal(got, c.want) {
				e.Fatalf("List(%+v) = %v, want %v", c.f, got, c.want)
			}
		}
	}
	rows, _, err := e.s.List(e.ctx, storage.ListFilter{SagaID: "s", Limit: 1})
	if err != nil || len(rows) != 1 || rows[0].ID != "s-early" || rows[0].SagaID != "s" || rows[0].Lock == "" {
		e.Fatalf("List by saga = %+v, %v; want s-early with its saga id and lock", rows, err)
	}
	rows, next, err := e.s.List(e.ctx, storage.ListFilter{SagaID: "s", Limit: 2})
	if err != nil || len(rows) != 2 || next == "" {
		e.Fatalf("List by saga, first page = %+v, %q, %v", rows, next, err)
	}
	e.removeUnconditional("s-b")
	e.insert(mk("s-new", "s", "orders", at(2*time.Minute)), mk("s-before", "s", "orders", at(0)))
	if got := e.listAll(storage.ListFilter{SagaID: "s", Limit: 2, After: next}); !slices.Equal(got, []string{"s-new", "s-late"}) {
		e.Fatalf("List by saga after changes = %v, want s-new, s-late", got)
	}
}

// testCancel: a pending row goes; a leased one stays (ErrLeased) until its
// lease expires; a missing one is ErrNotFound.
func testCancel(e *env) {
	e.insertDue("a", "b")
	ls := e.lease("o", 1, time.Minute)
	leased := ls[0].ID
	free := "a"
	if leased == "a" {
		free = "b"
	}
	if err := e.s.Cancel(e.ctx, free, storage.CancelOrdered); err != nil {
		e.Fatalf("Cancel(%s): %v", free, err)
	}
	if _, err := e.s.Get(e.ctx, free); !errors.Is(err, storage.ErrNotFound) {
		e.Fatalf("cancelled row still there: %v", err)
	}
	if err := e.s.Cancel(e.ctx, free, storage.CancelOrdered); !errors.Is(err, storage.ErrNotFound) {
		e.Fatalf("Cancel of a missing row = %v, want ErrNotFound", err)
	}
	if err := e.s.Cancel(e.ctx, leased, storage.CancelOrdered); !errors.Is(err, storage.ErrLeased) {
		e.Fatalf("Cancel of a leased row = %v, want ErrLeased", err)
	}
	if _, err := e.s.Get(e.ctx, leased); err != nil {
		e.Fatalf("a refused Cancel removed the row: %v", err)
	}
	e.clock.Advance(time.Minute)
	if err := e.s.Cancel(e.ctx, leased, storage.CancelOrdered); err != nil {
		e.Fatalf("Cancel after the lease expired: %v", err)
	}
	if rows, _, _ := e.s.List(e.ctx, storage.ListFilter{Limit: 10}); len(rows) != 0 {
		e.Fatalf("rows left after cancelling all: %v", rows)
	}
}

// testReschedule: a new due time moves the row in Lease and List order and
// clears a retry hold; a leased row is refused.
func testReschedule(e *env) {
	e.insert(newTimeout("a", at(time.Hour)), newTimeout("b", at(-time.Minute)))
	if err := e.s.Reschedule(e.ctx, "a", at(-time.Hour)); err != nil {
		e.Fatal(err)
	}
	if got := e.listAll(storage.ListFilter{Limit: 10}); !slices.Equal(got, []string{"a", "b"}) {
		e.Fatalf("List after rescheduling a earlier = %v", got)
	}
	ls := e.lease("o", 1, time.Minute)
	if len(ls) != 1 || ls[0].ID != "a" || !ls[0].DueAt.Equal(at(-time.Hour)) {
		e.Fatalf("Lease after reschedule = %+v; want a at its new due time", ls)
	}
	if err := e.s.Reschedule(e.ctx, "a", at(time.Hour)); !errors.Is(err, storage.ErrLeased) {
		e.Fatalf("Reschedule of a leased row = %v, want ErrLeased", err)
	}
	// A row held back for a retry: rescheduling to now makes it due now.
	if err := e.s.Release(e.ctx, "a", ls[0].Lock, at(time.Hour)); err != nil {
		e.Fatal(err)
	}
	if err := e.s.Reschedule(e.ctx, "b", at(2*time.Hour)); err != nil {
		e.Fatal(err)
	}
	if err := e.s.Reschedule(e.ctx, "a", at(0)); err != nil {
		e.Fatal(err)
	}
	row := e.get("a")
	if !row.DueAt.Equal(at(0)) || !row.NotBefore.IsZero() {
		e.Fatalf("after reschedule: due %s notBefore %s", row.DueAt, row.NotBefore)
	}
	if ls := e.lease("o", 10, time.Minute); len(ls) != 1 || ls[0].ID != "a" {
		e.Fatalf("Lease = %+v, want only a (b is now due in two hours)", ls)
	}
	if err := e.s.Reschedule(e.ctx, "nope", at(0)); !errors.Is(err, storage.ErrNotFound) {
		e.Fatalf("Reschedule of a missing row = %v", err)
	}
	// An expired lease does not block a reschedule, and the row is free after.
	e.clock.Advance(time.Minute)
	if err := e.s.Reschedule(e.ctx, "a", at(time.Minute)); err != nil {
		e.Fatal(err)
	}
	if row := e.get("a"); row.Lock != "" {
		e.Fatalf("rescheduled row keeps the expired lock %q", row.Lock)
	}
}
