package boltstore

import (
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/storage/storetest"
)

// ReleaseLeases frees every lease at once: the rows can be leased again
// right away, and a token of a freed lease no longer removes its row.
func TestReleaseLeases(t *testing.T) {
	clock := storetest.NewClock(t0)
	s := open(t, filepath.Join(t.TempDir(), "db"), clock.Now)
	for i := range 3 {
		if _, err := s.Insert(ctx, []storage.Timeout{{ID: fmt.Sprint("r", i), Destination: "d", DueAt: t0.Add(-time.Second)}}); err != nil {
			t.Fatal(err)
		}
	}
	first, err := s.Lease(ctx, "me", time.Time{}, 2, time.Hour)
	if err != nil || len(first) != 2 {
		t.Fatalf("Lease = %v, %v; want 2 rows", first, err)
	}
	if n := s.ReleaseLeases(); n != 2 {
		t.Fatalf("ReleaseLeases = %d, want 2", n)
	}
	if _, leased, err := s.Stats(ctx); err != nil || leased != 0 {
		t.Fatalf("Stats: %d leased, %v; want 0", leased, err)
	}
	again, err := s.Lease(ctx, "me", time.Time{}, 10, time.Hour)
	if err != nil || len(again) != 3 {
		t.Fatalf("Lease after ReleaseLeases = %d rows, %v; want all 3", len(again), err)
	}
	res, err := s.Remove(ctx, []storage.Ref{{ID: first[0].ID, Lock: first[0].Lock}})
	if err != nil {
		t.Fatal(err)
	}
	if res[0] == nil || errors.Is(res[0], storage.ErrNotFound) {
		t.Fatalf("Remove with a freed lease's lock = %v, want a refusal of the stale lock", res[0])
	}
	if n := s.ReleaseLeases(); n != 3 {
		t.Errorf("second ReleaseLeases = %d, want 3", n)
	}
	if n := s.ReleaseLeases(); n != 0 {
		t.Errorf("ReleaseLeases with none held = %d, want 0", n)
	}
}

// storage.ReleaseEach gives back the leases of an unpublished batch in one
// commit (they queue for the group commit together), not one commit each:
// a lost broker connection then costs one fsync, not one per lease.
func TestReleaseEachSharesOneCommit(t *testing.T) {
	clock := storetest.NewClock(t0)
	s := open(t, filepath.Join(t.TempDir(), "db"), clock.Now)
	const n = 40
	for i := range n {
		if _, err := s.Insert(ctx, []storage.Timeout{{ID: fmt.Sprint("r", i), Destination: "d", DueAt: t0.Add(-time.Second)}}); err != nil {
			t.Fatal(err)
		}
	}
	ls, err := s.Lease(ctx, "me", time.Time{}, n, time.Hour)
	if err != nil || len(ls) != n {
		t.Fatalf("Lease = %d rows, %v; want %d", len(ls), err, n)
	}
	refs := make([]storage.Ref, n)
	for i, l := range ls {
		refs[i] = storage.Ref{ID: l.ID, Lock: l.Lock}
	}
	release := holdCommits(t, s)
	before := txID(t, s)
	done := make(chan []error, 1)
	go func() { done <- storage.ReleaseEach(ctx, s, refs, time.Time{}) }()
	queued := time.Now().Add(5 * time.Second)
	for len(s.ops) < n && time.Now().Before(queued) {
		time.Sleep(time.Millisecond)
	}
	q := len(s.ops)
	release()
	for i, err := range <-done {
		if err != nil {
			t.Errorf("release of %s: %v", refs[i].ID, err)
		}
	}
	if q < n {
		t.Errorf("%d releases queued for the commit together, want all %d", q, n)
	}
	// The holding write's commit and the releases'.
	if commits := txID(t, s) - before; commits != 2 {
		t.Errorf("%d commits for the holding write and %d releases, want 2", commits, n)
	}
	if again, err := s.Lease(ctx, "me", time.Time{}, n+1, time.Hour); err != nil || len(again) != n {
		t.Fatalf("Lease after ReleaseEach = %d rows, %v; want all %d", len(again), err, n)
	}
}
