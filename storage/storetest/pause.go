package storetest

import (
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/wire"
)

// pauseRow is a timeout for destination d.
func pauseRow(id string, d wire.Destination, due time.Duration) storage.Timeout {
	t := newTimeout(id, at(due))
	t.Exchange, t.Destination = d.Exchange, d.Key
	return t
}

func (e *env) pause(d wire.Destination, by string, want bool) {
	e.Helper()
	got, err := e.s.Pause(e.ctx, d, by)
	if err != nil || got != want {
		e.Fatalf("Pause(%s) = %v, %v; want %v", d, got, err, want)
	}
}

func (e *env) resume(d wire.Destination, want bool) {
	e.Helper()
	got, err := e.s.Resume(e.ctx, d)
	if err != nil || got != want {
		e.Fatalf("Resume(%s) = %v, %v; want %v", d, got, err, want)
	}
}

// expectPausedList checks List's rows: their ids in due order and which of
// them are shown paused.
func (e *env) expectPausedList(f storage.ListFilter, ids, paused []string) {
	e.Helper()
	f.Limit = 1000
	rows, _, err := e.s.List(e.ctx, f)
	if err != nil {
		e.Fatalf("List: %v", err)
	}
	var gotIDs, gotPaused []string
	for _, r := range rows {
		gotIDs = append(gotIDs, r.ID)
		if r.Paused {
			gotPaused = append(gotPaused, r.ID)
		}
	}
	if diff := cmp.Diff(ids, gotIDs, cmpOpts); diff != "" {
		e.Fatalf("List ids (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(paused, gotPaused, cmpOpts); diff != "" {
		e.Fatalf("List paused rows (-want +got):\n%s", diff)
	}
}

// testPause: a paused destination's rows, and those inserted while it is
// paused, are held past their due time (not leased, not NextDue) and shown
// paused; the other calls treat them as usual; after Resume they are
// leased at once. A queue and an exchange routing key of one name are
// apart.
func testPause(e *env) {
	q, q2, xq := wire.Queue("q"), wire.Queue("q2"), wire.Destination{Exchange: "x", Key: "q"}
	e.insert(pauseRow("q-a", q, -2*time.Minute), pauseRow("q-b", q, -time.Minute), pauseRow("q-c", q, time.Hour),
		pauseRow("q2-a", q2, -90*time.Second), pauseRow("x-a", xq, -30*time.Second))
	held := pauseRow("q-held", q, -3*time.Minute)
	held.NotBefore = at(-10 * time.Second) // a retry's hold, past by now
	e.insert(held)

	e.pause(q, "alice", true)
	e.clock.Advance(time.Second)
	e.pause(q, "bob", false) // paused already: since and by kept
	e.pause(wire.Queue("idle"), "", true)
	got, err := e.s.Paused(e.ctx)
	if err != nil {
		e.Fatal(err)
	}
	want := []storage.PausedDestination{
		{Destination: wire.Queue("idle"), Since: at(time.Second)},
		{Destination: q, Since: at(0), By: "alice"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		e.Fatalf("Paused (-want +got):\n%s", diff)
	}

	// Only the other destinations' rows are leasable; NextDue reports none
	// of q's.
	e.expectNextDue(at(-90 * time.Second))
	if !e.get("q-a").Paused || e.get("q2-a").Paused || e.get("x-a").Paused {
		e.Fatal("Get: Paused wrong")
	}
	e.insert(pauseRow("q-new", q, -5*time.Minute), pauseRow("idle-a", wire.Queue("idle"), -time.Minute))
	e.expectPausedList(storage.ListFilter{},
		[]string{"q-new", "q-held", "q-a", "q2-a", "idle-a", "q-b", "x-a", "q-c"},
		[]string{"q-new", "q-held", "q-a", "idle-a", "q-b", "q-c"})
	e.expectPausedList(storage.ListFilter{Destination: "q", DueFrom: at(-2 * time.Minute)},
		[]string{"q-a", "q-b", "q-c"}, []string{"q-a", "q-b", "q-c"})
	ls := e.lease("owner", 1000, time.Minute)
	if diff := cmp.Diff([]string{"q2-a", "x-a"}, leaseIDs(ls)); diff != "" {
		e.Fatalf("Lease while q is paused (-want +got):\n%s", diff)
	}
	if at, ok := e.nextDue(); !ok || !at.Equal(e.clock.Now().Add(time.Minute)) {
		e.Fatalf("NextDue with only paused rows due and two leases = %s, %v; want the leases' expiry", at, ok)
	}
	e.remove(storage.Ref{ID: ls[0].ID, Lock: ls[0].Lock}, storage.Ref{ID: ls[1].ID, Lock: ls[1].Lock})
	if _, ok := e.nextDue(); ok {
		e.Fatal("NextDue reports a paused row")
	}
	e.expectNoLease()

	// Other calls work on paused rows, which stay paused.
	if err := e.s.Reschedule(e.ctx, "q-c", at(-time.Hour)); err != nil {
		e.Fatal(err)
	}
	if err := e.s.Cancel(e.ctx, "q-b", storage.CancelOrdered); err != nil {
		e.Fatal(err)
	}
	if res := e.remove(storage.Ref{ID: "idle-a"}); res[0] != nil {
		e.Fatal(res[0])
	}
	res, err := e.s.Bulk(e.ctx, storage.ListFilter{Destination: "q", IDPrefix: "q-new"},
		storage.BulkAction{Kind: storage.BulkShift, Shift: time.Minute})
	if err != nil {
		e.Fatal(err)
	}
	if res.Changed != 1 {
		e.Fatalf("Bulk shift of a paused row changed %d", res.Changed)
	}
	e.expectNoLease()
	if _, ok := e.nextDue(); ok {
		e.Fatal("NextDue reports a paused row after changes")
	}

	// A pause does not recall a row leased before it: its lease works on.
	// Released, it is held with the others.
	e.resume(q, true)
	e.resume(q, false)
	ls = e.lease("owner", 1000, time.Minute)
	if len(ls) != 4 {
		e.Fatalf("Lease after Resume took %v, want q's four rows", leaseIDs(ls))
	}
	e.pause(q, "", true)
	for _, l := range ls {
		if err := e.s.Release(e.ctx, l.ID, l.Lock, time.Time{}); err != nil {
			e.Fatalf("Release of a row leased before the pause: %v", err)
		}
	}
	e.expectNoLease()
	e.expectPausedList(storage.ListFilter{Destination: "q"},
		[]string{"q-c", "q-new", "q-held", "q-a"}, []string{"q-c", "q-new", "q-held", "q-a"})

	e.resume(q, true)
	e.resume(wire.Queue("idle"), true)
	if got, err := e.s.Paused(e.ctx); err != nil || len(got) != 0 {
		e.Fatalf("Paused after resuming all = %v, %v", got, err)
	}
	e.expectNextDue(at(-time.Hour))
	ls = e.lease("owner", 1000, time.Minute)
	if diff := cmp.Diff([]string{"q-c", "q-new", "q-held", "q-a"}, leaseIDs(ls)); diff != "" {
		e.Fatalf("Lease after Resume (-want +got):\n%s", diff)
	}
	e.expectPausedList(storage.ListFilter{}, []string{"q-c", "q-new", "q-held", "q-a"}, nil)
	if _, err := e.s.Pause(e.ctx, wire.Destination{}, ""); err == nil {
		e.Fatal("Pause of an empty destination: no error")
	}
}

// testPauseMany: pausing and resuming one destination among many moves all
// its rows and none of the others.
func testPauseMany(e *env) {
	var ts []storage.Timeout
	var want []string
	for i := range 300 {
		d := wire.Queue("other")
		id := "o" + time.Duration(i).String()
		if i%3 == 0 {
			d, id = wire.Queue("p"), "p"+time.Duration(i).String()
			want = append(want, id)
		}
		ts = append(ts, pauseRow(id, d, -time.Duration(i)*time.Second))
	}
	e.insert(ts...)
	e.pause(wire.Queue("p"), "", true)
	ls := e.lease("owner", 1000, time.Minute)
	if len(ls) != 200 {
		e.Fatalf("Lease while p is paused took %d rows, want 200", len(ls))
	}
	for _, l := range ls {
		if l.ID[0] != 'o' {
			e.Fatalf("Lease took %s of the paused destination", l.ID)
		}
	}
	e.resume(wire.Queue("p"), true)
	ls = e.lease("owner", 1000, time.Minute)
	got := leaseIDs(ls)
	slices.Sort(got)
	slices.Sort(want)
	if diff := cmp.Diff(want, got); diff != "" {
		e.Fatalf("Lease after Resume (-want +got):\n%s", diff)
	}
}

// testPauseInsertConcurrent: a pause racing inserts for its destination
// lets none of them escape: every row, stored before or after the pause,
// is held.
func testPauseInsertConcurrent(e *env) {
	q := wire.Queue("q")
	const writers, batches, per = 4, 25, 5
	var wg sync.WaitGroup
	errs := make(chan error, writers+1)
	started := make(chan struct{})
	for w := range writers {
		wg.Go(func() {
			for b := range batches {
				if b == 3 && w == 0 {
					close(started)
				}
				var ts []storage.Timeout
				for i := range per {
					ts = append(ts, pauseRow(fmt.Sprintf("w%d-%02d-%d", w, b, i), q, -time.Minute))
				}
				if _, err := e.s.Insert(e.ctx, ts); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	<-started
	if _, err := e.s.Pause(e.ctx, q, ""); err != nil {
		errs <- err
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		e.Fatal(err)
	}
	if ls := e.lease("owner", 1000, time.Minute); len(ls) != 0 {
		e.Fatalf("Lease after a pause raced by inserts took %d rows, e.g. %s", len(ls), ls[0].ID)
	}
	e.expectPausedList(storage.ListFilter{IDPrefix: "w0-00-0"}, []string{"w0-00-0"}, []string{"w0-00-0"})
	e.resume(q, true)
	if ls := e.lease("owner", 1000, time.Minute); len(ls) != writers*batches*per {
		e.Fatalf("Lease after Resume took %d rows, want %d", len(ls), writers*batches*per)
	}
}
