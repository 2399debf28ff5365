package boltstore

import (
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/storage/storetest"
	"github.com/delaybridge/delaybridge/wire"
)

// The per-destination counts live in memory: a reopened store counts them
// from the file in the background, and a write that fails counts nothing.
func TestDestinationCountAtOpen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "db")
	s := open(t, path, nil)
	insertFuture(t, s, 25_000) // destination d
	// Two destinations whose exchange and key, run together, read the same.
	if _, err := s.Insert(ctx, []storage.Timeout{
		{ID: "x", Exchange: "x", Destination: "k", DueAt: t0, Message: []byte{1}},
		{ID: "ab-c", Exchange: "ab", Destination: "c", DueAt: t0.Add(time.Hour), Message: []byte{1}},
		{ID: "a-bc", Exchange: "a", Destination: "bc", DueAt: t0.Add(time.Hour), Message: []byte{1}},
	}); err != nil {
		t.Fatal(err)
	}
	want := map[wire.Destination]storage.DestinationCount{
		wire.Queue("d"):            {Pending: 25_000},
		{Exchange: "x", Key: "k"}:  {Pending: 1, DueSoon: 1},
		{Exchange: "ab", Key: "c"}: {Pending: 1},
		{Exchange: "a", Key: "bc"}: {Pending: 1},
	}
	check := func(s *Store, when string) {
		t.Helper()
		got, err := s.CountByDestination(ctx, t0, t0.Add(time.Minute))
		for deadline := time.Now().Add(time.Minute); errors.Is(err, storage.ErrNotYet) && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond)
			got, err = s.CountByDestination(ctx, t0, t0.Add(time.Minute))
		}
		if err != nil || !maps.Equal(got, want) {
			t.Fatalf("%s: CountByDestination = %v, %v; want %v", when, got, err, want)
		}
	}
	check(s, "after the inserts")
	// A write that fails (here: an error from inside the transaction)
	// leaves the counts as they were.
	boom := errors.New("boom")
	err := s.update(func(tx *bolt.Tx, c *counts) error {
		b, err := buckets(tx, c)
		if err != nil {
			return err
		}
		r, err := b.load("x")
		if err != nil {
			return err
		}
		if err := b.forget(r); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("failing write: %v", err)
	}
	check(s, "after a failed write")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	s = open(t, path, nil)
	t.Logf("Open of %d rows took %s", 25_003, time.Since(start))
	// Writes all over the sequence range while the background count runs:
	// each is counted once, whether the count had passed its row or not.
	var ins []storage.Timeout
	var rm []storage.Ref
	for i := 0; i < 25_000; i += 500 {
		ins = append(ins, storage.Timeout{ID: fmt.Sprintf("future-%07d-new", i), Destination: "d2", DueAt: t0.Add(time.Hour), Message: []byte{1}})
		rm = append(rm, storage.Ref{ID: fmt.Sprintf("future-%07d", i+1)})
	}
	for i := range ins {
		if _, err := s.Insert(ctx, ins[i:i+1]); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Remove(ctx, rm[i:i+1]); err != nil {
			t.Fatal(err)
		}
	}
	want[wire.Queue("d")] = storage.DestinationCount{Pending: 25_000 - len(rm)}
	want[wire.Queue("d2")] = storage.DestinationCount{Pending: len(ins)}
	check(s, "after a reopen and writes during the count")
	s.Close()
	s = open(t, path, nil)
	check(s, "after another reopen")
}

// BenchmarkOpenCount: one op = Open of a file of 1,000,000 rows and its
// count of them per destination (until CountByDestination answers), then
// Close. Not run by the tests: it inserts for minutes.
func BenchmarkOpenCount(b *testing.B) {
	path := filepath.Join(b.TempDir(), "db")
	s := open(b, path, storetest.NewClock(t0).Now)
	insertFuture(b, s, 1_000_000)
	s.Close()
	b.ResetTimer()
	for range b.N {
		s, err := Open(path, Options{})
		if err != nil {
			b.Fatal(err)
		}
		for {
			if _, err := s.CountByDestination(ctx, t0, t0); !errors.Is(err, storage.ErrNotYet) {
				break
			}
			time.Sleep(time.Millisecond)
		}
		s.Close()
	}
}

// A row a retry holds sits in index held at its due time and in ready at
// its retry time: the due-soon counts and Bulk's walk find it once, at its
// due time.
func TestDueWalkHeldRows(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "db"), nil)
	defer s.Close()
	ins := []storage.Timeout{
		{ID: "held", Destination: "h", DueAt: t0, NotBefore: t0.Add(2 * time.Hour), Message: []byte{1}},
		{ID: "plain", Destination: "p", DueAt: t0.Add(30 * time.Second), Message: []byte{1}},
	}
	if _, err := s.Insert(ctx, ins); err != nil {
		t.Fatal(err)
	}
	count := func(from, to time.Time) map[wire.Destination]storage.DestinationCount {
		t.Helper()
		got, err := s.CountByDestination(ctx, from, to)
		for deadline := time.Now().Add(time.Minute); errors.Is(err, storage.ErrNotYet) && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond)
			got, err = s.CountByDestination(ctx, from, to)
		}
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	want := map[wire.Destination]storage.DestinationCount{wire.Queue("h"): {Pending: 1, DueSoon: 1}, wire.Queue("p"): {Pending: 1, DueSoon: 1}}
	if got := count(t0, t0.Add(time.Minute)); !maps.Equal(got, want) {
		t.Fatalf("due soon over the due times = %v, want %v", got, want)
	}
	want = map[wire.Destination]storage.DestinationCount{wire.Queue("h"): {Pending: 1}, wire.Queue("p"): {Pending: 1}}
	if got := count(t0.Add(2*time.Hour), t0.Add(2*time.Hour+time.Minute)); !maps.Equal(got, want) {
		t.Fatalf("due soon over the retry time = %v, want %v", got, want)
	}
	for _, desc := range []bool{false, true} {
		a := storage.BulkAction{Kind: storage.BulkShift, Shift: -time.Second}
		if desc {
			a.Shift = time.Second
		}
		res, err := s.Bulk(ctx, storage.ListFilter{DueFrom: t0.Add(-time.Minute), DueTo: t0.Add(time.Hour)}, a)
		if err != nil || res != (storage.BulkResult{Changed: 2}) {
			t.Fatalf("Bulk (shift %s) = %+v, %v; want 2 changed", a.Shift, res, err)
		}
	}
	if got, err := s.Get(ctx, "held"); err != nil || !got.DueAt.Equal(t0) || !got.NotBefore.IsZero() {
		t.Fatalf("held row after the shifts: %+v, %v", got, err)
	}
}
