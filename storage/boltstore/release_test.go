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
