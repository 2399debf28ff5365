package postgres

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/delaybridge/delaybridge/internal/tcpproxy"
	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/storage/postgres/pgtest"
	"github.com/delaybridge/delaybridge/storage/storetest"
)

// A batch of large messages is split over several statements of one
// transaction: one statement cannot carry them all.
func TestInsertLargeBatch(t *testing.T) {
	// A call timeout far too short for 90 MiB as a whole: the calls that
	// move message bytes fail on a quiet connection, not on a slow one.
	s, err := Open(ctx, pgtest.Require(t), Options{Schema: pgtest.Schema(t), CallTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const size = 30 << 20 // 3 of them exceed maxInsertBytes
	ts := make([]storage.Timeout, 3)
	for i := range ts {
		ts[i] = newTimeout(fmt.Sprintf("big-%d", 2-i), time.Now().Add(time.Hour))
		ts[i].Message = bytes.Repeat([]byte{byte('a' + i)}, size)
	}
	began := time.Now()
	inserted, err := s.Insert(ctx, ts)
	t.Logf("3 × 30 MiB inserted in %s", time.Since(began).Round(time.Millisecond))
	if err != nil {
		t.Fatalf("Insert of 3 × 30 MiB: %v", err)
	}
	for i, o := range inserted {
		if o != storage.Stored {
			t.Fatalf("row %d not inserted", i)
		}
	}
	for i := range ts {
		got, err := s.Get(ctx, ts[i].ID)
		if err != nil || !bytes.Equal(got.Message, ts[i].Message) {
			t.Fatalf("Get %s: %v (message intact: %v)", ts[i].ID, err, err == nil && bytes.Equal(got.Message, ts[i].Message))
		}
	}
	// Again, with one new row: the old ones are reported as already there.
	more := append([]storage.Timeout{newTimeout("big-new", time.Now())}, ts...)
	more[0].Message = bytes.Repeat([]byte{'z'}, size)
	inserted, err = s.Insert(ctx, more)
	if err != nil {
		t.Fatal(err)
	}
	if want := []storage.Outcome{storage.Stored, storage.Duplicate, storage.Duplicate, storage.Duplicate}; !slices.Equal(inserted, want) {
		t.Fatalf("inserted = %v, want %v", inserted, want)
	}
}

// LeasedBy counts one owner's leases only.
func TestLeasedBy(t *testing.T) {
	s := openSchema(t, pgtest.Schema(t), nil)
	for i := range 5 {
		storetest.MustInsert(t, s, newTimeout(fmt.Sprint("r", i), time.Now().Add(-time.Second)))
	}
	if _, err := s.Lease(ctx, "host_a-1", time.Time{}, 2, time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Lease(ctx, "host%b-2", time.Time{}, 3, time.Hour); err != nil {
		t.Fatal(err)
	}
	for owner, want := range map[string]int{"host_a-1": 2, "host%b-2": 3, "host": 0, "host_a": 0} {
		if n, err := s.LeasedBy(ctx, owner, 100); err != nil || n != want {
			t.Errorf("LeasedBy(%q) = %d, %v; want %d", owner, n, err, want)
		}
	}
	if n, err := s.LeasedBy(ctx, "host%b-2", 2); err != nil || n != 2 {
		t.Errorf("LeasedBy with atMost 2 = %d, %v; want 2", n, err)
	}
}

// LeasedBy reads the partial index of leased rows, whatever statistics the
// planner has: it runs before every poll on every instance.
func TestLeasedByUsesTheLeasedIndex(t *testing.T) {
	s := openSchema(t, pgtest.Schema(t), nil)
	var ts []storage.Timeout
	for i := range 5000 {
		ts = append(ts, newTimeout(fmt.Sprint("p", i), time.Now().Add(-time.Second)))
	}
	storetest.MustInsert(t, s, ts...)
	if _, err := s.Lease(ctx, "big", time.Time{}, 5000, time.Hour); err != nil {
		t.Fatal(err)
	}
	// Statistics that say most rows are leased, then most are not.
	if _, err := s.pool.Exec(ctx, `ANALYZE `+s.qs+`.timeouts`); err != nil {
		t.Fatal(err)
	}
	if _, err := s.pool.Exec(ctx, `UPDATE `+s.qs+`.timeouts SET lock_token = NULL, lock_expires_at = NULL WHERE id <> 'p1'`); err != nil {
		t.Fatal(err)
	}
	plan := queryStrings(t, s, `EXPLAIN `+s.q.countLeasedBy, "big:", 20000)
	if p := strings.Join(plan, "\n"); !strings.Contains(p, "timeouts_leased") || strings.Contains(p, "Seq Scan") {
		t.Fatalf("LeasedBy does not use timeouts_leased:\n%s", p)
	}
	if n, err := s.LeasedBy(ctx, "big", 20000); err != nil || n != 1 {
		t.Fatalf("LeasedBy = %d, %v; want 1", n, err)
	}
}

// A due time between two microseconds is rounded up, never down: the row
// must not become leasable before it is due.
func TestSubMicrosecondDueIsNotEarly(t *testing.T) {
	base := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	now := base.Add(100 * time.Nanosecond)
	s := openSchema(t, pgtest.Schema(t), func() time.Time { return now })
	storetest.MustInsert(t, s, newTimeout("sub", base.Add(900*time.Nanosecond)))
	if ls, err := s.Lease(ctx, "o", time.Time{}, 10, time.Minute); err != nil || len(ls) != 0 {
		t.Fatalf("leased %v (%v) 800ns before it was due", ls, err)
	}
	got, err := s.Get(ctx, "sub")
	if err != nil {
		t.Fatal(err)
	}
	if got.DueAt.Before(base.Add(900 * time.Nanosecond)) {
		t.Fatalf("stored due time %s is earlier than the one given", got.DueAt)
	}
}

// Above exactCountLimit rows Stats reports the planner's estimate.
func TestStatsEstimateForLargeTables(t *testing.T) {
	old := exactCountLimit
	exactCountLimit = 10
	t.Cleanup(func() { exactCountLimit = old })
	s := openSchema(t, pgtest.Schema(t), nil)
	for i := range 40 {
		storetest.MustInsert(t, s, newTimeout(fmt.Sprint("e", i), time.Now().Add(time.Hour)))
	}
	if _, err := s.pool.Exec(ctx, `ANALYZE `+s.qs+`.timeouts`); err != nil {
		t.Fatal(err)
	}
	s.stats = statsCache{} // forget the cached count
	pending, leased, err := s.Stats(ctx)
	if err != nil || pending != 40 || leased != 0 {
		t.Fatalf("Stats = %d, %d, %v; want 40 (the estimate right after ANALYZE), 0", pending, leased, err)
	}
}

// A database that stops answering fails calls after CallTimeout instead of
// hanging them: the bridge's breakers can only count errors. The calls that
// move message bytes too, when the messages are small.
func TestCallTimeoutWhenTheDatabaseGoesSilent(t *testing.T) {
	u, host := dbAddr(t)
	p, err := tcpproxy.Start(host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	u.Host = p.Addr()
	schema := pgtest.Schema(t)
	s, err := Open(ctx, u.String(), Options{Schema: schema, CallTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	storetest.MustInsert(t, s, newTimeout("x", time.Now()))
	p.Stall() // a database gone silent: connections stay open, nothing passes
	for what, call := range map[string]func() error{
		"Get":     func() error { _, err := s.Get(context.Background(), "x"); return err },
		"GetMany": func() error { _, err := s.GetMany(context.Background(), []string{"x"}); return err },
		"Insert": func() error {
			_, err := s.Insert(context.Background(), []storage.Timeout{newTimeout("y", time.Now())})
			return err
		},
		"Lease": func() error { _, err := s.Lease(context.Background(), "o", time.Time{}, 1, time.Minute); return err },
	} {
		began := time.Now()
		err := call()
		took := time.Since(began)
		// Either limit of quietWatch ends it: the quiet one, or, when a
		// few bytes got through just after the call began (a busy machine
		// delays the stall), the call's upper bound, which then comes a
		// moment sooner. Both are CallTimeout for a call that moves nothing.
		if err == nil || errors.Is(err, storage.ErrNotFound) ||
			!(strings.Contains(err.Error(), "no answer within") || strings.Contains(err.Error(), "not done within")) ||
			!errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("%s against a silent database: %v; want a timeout error", what, err)
		}
		if took > 5*time.Second {
			t.Fatalf("%s took %s to fail", what, took)
		}
		t.Logf("%s failed after %s: %v", what, took.Round(time.Millisecond), err)
	}
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	select {
	case err := <-closed:
		if err == nil {
			t.Error("Close reported success although the database never answered")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close hangs on a silent database")
	}
}

// Operators find the bridge's sessions in pg_stat_activity by name.
func TestApplicationName(t *testing.T) {
	schema := pgtest.Schema(t)
	s, err := Open(ctx, pgtest.Require(t), Options{Schema: schema, ApplicationName: "delaybridge test-owner"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var name string
	if err := s.pool.QueryRow(ctx, `SELECT current_setting('application_name')`).Scan(&name); err != nil || name != "delaybridge test-owner" {
		t.Fatalf("application_name = %q (%v)", name, err)
	}
}

func TestRetryable(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{&pgconn.PgError{Code: "40P01"}, true},
		{&pgconn.PgError{Code: "40001"}, true},
		{fmt.Errorf("remove: %w", &pgconn.PgError{Code: "57P01"}), true}, // terminated by an administrator
		{&pgconn.PgError{Code: "08006"}, true},
		{&pgconn.PgError{Code: "23505"}, false}, // unique violation: a bug, not the connection
		{&pgconn.PgError{Code: "42P01"}, false},
		{io.ErrUnexpectedEOF, true},
		{context.DeadlineExceeded, false},
		{context.Canceled, false},
		{errors.New("something else"), false},
		{noReconnectRetry{&pgconn.PgError{Code: "57P01"}}, false}, // not idempotent: not after a lost connection
		{fmt.Errorf("x: %w", noReconnectRetry{io.ErrUnexpectedEOF}), false},
		{noReconnectRetry{&pgconn.PgError{Code: "40P01"}}, true}, // a deadlock rolled back for sure
	} {
		if got := retryable(tc.err); got != tc.want {
			t.Errorf("retryable(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// A Remove whose connection was terminated is repeated on a new one, so a
// forwarded timeout is not left behind to be forwarded again.
func TestRemoveSurvivesTerminatedSessions(t *testing.T) {
	schema := pgtest.Schema(t)
	app := fmt.Sprintf("terminate-%d", time.Now().UnixNano()) // application_name keeps 63 bytes
	s, err := Open(ctx, pgtest.Require(t), Options{Schema: schema, ApplicationName: app})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	admin := openSchema(t, schema, nil)
	for round := range 5 {
		id := fmt.Sprint("t", round)
		storetest.MustInsert(t, s, newTimeout(id, time.Now().Add(-time.Second)))
		ls, err := s.Lease(ctx, "o", time.Time{}, 1, time.Hour)
		if err != nil || len(ls) != 1 {
			t.Fatalf("Lease: %v %v", ls, err)
		}
		// Kill the store's (idle) sessions: the Remove goes out on a dead one.
		var killed int
		if err := admin.pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1`,
			app).Scan(&killed); err != nil || killed == 0 {
			t.Fatalf("round %d: terminated %d sessions (%v)", round, killed, err)
		}
		time.Sleep(20 * time.Millisecond) // let the backends exit
		res, err := s.Remove(ctx, []storage.Ref{{ID: ls[0].ID, Lock: ls[0].Lock}})
		if err != nil {
			t.Fatalf("round %d: Remove after its sessions were terminated: %v", round, err)
		}
		if res[0] != nil {
			t.Fatalf("round %d: Remove result %v, want success", round, res[0])
		}
		if _, err := s.Get(ctx, id); !errors.Is(err, storage.ErrNotFound) {
			t.Fatalf("round %d: the row is still there (%v)", round, err)
		}
	}
}

// GetMany returns exactly the pending rows named, each a copy of its own.
func TestGetMany(t *testing.T) {
	s := openSchema(t, pgtest.Schema(t), nil)
	var in []storage.Timeout
	for i := range 3 {
		tm := newTimeout(fmt.Sprint("g", i), time.Now().Add(time.Duration(i)*time.Hour))
		tm.Message = []byte(fmt.Sprint("body-", i))
		in = append(in, tm)
	}
	storetest.MustInsert(t, s, in...)
	ls, err := s.Lease(ctx, "o", in[0].DueAt.Add(time.Second), 1, time.Hour)
	if err != nil || len(ls) != 1 {
		t.Fatalf("Lease: %v %v", ls, err)
	}
	got, err := s.GetMany(ctx, []string{"g0", "g2", "missing", "g0"})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Fatalf("GetMany returned %d rows, want 2: %v", len(got), got)
	}
	for _, id := range []string{"g0", "g2"} {
		one, err := s.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(one, got[id]); diff != "" {
			t.Errorf("GetMany[%s] differs from Get (-Get +GetMany):\n%s", id, diff)
		}
	}
	if got["g0"].Lock != ls[0].Lock || string(got["g2"].Message) != "body-2" {
		t.Fatalf("rows mixed up: %+v", got)
	}
}

// Instances of one endpoint starting at the same moment on a fresh schema
// all claim it (a single-statement claim could miss a concurrent one).
func TestConcurrentClaimsOfOneEndpoint(t *testing.T) {
	for round := range 20 {
		stores := openInstances(t, 8) // migrated, not yet claimed
		var wg sync.WaitGroup
		start := make(chan struct{})
		errs := make(chan error, len(stores))
		for _, s := range stores {
			wg.Go(func() {
				<-start
				if err := s.claimEndpoint(ctx, "orders"); err != nil {
					errs <- err
				}
			})
		}
		close(start)
		wg.Wait()
		close(errs)
		for _, s := range stores {
			_ = s.Close() // keep within max_connections
		}
		for err := range errs {
			t.Fatalf("round %d: claim: %v", round, err)
		}
	}
}

// A Lease repeated after its answer was lost frees what the lost attempt
// leased before leasing again: those rows must not wait out a whole lease.
func TestLeaseRepeatedAfterLostAnswerLeavesNoOrphans(t *testing.T) {
	s := openSchema(t, pgtest.Schema(t), nil)
	for i := range 3 {
		storetest.MustInsert(t, s, newTimeout(fmt.Sprint("o", i), time.Now().Add(-time.Second)))
	}
	s.testLeaseAnswerLost = func(attempt int) error {
		if attempt == 1 {
			return io.ErrUnexpectedEOF // retryable, like a connection reset
		}
		return nil
	}
	ls, err := s.Lease(ctx, "me", time.Time{}, 10, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if len(ls) != 3 {
		t.Fatalf("the repeated lease got %d rows, want all 3", len(ls))
	}
	if n, err := s.LeasedBy(ctx, "me", 100); err != nil || n != 3 {
		t.Fatalf("%d rows leased by me (%v), want 3: the lost attempt's leases are orphans", n, err)
	}
	for _, l := range ls {
		row, err := s.Get(ctx, l.ID)
		if err != nil || row.Lock != l.Lock {
			t.Fatalf("row %s holds lock %q, the lease says %q (%v)", l.ID, row.Lock, l.Lock, err)
		}
	}
}

// A cancel that finds nothing takes the cancel lock exclusively, and new
// inserts of every instance queue behind its request: while a long insert
// holds the lock shared, the cancel gives up (lock_timeout, retried a few
// times) instead of stalling intake until its call timeout; the caller
// retries it later.
func TestCancelDoesNotStallInsertsBehindALongInsert(t *testing.T) {
	s := openSchema(t, pgtest.Schema(t), nil)
	long, err := s.pool.Begin(ctx) // stands for an insert of large messages in progress
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = long.Rollback(ctx) }()
	if _, err := long.Exec(ctx, `SELECT pg_advisory_xact_lock_shared($1)`, s.cancelKey); err != nil {
		t.Fatal(err)
	}
	cancelled := make(chan error, 1)
	go func() { cancelled <- s.Cancel(ctx, "not-stored-yet", storage.CancelOrdered) }()
	time.Sleep(50 * time.Millisecond) // the cancel's request is queued
	inserted := make(chan error, 1)
	go func() {
		_, err := s.Insert(ctx, []storage.Timeout{newTimeout("meanwhile", time.Now().Add(time.Hour))})
		inserted <- err
	}()
	// Both return while the long insert still holds its lock: neither waits
	// for it (before the fix, both waited for it, or for the call timeout).
	for _, c := range []struct {
		what string
		ch   chan error
		ok   bool
	}{{"Insert", inserted, true}, {"Cancel", cancelled, false}} {
		select {
		case err := <-c.ch:
			if (err == nil) != c.ok {
				t.Errorf("%s: %v", c.what, err)
			}
		case <-time.After(8 * time.Second):
			t.Fatalf("%s waited for the long insert", c.what)
		}
	}
	_ = long.Rollback(ctx)
	if err := s.Cancel(ctx, "not-stored-yet", storage.CancelOrdered); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("Cancel once the lock is free: %v, want ErrNotFound (and a tombstone)", err)
	}
}

// Two instances store one id at once: the insert that comes second waits
// for the first one's commit, finds the key taken (its plain INSERT fails),
// and stores the batch again with ON CONFLICT: the id counts once, as a
// duplicate there, and the rest of its batch is stored.
func TestInsertRacingAnotherInstanceOfTheID(t *testing.T) {
	schema := pgtest.Schema(t)
	a, b := openSchema(t, schema, nil), openSchema(t, schema, nil)
	due := time.Now().Add(time.Hour)
	first, err := b.pool.Begin(ctx) // b's insert of "x", not yet committed
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = first.Rollback(ctx) }()
	in := []storage.Timeout{newTimeout("x", due)}
	if n, err := b.insertRows(ctx, first, in, make([]storage.Outcome, 1), make([]string, 1), time.Now()); err != nil || n != 1 {
		t.Fatalf("insertRows = %d, %v", n, err)
	}
	type result struct {
		out []storage.Outcome
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := a.Insert(ctx, []storage.Timeout{newTimeout("w", due), newTimeout("x", due), newTimeout("y", due)})
		done <- result{out, err}
	}()
	select {
	case r := <-done:
		t.Fatalf("Insert returned while the other insert of x was open: %v, %v", r.out, r.err)
	case <-time.After(300 * time.Millisecond):
	}
	if err := first.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatalf("Insert: %v", r.err)
	}
	if want := []storage.Outcome{storage.Stored, storage.Duplicate, storage.Stored}; !slices.Equal(r.out, want) {
		t.Fatalf("outcomes %v, want %v", r.out, want)
	}
	var n int
	if err := a.pool.QueryRow(ctx, `SELECT count(*) FROM `+a.q.table).Scan(&n); err != nil || n != 3 {
		t.Fatalf("rows = %d, %v; want 3", n, err)
	}
}
