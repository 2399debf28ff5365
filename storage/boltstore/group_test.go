package boltstore

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/storage/storetest"
)

// txID is the id of the last committed write transaction: the number of
// commits so far.
func txID(t *testing.T, s *Store) int {
	t.Helper()
	var id int
	if err := s.db.View(func(tx *bolt.Tx) error { id = int(tx.ID()); return nil }); err != nil {
		t.Fatal(err)
	}
	return id
}

// holdCommits blocks the commit loop until the returned func runs; writes
// queue meanwhile.
func holdCommits(t *testing.T, s *Store) (release func()) {
	t.Helper()
	started, gate := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- s.update(func(*bolt.Tx, *counts) error { close(started); <-gate; return nil })
	}()
	<-started
	return func() {
		close(gate)
		if err := <-done; err != nil {
			t.Errorf("holding write: %v", err)
		}
	}
}

// waitQueued waits until n writes wait for the commit loop.
func waitQueued(t *testing.T, s *Store, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for len(s.ops) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d writes queued, want %d", len(s.ops), n)
		}
		time.Sleep(time.Millisecond)
	}
}

func timeout(id string) storage.Timeout {
	return storage.Timeout{ID: id, Destination: "q", DueAt: storetest.T0, ReceivedAt: storetest.T0, Message: []byte("m")}
}

func TestWritesThatQueueShareOneCommit(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "db"), storetest.NewClock(t0).Now)
	release := holdCommits(t, s)
	before := txID(t, s)
	const n = 20
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = s.Insert(context.Background(), []storage.Timeout{timeout(fmt.Sprint("id-", i))})
		}()
	}
	waitQueued(t, s, n)
	release()
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("insert %d: %v", i, err)
		}
	}
	// The holding write, then the 20 inserts together.
	if got := txID(t, s) - before; got != 2 {
		t.Fatalf("%d commits for a held write and %d queued inserts, want 2", got, n)
	}
	if pending, _, err := s.Stats(context.Background()); err != nil || pending != n {
		t.Fatalf("Stats = %d, %v; want %d", pending, err, n)
	}
	closeAndVerify(t, s)
}

func TestAFailingWriteDoesNotSpoilItsGroup(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "db"), storetest.NewClock(t0).Now)
	if _, err := s.Insert(context.Background(), []storage.Timeout{timeout("leased")}); err != nil {
		t.Fatal(err)
	}
	release := holdCommits(t, s)
	boom := errors.New("boom")
	var wg sync.WaitGroup
	results := make(map[string]error)
	var mu sync.Mutex
	run := func(name string, f func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := f()
			mu.Lock()
			results[name] = err
			mu.Unlock()
		}()
	}
	run("a", func() error { _, err := s.Insert(context.Background(), []storage.Timeout{timeout("a")}); return err })
	waitQueued(t, s, 1)
	run("fails", func() error {
		return s.update(func(tx *bolt.Tx, c *counts) error {
			// A write that changed something, then failed: its change
			// must be rolled back, and the others' kept.
			if err := tx.Bucket(bucketMeta).Put([]byte("scratch"), []byte("x")); err != nil {
				return err
			}
			return boom
		})
	})
	waitQueued(t, s, 2)
	run("refused", func() error { return s.Release(context.Background(), "missing", "", time.Time{}) })
	waitQueued(t, s, 3)
	run("b", func() error { _, err := s.Insert(context.Background(), []storage.Timeout{timeout("b")}); return err })
	waitQueued(t, s, 4)
	release()
	wg.Wait()
	if results["a"] != nil || results["b"] != nil {
		t.Fatalf("inserts beside a failing write: a %v, b %v", results["a"], results["b"])
	}
	if !errors.Is(results["fails"], boom) {
		t.Fatalf("failing write returned %v, want %v", results["fails"], boom)
	}
	if !errors.Is(results["refused"], storage.ErrNotFound) {
		t.Fatalf("release of a missing row returned %v, want ErrNotFound", results["refused"])
	}
	_ = s.db.View(func(tx *bolt.Tx) error {
		if v := tx.Bucket(bucketMeta).Get([]byte("scratch")); v != nil {
			t.Errorf("the failing write's change was committed")
		}
		return nil
	})
	for _, id := range []string{"a", "b"} {
		if _, err := s.Get(context.Background(), id); err != nil {
			t.Errorf("Get(%s) after its group failed: %v", id, err)
		}
	}
	closeAndVerify(t, s)
}

func TestARefusalCommitsWithItsGroup(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "db"), storetest.NewClock(t0).Now)
	release := holdCommits(t, s)
	before := txID(t, s)
	var wg sync.WaitGroup
	var insErr, relErr error
	wg.Add(2)
	go func() {
		defer wg.Done()
		_, insErr = s.Insert(context.Background(), []storage.Timeout{timeout("a")})
	}()
	waitQueued(t, s, 1)
	go func() { defer wg.Done(); relErr = s.Release(context.Background(), "missing", "", time.Time{}) }()
	waitQueued(t, s, 2)
	release()
	wg.Wait()
	if insErr != nil || !errors.Is(relErr, storage.ErrNotFound) {
		t.Fatalf("insert %v, release %v", insErr, relErr)
	}
	if got := txID(t, s) - before; got != 2 {
		t.Fatalf("%d commits, want 2: a refusal must not make its group run again", got)
	}
}

func closeAndVerify(t *testing.T, s *Store) {
	t.Helper()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	verifyFile(t, s.Path())
}

// TestCancelNeverLosesToALease races Cancel (and Reschedule) against Lease
// on the same due row: a row Lease hands out must not also be reported
// cancelled or rescheduled. Leases live in memory and Lease reads a
// snapshot, so without the pin a Lease could take a row from a snapshot
// older than the cancel's commit.
func TestCancelNeverLosesToALease(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "db"), nil)
	for i := range 300 {
		id := fmt.Sprint("row-", i)
		if _, err := s.Insert(ctx, []storage.Timeout{{ID: id, Destination: "q", DueAt: time.Now().Add(-time.Second)}}); err != nil {
			t.Fatal(err)
		}
		var leased bool
		var changeErr error
		var wg sync.WaitGroup
		wg.Add(2)
		go func() {
			defer wg.Done()
			ls, err := s.Lease(ctx, "o", time.Time{}, 10, time.Minute)
			if err != nil {
				t.Error(err)
			}
			for _, l := range ls {
				leased = leased || l.ID == id
			}
		}()
		go func() {
			defer wg.Done()
			if i%2 == 0 {
				changeErr = s.Cancel(ctx, id, storage.CancelOrdered)
			} else {
				changeErr = s.Reschedule(ctx, id, time.Now().Add(time.Hour))
			}
		}()
		wg.Wait()
		switch {
		case leased && changeErr == nil:
			t.Fatalf("round %d: %s was leased and also cancelled or rescheduled", i, id)
		case !leased && changeErr != nil:
			t.Fatalf("round %d: not leased, yet the change failed: %v", i, changeErr)
		case leased && !errors.Is(changeErr, storage.ErrLeased):
			t.Fatalf("round %d: leased, change returned %v, want ErrLeased", i, changeErr)
		}
		// Clean up for the next round.
		if _, err := s.Remove(ctx, []storage.Ref{{ID: id}}); err != nil {
			t.Fatal(err)
		}
	}
}
