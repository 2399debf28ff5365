package boltstore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	bolt "go.etcd.io/bbolt"

	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/storage/storetest"
)

// writeFormat1 writes rs as builds of format 1 did: records keyed by id,
// a leased row (Lock set) in index "leased" at its lock expiry, others in
// "ready" at max(DueAt, NotBefore), every row in "due", and the counts.
func writeFormat1(t *testing.T, path string, rs ...*record) {
	t.Helper()
	for i, r := range rs {
		r.index, r.key = idxReady, indexKey(visibleAt(&r.Timeout), uint64(i+1))
		if r.Lock != "" {
			r.index, r.key = idxLeased, indexKey(r.LockExpiresAt, uint64(i+1))
		}
	}
	writeFormat1Raw(t, path, rs, encodeRecord)
}

// writeFormat1Raw writes rs, whose index and key are set, in format 1 with
// the record bytes enc gives.
func writeFormat1Raw(t *testing.T, path string, rs []*record, enc func(*record) []byte) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	err = db.Update(func(tx *bolt.Tx) error {
		bs := map[string]*bolt.Bucket{}
		for _, name := range []string{"meta", "timeouts", "ready", "leased", "due", "sagas", "cancelled"} {
			b, err := tx.CreateBucket([]byte(name))
			if err != nil {
				return err
			}
			bs[name] = b
		}
		leased := 0
		for _, r := range rs {
			idx := "ready"
			if r.index == idxLeased {
				idx = "leased"
				leased++
			}
			due := binary.BigEndian.AppendUint64(nil, keyTime(r.DueAt))
			err := errors.Join(
				bs["timeouts"].Put([]byte(r.ID), enc(r)),
				bs[idx].Put(bytes.Clone(r.key[:]), []byte(r.ID)),
				bs["due"].Put(append(due, r.ID...), []byte{}))
			if err == nil && r.SagaID != "" {
				err = bs["sagas"].Put(sagaKey(r.SagaID, r.ID), []byte{})
			}
			if err != nil {
				return err
			}
		}
		u64 := func(n int) []byte { return binary.BigEndian.AppendUint64(nil, uint64(n)) }
		return errors.Join(
			bs["meta"].Put(keyFormat, []byte("1")),
			bs["meta"].Put([]byte("pending"), u64(len(rs))),
			bs["meta"].Put([]byte("leased"), u64(leased)))
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestConvertFormat1: Open converts a file of format 1, in more than one
// chunk, into format 2 with every row, field, index entry and tombstone,
// and frees the leases it held.
func TestConvertFormat1(t *testing.T) {
	path := filepath.Join(t.TempDir(), "db")
	const n = 2*migrateChunk + 123
	var rs []*record
	leased := 0
	for i := range n {
		r := &record{Timeout: storage.Timeout{
			ID: fmt.Sprintf("id-%05d", (i*7919)%n), Destination: "d", DueAt: t0.Add(time.Duration(i%500) * time.Second),
			ReceivedAt: t0.Add(-time.Hour), Message: []byte(fmt.Sprint("body ", i)),
		}}
		switch i % 7 {
		case 1:
			r.NotBefore, r.Attempts, r.LastError = r.DueAt.Add(time.Hour), 3, "NO_ROUTE" // held
		case 2:
			r.SagaID = fmt.Sprint("saga-", i%3)
		case 3:
			r.Exchange, r.Destination = "amq.topic", "k"
		case 4:
			r.Lock, r.LockExpiresAt = "gone", t0.Add(time.Hour)
			leased++
		}
		rs = append(rs, r)
	}
	writeFormat1(t, path, rs...)
	db, err := bolt.Open(path, 0o600, nil)
	if err == nil {
		err = db.Update(func(tx *bolt.Tx) error {
			return tx.Bucket(bucketCancelled).Put([]byte("gone-id"), binary.BigEndian.AppendUint64(nil, uint64(t0.Add(time.Hour).UnixNano())))
		})
		_ = db.Close()
	}
	if err != nil {
		t.Fatal(err)
	}
	// A copy left by a conversion that died is started over.
	if err := os.WriteFile(path+".format2", []byte("junk"), 0o600); err != nil {
		t.Fatal(err)
	}

	clock := storetest.NewClock(t0)
	s := open(t, path, clock.Now)
	if got := s.RecoveredLeases(); got != leased {
		t.Errorf("RecoveredLeases = %d, want %d", got, leased)
	}
	if _, err := os.Stat(path + ".format2"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the copy is left beside the file: %v", err)
	}
	if pending, _, err := s.Stats(ctx); err != nil || pending != n {
		t.Fatalf("Stats = %d, %v; want %d", pending, err, n)
	}
	for _, i := range []int{0, 1, 2, 3, 4, n - 1} {
		want := rs[i].Timeout
		want.Lock, want.LockExpiresAt = "", time.Time{}
		got, err := s.Get(ctx, want.ID)
		if diff := cmp.Diff(want, got); err != nil || diff != "" {
			t.Errorf("row %d: %v (-want +got):\n%s", i, err, diff)
		}
	}
	// List: due order, ties by id, every row once.
	var want []string
	byDue := slices.Clone(rs)
	slices.SortFunc(byDue, func(a, b *record) int {
		if c := a.DueAt.Compare(b.DueAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	for _, r := range byDue {
		want = append(want, r.ID)
	}
	var got []string
	f := storage.ListFilter{Limit: 1000}
	for {
		rows, next, err := s.List(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rows {
			got = append(got, r.ID)
		}
		if next == "" {
			break
		}
		f.After = next
	}
	if !slices.Equal(got, want) {
		t.Fatalf("List after conversion: %d rows, want %d in due order", len(got), len(want))
	}
	if ins, err := s.Insert(ctx, []storage.Timeout{{ID: "gone-id", Destination: "d", DueAt: t0}}); err != nil || ins[0] == storage.Stored {
		t.Errorf("Insert of a cancelled id after conversion = %v, %v; want refused by the tombstone", ins, err)
	}
	if c, l, err := s.CancelSaga(ctx, "saga-1"); err != nil || c == 0 || l != 0 {
		t.Errorf("CancelSaga = %d, %d, %v", c, l, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	verifyFile(t, path)
	if s := open(t, path, clock.Now); s.RecoveredLeases() != 0 {
		t.Error("a second Open converted again")
	}
}

// TestConvertFormat1Fails: a conversion that fails leaves the file of
// format 1 as it was, and no copy beside it.
func TestConvertFormat1Fails(t *testing.T) {
	path := filepath.Join(t.TempDir(), "db")
	rs := []*record{
		{Timeout: storage.Timeout{ID: "a", Destination: "d", DueAt: t0}},
		{Timeout: storage.Timeout{ID: "b", Destination: "d", DueAt: t0}},
	}
	for i, r := range rs {
		r.index, r.key = idxReady, indexKey(r.DueAt, uint64(i+1))
	}
	writeFormat1Raw(t, path, rs, func(r *record) []byte {
		if r.ID == "b" {
			return []byte{recordVersion, idxReady, 1, 2, 3} // damaged
		}
		return encodeRecord(r)
	})
	before, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if s, err := Open(path, Options{}); err == nil {
		_ = s.Close()
		t.Fatal("Open converted a file with a damaged record")
	} else if !errors.Is(err, errCorrupt) {
		t.Errorf("error does not wrap errCorrupt: %v", err)
	}
	if after, err := os.ReadFile(path); err != nil || !bytes.Equal(before, after) {
		t.Errorf("the file of format 1 changed (%v)", err)
	}
	if _, err := os.Stat(path + ".format2"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the copy is left beside the file: %v", err)
	}
}
