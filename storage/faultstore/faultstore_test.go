package faultstore

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/storage/boltstore"
	"github.com/delaybridge/delaybridge/storage/storetest"
	"github.com/delaybridge/delaybridge/wire"
)

var ctx = context.Background()

var errBoom = errors.New("boom")

// TestConformance proves the wrapper transparent once healed: the shared
// suite runs over a faultstore that had every fault and delay set, then
// healed.
func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T, clock *storetest.Clock) storage.Store {
		inner, err := boltstore.Open(filepath.Join(t.TempDir(), "fault.db"), boltstore.Options{Now: clock.Now})
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		s := Wrap(inner)
		for op := Insert; op < Close; op++ {
			s.Fail(op, errBoom)
			s.Delay(op, time.Hour)
		}
		s.Heal()
		return s
	})
}

// open returns a faultstore over a fresh boltstore, and the boltstore.
func open(t *testing.T, now func() time.Time) (*Store, *boltstore.Store) {
	t.Helper()
	inner, err := boltstore.Open(filepath.Join(t.TempDir(), "fault.db"), boltstore.Options{Now: now})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	s := Wrap(inner)
	t.Cleanup(func() { _ = s.Close() })
	return s, inner
}

// openFull is open with a fullStore, which records the calls that reach
// it, between the fault store and bbolt.
func openFull(t *testing.T) (*storetest.Clock, *fullStore, *Store) {
	t.Helper()
	clock := storetest.NewClock(storetest.T0)
	_, bolt := open(t, clock.Now)
	inner := &fullStore{Store: bolt, calls: map[Op]int{}}
	return clock, inner, Wrap(inner)
}

func row(id string, due time.Time) storage.Timeout {
	return storage.Timeout{ID: id, Destination: "dest", DueAt: due, ReceivedAt: due, Message: []byte("body-" + id)}
}

func mustLease(t *testing.T, s storage.Store, want int) []storage.Lease {
	t.Helper()
	ls, err := s.Lease(ctx, "owner", time.Time{}, 10, time.Minute)
	if err != nil {
		t.Fatalf("Lease: %v", err)
	}
	if len(ls) != want {
		t.Fatalf("Lease: got %d leases, want %d", len(ls), want)
	}
	return ls
}

func wantInjected(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, errBoom) {
		t.Fatalf("%s: got error %v, want the injected %v", what, err, errBoom)
	}
}

// Every injected fault fails its operation with the injected error and leaves
// the wrapped store exactly as it was; clearing it (nil) restores delegation.
func TestFaultsDoNotTouchTheStore(t *testing.T) {
	clock := storetest.NewClock(storetest.T0)
	now := clock.Now()

	t.Run("Insert", func(t *testing.T) {
		s, inner := open(t, clock.Now)
		s.FailInsert(errBoom)
		ins, err := s.Insert(ctx, []storage.Timeout{row("a", now)})
		wantInjected(t, "Insert", err)
		if ins != nil {
			t.Errorf("Insert: got results %v with an error", ins)
		}
		if _, err := inner.Get(ctx, "a"); !errors.Is(err, storage.ErrNotFound) {
			t.Fatalf("inner Get after failed Insert: %v, want ErrNotFound", err)
		}
		s.FailInsert(nil)
		storetest.MustInsert(t, s, row("a", now))
		if _, err := inner.Get(ctx, "a"); err != nil {
			t.Fatalf("inner Get after healed Insert: %v", err)
		}
	})

	t.Run("Lease", func(t *testing.T) {
		s, inner := open(t, clock.Now)
		storetest.MustInsert(t, s, row("a", now))
		s.FailLease(errBoom)
		ls, err := s.Lease(ctx, "owner", time.Time{}, 10, time.Minute)
		wantInjected(t, "Lease", err)
		if ls != nil {
			t.Errorf("Lease: got %v with an error", ls)
		}
		if r, _ := inner.Get(ctx, "a"); r.Lock != "" {
			t.Fatalf("row leased by a failed Lease: lock %q", r.Lock)
		}
		s.FailLease(nil)
		mustLease(t, s, 1)
	})

	t.Run("NextDue", func(t *testing.T) {
		s, _ := open(t, clock.Now)
		storetest.MustInsert(t, s, row("a", now))
		s.FailNextDue(errBoom)
		at, ok, err := s.NextDue(ctx)
		wantInjected(t, "NextDue", err)
		if ok || !at.IsZero() {
			t.Errorf("NextDue: got %v, %v with an error", at, ok)
		}
		s.FailNextDue(nil)
		if at, ok, err := s.NextDue(ctx); err != nil || !ok || !at.Equal(now) {
			t.Fatalf("NextDue healed: %v, %v, %v; want %v, true", at, ok, err, now)
		}
	})

	t.Run("Get", func(t *testing.T) {
		s, _ := open(t, clock.Now)
		storetest.MustInsert(t, s, row("a", now))
		s.FailGet(errBoom)
		r, err := s.Get(ctx, "a")
		wantInjected(t, "Get", err)
		if r.ID != "" {
			t.Errorf("Get: got row %q with an error", r.ID)
		}
		s.FailGet(nil)
		if r, err := s.Get(ctx, "a"); err != nil || string(r.Message) != "body-a" {
			t.Fatalf("Get healed: %+v, %v", r, err)
		}
	})

	t.Run("Remove", func(t *testing.T) {
		s, inner := open(t, clock.Now)
		storetest.MustInsert(t, s, row("a", now))
		l := mustLease(t, s, 1)[0]
		s.FailRemove(errBoom)
		res, err := s.Remove(ctx, []storage.Ref{{ID: l.ID, Lock: l.Lock}})
		wantInjected(t, "Remove", err)
		if res != nil {
			t.Errorf("Remove: got results %v with an error", res)
		}
		if r, err := inner.Get(ctx, "a"); err != nil || r.Lock != l.Lock {
			t.Fatalf("row after failed Remove: %+v, %v; want it still leased", r, err)
		}
		s.FailRemove(nil)
		res, err = s.Remove(ctx, []storage.Ref{{ID: l.ID, Lock: l.Lock}})
		if err != nil || len(res) != 1 || res[0] != nil {
			t.Fatalf("Remove healed: %v, %v", res, err)
		}
		if _, err := inner.Get(ctx, "a"); !errors.Is(err, storage.ErrNotFound) {
			t.Fatalf("row after Remove: %v, want ErrNotFound", err)
		}
	})

	t.Run("Release", func(t *testing.T) {
		s, inner := open(t, clock.Now)
		storetest.MustInsert(t, s, row("a", now))
		l := mustLease(t, s, 1)[0]
		s.FailRelease(errBoom)
		wantInjected(t, "Release", s.Release(ctx, l.ID, l.Lock, time.Time{}))
		if r, _ := inner.Get(ctx, "a"); r.Lock != l.Lock {
			t.Fatalf("row after failed Release: lock %q, want still %q", r.Lock, l.Lock)
		}
		s.FailRelease(nil)
		if err := s.Release(ctx, l.ID, l.Lock, time.Time{}); err != nil {
			t.Fatalf("Release healed: %v", err)
		}
		if r, _ := inner.Get(ctx, "a"); r.Lock != "" {
			t.Fatalf("row after Release: lock %q, want none", r.Lock)
		}
	})

	t.Run("Increment", func(t *testing.T) {
		s, inner := open(t, clock.Now)
		storetest.MustInsert(t, s, row("a", now))
		l := mustLease(t, s, 1)[0]
		s.FailIncrement(errBoom)
		n, err := s.IncrementFailureCount(ctx, l.ID, l.Lock, "why")
		wantInjected(t, "IncrementFailureCount", err)
		if n != 0 {
			t.Errorf("IncrementFailureCount: got %d with an error", n)
		}
		if r, _ := inner.Get(ctx, "a"); r.Attempts != 0 || r.LastError != "" {
			t.Fatalf("row after failed increment: attempts %d, last error %q", r.Attempts, r.LastError)
		}
		s.FailIncrement(nil)
		if n, err := s.IncrementFailureCount(ctx, l.ID, l.Lock, "why"); err != nil || n != 1 {
			t.Fatalf("IncrementFailureCount healed: %d, %v; want 1", n, err)
		}
	})

	t.Run("Reap", func(t *testing.T) {
		s, _ := open(t, clock.Now)
		s.FailReap(errBoom)
		_, err := s.Reap(ctx)
		wantInjected(t, "Reap", err)
		s.FailReap(nil)
		if _, err := s.Reap(ctx); err != nil {
			t.Fatalf("Reap healed: %v", err)
		}
	})
}

// A fault on one operation leaves the others alone, and Heal clears all.
func TestFaultsAreIndependentAndHealClearsAll(t *testing.T) {
	clock := storetest.NewClock(storetest.T0)
	s, _ := open(t, clock.Now)
	s.FailLease(errBoom)
	s.FailNextDue(errBoom)
	storetest.MustInsert(t, s, row("a", clock.Now()))
	if _, err := s.Get(ctx, "a"); err != nil {
		t.Fatalf("Get with other faults set: %v", err)
	}
	_, err := s.Lease(ctx, "o", time.Time{}, 1, time.Minute)
	wantInjected(t, "Lease", err)

	s.FailInsert(errBoom)
	s.FailGet(errBoom)
	s.FailRemove(errBoom)
	s.FailRelease(errBoom)
	s.FailIncrement(errBoom)
	s.FailReap(errBoom)
	s.Delay(Insert, time.Hour)
	s.Heal()

	done := make(chan struct{})
	go func() {
		defer close(done)
		storetest.MustInsert(t, s, row("b", clock.Now()))
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Insert still delayed after Heal")
	}
	ls := mustLease(t, s, 2)
	if _, _, err := s.NextDue(ctx); err != nil {
		t.Fatalf("NextDue after Heal: %v", err)
	}
	if _, err := s.Get(ctx, "a"); err != nil {
		t.Fatalf("Get after Heal: %v", err)
	}
	if _, err := s.IncrementFailureCount(ctx, ls[0].ID, ls[0].Lock, "x"); err != nil {
		t.Fatalf("IncrementFailureCount after Heal: %v", err)
	}
	if err := s.Release(ctx, ls[0].ID, ls[0].Lock, time.Time{}); err != nil {
		t.Fatalf("Release after Heal: %v", err)
	}
	if _, err := s.Remove(ctx, []storage.Ref{{ID: ls[1].ID, Lock: ls[1].Lock}}); err != nil {
		t.Fatalf("Remove after Heal: %v", err)
	}
	if _, err := s.Reap(ctx); err != nil {
		t.Fatalf("Reap after Heal: %v", err)
	}
}

func TestCalls(t *testing.T) {
	clock := storetest.NewClock(storetest.T0)
	s, _ := open(t, clock.Now)
	for op := Insert; op <= Close; op++ {
		if n := s.Calls(op); n != 0 {
			t.Fatalf("Calls(%v) = %d before any call", op, n)
		}
	}
	storetest.MustInsert(t, s, row("a", clock.Now()))
	s.FailInsert(errBoom)
	_, _ = s.Insert(ctx, []storage.Timeout{row("b", clock.Now())}) // failing calls count too
	_, _ = s.Insert(ctx, []storage.Timeout{row("c", clock.Now())})
	_, _ = s.Get(ctx, "a")
	_, _, _ = s.NextDue(ctx)
	_, _, _ = s.NextDue(ctx)
	_ = s.Close()
	_ = s.Close()
	want := map[Op]int{Insert: 3, Get: 1, NextDue: 2, Close: 2}
	for op := Insert; op <= Close; op++ {
		if got := s.Calls(op); got != want[op] {
			t.Errorf("Calls(%v) = %d, want %d", op, got, want[op])
		}
	}
	s.Heal()
	if got := s.Calls(Insert); got != 3 {
		t.Errorf("Heal reset the counters: Calls(Insert) = %d", got)
	}
	if got := s.Calls(Op(99)); got != 0 {
		t.Errorf("Calls(invalid) = %d", got)
	}
}

func TestDelay(t *testing.T) {
	clock := storetest.NewClock(storetest.T0)
	s, inner := open(t, clock.Now)
	const d = 150 * time.Millisecond
	s.Delay(Insert, d)
	start := time.Now()
	storetest.MustInsert(t, s, row("a", clock.Now()))
	if took := time.Since(start); took < d {
		t.Fatalf("delayed Insert took %s, want at least %s", took, d)
	}
	// Other operations are not delayed: with Insert held for an hour, a Get
	// still answers well within its context (not a timing bound: a busy
	// disk can make any call slow, never an hour slow).
	s.Delay(Insert, time.Hour)
	gctx, gcancel := context.WithTimeout(ctx, 30*time.Second)
	defer gcancel()
	if _, err := s.Get(gctx, "a"); err != nil {
		t.Fatalf("Get with only Insert delayed: %v", err)
	}

	// A delayed call whose context ends fails with ctx's error and stores nothing.
	s.Delay(Insert, time.Hour)
	cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	_, err := s.Insert(cctx, []storage.Timeout{row("b", clock.Now())})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Insert with an ended context during its delay: %v, want DeadlineExceeded", err)
	}
	if _, err := inner.Get(ctx, "b"); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("row b after cancelled delayed Insert: %v, want ErrNotFound", err)
	}

	// A delay combined with a fault: slow, then failing, store untouched.
	s.Delay(Insert, d)
	s.FailInsert(errBoom)
	start = time.Now()
	_, err = s.Insert(ctx, []storage.Timeout{row("c", clock.Now())})
	wantInjected(t, "slow failing Insert", err)
	if took := time.Since(start); took < d {
		t.Errorf("slow failing Insert took %s, want at least %s", took, d)
	}
	if _, err := inner.Get(ctx, "c"); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("row c after failed Insert: %v, want ErrNotFound", err)
	}

	// Zero clears a delay, even an hour's.
	s.FailInsert(nil)
	s.Delay(Insert, time.Hour)
	s.Delay(Insert, 0)
	zctx, zcancel := context.WithTimeout(ctx, 30*time.Second)
	defer zcancel()
	if _, err := s.Insert(zctx, []storage.Timeout{row("d", clock.Now())}); err != nil {
		t.Fatalf("Insert after Delay(Insert, 0): %v", err)
	}
}

func TestCloseDelegatesOnce(t *testing.T) {
	clock := storetest.NewClock(storetest.T0)
	s, inner := open(t, clock.Now)
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if _, err := inner.Get(ctx, "a"); !errors.Is(err, storage.ErrClosed) {
		t.Fatalf("inner Get after Close: %v, want ErrClosed", err)
	}
	if _, err := s.Get(ctx, "a"); !errors.Is(err, storage.ErrClosed) {
		t.Fatalf("Get after Close: %v, want ErrClosed", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if s.Unwrap() != storage.Store(inner) {
		t.Fatal("Unwrap does not return the wrapped store")
	}
}

func TestInvalidControlsPanic(t *testing.T) {
	s := Wrap(nil)
	for name, f := range map[string]func(){
		"Fail(Close)":  func() { s.Fail(Close, errBoom) },
		"Delay(Close)": func() { s.Delay(Close, time.Second) },
		"Fail(99)":     func() { s.Fail(Op(99), errBoom) },
		"Delay(-1)":    func() { s.Delay(Op(-1), time.Second) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s did not panic", name)
				}
			}()
			f()
		}()
	}
	if got := Increment.String(); got != "IncrementFailureCount" {
		t.Errorf("Increment.String() = %q", got)
	}
	if got := Op(42).String(); got != "Op(42)" {
		t.Errorf("Op(42).String() = %q", got)
	}
}

// Controls and calls race freely (run with -race): faults set and cleared
// from one goroutine while others call every operation.
func TestConcurrentControls(t *testing.T) {
	clock := storetest.NewClock(storetest.T0)
	s, _ := open(t, clock.Now)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			switch i % 4 {
			case 0:
				s.FailInsert(errBoom)
				s.FailLease(errBoom)
			case 1:
				s.Delay(Get, time.Microsecond)
			case 2:
				s.FailRemove(errBoom)
			case 3:
				s.Heal()
			}
		}
	}()
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				id := fmt.Sprintf("g%d-%d", g, i)
				if _, err := s.Insert(ctx, []storage.Timeout{row(id, clock.Now())}); err != nil && !errors.Is(err, errBoom) {
					t.Errorf("Insert: unexpected error %v", err)
				}
				_, _ = s.Get(ctx, id)
				if ls, err := s.Lease(ctx, "o", time.Time{}, 5, time.Minute); err == nil {
					for _, l := range ls {
						_, _ = s.Remove(ctx, []storage.Ref{{ID: l.ID, Lock: l.Lock}})
					}
				}
				_, _, _ = s.NextDue(ctx)
				_ = s.Calls(Insert)
			}
		}()
	}
	time.Sleep(50 * time.Millisecond)
	close(stop)
	wg.Wait()
	if got := s.Calls(Insert); got != 200 {
		t.Errorf("Calls(Insert) = %d, want 200", got)
	}
}

// fullStore is a boltstore counting the calls that reach it: LeasedBy
// answers 7 and records its arguments.
type fullStore struct {
	*boltstore.Store
	calls    map[Op]int
	leasedBy string
}

func (f *fullStore) Stats(ctx context.Context) (int, int, error) {
	f.calls[Stats]++
	return f.Store.Stats(ctx)
}

func (f *fullStore) LeasedBy(_ context.Context, owner string, atMost int) (int, error) {
	f.calls[LeasedBy]++
	f.leasedBy = fmt.Sprint(owner, " ", atMost)
	return 7, nil
}

func (f *fullStore) GetMany(ctx context.Context, ids []string) (map[string]storage.Timeout, error) {
	f.calls[GetMany]++
	return f.Store.GetMany(ctx, ids)
}

func (f *fullStore) CancelSaga(ctx context.Context, sagaID string) (int, int, error) {
	f.calls[CancelSaga]++
	return f.Store.CancelSaga(ctx, sagaID)
}

func (f *fullStore) ReplaceGroups(ctx context.Context, groups []string, ts []storage.Timeout) ([]storage.Outcome, int, int, error) {
	f.calls[ReplaceGroups]++
	return f.Store.ReplaceGroups(ctx, groups, ts)
}

func (f *fullStore) InsertAndCancel(ctx context.Context, ts []storage.Timeout, cancels []storage.OrderedCancel) ([]storage.Outcome, []storage.CancelResult, error) {
	f.calls[InsertAndCancel]++
	return f.Store.InsertAndCancel(ctx, ts, cancels)
}

func (f *fullStore) Bulk(ctx context.Context, fl storage.ListFilter, a storage.BulkAction) (storage.BulkResult, error) {
	f.calls[Bulk]++
	return f.Store.Bulk(ctx, fl, a)
}

func (f *fullStore) CountByDestination(ctx context.Context, from, to time.Time) (map[wire.Destination]storage.DestinationCount, error) {
	f.calls[CountByDestination]++
	return f.Store.CountByDestination(ctx, from, to)
}

func (f *fullStore) Pause(ctx context.Context, d wire.Destination, by string) (bool, error) {
	f.calls[Pause]++
	return f.Store.Pause(ctx, d, by)
}

func (f *fullStore) Resume(ctx context.Context, d wire.Destination) (bool, error) {
	f.calls[Resume]++
	return f.Store.Resume(ctx, d)
}

func (f *fullStore) Paused(ctx context.Context) ([]storage.PausedDestination, error) {
	f.calls[Paused]++
	return f.Store.Paused(ctx)
}

// The methods of the parts of storage.Store delegate when healed, and fail
// or wait with their own faults and delays without reaching the wrapped
// store.
func TestPartMethods(t *testing.T) {
	clock, inner, s := openFull(t)
	saga := row("c", clock.Now().Add(time.Hour))
	saga.SagaID = "saga-1"
	storetest.MustInsert(t, s, row("a", clock.Now()), row("b", clock.Now().Add(time.Hour)), saga)
	mustLease(t, s, 1)
	rowA, err := inner.Store.Get(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	// boltstore counts by destination once it has counted its file.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := inner.Store.CountByDestination(ctx, clock.Now(), clock.Now()); !errors.Is(err, storage.ErrNotYet) || time.Now().After(deadline) {
			break
		}
	}
	for _, tc := range []struct {
		op   Op
		call func(ctx context.Context) (any, error)
		want any
	}{
		{Stats, func(ctx context.Context) (any, error) {
			p, l, err := s.Stats(ctx)
			return [2]int{p, l}, err
		}, [2]int{3, 1}},
		{LeasedBy, func(ctx context.Context) (any, error) { return s.LeasedBy(ctx, "me", 5) }, 7},
		{GetMany, func(ctx context.Context) (any, error) { return s.GetMany(ctx, []string{"a", "zz"}) },
			map[string]storage.Timeout{"a": rowA}},
		{CancelSaga, func(ctx context.Context) (any, error) {
			c, l, err := s.CancelSaga(ctx, "saga-1")
			return [2]int{c, l}, err
		}, [2]int{1, 0}},
		{ReplaceGroups, func(ctx context.Context) (any, error) {
			r := row("d", clock.Now().Add(time.Hour))
			r.SagaID = "saga-2"
			o, c, l, err := s.ReplaceGroups(ctx, []string{"saga-2"}, []storage.Timeout{r})
			return fmt.Sprint(o, c, l), err
		}, fmt.Sprint([]storage.Outcome{storage.Stored}, 0, 0)},
		{InsertAndCancel, func(ctx context.Context) (any, error) {
			o, res, err := s.InsertAndCancel(ctx, []storage.Timeout{row("e", clock.Now().Add(time.Hour))},
				[]storage.OrderedCancel{{At: 0, ID: "e"}, {At: 1, ID: "f"}})
			return fmt.Sprint(o, res), err
		}, fmt.Sprint([]storage.Outcome{storage.Cancelled}, []storage.CancelResult{{Err: storage.ErrNotFound}, {Err: storage.ErrNotFound}})},
		{Bulk, func(ctx context.Context) (any, error) {
			return s.Bulk(ctx, storage.ListFilter{IDPrefix: "b"}, storage.BulkAction{Kind: storage.BulkShift, Shift: time.Minute})
		}, storage.BulkResult{Changed: 1}},
		{Pause, func(ctx context.Context) (any, error) { return s.Pause(ctx, wire.Queue("p"), "me") }, true},
		{Resume, func(ctx context.Context) (any, error) { return s.Resume(ctx, wire.Queue("p")) }, true},
		{Paused, func(ctx context.Context) (any, error) {
			ps, err := s.Paused(ctx)
			return len(ps), err
		}, 0},
		{CountByDestination, func(ctx context.Context) (any, error) {
			counts, err := s.CountByDestination(ctx, clock.Now(), clock.Now().Add(time.Minute))
			return counts[wire.Queue("dest")], err
		}, storage.DestinationCount{Pending: 3, DueSoon: 1}},
	} {
		t.Run(tc.op.String(), func(t *testing.T) {
			got, err := tc.call(ctx)
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("healed: %v, %v; want %v", got, err, tc.want)
			}
			if inner.calls[tc.op] != 1 {
				t.Fatalf("healed: the wrapped store had %d calls, want 1", inner.calls[tc.op])
			}

			s.Fail(tc.op, errBoom)
			_, err = tc.call(ctx)
			wantInjected(t, tc.op.String(), err)
			s.Heal()
			s.Delay(tc.op, time.Hour)
			cctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
			defer cancel()
			if _, err := tc.call(cctx); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("delayed past its context: %v, want DeadlineExceeded", err)
			}
			s.Heal()
			if inner.calls[tc.op] != 1 {
				t.Fatalf("failed calls reached the wrapped store (%d calls)", inner.calls[tc.op])
			}
			if n := s.Calls(tc.op); n != 3 {
				t.Fatalf("Calls(%v) = %d, want 3", tc.op, n)
			}
		})
	}
	if inner.leasedBy != "me 5" {
		t.Errorf("LeasedBy reached the wrapped store as %q, want owner me, atMost 5", inner.leasedBy)
	}
}

// ReplaceGroups and InsertAndCancel commit new rows as Insert does:
// Insert's fault and delay apply to them too, without counting an Insert
// or reaching the wrapped store.
func TestCommitsOfNewRowsTakeInsertFaults(t *testing.T) {
	for _, tc := range []struct {
		op   Op
		call func(s *Store, ctx context.Context, r storage.Timeout) error
	}{
		{ReplaceGroups, func(s *Store, ctx context.Context, r storage.Timeout) error {
			_, _, _, err := s.ReplaceGroups(ctx, []string{"g"}, []storage.Timeout{r})
			return err
		}},
		{InsertAndCancel, func(s *Store, ctx context.Context, r storage.Timeout) error {
			_, _, err := s.InsertAndCancel(ctx, []storage.Timeout{r}, []storage.OrderedCancel{{At: 1, ID: "x"}})
			return err
		}},
	} {
		t.Run(tc.op.String(), func(t *testing.T) {
			clock, inner, s := openFull(t)
			r := row("a", clock.Now().Add(time.Hour))
			r.SagaID = "g"
			s.FailInsert(errBoom)
			wantInjected(t, tc.op.String(), tc.call(s, ctx, r))
			s.Heal()
			s.Delay(Insert, time.Hour)
			cctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
			defer cancel()
			if err := tc.call(s, cctx, r); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("%v with Insert delayed past its context: %v, want DeadlineExceeded", tc.op, err)
			}
			if inner.calls[tc.op] != 0 || s.Calls(Insert) != 0 || s.Calls(tc.op) != 2 {
				t.Fatalf("wrapped store had %d %v; Calls(Insert) %d, Calls(%v) %d; want 0, 0, 2",
					inner.calls[tc.op], tc.op, s.Calls(Insert), tc.op, s.Calls(tc.op))
			}
			if _, err := inner.Store.Get(ctx, "a"); !errors.Is(err, storage.ErrNotFound) {
				t.Fatalf("a failed %v stored its row: %v", tc.op, err)
			}
		})
	}
}

// Properties are the wrapped store's; ReleaseLeases frees the wrapped
// store's leases when it can, and none when it cannot.
func TestPropertiesAndReleaseLeases(t *testing.T) {
	clock := storetest.NewClock(storetest.T0)
	s, bolt := open(t, clock.Now)
	if s.Properties() != bolt.Properties() {
		t.Fatalf("Properties %+v, want the wrapped store's %+v", s.Properties(), bolt.Properties())
	}
	storetest.MustInsert(t, s, row("a", clock.Now()))
	mustLease(t, s, 1)
	if n := Wrap(struct{ storage.Store }{bolt}).ReleaseLeases(); n != 0 {
		t.Fatalf("ReleaseLeases over a store that cannot = %d, want 0", n)
	}
	if n := s.ReleaseLeases(); n != 1 {
		t.Fatalf("ReleaseLeases = %d, want the boltstore's 1", n)
	}
	mustLease(t, s, 1)
}
