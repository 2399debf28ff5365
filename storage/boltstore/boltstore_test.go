package boltstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/storage/storetest"
)

var ctx = context.Background()

// storage.CheckInsert's limits are the keys this store writes: an id at
// the limit fits an index key, and so does a saga key (saga id, NUL, id) at
// MaxStoreKeyBytes; both are stored and found.
func TestStorageLimitsAreBolts(t *testing.T) {
	if storage.MaxStoreKeyBytes != bolt.MaxKeySize || storage.MaxStoredIDBytes != maxIDLen {
		t.Fatalf("storage limits %d, %d; bbolt's %d, %d", storage.MaxStoreKeyBytes, storage.MaxStoredIDBytes, bolt.MaxKeySize, maxIDLen)
	}
	s, err := Open(filepath.Join(t.TempDir(), "limits.db"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	id := strings.Repeat("i", storage.MaxStoredIDBytes)
	saga := strings.Repeat("s", storage.MaxStoreKeyBytes-1-len("x"))
	ts := []storage.Timeout{{ID: id, Destination: "d", DueAt: time.Now()}, {ID: "x", Destination: "d", SagaID: saga, DueAt: time.Now()}}
	if err := storage.CheckInsert(ts); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Insert(ctx, ts); err != nil {
		t.Fatalf("Insert at the limits: %v", err)
	}
	for _, want := range ts {
		if got, err := s.Get(ctx, want.ID); err != nil || got.SagaID != want.SagaID {
			t.Fatalf("Get(%d-byte id) = saga of %d bytes, %v", len(want.ID), len(got.SagaID), err)
		}
	}
}

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T, clock *storetest.Clock) storage.Store {
		path := filepath.Join(t.TempDir(), "nested", "dir", "delaybridge.db")
		s, err := Open(path, Options{Now: clock.Now})
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		// Runs after the suite's own Close: check the file it left.
		t.Cleanup(func() {
			if err := s.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
			verifyFile(t, path)
		})
		return s
	})
}

// verifyFile checks bbolt's own consistency and the store's invariants:
// every record decodes and has exactly the index entries that follow from
// it, each holding its sequence; no index entry is left over; the kept
// count matches.
func verifyFile(t *testing.T, path string) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		t.Fatalf("verify: open: %v", err)
	}
	defer db.Close()
	err = db.View(func(tx *bolt.Tx) error {
		for err := range tx.Check() {
			return fmt.Errorf("bbolt check: %w", err)
		}
		if f := tx.Bucket(bucketMeta).Get(keyFormat); string(f) != fileFormat {
			return fmt.Errorf("format %q, want %q", f, fileFormat)
		}
		b, err := buckets(tx, nil)
		if err != nil {
			return err
		}
		rows, nheld, sagas := 0, 0, 0
		err = b.rows.ForEach(func(k, v []byte) error {
			rows++
			r, err := decodeRow(v, true)
			if err != nil {
				return fmt.Errorf("record %x: %w", k, err)
			}
			entries := map[string][]byte{"ids": b.ids.Get([]byte(r.ID)), "ready": b.ready.Get(readyKey(r))}
			if held(r) {
				nheld++
				entries["held"] = b.held.Get(dueKey(r))
			}
			for name, seq := range entries {
				if !bytes.Equal(seq, k) {
					return fmt.Errorf("record %x (%q): %s entry holds %x", k, r.ID, name, seq)
				}
			}
			if r.SagaID != "" {
				sagas++
				if b.sagas.Get(sagaKey(r.SagaID, r.ID)) == nil {
					return fmt.Errorf("record %q: no saga entry", r.ID)
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
		for name, n := range map[string][2]int{
			"ids": {b.ids.Stats().KeyN, rows}, "ready": {b.ready.Stats().KeyN, rows},
			"held": {b.held.Stats().KeyN, nheld}, "sagas": {b.sagas.Stats().KeyN, sagas},
		} {
			if n[0] != n[1] {
				return fmt.Errorf("%d %s entries, want %d (%d records)", n[0], name, n[1], rows)
			}
		}
		// The kept count must match what the file holds.
		if c := readCounts(tx.Bucket(bucketMeta)); c.pending != int64(rows) {
			return fmt.Errorf("kept count %d, file holds %d rows", c.pending, rows)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("verify %s: %v", path, err)
	}
}

func open(t testing.TB, path string, now func() time.Time) *Store {
	t.Helper()
	s, err := Open(path, Options{Now: now})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

var t0 = storetest.T0

func TestReopenPersistsEveryField(t *testing.T) {
	path := filepath.Join(t.TempDir(), "db")
	clock := storetest.NewClock(t0)
	s := open(t, path, clock.Now)
	zone := time.FixedZone("minus-3", -3*3600)
	full := storage.Timeout{
		ID:          "full",
		Destination: "billing",
		Exchange:    "amq.topic",
		DueAt:       time.Date(2026, 3, 1, 8, 59, 59, 123456789, zone), // ns precision
		ReceivedAt:  time.Date(2026, 3, 1, 11, 0, 0, 1, time.UTC),
		Message:     []byte("\x00\x01binary\xff"),
		Attempts:    4,
		LastError:   "NO_ROUTE",
		NotBefore:   time.Date(2026, 3, 1, 12, 0, 0, 999999999, time.UTC),
	}
	if _, err := s.Insert(ctx, []storage.Timeout{full, {ID: "leased", Destination: "d", DueAt: time.Date(1969, 7, 20, 20, 17, 40, 7, time.UTC)}}); err != nil {
		t.Fatal(err)
	}
	clock.Set(t0.Add(time.Second))
	ls, err := s.Lease(ctx, "me", time.Time{}, 10, time.Hour)
	if err != nil || len(ls) != 2 {
		t.Fatalf("Lease = %v, %v", ls, err)
	}
	want := map[string]storage.Timeout{}
	for _, id := range []string{"full", "leased"} {
		if _, err := s.IncrementFailureCount(ctx, id, "", "reason of "+id); err != nil {
			t.Fatal(err)
		}
		want[id], err = s.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
	}
	// Release one of them so that NotBefore is set by Release too.
	rl := ls[0]
	if err := s.Release(ctx, rl.ID, rl.Lock, t0.Add(time.Minute+time.Nanosecond)); err != nil {
		t.Fatal(err)
	}
	want[rl.ID], _ = s.Get(ctx, rl.ID)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s2 := open(t, path, clock.Now)
	if got := s2.RecoveredLeases(); got != 0 {
		t.Errorf("RecoveredLeases = %d, want 0: leases are not kept in the file", got)
	}
	for id, w := range want {
		got, err := s2.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		// Open frees leases: expect the lock fields cleared, all else kept.
		w.Lock, w.LockExpiresAt = "", time.Time{}
		if diff := cmp.Diff(w, got); diff != "" {
			t.Errorf("row %s after reopen (-before +after):\n%s", id, diff)
		}
		for name, tm := range map[string]time.Time{"DueAt": got.DueAt, "ReceivedAt": got.ReceivedAt, "NotBefore": got.NotBefore} {
			if !tm.IsZero() && tm.Location() != time.UTC {
				t.Errorf("row %s: %s in %s, want UTC", id, name, tm.Location())
			}
		}
	}
	if !want["full"].DueAt.Equal(full.DueAt) || want["full"].DueAt.Nanosecond() != 123456789 {
		t.Errorf("DueAt lost nanoseconds: %s", want["full"].DueAt)
	}
	// Lock tokens keep counting across reopen.
	clock.Set(t0.Add(time.Hour))
	ls2, err := s2.Lease(ctx, "me", time.Time{}, 10, time.Hour)
	if err != nil || len(ls2) != 2 {
		t.Fatalf("Lease after reopen = %v, %v", ls2, err)
	}
	for _, a := range ls {
		for _, b := range ls2 {
			if a.Lock == b.Lock {
				t.Errorf("lock %q reused after reopen", a.Lock)
			}
		}
	}
	_ = s2.Close()
	verifyFile(t, path)
}

func TestOpenFreesLeasesOfPredecessor(t *testing.T) {
	path := filepath.Join(t.TempDir(), "db")
	clock := storetest.NewClock(t0)
	s := open(t, path, clock.Now)
	if n := s.RecoveredLeases(); n != 0 {
		t.Fatalf("fresh file: RecoveredLeases = %d", n)
	}
	_ = s.Close()
	// Builds before in-memory leases wrote them to the file (format 1):
	// an upgrade may find the leases of a predecessor that died there.
	path = filepath.Join(t.TempDir(), "db")
	var rs []*record
	var old []storage.Lease
	for i := range 5 {
		r := &record{Timeout: storage.Timeout{ID: fmt.Sprint("r", i), Destination: "d", DueAt: t0.Add(-time.Duration(i) * time.Second)}}
		if i >= 2 {
			r.Lock, r.LockExpiresAt = fmt.Sprint("gone:", i), t0.Add(time.Hour)
			old = append(old, storage.Lease{ID: r.ID, Lock: r.Lock, DueAt: r.DueAt})
		}
		rs = append(rs, r)
	}
	writeFormat1(t, path, rs...)

	s2 := open(t, path, clock.Now) // same instant: no lease has expired
	if n := s2.RecoveredLeases(); n != 3 {
		t.Fatalf("RecoveredLeases = %d, want 3", n)
	}
	pending, leased, err := s2.Stats(ctx)
	if err != nil || pending != 5 || leased != 0 {
		t.Fatalf("Stats = %d, %d, %v; want 5, 0", pending, leased, err)
	}
	if at, ok, err := s2.NextDue(ctx); err != nil || !ok || !at.Equal(t0.Add(-4*time.Second)) {
		t.Fatalf("NextDue = %s, %v, %v", at, ok, err)
	}
	ls, err := s2.Lease(ctx, "heir", time.Time{}, 10, time.Hour)
	if err != nil || len(ls) != 5 {
		t.Fatalf("Lease after reopen = %d rows, %v; want all 5 at once", len(ls), err)
	}
	for i := 1; i < len(ls); i++ {
		if ls[i].DueAt.Before(ls[i-1].DueAt) {
			t.Fatalf("recovered rows out of due order: %v", ls)
		}
	}
	res, err := s2.Remove(ctx, []storage.Ref{{ID: old[0].ID, Lock: old[0].Lock}})
	if err != nil || !errors.Is(res[0], storage.ErrConcurrency) {
		t.Fatalf("Remove with the predecessor's lock = %v, %v; want ErrConcurrency", res, err)
	}
	_ = s2.Close() // dies holding 5 leases, in memory
	s3 := open(t, path, clock.Now)
	if n := s3.RecoveredLeases(); n != 0 {
		t.Fatalf("third Open: RecoveredLeases = %d, want 0: this build keeps no lease in the file", n)
	}
	if ls, err := s3.Lease(ctx, "heir", time.Time{}, 10, time.Hour); err != nil || len(ls) != 5 {
		t.Fatalf("Lease after the second reopen = %d rows, %v; want all 5", len(ls), err)
	}
	_ = s3.Close()
	verifyFile(t, path)
}

func TestOpenWhileInUse(t *testing.T) {
	path := filepath.Join(t.TempDir(), "db")
	s := open(t, path, nil)
	start := time.Now()
	s2, err := Open(path, Options{OpenTimeout: 200 * time.Millisecond})
	if err == nil {
		_ = s2.Close()
		t.Fatal("second Open of a file in use succeeded")
	}
	t.Logf("second Open failed after %s: %v", time.Since(start), err)
	if !strings.Contains(err.Error(), "in use by another process") || !strings.Contains(err.Error(), path) {
		t.Errorf("error does not say the file is in use: %v", err)
	}
	if !errors.Is(err, bolterrors.ErrTimeout) {
		t.Errorf("error does not wrap bbolt's ErrTimeout: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s3, err := Open(path, Options{OpenTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatalf("Open after the first store closed: %v", err)
	}
	_ = s3.Close()
}

func TestOpenCreatesDirectories(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a", "b")
	s := open(t, filepath.Join(dir, "c.db"), nil)
	fi, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if perm := fi.Mode().Perm(); perm&^0o750 != 0 {
		t.Errorf("directory mode %o, want at most 0750", perm)
	}
	_ = s.Close()
}

// TestVersion1Records: the records of a file written before exchange
// destinations read as rows for a queue once converted.
func TestVersion1Records(t *testing.T) {
	path := filepath.Join(t.TempDir(), "db")
	v1 := recordV1Decoded()
	clock := storetest.NewClock(v1.DueAt)
	writeFormat1Raw(t, path, []*record{v1}, func(*record) []byte { return recordV1 })

	s := open(t, path, clock.Now)
	got, err := s.Get(ctx, v1.ID)
	if err != nil {
		t.Fatalf("Get of a version 1 record: %v", err)
	}
	if diff := cmp.Diff(v1.Timeout, got); diff != "" {
		t.Fatalf("version 1 row (-want +got):\n%s", diff)
	}
	if rows, _, err := s.List(ctx, storage.ListFilter{Destination: "orders", Limit: 10}); err != nil || len(rows) != 1 || rows[0].ID != v1.ID {
		t.Fatalf("List of queue orders = %v, %v; want the version 1 row", rows, err)
	}
	if at, ok, err := s.NextDue(ctx); err != nil || !ok || !at.Equal(v1.NotBefore) {
		t.Fatalf("NextDue = %s, %v, %v; want the row's NotBefore %s", at, ok, err, v1.NotBefore)
	}
	clock.Set(v1.NotBefore)
	ls, err := s.Lease(ctx, "me", time.Time{}, 10, time.Minute)
	if err != nil || len(ls) != 1 || ls[0].ID != v1.ID {
		t.Fatalf("Lease = %v, %v; want the version 1 row", ls, err)
	}
	got, err = s.Get(ctx, v1.ID)
	want := v1.Timeout
	want.Lock, want.LockExpiresAt = ls[0].Lock, v1.NotBefore.Add(time.Minute)
	if diff := cmp.Diff(want, got); err != nil || diff != "" {
		t.Fatalf("leased row: %v (-want +got):\n%s", err, diff)
	}
	if err := s.Release(ctx, v1.ID, ls[0].Lock, v1.NotBefore); err != nil {
		t.Fatal(err)
	}
	got, err = s.Get(ctx, v1.ID)
	if diff := cmp.Diff(v1.Timeout, got); err != nil || diff != "" {
		t.Fatalf("released row: %v (-want +got):\n%s", err, diff)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	verifyFile(t, path)
}

func TestOpenRejectsOtherFormat(t *testing.T) {
	path := filepath.Join(t.TempDir(), "db")
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucket(bucketMeta)
		if err != nil {
			return err
		}
		return b.Put(keyFormat, []byte("99"))
	})
	_ = db.Close()
	if err != nil {
		t.Fatal(err)
	}
	if s, err := Open(path, Options{}); err == nil {
		_ = s.Close()
		t.Fatal("Open accepted a file of format 99")
	} else if !strings.Contains(err.Error(), "format") {
		t.Fatalf("error does not name the format: %v", err)
	}
	// The failed Open released the file.
	db, err = bolt.Open(path, 0o600, &bolt.Options{Timeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatalf("file still locked after a failed Open: %v", err)
	}
	_ = db.Close()
}

func TestOpenError(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	// Parent "directory" is a file.
	if s, err := Open(filepath.Join(file, "db"), Options{}); err == nil {
		_ = s.Close()
		t.Fatal("Open under a regular file succeeded")
	}
	// Not a bbolt file.
	if s, err := Open(file, Options{}); err == nil {
		_ = s.Close()
		t.Fatal("Open of a non-bbolt file succeeded")
	} else if !strings.HasPrefix(err.Error(), "boltstore:") {
		t.Fatalf("error without boltstore prefix: %v", err)
	}
}

func TestStats(t *testing.T) {
	clock := storetest.NewClock(t0)
	s := open(t, filepath.Join(t.TempDir(), "db"), clock.Now)
	check := func(wantPending, wantLeased int) {
		t.Helper()
		p, l, err := s.Stats(ctx)
		if err != nil || p != wantPending || l != wantLeased {
			t.Fatalf("Stats = %d, %d, %v; want %d, %d", p, l, err, wantPending, wantLeased)
		}
	}
	check(0, 0)
	var ts []storage.Timeout
	for i := range 1500 { // enough for several index pages
		ts = append(ts, storage.Timeout{ID: fmt.Sprintf("s%04d", i), Destination: "d", DueAt: t0.Add(time.Duration(i-1000) * time.Second)})
	}
	if _, err := s.Insert(ctx, ts); err != nil {
		t.Fatal(err)
	}
	check(1500, 0)
	ls, err := s.Lease(ctx, "o", time.Time{}, 600, time.Minute)
	if err != nil || len(ls) != 600 {
		t.Fatalf("Lease = %d, %v", len(ls), err)
	}
	check(1500, 600)
	if _, err := s.Remove(ctx, []storage.Ref{{ID: ls[0].ID, Lock: ls[0].Lock}, {ID: "s1499"}}); err != nil {
		t.Fatal(err)
	}
	check(1498, 599)
	_ = s.Close()
	if _, _, err := s.Stats(ctx); !errors.Is(err, storage.ErrClosed) {
		t.Fatalf("Stats after Close: %v", err)
	}
}

// TestNoScan: with 100k rows due in the future, Lease and NextDue visit a
// handful of index entries, not the pending rows.
func TestNoScan(t *testing.T) {
	if testing.Short() && os.Getenv("CI") != "true" {
		t.Skip("inserts 100k rows")
	}
	clock := storetest.NewClock(t0)
	s := open(t, filepath.Join(t.TempDir(), "db"), clock.Now)
	insertFuture(t, s, 100_000)
	due := []storage.Timeout{
		{ID: "due-1", Destination: "d", DueAt: t0.Add(-time.Second)},
		{ID: "due-2", Destination: "d", DueAt: t0},
	}
	if _, err := s.Insert(ctx, due); err != nil {
		t.Fatal(err)
	}
	steps := func(what string, max int64, f func()) { t.Helper(); expectSteps(t, s, what, max, f) }
	// Leased rows stay in the ready index (leases.go): a Lease or NextDue
	// steps over them, as many as are leased (MaxLeased bounds them), and
	// never over the pending rows that are not due.
	steps("Lease", 3, func() { // two due rows and the first future one
		ls, err := s.Lease(ctx, "o", time.Time{}, 1000, time.Minute)
		if err != nil || len(ls) != 2 {
			t.Fatalf("Lease = %v, %v", ls, err)
		}
	})
	steps("empty Lease", 3, func() { // the two leased rows, then the first future one
		if ls, err := s.Lease(ctx, "o", time.Time{}, 1000, time.Minute); err != nil || len(ls) != 0 {
			t.Fatalf("Lease = %v, %v", ls, err)
		}
	})
	steps("NextDue", 3, func() { // the same
		if at, ok, err := s.NextDue(ctx); err != nil || !ok || !at.Equal(t0.Add(time.Minute)) {
			t.Fatalf("NextDue = %s, %v, %v", at, ok, err)
		}
	})
	clock.Set(t0.Add(time.Minute))
	steps("Lease of expired leases", 3, func() {
		ls, err := s.Lease(ctx, "o", time.Time{}, 1000, time.Minute)
		if err != nil || len(ls) != 2 {
			t.Fatalf("Lease = %v, %v", ls, err)
		}
	})
	steps("Reap", 0, func() {
		if n, err := s.Reap(ctx); err != nil || n != 0 {
			t.Fatalf("Reap = %d, %v", n, err)
		}
	})
}

// expectSteps runs f and checks that it visited at most max index entries.
func expectSteps(t *testing.T, s *Store, what string, max int64, f func()) {
	t.Helper()
	s.steps.Store(0)
	f()
	if n := s.steps.Load(); n > max {
		t.Errorf("%s visited %d index entries, want at most %d", what, n, max)
	}
}

func insertFuture(t testing.TB, s *Store, n int) {
	t.Helper()
	const batch = 10_000
	body := bytes.Repeat([]byte("m"), 200)
	for i := 0; i < n; i += batch {
		ts := make([]storage.Timeout, 0, batch)
		for j := i; j < i+batch && j < n; j++ {
			ts = append(ts, storage.Timeout{
				ID:          fmt.Sprintf("future-%07d", j),
				Destination: "d",
				DueAt:       t0.Add(time.Hour + time.Duration(j*7919%n)*time.Second),
				Message:     body,
			})
		}
		if _, err := s.Insert(ctx, ts); err != nil {
			t.Fatal(err)
		}
	}
}

// TestCorruptRecord: a damaged record is reported as an error, never a panic
// or a silent skip.
func TestCorruptRecord(t *testing.T) {
	clock := storetest.NewClock(t0)
	s := open(t, filepath.Join(t.TempDir(), "db"), clock.Now)
	if _, err := s.Insert(ctx, []storage.Timeout{{ID: "x", Destination: "d", DueAt: t0}}); err != nil {
		t.Fatal(err)
	}
	err := s.db.Update(func(tx *bolt.Tx) error {
		b, err := buckets(tx, nil)
		if err != nil {
			return err
		}
		return b.rows.Put(b.ids.Get([]byte("x")), []byte{rowVersion, 1, 2, 3})
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "x"); err == nil || errors.Is(err, storage.ErrNotFound) || !errors.Is(err, errCorrupt) {
		t.Errorf("Get of a corrupt record: %v", err)
	}
	if _, err := s.Lease(ctx, "o", time.Time{}, 10, time.Minute); err == nil {
		t.Error("Lease over a corrupt record succeeded")
	}
	if _, _, err := s.NextDue(ctx); err == nil {
		t.Error("NextDue over a corrupt record succeeded")
	}
	if _, err := s.Remove(ctx, []storage.Ref{{ID: "x"}}); err == nil {
		t.Error("Remove of a corrupt record succeeded")
	}
}
