package boltstore

import (
	"bytes"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/storage/storetest"
)

// Reopens between commits, while inserts, leases, removals and reads run,
// lose and duplicate nothing.
func TestRenewUnderLoad(t *testing.T) {
	path := filepath.Join(t.TempDir(), "db")
	clock := storetest.NewClock(t0)
	s, err := Open(path, Options{Now: clock.Now, renewAfter: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const writers, perWriter = 4, 150
	var wg sync.WaitGroup
	stop := make(chan struct{})
	errs := make(chan error, 16)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perWriter {
				ts := []storage.Timeout{{ID: fmt.Sprintf("w%d-%04d", w, i), Destination: "d", DueAt: t0.Add(-time.Second), Message: bytes.Repeat([]byte{'m'}, 300)}}
				if _, err := s.Insert(ctx, ts); err != nil {
					errs <- fmt.Errorf("insert: %w", err)
					return
				}
			}
		}()
	}
	removed := map[string]bool{}
	var leaser sync.WaitGroup
	leaser.Add(2)
	// Leases and removes what is due, as the dispatcher does.
	go repeatUntil(&leaser, stop, errs, func() error {
		ls, err := s.Lease(ctx, "owner", t0, 20, time.Minute)
		if err != nil {
			return fmt.Errorf("lease: %w", err)
		}
		var refs []storage.Ref
		for _, l := range ls {
			if _, err := s.Get(ctx, l.ID); err != nil {
				return fmt.Errorf("get %s: %w", l.ID, err)
			}
			refs = append(refs, storage.Ref{ID: l.ID, Lock: l.Lock})
		}
		res, err := s.Remove(ctx, refs)
		if err != nil {
			return fmt.Errorf("remove: %w", err)
		}
		for i, r := range refs {
			if res[i] != nil {
				return fmt.Errorf("remove %s: %w", r.ID, res[i])
			}
			if removed[r.ID] {
				return fmt.Errorf("%s leased and removed twice", r.ID)
			}
			removed[r.ID] = true
		}
		return nil
	})
	// Reads that overlap the reopens.
	go repeatUntil(&leaser, stop, errs, func() error {
		if _, _, err := s.Stats(ctx); err != nil {
			return fmt.Errorf("stats: %w", err)
		}
		if _, _, err := s.List(ctx, storage.ListFilter{Limit: 50}); err != nil {
			return fmt.Errorf("list: %w", err)
		}
		return nil
	})
	wg.Wait()
	close(stop)
	leaser.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	pending, _, err := s.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if total := writers * perWriter; pending+len(removed) != total {
		t.Fatalf("pending %d + removed %d, want %d", pending, len(removed), total)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// After Close the commit loop has returned: its fields are ours.
	if s.renew.renewals == 0 {
		t.Fatal("the file was never reopened: the test exercised nothing")
	}
	t.Logf("%d reopens, the last took %s; %d removed, %d pending", s.renew.renewals, s.renew.took, len(removed), pending)
	s = open(t, path, clock.Now)
	for w := range writers {
		for i := range perWriter {
			id := fmt.Sprintf("w%d-%04d", w, i)
			_, err := s.Get(ctx, id)
			if removed[id] != errors.Is(err, storage.ErrNotFound) {
				t.Fatalf("%s: removed %v, Get after reopen: %v", id, removed[id], err)
			}
		}
	}
}

// repeatUntil calls step until stop is closed or step fails, and sends the
// failure to errs; it calls wg.Done when it returns.
func repeatUntil(wg *sync.WaitGroup, stop <-chan struct{}, errs chan<- error, step func() error) {
	defer wg.Done()
	for {
		select {
		case <-stop:
			return
		default:
		}
		if err := step(); err != nil {
			errs <- err
			return
		}
	}
}

// A file of fewer pages than the limit is not reopened, however many pages
// its commits allocate; once it has grown past it, it is.
func TestRenewOnlyLargeFiles(t *testing.T) {
	path := filepath.Join(t.TempDir(), "db")
	// bbolt grows this file in steps of 16 MiB (4,096 pages of 4 KiB).
	const limit = 8_000
	s, err := Open(path, Options{renewAfter: limit})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	body := bytes.Repeat([]byte{'b'}, 100<<10) // 25 pages a row
	cycle := func(prefix string, n int, keep bool) {
		t.Helper()
		var ts []storage.Timeout
		var refs []storage.Ref
		for i := range n {
			id := fmt.Sprintf("%s-%03d", prefix, i)
			ts = append(ts, storage.Timeout{ID: id, Destination: "d", DueAt: t0.Add(time.Hour), Message: body})
			refs = append(refs, storage.Ref{ID: id})
		}
		if _, err := s.Insert(ctx, ts); err != nil {
			t.Fatal(err)
		}
		if keep {
			return
		}
		if _, err := s.Remove(ctx, refs); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 14 { // about 14 × 1,000 pages allocated, in a small file
		cycle(fmt.Sprint("small", i), 40, false)
	}
	if st := s.db.Stats(); st.TxStats.GetPageCount() < limit {
		t.Fatalf("only %d pages allocated: the test needs more than %d", st.TxStats.GetPageCount(), limit)
	}
	if renewals := renewalsOf(t, s); renewals != 0 {
		t.Fatalf("%d reopens of a file smaller than the limit", renewals)
	}
	cycle("big", 400, true) // 40 MiB: the file grows past the limit
	for i := range 12 {
		cycle(fmt.Sprint("after", i), 40, false)
	}
	if renewals := renewalsOf(t, s); renewals == 0 {
		t.Fatal("a file larger than the limit was never reopened")
	}
}

// renewalsOf reads the commit loop's count of reopens: a write goes
// through the loop after it, so reading it then is ordered after it.
func renewalsOf(t *testing.T, s *Store) int {
	t.Helper()
	var n int
	err := s.update(func(*bolt.Tx, *counts) error {
		n = s.renew.renewals
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// A reopen that cannot take the file back (another process opened it in
// between) fails every later call with ErrReopen and says why; nothing
// committed is lost, and the file opens again once it is free.
func TestRenewFails(t *testing.T) {
	path := filepath.Join(t.TempDir(), "db")
	var other *bolt.DB
	hook := func() {
		if other != nil {
			return
		}
		var err error
		other, err = bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
		if err != nil {
			t.Errorf("the competing open: %v", err)
		}
	}
	s, err := Open(path, Options{OpenTimeout: 100 * time.Millisecond, renewAfter: 16, renewHook: hook})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var stored []string
	var insertErr error
	for i := 0; i < 200 && insertErr == nil; i++ {
		id := fmt.Sprintf("r-%03d", i)
		if _, insertErr = s.Insert(ctx, []storage.Timeout{{ID: id, Destination: "d", DueAt: t0, Message: []byte{1}}}); insertErr == nil {
			stored = append(stored, id)
		}
	}
	if !errors.Is(insertErr, ErrReopen) || !strings.Contains(insertErr.Error(), "in use by another process") {
		t.Fatalf("insert after the failed reopen: %v; want ErrReopen naming the lock", insertErr)
	}
	if _, err := s.Get(ctx, stored[0]); !errors.Is(err, ErrReopen) {
		t.Fatalf("get after the failed reopen: %v; want ErrReopen", err)
	}
	if _, _, err := s.Stats(ctx); !errors.Is(err, ErrReopen) {
		t.Fatalf("stats after the failed reopen: %v; want ErrReopen", err)
	}
	if _, err := s.CountByDestination(ctx, t0, t0); !errors.Is(err, ErrReopen) {
		t.Fatalf("count by destination after the failed reopen: %v; want ErrReopen", err)
	}
	if err := s.Close(); !errors.Is(err, ErrReopen) {
		t.Fatalf("close after the failed reopen: %v; want ErrReopen", err)
	}
	if other == nil {
		t.Fatal("the hook never ran")
	}
	if err := other.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, path, nil)
	for _, id := range stored {
		if _, err := s.Get(ctx, id); err != nil {
			t.Fatalf("%s, stored before the failure: %v", id, err)
		}
	}
	if pending, _, err := s.Stats(ctx); err != nil || pending != len(stored) {
		t.Fatalf("Stats = %d, %v; want %d", pending, err, len(stored))
	}
}

// A due reopen does not wait for a long read (a walk over every row can
// take seconds): writes go on meanwhile, and the file is reopened after
// the read ends.
func TestRenewWaitsForNoRead(t *testing.T) {
	s, err := Open(filepath.Join(t.TempDir(), "db"), Options{renewAfter: 16, renewMaxWait: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	insert := func(id string) {
		t.Helper()
		done := make(chan error, 1)
		go func() {
			_, err := s.Insert(ctx, []storage.Timeout{{ID: id, Destination: "d", DueAt: t0, Message: []byte{1}}})
			done <- err
		}()
		testenv.WaitNil(t, done, 10*time.Second, "insert "+id+", not blocked behind a due reopen")
	}
	inRead, endRead := make(chan struct{}), make(chan struct{})
	release := sync.OnceFunc(func() { close(endRead) })
	defer release() // before Close, which would wait for a blocked insert
	readDone := make(chan error, 1)
	go func() {
		readDone <- s.view(func(*bolt.Tx) error {
			close(inRead)
			<-endRead
			return nil
		})
	}()
	<-inRead
	for i := range 100 { // far more page allocations than renewAfter
		insert(fmt.Sprintf("during-%03d", i))
	}
	if n := renewalsOf(t, s); n != 0 {
		t.Fatalf("%d reopens while a read was in progress", n)
	}
	release()
	if err := <-readDone; err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		insert(fmt.Sprintf("after-%03d", i))
	}
	if n := renewalsOf(t, s); n == 0 {
		t.Fatal("no reopen after the read ended")
	}
	if pending, _, err := s.Stats(ctx); err != nil || pending != 110 {
		t.Fatalf("Stats = %d, %v; want 110", pending, err)
	}
}
