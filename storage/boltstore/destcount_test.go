package boltstore

import (
	"errors"
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/storage/storetest"
	"github.com/delaybridge/delaybridge/wire"
)

// The per-destination counts live in memory: Open counts them from the
// file, and a write that fails counts nothing.
func TestDestinationCountAtOpen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "db")
	s := open(t, path, nil)
	insertFuture(t, s, 25_000) // destination d
	if _, err := s.Insert(ctx, []storage.Timeout{{ID: "x", Exchange: "x", Destination: "k", DueAt: t0, Message: []byte{1}}}); err != nil {
		t.Fatal(err)
	}
	want := map[wire.Destination]storage.DestinationCount{wire.Queue("d"): {Pending: 25_000}, {Exchange: "x", Key: "k"}: {Pending: 1, DueSoon: 1}}
	check := func(s *Store, when string) {
		t.Helper()
		got, err := s.CountByDestination(ctx, t0, t0.Add(time.Minute))
		if err != nil || len(got) != 2 || got[wire.Queue("d")] != want[wire.Queue("d")] || got[wire.Destination{Exchange: "x", Key: "k"}] != want[wire.Destination{Exchange: "x", Key: "k"}] {
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
	t.Logf("Open of %d rows took %s", 25_001, time.Since(start))
	check(s, "after a reopen")
}

// BenchmarkOpenCount: one op = Open (and Close) of a file of 1,000,000
// rows, which counts them per destination. Not run by the tests: it
// inserts for minutes.
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
		s.Close()
	}
}
