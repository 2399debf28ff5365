package boltstore

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/storage/storetest"
	"github.com/delaybridge/delaybridge/wire"
)

// TestPauseNoScanAndReopen: a paused destination's due rows, however many,
// are never stepped over by Lease or NextDue; the pause and its rows'
// place survive a reopen; Resume makes them leasable.
func TestPauseNoScanAndReopen(t *testing.T) {
	const n = 20_000
	clock := storetest.NewClock(t0)
	path := filepath.Join(t.TempDir(), "db")
	s := open(t, path, clock.Now)
	for i := 0; i < n; i += 5000 {
		ts := make([]storage.Timeout, 0, 5000)
		for j := i; j < i+5000; j++ {
			ts = append(ts, storage.Timeout{ID: fmt.Sprintf("p-%06d", j), Destination: "p",
				DueAt: t0.Add(-time.Duration(j+1) * time.Millisecond), Message: []byte("m")})
		}
		if _, err := s.Insert(ctx, ts); err != nil {
			t.Fatal(err)
		}
	}
	if ok, err := s.Pause(ctx, wire.Queue("p"), "ops"); err != nil || !ok {
		t.Fatalf("Pause = %v, %v", ok, err)
	}
	// Inserted while paused, due: held as well.
	if _, err := s.Insert(ctx, []storage.Timeout{
		{ID: "p-late", Destination: "p", DueAt: t0.Add(-time.Hour), Message: []byte("m")},
		{ID: "other", Destination: "o", DueAt: t0, Message: []byte("m")},
	}); err != nil {
		t.Fatal(err)
	}
	steps := func(what string, max int64, f func()) { t.Helper(); expectSteps(t, s, what, max, f) }
	steps("Lease", 1, func() {
		ls, err := s.Lease(ctx, "o", time.Time{}, 1000, time.Minute)
		if err != nil || len(ls) != 1 || ls[0].ID != "other" {
			t.Fatalf("Lease = %v, %v; want [other]", ls, err)
		}
		if _, err := s.Remove(ctx, []storage.Ref{{ID: ls[0].ID, Lock: ls[0].Lock}}); err != nil {
			t.Fatal(err)
		}
	})
	steps("NextDue", 0, func() {
		if at, ok, err := s.NextDue(ctx); err != nil || ok {
			t.Fatalf("NextDue with only paused rows = %s, %v, %v; want none", at, ok, err)
		}
	})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = open(t, path, clock.Now)
	ps, err := s.Paused(ctx)
	if err != nil || len(ps) != 1 || ps[0].Destination != wire.Queue("p") || ps[0].By != "ops" || !ps[0].Since.Equal(t0) {
		t.Fatalf("Paused after reopen = %+v, %v", ps, err)
	}
	if ls, err := s.Lease(ctx, "o", time.Time{}, 1000, time.Minute); err != nil || len(ls) != 0 {
		t.Fatalf("Lease after reopen = %d rows, %v; want none", len(ls), err)
	}
	rows, _, err := s.List(ctx, storage.ListFilter{Destination: "p", Limit: 2})
	if err != nil || len(rows) != 2 || rows[0].ID != "p-late" || !rows[0].Paused || !rows[1].Paused {
		t.Fatalf("List after reopen = %+v, %v", rows, err)
	}
	if ok, err := s.Resume(ctx, wire.Queue("p")); err != nil || !ok {
		t.Fatalf("Resume = %v, %v", ok, err)
	}
	got := 0
	for {
		ls, err := s.Lease(ctx, "o", time.Time{}, 5000, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if len(ls) == 0 {
			break
		}
		got += len(ls)
	}
	if got != n+1 {
		t.Fatalf("leased %d rows after Resume, want %d", got, n+1)
	}
	if pending, _, err := s.Stats(ctx); err != nil || pending != n+1 {
		t.Fatalf("Stats = %d, %v", pending, err)
	}
}
