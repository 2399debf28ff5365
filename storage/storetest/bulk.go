package storetest

import (
	"errors"
	"fmt"
	"slices"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/message"
	"github.com/delaybridge/delaybridge/storage"
)

// withHeaders is t with an encoded message carrying headers h.
func withHeaders(e *env, t storage.Timeout, h amqp.Table) storage.Timeout {
	e.Helper()
	b, err := message.Encode(nil, &amqp.Publishing{Headers: h, Body: []byte("body of " + t.ID)})
	if err != nil {
		e.Fatal(err)
	}
	t.Message = b
	return t
}

func (e *env) bulk(f storage.ListFilter, a storage.BulkAction, want storage.BulkResult) {
	e.Helper()
	got, err := e.s.Bulk(e.ctx, f, a)
	if err != nil || got != want {
		e.Fatalf("Bulk(%+v, %+v) = %+v, %v; want %+v", f, a, got, err, want)
	}
}

// testBulkCancel: a bulk cancel by destination spans several chunks,
// leaves the leased rows (counted), cancels rows whose lease expired,
// leaves a tombstone for each row it removed, and touches no row of
// another destination or of an exchange routing key of the same name.
func testBulkCancel(e *env) {
	if _, err := e.s.Bulk(e.ctx, storage.ListFilter{}, storage.BulkAction{Kind: storage.BulkCancel}); !errors.Is(err, storage.ErrEmptyFilter) {
		e.Fatalf("Bulk with an empty filter = %v, want ErrEmptyFilter", err)
	}
	n := 2*storage.BulkChunk + 7
	var rows []storage.Timeout
	for i := range n {
		t := newTimeout(fmt.Sprintf("q-%05d", i), at(time.Duration(i-10)*time.Second))
		t.Destination = "q"
		rows = append(rows, t)
	}
	other := newTimeout("other", at(-time.Hour))
	other.Destination = "q2"
	exch := newTimeout("exch", at(-time.Hour))
	exch.Exchange, exch.Destination = "x", "q" // routing key q: not the queue q
	rows = append(rows, other, exch)
	for i := 0; i < len(rows); i += 500 {
		e.insert(rows[i:min(i+500, len(rows))]...)
	}
	leases := e.lease("o", 3, time.Hour) // other and exch come first (due an hour ago)
	leases = append(leases, e.lease("o", 4, 2*time.Hour)...)
	if ids := leaseIDs(leases); !slices.Equal(ids[3:], []string{"q-00001", "q-00002", "q-00003", "q-00004"}) {
		e.Fatalf("leased %v", ids)
	}
	e.clock.Advance(time.Hour) // the first three leases (exch, other, q-00000) expire
	e.bulk(storage.ListFilter{Destination: "q"}, storage.BulkAction{Kind: storage.BulkCancel},
		storage.BulkResult{Changed: n - 4, Leased: 4})
	for _, id := range []string{"q-00001", "q-00004", "other", "exch"} {
		e.get(id)
	}
	e.expectMissing("q-00000")
	e.expectMissing(fmt.Sprintf("q-%05d", n-1))
	if p, _, err := e.s.Stats(e.ctx); err != nil || p != 6 {
		e.Fatalf("Stats after the bulk cancel = %d pending, %v; want 6", p, err)
	}
	// Tombstones: a cancelled id stays cancelled; a leased one was not.
	if got := e.insert(rows[5], rows[n-1]); got[0] || got[1] {
		e.Fatalf("Insert of bulk-cancelled ids = %v, want [false false]", got)
	}
	// Again: only the leased rows are left.
	e.bulk(storage.ListFilter{Destination: "q"}, storage.BulkAction{Kind: storage.BulkCancel}, storage.BulkResult{Leased: 4})
	// The exchange's rows, by routing key.
	e.bulk(storage.ListFilter{Exchange: "x", Destination: "q"}, storage.BulkAction{Kind: storage.BulkCancel}, storage.BulkResult{Changed: 1})
	e.expectMissing("exch")
	e.get("other")
}

// testBulkReschedule: setting a due time, and shifting later and earlier,
// change every selected row exactly once (across chunks, whichever way the
// rows move), clear retry holds, leave leased rows, and count shifts past
// MaxDueAt; selectors by due range, id prefix and header.
func testBulkReschedule(e *env) {
	n := storage.BulkChunk + 3
	var rows []storage.Timeout
	for i := range n {
		t := newTimeout(fmt.Sprintf("p-%05d", i), at(time.Duration(i)*time.Second))
		rows = append(rows, t)
	}
	e.insert(rows[:500]...)
	e.insert(rows[500:]...)
	due := func(id string) time.Time { e.Helper(); return e.get(id).DueAt }
	expectDue := func(i int, d time.Duration) {
		e.Helper()
		id := fmt.Sprintf("p-%05d", i)
		if got := due(id); !got.Equal(at(time.Duration(i)*time.Second + d)) {
			e.Fatalf("%s due %s, want %s", id, got, at(time.Duration(i)*time.Second+d))
		}
	}
	// Later by 10 minutes: every row once, though rows move into the range
	// still to walk.
	e.bulk(storage.ListFilter{IDPrefix: "p-"}, storage.BulkAction{Kind: storage.BulkShift, Shift: 10 * time.Minute},
		storage.BulkResult{Changed: n})
	for _, i := range []int{0, 1, 599, n - 1} {
		expectDue(i, 10*time.Minute)
	}
	// Earlier by 15 minutes.
	e.bulk(storage.ListFilter{IDPrefix: "p-"}, storage.BulkAction{Kind: storage.BulkShift, Shift: -15 * time.Minute},
		storage.BulkResult{Changed: n})
	for _, i := range []int{0, 1, 599, n - 1} {
		expectDue(i, -5*time.Minute)
	}
	// A due range [T0-5m+100s, T0-5m+200s): rows 100..199.
	f := storage.ListFilter{DueFrom: at(-5*time.Minute + 100*time.Second), DueTo: at(-5*time.Minute + 200*time.Second)}
	e.bulk(f, storage.BulkAction{Kind: storage.BulkSetDue, DueAt: at(time.Hour)}, storage.BulkResult{Changed: 100})
	expectDue(99, -5*time.Minute)
	expectDue(200, -5*time.Minute)
	if got := due("p-00100"); !got.Equal(at(time.Hour)) {
		e.Fatalf("p-00100 due %s, want %s", got, at(time.Hour))
	}
	// Everything to one time: rows already due then are not counted, and
	// the walk, which the moved rows overtake, changes each row once.
	e.bulk(storage.ListFilter{IDPrefix: "p-"}, storage.BulkAction{Kind: storage.BulkSetDue, DueAt: at(time.Hour)},
		storage.BulkResult{Changed: n - 100})
	e.bulk(storage.ListFilter{IDPrefix: "p-"}, storage.BulkAction{Kind: storage.BulkSetDue, DueAt: at(time.Hour)},
		storage.BulkResult{})

	// Headers, a lease, a retry hold, an expired lease.
	e.bulk(storage.ListFilter{IDPrefix: "p-"}, storage.BulkAction{Kind: storage.BulkCancel}, storage.BulkResult{Changed: n})
	mk := func(id, tenant string, due time.Duration) storage.Timeout {
		return withHeaders(e, newTimeout(id, at(time.Hour+due)), amqp.Table{"tenant": tenant, "n": int32(7)})
	}
	e.insert(mk("h-a1", "a", time.Minute), mk("h-a2", "a", 2*time.Minute), mk("h-a3", "a", 3*time.Minute), mk("h-b1", "b", 4*time.Minute),
		withHeaders(e, newTimeout("h-bytes", at(time.Hour+5*time.Minute)), amqp.Table{"tenant": []byte("a")}))
	e.clock.Set(at(time.Hour + time.Minute))
	l := e.leaseOne("h-a1", time.Hour)
	e.clock.Set(at(time.Hour + 2*time.Minute))
	l2 := e.leaseOne("h-a2", time.Minute)
	if err := e.s.Release(e.ctx, "h-a2", l2.Lock, at(3*time.Hour)); err != nil {
		e.Fatal(err)
	}
	e.clock.Set(at(time.Hour + 3*time.Minute))
	e.leaseOne("h-a3", time.Second)
	e.clock.Advance(time.Second) // h-a3's lease expires
	e.bulk(storage.ListFilter{HeaderName: "tenant", HeaderValue: "a"}, storage.BulkAction{Kind: storage.BulkSetDue, DueAt: at(time.Hour)},
		storage.BulkResult{Changed: 3, Leased: 1})
	for _, id := range []string{"h-a2", "h-a3", "h-bytes"} {
		if got := e.get(id); !got.DueAt.Equal(at(time.Hour)) || !got.NotBefore.IsZero() || got.Lock != "" {
			e.Fatalf("%s after the bulk reschedule: due %s, not before %s, lock %q", id, got.DueAt, got.NotBefore, got.Lock)
		}
	}
	if got := e.get("h-b1"); !got.DueAt.Equal(at(time.Hour + 4*time.Minute)) {
		e.Fatalf("h-b1 (tenant b) was rescheduled to %s", got.DueAt)
	}
	if got := e.get("h-a1"); !got.DueAt.Equal(at(time.Hour+time.Minute)) || got.Lock != l.Lock {
		e.Fatalf("leased h-a1 was changed: %+v", got)
	}
	e.bulk(storage.ListFilter{HeaderName: "n", HeaderValue: "7", IDPrefix: "h-b"}, storage.BulkAction{Kind: storage.BulkCancel},
		storage.BulkResult{Changed: 1})
	e.expectMissing("h-b1")

	// Past MaxDueAt.
	late := newTimeout("late", storage.MaxDueAt.Add(-time.Minute).Truncate(time.Microsecond))
	e.insert(late, newTimeout("late2", at(time.Hour)))
	e.bulk(storage.ListFilter{IDPrefix: "late"}, storage.BulkAction{Kind: storage.BulkShift, Shift: time.Hour},
		storage.BulkResult{Changed: 1, OutOfRange: 1})
	if got := e.get("late"); !got.DueAt.Equal(late.DueAt) {
		e.Fatalf("late moved to %s", got.DueAt)
	}
	if _, err := e.s.Bulk(e.ctx, storage.ListFilter{IDPrefix: "late"}, storage.BulkAction{Kind: storage.BulkSetDue, DueAt: storage.MaxDueAt.Add(time.Second)}); !errors.Is(err, storage.ErrDueOutOfRange) {
		e.Fatalf("Bulk set due past MaxDueAt = %v, want ErrDueOutOfRange", err)
	}
}

// testListFiltersIDPrefixHeader: List selects by id prefix and by header,
// across pages.
func testListFiltersIDPrefixHeader(e *env) {
	var rows []storage.Timeout
	for i := range 12 {
		tenant := "t1"
		if i%3 == 0 {
			tenant = "t2"
		}
		rows = append(rows, withHeaders(e, newTimeout(fmt.Sprintf("r%02d", i), at(time.Duration(i)*time.Minute)), amqp.Table{"tenant": tenant}))
	}
	rows = append(rows, newTimeout("s00", at(0)), newTimeout("r-plain", at(time.Hour)))
	e.insert(rows...)
	for _, size := range []int{1, 2, 5, 100} {
		if got := e.listAll(storage.ListFilter{Limit: size, HeaderName: "tenant", HeaderValue: "t2"}); !slices.Equal(got, []string{"r00", "r03", "r06", "r09"}) {
			e.Fatalf("List by header, pages of %d = %v", size, got)
		}
		if got := e.listAll(storage.ListFilter{Limit: size, IDPrefix: "r0"}); !slices.Equal(got, []string{"r00", "r01", "r02", "r03", "r04", "r05", "r06", "r07", "r08", "r09"}) {
			e.Fatalf("List by id prefix, pages of %d = %v", size, got)
		}
	}
	if got := e.listAll(storage.ListFilter{Limit: 3, HeaderName: "tenant", HeaderValue: "t2", IDPrefix: "r0", DueFrom: at(time.Minute)}); !slices.Equal(got, []string{"r03", "r06", "r09"}) {
		e.Fatalf("List by header, id prefix and due range = %v", got)
	}
	if got := e.listAll(storage.ListFilter{Limit: 3, HeaderName: "missing", HeaderValue: ""}); len(got) != 0 {
		e.Fatalf("List by a header no row has = %v", got)
	}
}
