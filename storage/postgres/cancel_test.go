package postgres

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/storage/postgres/pgtest"
	"github.com/delaybridge/delaybridge/storage/storetest"
)

// TestCancelAcrossInstances: one instance stores each message while another
// cancels it at the same moment (as two bridges consuming one E.Timeouts
// do); no message stays pending, whichever commits first.
func TestCancelAcrossInstances(t *testing.T) {
	schema := pgtest.Schema(t)
	storetest.RaceCancelInsert(t, openSchema(t, schema, nil), openSchema(t, schema, nil), 300)
}

// TestCancelAcrossInstancesOfAPendingRow: one instance inserts a pending
// message again (its first insert committed, but the answer was lost with
// the connection, so the insert is repeated) while another cancels it: the
// cancel's tombstone holds whichever commits first.
func TestCancelAcrossInstancesOfAPendingRow(t *testing.T) {
	schema := pgtest.Schema(t)
	storetest.RaceCancelReinsert(t, openSchema(t, schema, nil), openSchema(t, schema, nil), 300)
}

// TestBatchCancelAcrossInstances: as TestCancelAcrossInstances, each
// cancel committed by InsertAndCancel with a row beside it, as ingest
// commits a batch holding cancels.
func TestBatchCancelAcrossInstances(t *testing.T) {
	schema := pgtest.Schema(t)
	storetest.RaceBatchCancelInsert(t, openSchema(t, schema, nil), openSchema(t, schema, nil), 300)
}

// TestReapPurgesExpiredTombstones: tombstones are rows of their own table,
// deleted by Reap once expired, not before.
func TestReapPurgesExpiredTombstones(t *testing.T) {
	clock := storetest.NewClock(t0)
	s := open(t, clock.Now)
	for i := range 5 {
		if err := s.Cancel(ctx, fmt.Sprintf("gone-%d", i), storage.CancelOrdered); !errors.Is(err, storage.ErrNotFound) {
			t.Fatalf("Cancel: %v", err)
		}
	}
	count := func() int {
		t.Helper()
		var n int
		if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM `+s.qs+`.cancelled`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if got := count(); got != 5 {
		t.Fatalf("%d tombstones after 5 cancels of missing ids, want 5", got)
	}
	clock.Set(t0.Add(storage.DefaultCancelWindow - time.Microsecond))
	if _, err := s.Reap(ctx); err != nil {
		t.Fatal(err)
	}
	if got := count(); got != 5 {
		t.Fatalf("Reap deleted live tombstones: %d left, want 5", got)
	}
	clock.Set(t0.Add(storage.DefaultCancelWindow))
	if _, err := s.Reap(ctx); err != nil {
		t.Fatal(err)
	}
	if got := count(); got != 0 {
		t.Fatalf("%d expired tombstones left after Reap", got)
	}
}

// TestCancelRefusedByTheDatabase: a cancel whose statement PostgreSQL
// refuses (a NUL byte in the id) fails with that error, records nothing,
// and leaves the store working: its batch is read to the end and rolled
// back.
func TestCancelRefusedByTheDatabase(t *testing.T) {
	s := open(t, nil)
	storetest.MustInsert(t, s, newTimeout("p", t0.Add(time.Hour)))
	err := s.Cancel(ctx, "nul\x00id", storage.CancelOrdered)
	if err == nil || errors.Is(err, storage.ErrNotFound) || errors.Is(err, storage.ErrLeased) {
		t.Fatalf("Cancel of an id with a NUL byte: %v, want the database's refusal", err)
	}
	var n int
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM `+s.qs+`.cancelled`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d tombstones (%v) after a refused cancel, want 0", n, err)
	}
	if err := s.Cancel(ctx, "p", storage.CancelOrdered); err != nil {
		t.Fatalf("Cancel after the refused one: %v", err)
	}
	if _, err := s.Get(ctx, "p"); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("p is still pending after its cancel: %v", err)
	}
}
