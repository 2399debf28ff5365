// Package faultstore wraps any storage.Store with fault injection for tests:
// per-operation injected errors and delays, and call counters. A healed
// faultstore is transparent: every call is delegated unchanged.
//
//	fs := faultstore.Wrap(inner)
//	fs.FailInsert(errors.New("disk full")) // Insert fails, inner untouched
//	fs.Delay(faultstore.Insert, 200*time.Millisecond)
//	...
//	fs.Heal()
//
// It forwards every method of storage.Store, so that code under test runs
// the paths it runs on the wrapped store, each with faults of its own.
// ReplaceGroups, an insert of replacing rows, and InsertAndCancel, an
// insert with cancels among its rows, also fail and wait with Insert's
// faults, so that a test failing inserts fails every commit of new rows.
//
// All controls are safe for concurrent use with the store's methods.
package faultstore

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/wire"
)

// Op names one method of storage.Store.
type Op int

// The operations a fault or delay can be set on. Close is counted but
// cannot be failed or delayed.
const (
	Insert Op = iota
	Lease
	Get
	Remove
	Release
	Increment // IncrementFailureCount
	NextDue
	Reap
	List
	Cancel
	Reschedule
	Stats              // storage.Stater
	LeasedBy           // storage.LeaseCounter
	GetMany            // storage.MultiGetter
	CancelSaga         // storage.SagaCanceller
	Bulk               // storage.Bulker
	CountByDestination // storage.DestinationCounter
	Pause              // storage.Pauser
	Resume             // storage.Pauser
	Paused             // storage.Pauser
	ReplaceGroups      // storage.GroupReplacer; Insert's faults apply too
	PutSchedule        // storage.Scheduler
	ChangeSchedule     // storage.Scheduler: CancelSchedule, PauseSchedule, ResumeSchedule
	ReadSchedules      // storage.Scheduler: GetSchedule, ListSchedules, NextScheduleDue
	Fire               // storage.Scheduler: FireDue, FireNow
	InsertAndCancel    // storage.InsertCanceller; Insert's faults apply too
	Close
	numOps
)

var opNames = [...]string{
	Insert: "Insert", Lease: "Lease", Get: "Get", Remove: "Remove", Release: "Release",
	Increment: "IncrementFailureCount", NextDue: "NextDue", Reap: "Reap", List: "List", Cancel: "Cancel",
	Reschedule: "Reschedule", Stats: "Stats", LeasedBy: "LeasedBy", GetMany: "GetMany", Close: "Close",
	CancelSaga: "CancelSaga", Bulk: "Bulk", CountByDestination: "CountByDestination",
	Pause: "Pause", Resume: "Resume", Paused: "Paused", ReplaceGroups: "ReplaceGroups",
	PutSchedule: "PutSchedule", ChangeSchedule: "ChangeSchedule", ReadSchedules: "ReadSchedules", Fire: "Fire",
	InsertAndCancel: "InsertAndCancel",
}

func (op Op) String() string {
	if op >= 0 && op < numOps {
		return opNames[op]
	}
	return fmt.Sprintf("Op(%d)", int(op))
}

// Store is a storage.Store that delegates to another one unless a fault is
// injected. A call whose operation has an injected error waits its delay (if
// any), counts, and returns that error without touching the wrapped store.
type Store struct {
	inner storage.Store

	mu     sync.Mutex
	errs   [numOps]error
	delays [numOps]time.Duration

	calls [numOps]atomic.Int64

	closeOnce sync.Once
}

var (
	_ storage.Store         = (*Store)(nil)
	_ storage.LeaseReleaser = (*Store)(nil)
	_ storage.Scheduler     = (*Store)(nil)
)

// Wrap returns a healed faultstore around s.
func Wrap(s storage.Store) *Store {
	return &Store{inner: s}
}

// Unwrap returns the wrapped store (to inspect it behind the faults).
func (s *Store) Unwrap() storage.Store { return s.inner }

// Fail makes every later call of op return err (errors.Is-comparable: it is
// returned as is) until cleared; nil clears it. Close cannot be failed.
func (s *Store) Fail(op Op, err error) {
	if op < 0 || op >= numOps || op == Close {
		panic(fmt.Sprintf("faultstore: cannot fail %v", op))
	}
	s.mu.Lock()
	s.errs[op] = err
	s.mu.Unlock()
}

// FailInsert sets (nil clears) the error Insert returns.
func (s *Store) FailInsert(err error) { s.Fail(Insert, err) }

// FailLease sets (nil clears) the error Lease returns.
func (s *Store) FailLease(err error) { s.Fail(Lease, err) }

// FailNextDue sets (nil clears) the error NextDue returns.
func (s *Store) FailNextDue(err error) { s.Fail(NextDue, err) }

// FailGet sets (nil clears) the error Get returns.
func (s *Store) FailGet(err error) { s.Fail(Get, err) }

// FailRemove sets (nil clears) the error Remove returns (as the error of the
// whole commit).
func (s *Store) FailRemove(err error) { s.Fail(Remove, err) }

// FailRelease sets (nil clears) the error Release returns.
func (s *Store) FailRelease(err error) { s.Fail(Release, err) }

// FailIncrement sets (nil clears) the error IncrementFailureCount returns.
func (s *Store) FailIncrement(err error) { s.Fail(Increment, err) }

// FailReap sets (nil clears) the error Reap returns.
func (s *Store) FailReap(err error) { s.Fail(Reap, err) }

// Delay makes every later call of op wait d before it runs (or fails); zero
// clears it. The wait ends early when the call's context ends, and the call
// then fails with an error wrapping ctx.Err() without touching the wrapped
// store. Close cannot be delayed.
func (s *Store) Delay(op Op, d time.Duration) {
	if op < 0 || op >= numOps || op == Close {
		panic(fmt.Sprintf("faultstore: cannot delay %v", op))
	}
	s.mu.Lock()
	s.delays[op] = max(d, 0)
	s.mu.Unlock()
}

// Heal clears every injected error and delay. Counters are kept.
func (s *Store) Heal() {
	s.mu.Lock()
	s.errs = [numOps]error{}
	s.delays = [numOps]time.Duration{}
	s.mu.Unlock()
}

// Calls returns how many times op was called, failing calls included.
func (s *Store) Calls(op Op) int {
	if op < 0 || op >= numOps {
		return 0
	}
	return int(s.calls[op].Load())
}

// enter counts the call, waits its delay and returns the injected error, if
// any. A non-nil result means: do not touch the wrapped store.
func (s *Store) enter(ctx context.Context, op Op) error {
	s.calls[op].Add(1)
	return s.fault(ctx, op)
}

// fault waits op's delay and returns op's injected error, if any, without
// counting a call.
func (s *Store) fault(ctx context.Context, op Op) error {
	s.mu.Lock()
	d := s.delays[op]
	s.mu.Unlock()
	if d > 0 {
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("faultstore: %v: %w", op, ctx.Err())
		case <-t.C:
		}
	}
	// Read the fault after the delay: a slow call sees a Heal made meanwhile.
	s.mu.Lock()
	err := s.errs[op]
	s.mu.Unlock()
	return err
}

// Insert implements storage.Store.
func (s *Store) Insert(ctx context.Context, ts []storage.Timeout) ([]storage.Outcome, error) {
	if err := s.enter(ctx, Insert); err != nil {
		return nil, err
	}
	return s.inner.Insert(ctx, ts)
}

// Lease implements storage.Store.
func (s *Store) Lease(ctx context.Context, owner string, dueBy time.Time, limit int, d time.Duration) ([]storage.Lease, error) {
	if err := s.enter(ctx, Lease); err != nil {
		return nil, err
	}
	return s.inner.Lease(ctx, owner, dueBy, limit, d)
}

// Get implements storage.Store.
func (s *Store) Get(ctx context.Context, id string) (storage.Timeout, error) {
	if err := s.enter(ctx, Get); err != nil {
		return storage.Timeout{}, err
	}
	return s.inner.Get(ctx, id)
}

// Remove implements storage.Store.
func (s *Store) Remove(ctx context.Context, refs []storage.Ref) ([]error, error) {
	if err := s.enter(ctx, Remove); err != nil {
		return nil, err
	}
	return s.inner.Remove(ctx, refs)
}

// Release implements storage.Store.
func (s *Store) Release(ctx context.Context, id, lock string, notBefore time.Time) error {
	if err := s.enter(ctx, Release); err != nil {
		return err
	}
	return s.inner.Release(ctx, id, lock, notBefore)
}

// IncrementFailureCount implements storage.Store.
func (s *Store) IncrementFailureCount(ctx context.Context, id, lock, reason string) (int, error) {
	if err := s.enter(ctx, Increment); err != nil {
		return 0, err
	}
	return s.inner.IncrementFailureCount(ctx, id, lock, reason)
}

// NextDue implements storage.Store.
func (s *Store) NextDue(ctx context.Context) (time.Time, bool, error) {
	if err := s.enter(ctx, NextDue); err != nil {
		return time.Time{}, false, err
	}
	return s.inner.NextDue(ctx)
}

// Reap implements storage.Store.
func (s *Store) Reap(ctx context.Context) (int, error) {
	if err := s.enter(ctx, Reap); err != nil {
		return 0, err
	}
	return s.inner.Reap(ctx)
}

// List delegates unless List is failing.
func (s *Store) List(ctx context.Context, f storage.ListFilter) ([]storage.Timeout, string, error) {
	if err := s.enter(ctx, List); err != nil {
		return nil, "", err
	}
	return s.inner.List(ctx, f)
}

// Cancel delegates unless Cancel is failing.
func (s *Store) Cancel(ctx context.Context, id string, mode storage.CancelMode) error {
	if err := s.enter(ctx, Cancel); err != nil {
		return err
	}
	return s.inner.Cancel(ctx, id, mode)
}

// Reschedule delegates unless Reschedule is failing.
func (s *Store) Reschedule(ctx context.Context, id string, dueAt time.Time) error {
	if err := s.enter(ctx, Reschedule); err != nil {
		return err
	}
	return s.inner.Reschedule(ctx, id, dueAt)
}

// Stats implements storage.Stater.
func (s *Store) Stats(ctx context.Context) (pending, leased int, err error) {
	if err := s.enter(ctx, Stats); err != nil {
		return 0, 0, err
	}
	return s.inner.Stats(ctx)
}

// LeasedBy implements storage.LeaseCounter.
func (s *Store) LeasedBy(ctx context.Context, owner string, atMost int) (int, error) {
	if err := s.enter(ctx, LeasedBy); err != nil {
		return 0, err
	}
	return s.inner.LeasedBy(ctx, owner, atMost)
}

// GetMany implements storage.MultiGetter.
func (s *Store) GetMany(ctx context.Context, ids []string) (map[string]storage.Timeout, error) {
	if err := s.enter(ctx, GetMany); err != nil {
		return nil, err
	}
	return s.inner.GetMany(ctx, ids)
}

// CancelSaga implements storage.SagaCanceller.
func (s *Store) CancelSaga(ctx context.Context, sagaID string) (cancelled, leased int, err error) {
	if err := s.enter(ctx, CancelSaga); err != nil {
		return 0, 0, err
	}
	return s.inner.CancelSaga(ctx, sagaID)
}

// ReplaceGroups implements storage.GroupReplacer. Insert's faults apply
// too, after its own (Insert's calls are not counted): it is the commit of
// new rows that Insert is for other messages.
func (s *Store) ReplaceGroups(ctx context.Context, groups []string, ts []storage.Timeout) ([]storage.Outcome, int, int, error) {
	if err := s.enter(ctx, ReplaceGroups); err != nil {
		return nil, 0, 0, err
	}
	if err := s.fault(ctx, Insert); err != nil {
		return nil, 0, 0, err
	}
	return s.inner.ReplaceGroups(ctx, groups, ts)
}

// InsertAndCancel implements storage.InsertCanceller. Insert's faults
// apply too, after its own, as for ReplaceGroups: it commits the new rows
// of a batch that holds cancels.
func (s *Store) InsertAndCancel(ctx context.Context, ts []storage.Timeout, cancels []storage.OrderedCancel) ([]storage.Outcome, []storage.CancelResult, error) {
	if err := s.enter(ctx, InsertAndCancel); err != nil {
		return nil, nil, err
	}
	if err := s.fault(ctx, Insert); err != nil {
		return nil, nil, err
	}
	return s.inner.InsertAndCancel(ctx, ts, cancels)
}

// Bulk implements storage.Bulker.
func (s *Store) Bulk(ctx context.Context, f storage.ListFilter, a storage.BulkAction) (storage.BulkResult, error) {
	if err := s.enter(ctx, Bulk); err != nil {
		return storage.BulkResult{}, err
	}
	return s.inner.Bulk(ctx, f, a)
}

// CountByDestination implements storage.DestinationCounter.
func (s *Store) CountByDestination(ctx context.Context, soonFrom, soonTo time.Time) (map[wire.Destination]storage.DestinationCount, error) {
	if err := s.enter(ctx, CountByDestination); err != nil {
		return nil, err
	}
	return s.inner.CountByDestination(ctx, soonFrom, soonTo)
}

// Pause implements storage.Pauser.
func (s *Store) Pause(ctx context.Context, d wire.Destination, by string) (bool, error) {
	if err := s.enter(ctx, Pause); err != nil {
		return false, err
	}
	return s.inner.Pause(ctx, d, by)
}

// Resume implements storage.Pauser.
func (s *Store) Resume(ctx context.Context, d wire.Destination) (bool, error) {
	if err := s.enter(ctx, Resume); err != nil {
		return false, err
	}
	return s.inner.Resume(ctx, d)
}

// Paused implements storage.Pauser.
func (s *Store) Paused(ctx context.Context) ([]storage.PausedDestination, error) {
	if err := s.enter(ctx, Paused); err != nil {
		return nil, err
	}
	return s.inner.Paused(ctx)
}

// Properties are the wrapped store's; no fault applies.
func (s *Store) Properties() storage.Properties { return s.inner.Properties() }

// ReleaseLeases frees the wrapped store's leases when it can
// (storage.LeaseReleaser) and returns how many; over a store that cannot,
// it frees none. Callers ask it only of a store that is not shared
// (storage.Properties), which can; no fault applies.
func (s *Store) ReleaseLeases() int {
	if r, ok := s.inner.(storage.LeaseReleaser); ok {
		return r.ReleaseLeases()
	}
	return 0
}

// Close closes the wrapped store the first time and returns its result;
// closing again is a no-op returning nil. Faults do not apply to Close.
func (s *Store) Close() error {
	s.calls[Close].Add(1)
	var err error
	s.closeOnce.Do(func() { err = s.inner.Close() })
	return err
}
