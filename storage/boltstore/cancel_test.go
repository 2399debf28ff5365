package boltstore

import (
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/storage/storetest"
)

// A file written before cancel tombstones (format 1) has no bucket for
// them: it converts, gains the bucket, and Cancel records tombstones in it.
func TestOpenAddsTheCancelBucket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "old.db")
	writeFormat1(t, path, &record{Timeout: storage.Timeout{ID: "kept", Destination: "d", DueAt: time.Now().Add(time.Hour)}})
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error { return tx.DeleteBucket(bucketCancelled) }); err != nil {
		t.Fatalf("make an old file: %v", err)
	}
	db.Close()

	s, err := Open(path, Options{})
	if err != nil {
		t.Fatalf("Open of a file without the cancel bucket: %v", err)
	}
	defer s.Close()
	if _, err := s.Get(ctx, "kept"); err != nil {
		t.Fatalf("row of the old file: %v", err)
	}
	if err := s.Cancel(ctx, "late", storage.CancelOrdered); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("Cancel: %v", err)
	}
	if got, err := s.Insert(ctx, []storage.Timeout{{ID: "late", Destination: "d", DueAt: time.Now()}}); err != nil || got[0] != storage.Cancelled {
		t.Fatalf("Insert of a cancelled id = %v, %v; want false", got, err)
	}
}

// TestReapPurgesExpiredTombstones: Reap deletes expired tombstones from
// the file, not live ones.
func TestReapPurgesExpiredTombstones(t *testing.T) {
	clock := storetest.NewClock(storetest.T0)
	s, err := Open(filepath.Join(t.TempDir(), "s.db"), Options{Now: clock.Now, CancelWindow: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for i := range 5 {
		if err := s.Cancel(ctx, fmt.Sprintf("gone-%d", i), storage.CancelOrdered); !errors.Is(err, storage.ErrNotFound) {
			t.Fatalf("Cancel: %v", err)
		}
	}
	count := func() int {
		t.Helper()
		n := 0
		if err := s.db.View(func(tx *bolt.Tx) error { n = tx.Bucket(bucketCancelled).Stats().KeyN; return nil }); err != nil {
			t.Fatal(err)
		}
		return n
	}
	clock.Advance(time.Minute - time.Nanosecond)
	if _, err := s.Reap(ctx); err != nil {
		t.Fatal(err)
	}
	if got := count(); got != 5 {
		t.Fatalf("Reap deleted live tombstones: %d left, want 5", got)
	}
	clock.Advance(time.Nanosecond)
	if _, err := s.Reap(ctx); err != nil {
		t.Fatal(err)
	}
	if got := count(); got != 0 {
		t.Fatalf("%d expired tombstones left after Reap", got)
	}
}
