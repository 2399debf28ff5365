package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"

	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/storage/postgres/pgtest"
	"github.com/delaybridge/delaybridge/storage/storetest"
	"github.com/delaybridge/delaybridge/wire"
)

var ctx = context.Background()

var t0 = storetest.T0

// open opens a store on a fresh schema of its own, closed and dropped when
// the test ends.
func open(t testing.TB, now func() time.Time) *Store {
	t.Helper()
	return openSchema(t, pgtest.Schema(t), now)
}

// openSchema opens a store on schema; it is closed when the test ends.
func openSchema(t testing.TB, schema string, now func() time.Time) *Store {
	t.Helper()
	s, err := Open(ctx, pgtest.Require(t), Options{Now: now, Schema: schema})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// openInstances opens n stores on one fresh schema, as n bridge instances
// sharing a database (each a pool of its own).
func openInstances(t testing.TB, n int) []*Store {
	t.Helper()
	schema := pgtest.Schema(t)
	stores := make([]*Store, n)
	for i := range stores {
		stores[i] = openSchema(t, schema, nil)
	}
	return stores
}

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T, clock *storetest.Clock) storage.Store {
		return open(t, clock.Now)
	})
}

func newTimeout(id string, due time.Time) storage.Timeout {
	return storage.Timeout{ID: id, Destination: "d", DueAt: due, Message: []byte("body of " + id)}
}

// queryStrings runs a query of one text column and returns its rows.
func queryStrings(t *testing.T, s *Store, sql string, args ...any) []string {
	t.Helper()
	rows, err := s.pool.Query(ctx, sql, args...)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestLeaseExclusiveAcrossInstances: 8 stores (8 pools, as 8 bridge
// instances would have) lease 5,000 rows concurrently in small batches;
// every row is handed out exactly once, and every lock is unique.
func TestLeaseExclusiveAcrossInstances(t *testing.T) {
	const n, instances, limit = 5000, 8, 13
	stores := openInstances(t, instances)
	ts := make([]storage.Timeout, n)
	for i := range ts {
		ts[i] = newTimeout(fmt.Sprintf("x-%05d", i), time.Now().Add(-time.Duration(i%17)*time.Second))
	}
	storetest.MustInsert(t, stores[0], ts...)

	var (
		mu    sync.Mutex
		got   = map[string]int{}
		locks = map[string]bool{}
		wg    sync.WaitGroup
	)
	for w, s := range stores {
		wg.Go(func() {
			owner := fmt.Sprint("instance-", w)
			for empty := 0; empty < 3; {
				ls, err := s.Lease(ctx, owner, time.Time{}, limit, time.Hour)
				if err != nil {
					t.Errorf("%s: Lease: %v", owner, err)
					return
				}
				if len(ls) == 0 {
					empty++ // others may hold the rest locked for a moment
					continue
				}
				empty = 0
				mu.Lock()
				for _, l := range ls {
					got[l.ID]++
					if locks[l.Lock] {
						t.Errorf("lock %q handed out twice", l.Lock)
					}
					if !strings.HasPrefix(l.Lock, owner+":") {
						t.Errorf("lock %q does not start with its owner %q", l.Lock, owner)
					}
					locks[l.Lock] = true
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(got) != n {
		t.Fatalf("%d distinct rows leased, want %d", len(got), n)
	}
	for id, c := range got {
		if c != 1 {
			t.Errorf("row %s leased %d times", id, c)
		}
	}
	if _, leased, err := stores[3].Stats(ctx); err != nil || leased != n {
		t.Fatalf("Stats: leased %d, %v; want %d", leased, err, n)
	}
}

// TestLeaseOrderWithExpiredLeases: rows whose lease expired come back in due
// order among the rows never leased, not after them.
func TestLeaseOrderWithExpiredLeases(t *testing.T) {
	clock := storetest.NewClock(t0)
	s := open(t, clock.Now)
	storetest.MustInsert(t, s, newTimeout("a", t0.Add(-3*time.Minute)), newTimeout("c", t0.Add(-time.Minute)))
	if ls, err := s.Lease(ctx, "dead", time.Time{}, 10, time.Minute); err != nil || len(ls) != 2 {
		t.Fatalf("Lease = %v, %v", ls, err)
	}
	storetest.MustInsert(t, s, newTimeout("b", t0.Add(-2*time.Minute)), newTimeout("d", t0.Add(30*time.Second)))
	clock.Advance(time.Minute)
	ls, err := s.Lease(ctx, "heir", time.Time{}, 10, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, l := range ls {
		ids = append(ids, l.ID)
	}
	if !slices.Equal(ids, []string{"a", "b", "c", "d"}) {
		t.Fatalf("leased %v, want [a b c d] (due order across expired and fresh rows)", ids)
	}
}

// TestLeaseExpiredNotYetVisible: a lease shorter than the lookahead expires
// before its row is due; the row is not leased again before dueBy reaches it.
func TestLeaseExpiredNotYetVisible(t *testing.T) {
	clock := storetest.NewClock(t0)
	s := open(t, clock.Now)
	storetest.MustInsert(t, s, newTimeout("soon", t0.Add(50*time.Millisecond)))
	if ls, err := s.Lease(ctx, "o", t0.Add(100*time.Millisecond), 10, 10*time.Millisecond); err != nil || len(ls) != 1 {
		t.Fatalf("Lease with lookahead = %v, %v", ls, err)
	}
	clock.Advance(20 * time.Millisecond) // expired, due in 30ms
	if ls, err := s.Lease(ctx, "o", time.Time{}, 10, time.Minute); err != nil || len(ls) != 0 {
		t.Fatalf("Lease by now = %v, %v; want nothing", ls, err)
	}
	if ls, err := s.Lease(ctx, "o", t0.Add(50*time.Millisecond), 10, time.Minute); err != nil || len(ls) != 1 {
		t.Fatalf("Lease by the due time = %v, %v; want the row", ls, err)
	}
}

func TestMigrateIdempotent(t *testing.T) {
	schema := pgtest.Schema(t)
	s1 := openSchema(t, schema, nil)
	storetest.MustInsert(t, s1, newTimeout("kept", t0))
	if err := s1.Close(); err != nil {
		t.Fatal(err)
	}
	s2 := openSchema(t, schema, nil)
	if _, err := s2.Get(ctx, "kept"); err != nil {
		t.Fatalf("row lost by the second Open: %v", err)
	}
	s3 := openSchema(t, schema, nil) // while s2 is open
	checkVersions(t, s3)
}

// checkVersions: schema_version holds each version once.
func checkVersions(t *testing.T, s *Store) {
	t.Helper()
	rows, err := s.pool.Query(ctx, `SELECT version FROM `+s.qs+`.schema_version ORDER BY version`)
	if err != nil {
		t.Fatal(err)
	}
	versions, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		t.Fatal(err)
	}
	var want []int
	for _, m := range migrations {
		want = append(want, m.version)
	}
	if !slices.Equal(versions, want) {
		t.Fatalf("schema_version holds %v, want %v", versions, want)
	}
}

// fromOldSchema opens a schema whose tables are as an older build left
// them (stmts undo the later migrations, and versions from since on are
// forgotten) with one row in them, and returns it reopened, migrated; the
// old row must come back as it was.
func fromOldSchema(t *testing.T, since int, stmts ...string) *Store {
	t.Helper()
	schema := pgtest.Schema(t)
	s := openSchema(t, schema, nil)
	if since <= 7 {
		stmts = append(undoPauses[:len(undoPauses):len(undoPauses)], stmts...)
	}
	if since <= 8 {
		stmts = append([]string{undoFingerprints}, stmts...)
	}
	if since <= 9 {
		stmts = append([]string{undoInstances}, stmts...)
	}
	if since <= 10 {
		stmts = append([]string{undoSchedules}, stmts...)
	}
	stmts = append(stmts,
		fmt.Sprintf(`DELETE FROM %s.schema_version WHERE version >= %d`, s.qs, since),
		`INSERT INTO `+s.qs+`.timeouts (id, destination, due_at, received_at, message)
			VALUES ('old', 'orders', '2026-03-01T12:00:00Z', '2026-03-01T11:00:00Z', 'body')`)
	for _, q := range stmts {
		if _, err := s.pool.Exec(ctx, strings.ReplaceAll(q, "{{s}}", s.qs)); err != nil {
			t.Fatal(err)
		}
	}
	_ = s.Close()
	s = openSchema(t, schema, nil)
	checkVersions(t, s)
	want := storage.Timeout{ID: "old", Destination: "orders", DueAt: t0, ReceivedAt: t0.Add(-time.Hour), Message: []byte("body")}
	got, err := s.Get(ctx, "old")
	if diff := cmp.Diff(want, got); err != nil || diff != "" {
		t.Fatalf("row of version %d: %v (-want +got):\n%s", since-1, err, diff)
	}
	return s
}

// undoSchedules takes a schema back from version 10 (recurring schedules).
const undoSchedules = `DROP TABLE {{s}}.schedules`

// undoInstances takes a schema back from version 9 (instance liveness).
const undoInstances = `DROP TABLE {{s}}.instances`

// TestMigrateToInstances: a schema at version 8 gets the instances table;
// a store with an owner then opens on it, and the lease an older build
// left is not taken over (its owner has no liveness session): it expires.
func TestMigrateToInstances(t *testing.T) {
	s := fromOldSchema(t, 9)
	if _, err := s.pool.Exec(ctx, `UPDATE `+s.qs+`.timeouts SET lock_token = 'old-owner:0a.1', lock_expires_at = now() + interval '1 hour'`); err != nil {
		t.Fatal(err)
	}
	b := openOwner(t, s.schema, "b", nil)
	if n, err := b.TakeOver(ctx); err != nil || n != 0 {
		t.Fatalf("TakeOver = %d, %v; want 0", n, err)
	}
	if lockOf(t, b, "old") != "old-owner:0a.1" {
		t.Fatal("the older build's lease was freed")
	}
}

// undoFingerprints takes a schema back from version 8 (send fingerprints).
const undoFingerprints = `ALTER TABLE {{s}}.timeouts DROP COLUMN fingerprint`

// TestMigrateToFingerprints: a schema at version 7 gets the fingerprint
// column; its rows have none, so a send without one is a redelivery of
// them (as before: one row per pending id) and a send with one is another
// send, stored under the key of send 2.
func TestMigrateToFingerprints(t *testing.T) {
	s := fromOldSchema(t, 8)
	old := newTimeout("old", t0)
	got, err := s.Insert(ctx, []storage.Timeout{old})
	if err != nil || got[0] != storage.Duplicate {
		t.Fatalf("Insert of the old row's id without a fingerprint = %v, %v; want duplicate", got, err)
	}
	old.Fingerprint = []byte("new")
	if got, err = s.Insert(ctx, []storage.Timeout{old}); err != nil || got[0] != storage.Stored {
		t.Fatalf("Insert of a send with a fingerprint = %v, %v; want stored", got, err)
	}
	if row, err := s.Get(ctx, wire.SendKey("old", 2)); err != nil || string(row.Fingerprint) != "new" {
		t.Fatalf("send 2 = %+v, %v", row, err)
	}
}

// undoPauses takes a schema back from version 7 (paused destinations).
var undoPauses = []string{
	`DROP TABLE {{s}}.paused`,
	`ALTER TABLE {{s}}.timeouts DROP COLUMN paused`, // and its two indexes
	`CREATE INDEX timeouts_ready ON {{s}}.timeouts (visible_at, id) WHERE lock_token IS NULL`,
}

// TestMigrateToPauses: a schema at version 6 gets the paused table, its
// rows are not paused and leasable from the new ready index, which
// replaces the old one, and a pause works.
func TestMigrateToPauses(t *testing.T) {
	s := fromOldSchema(t, 7)
	checkIndexes(t, s, map[string]bool{"timeouts_unpaused_ready": true, "timeouts_paused": true, "timeouts_ready": false})
	if ok, err := s.Pause(ctx, wire.Queue("orders"), "x"); err != nil || !ok {
		t.Fatalf("Pause = %v, %v", ok, err)
	}
	if ls, err := s.Lease(ctx, "o", t0.Add(time.Hour), 10, time.Minute); err != nil || len(ls) != 0 {
		t.Fatalf("Lease of a paused old row = %v, %v", ls, err)
	}
	if ok, err := s.Resume(ctx, wire.Queue("orders")); err != nil || !ok {
		t.Fatalf("Resume = %v, %v", ok, err)
	}
	if ls, err := s.Lease(ctx, "o", t0.Add(time.Hour), 10, time.Minute); err != nil || len(ls) != 1 || ls[0].ID != "old" {
		t.Fatalf("Lease of the old row = %v, %v", ls, err)
	}
}

// TestMigrateToExchanges: the rows of a schema at version 3, from before
// exchange destinations, are rows for their queue once Open has migrated
// the schema.
func TestMigrateToExchanges(t *testing.T) {
	s := fromOldSchema(t, 4, `ALTER TABLE {{s}}.timeouts DROP COLUMN exchange`, `ALTER TABLE {{s}}.timeouts DROP COLUMN saga_id`)
	if rows, _, err := s.List(ctx, storage.ListFilter{Destination: "orders", Limit: 10}); err != nil || len(rows) != 1 || rows[0].ID != "old" {
		t.Fatalf("List of queue orders = %v, %v; want the row of version 3", rows, err)
	}
}

// TestMigrateToSagaIDs: the rows of a schema at version 4 have no saga
// once Open has migrated the schema, and the index it adds exists.
func TestMigrateToSagaIDs(t *testing.T) {
	s := fromOldSchema(t, 5, `ALTER TABLE {{s}}.timeouts DROP COLUMN saga_id`)
	saga := newTimeout("new", t0)
	saga.SagaID = "s"
	storetest.MustInsert(t, s, saga)
	if c, l, err := s.CancelSaga(ctx, "s"); err != nil || c != 1 || l != 0 {
		t.Fatalf("CancelSaga = %d, %d, %v; want 1, 0", c, l, err)
	}
	if _, err := s.Get(ctx, "old"); err != nil {
		t.Fatalf("a row without a saga went with the saga: %v", err)
	}
	// Version 6 replaced the index version 5 added.
	checkIndexes(t, s, map[string]bool{"timeouts_saga_due": true})
}

// TestMigrateToSagaDueIndex: a schema at version 5 gets the saga index in
// due order in place of the one by saga id alone, and its saga rows list.
func TestMigrateToSagaDueIndex(t *testing.T) {
	s := fromOldSchema(t, 6, `DROP INDEX {{s}}.timeouts_saga_due`,
		`CREATE INDEX timeouts_saga ON {{s}}.timeouts (saga_id) WHERE saga_id IS NOT NULL`)
	checkIndexes(t, s, map[string]bool{"timeouts_saga_due": true, "timeouts_saga": false})
	saga := newTimeout("new", t0)
	saga.SagaID = "s"
	storetest.MustInsert(t, s, saga)
	if rows, _, err := s.List(ctx, storage.ListFilter{SagaID: "s", Limit: 10}); err != nil || len(rows) != 1 || rows[0].ID != "new" {
		t.Fatalf("List of saga s = %v, %v; want row new", rows, err)
	}
}

// checkIndexes fails t unless each index named exists exactly when want says.
func checkIndexes(t *testing.T, s *Store, want map[string]bool) {
	t.Helper()
	for name, exists := range want {
		var got bool
		if err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_indexes WHERE schemaname = $1 AND indexname = $2)`, s.schema, name).Scan(&got); err != nil || got != exists {
			t.Fatalf("index %s exists: %v (%v), want %v", name, got, err, exists)
		}
	}
}

func TestConcurrentOpenOfFreshSchema(t *testing.T) {
	schema := pgtest.Schema(t)
	const n = 6
	stores := make([]*Store, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			stores[i], errs[i] = Open(ctx, pgtest.Require(t), Options{Schema: schema})
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("Open %d: %v", i, err)
		}
		t.Cleanup(func() { _ = stores[i].Close() })
	}
	checkVersions(t, stores[0])
	storetest.MustInsert(t, stores[1], newTimeout("x", t0))
	if _, err := stores[n-1].Get(ctx, "x"); err != nil {
		t.Fatal(err)
	}
}

func TestOpenRefusesNewerSchema(t *testing.T) {
	schema := pgtest.Schema(t)
	s := openSchema(t, schema, nil)
	newer := SchemaVersion + 1
	if _, err := s.pool.Exec(ctx, `INSERT INTO `+s.qs+`.schema_version (version) VALUES ($1)`, newer); err != nil {
		t.Fatal(err)
	}
	_ = s.Close()
	s2, err := Open(ctx, pgtest.Require(t), Options{Schema: schema})
	if err == nil {
		_ = s2.Close()
		t.Fatal("Open accepted a schema of a newer version")
	}
	if !errors.Is(err, ErrSchemaTooNew) || !strings.HasPrefix(err.Error(), "postgres: migrate: ") ||
		!strings.Contains(err.Error(), fmt.Sprintf("version %d", newer)) {
		t.Fatalf("error does not say the schema is newer: %v", err)
	}
	t.Logf("refused: %v", err)
}

func TestOpenErrors(t *testing.T) {
	pgtest.Require(t)
	if _, err := Open(ctx, "postgres://u@127.0.0.1:5432/db?sslmode=bogus", Options{}); err == nil || !strings.HasPrefix(err.Error(), "postgres: connect: ") {
		t.Errorf("bad URL: %v", err)
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	// Port 1 on localhost refuses at once.
	if _, err := Open(cctx, "postgres://postgres@127.0.0.1:1/postgres?sslmode=disable&connect_timeout=2", Options{}); err == nil || !strings.HasPrefix(err.Error(), "postgres: connect: ") {
		t.Errorf("unreachable server: %v", err)
	}
	if _, err := Open(ctx, pgtest.URL(), Options{Schema: strings.Repeat("s", 64)}); err == nil {
		t.Error("Open accepted a 64-byte schema name")
	}
}

// TestOpenKeepsLiveLeases: unlike boltstore, Open must not free leases: in a
// shared database they belong to instances that are alive.
func TestOpenKeepsLiveLeases(t *testing.T) {
	clock := storetest.NewClock(t0)
	schema := pgtest.Schema(t)
	a := openSchema(t, schema, clock.Now)
	storetest.MustInsert(t, a, newTimeout("r1", t0.Add(-time.Second)), newTimeout("r2", t0.Add(-time.Second)))
	ls, err := a.Lease(ctx, "a", time.Time{}, 10, time.Minute)
	if err != nil || len(ls) != 2 {
		t.Fatalf("Lease = %v, %v", ls, err)
	}
	b := openSchema(t, schema, clock.Now)
	if _, leased, err := b.Stats(ctx); err != nil || leased != 2 {
		t.Fatalf("after a second Open: leased %d, %v; want 2", leased, err)
	}
	if ls, err := b.Lease(ctx, "b", time.Time{}, 10, time.Minute); err != nil || len(ls) != 0 {
		t.Fatalf("second instance leased %v, %v; want nothing", ls, err)
	}
	if n, err := b.Reap(ctx); err != nil || n != 0 {
		t.Fatalf("Reap = %d, %v; want 0", n, err)
	}
	res, err := a.Remove(ctx, []storage.Ref{{ID: ls[0].ID, Lock: ls[0].Lock}, {ID: ls[1].ID, Lock: ls[1].Lock}})
	if err != nil || res[0] != nil || res[1] != nil {
		t.Fatalf("Remove by the owner = %v, %v", res, err)
	}
}

// TestReapTwoOwners: one instance's Reap frees the expired leases of a
// dead instance and leaves the live ones of another alone.
func TestReapTwoOwners(t *testing.T) {
	clock := storetest.NewClock(t0)
	schema := pgtest.Schema(t)
	dead, live := openSchema(t, schema, clock.Now), openSchema(t, schema, clock.Now)
	storetest.MustInsert(t, dead, newTimeout("d1", t0.Add(-time.Minute)), newTimeout("d2", t0.Add(-time.Minute)))
	dl, err := dead.Lease(ctx, "dead", time.Time{}, 10, time.Minute)
	if err != nil || len(dl) != 2 {
		t.Fatalf("Lease = %v, %v", dl, err)
	}
	_ = dead.Close()
	storetest.MustInsert(t, live, newTimeout("l1", t0))
	ll, err := live.Lease(ctx, "live", time.Time{}, 10, time.Hour)
	if err != nil || len(ll) != 1 {
		t.Fatalf("Lease = %v, %v", ll, err)
	}
	clock.Advance(time.Minute)
	if n, err := live.Reap(ctx); err != nil || n != 2 {
		t.Fatalf("Reap = %d, %v; want the dead instance's 2", n, err)
	}
	for _, l := range dl {
		res, err := live.Remove(ctx, []storage.Ref{{ID: l.ID, Lock: l.Lock}})
		if err != nil || !errors.Is(res[0], storage.ErrConcurrency) {
			t.Fatalf("Remove with a reaped lock = %v, %v; want ErrConcurrency", res, err)
		}
	}
	if n, err := live.IncrementFailureCount(ctx, "l1", ll[0].Lock, "still mine"); err != nil || n != 1 {
		t.Fatalf("live lease after Reap: %d, %v", n, err)
	}
	if _, leased, err := live.Stats(ctx); err != nil || leased != 1 {
		t.Fatalf("Stats leased = %d, %v; want 1", leased, err)
	}
}

// TestEveryMethodClosed covers the methods the conformance suite does not.
func TestEveryMethodClosed(t *testing.T) {
	s := open(t, nil)
	_ = s.Close()
	_, _, err := s.List(ctx, storage.ListFilter{Limit: 1})
	for what, err := range map[string]error{
		"List":       err,
		"Cancel":     s.Cancel(ctx, "x", storage.CancelOrdered),
		"Reschedule": s.Reschedule(ctx, "x", t0),
		"Stats":      func() error { _, _, err := s.Stats(ctx); return err }(),
		"Remove nil": func() error { _, err := s.Remove(ctx, nil); return err }(),
	} {
		if !errors.Is(err, storage.ErrClosed) {
			t.Errorf("%s after Close: %v, want ErrClosed", what, err)
		}
	}
}

func TestStats(t *testing.T) {
	clock := storetest.NewClock(t0)
	schema := pgtest.Schema(t)
	s := openSchema(t, schema, clock.Now)
	check := func(s *Store, wantPending, wantLeased int) {
		t.Helper()
		p, l, err := s.Stats(ctx)
		if err != nil || p != wantPending || l != wantLeased {
			t.Fatalf("Stats = %d, %d, %v; want %d, %d", p, l, err, wantPending, wantLeased)
		}
	}
	check(s, 0, 0)
	var ts []storage.Timeout
	for i := range 1500 {
		ts = append(ts, newTimeout(fmt.Sprintf("s%04d", i), t0.Add(time.Duration(i-1000)*time.Second)))
	}
	storetest.MustInsert(t, s, ts...)
	check(s, 1500, 0) // the cached count follows this store's own writes
	ls, err := s.Lease(ctx, "o", time.Time{}, 600, time.Minute)
	if err != nil || len(ls) != 600 {
		t.Fatalf("Lease = %d, %v", len(ls), err)
	}
	check(s, 1500, 600)
	if _, err := s.Remove(ctx, []storage.Ref{{ID: ls[0].ID, Lock: ls[0].Lock}, {ID: "s1499"}, {ID: "s1499"}, {ID: "nope"}}); err != nil {
		t.Fatal(err)
	}
	check(s, 1498, 599)
	if err := s.Cancel(ctx, "s1498", storage.CancelOrdered); err != nil {
		t.Fatal(err)
	}
	check(s, 1497, 599)

	// Another instance's writes show once the cached count is renewed.
	other := openSchema(t, schema, clock.Now)
	check(other, 1497, 599)
	storetest.MustInsert(t, other, newTimeout("from-other", t0))
	if p, _, _ := s.Stats(ctx); p != 1497 && p != 1498 {
		t.Fatalf("pending %d", p)
	}
	s.stats.countedAt = time.Now().Add(-pendingTTL) // as if a second passed
	check(s, 1498, 599)
}

// TestTimesAndFields: every field survives a reopen; times come back in
// UTC, truncated to whole microseconds (timestamptz precision).
func TestTimesAndFields(t *testing.T) {
	clock := storetest.NewClock(t0)
	schema := pgtest.Schema(t)
	s := openSchema(t, schema, clock.Now)
	zone := time.FixedZone("minus-3", -3*3600)
	in := storage.Timeout{
		ID:          "full",
		Destination: "billing",
		Exchange:    "amq.topic",
		DueAt:       time.Date(2026, 3, 1, 8, 59, 59, 123456789, zone),
		ReceivedAt:  time.Date(1950, 3, 1, 11, 0, 0, 1999, time.UTC),
		Message:     []byte("\x00\x01binary\xff"),
		Attempts:    1 << 40,
		LastError:   "NO_ROUTE",
		NotBefore:   time.Date(2026, 3, 1, 12, 0, 0, 999999999, time.UTC),
	}
	storetest.MustInsert(t, s, in)
	_ = s.Close()
	got, err := openSchema(t, schema, clock.Now).Get(ctx, "full")
	if err != nil {
		t.Fatal(err)
	}
	want := in
	// Due times and holds round up to the microsecond (never early);
	// the receive time, a record only, rounds down.
	want.DueAt = time.Date(2026, 3, 1, 11, 59, 59, 123457000, time.UTC)
	want.ReceivedAt = time.Date(1950, 3, 1, 11, 0, 0, 1000, time.UTC)
	want.NotBefore = time.Date(2026, 3, 1, 12, 0, 1, 0, time.UTC)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("row after reopen (-want +got):\n%s", diff)
	}
	for name, tm := range map[string]time.Time{"DueAt": got.DueAt, "ReceivedAt": got.ReceivedAt, "NotBefore": got.NotBefore} {
		if tm.Location() != time.UTC {
			t.Errorf("%s in %s, want UTC", name, tm.Location())
		}
	}
}

func TestListCursor(t *testing.T) {
	s := open(t, nil)
	storetest.MustInsert(t, s, newTimeout("a", t0), newTimeout("b", t0), newTimeout("c", t0.Add(-time.Hour)))
	rows, next, err := s.List(ctx, storage.ListFilter{Limit: 2})
	if err != nil || len(rows) != 2 || rows[0].ID != "c" || rows[1].ID != "a" || next == "" {
		t.Fatalf("List = %v, %q, %v", rows, next, err)
	}
	rows, next2, err := s.List(ctx, storage.ListFilter{Limit: 2, After: next})
	if err != nil || len(rows) != 1 || rows[0].ID != "b" || next2 != "" {
		t.Fatalf("second page = %v, %q, %v", rows, next2, err)
	}
	for _, bad := range []string{"x", "not a cursor", next[:len(next)-12], "AA", encodeCursor(t0, "a")[1:], "Ag" + next[2:],
		encodeCursor(t0, "a\x00b"), encodeCursor(t0, "\xff")} {
		if _, _, err := s.List(ctx, storage.ListFilter{Limit: 2, After: bad}); err == nil || !strings.Contains(err.Error(), "invalid cursor") {
			t.Errorf("List after %q: %v, want an invalid cursor error", bad, err)
		}
	}
}

// TestInsertFailsWhole: a row PostgreSQL refuses fails the whole batch.
func TestInsertFailsWhole(t *testing.T) {
	s := open(t, nil)
	if _, err := s.Insert(ctx, []storage.Timeout{newTimeout("ok", t0), newTimeout("nul\x00id", t0)}); err == nil {
		t.Fatal("Insert of an id with a NUL byte succeeded")
	}
	if _, err := s.Get(ctx, "ok"); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("the good row of a failed batch was written: %v", err)
	}
}

// TestOpenContextEndsAfterOpen: the context given to Open bounds Open only;
// the store keeps working after it ends.
func TestOpenContextEndsAfterOpen(t *testing.T) {
	octx, cancel := context.WithTimeout(ctx, 30*time.Second)
	s, err := Open(octx, pgtest.Require(t), Options{Schema: pgtest.Schema(t), MaxConns: 2})
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	storetest.MustInsert(t, s, newTimeout("a", t0))
	if _, err := s.Get(ctx, "a"); err != nil {
		t.Fatalf("Get after Open's context ended: %v", err)
	}
	if got := s.pool.Config().MaxConns; got != 2 {
		t.Fatalf("pool MaxConns = %d, want 2", got)
	}
}

// TestContextDeadlineWhileBlocked: a call blocked on a row lock gives up at
// its context's deadline with an error wrapping it.
func TestContextDeadlineWhileBlocked(t *testing.T) {
	s := open(t, nil)
	storetest.MustInsert(t, s, newTimeout("busy", t0))
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SELECT 1 FROM `+s.q.table+` WHERE id = 'busy' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	dctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	err = s.Release(dctx, "busy", "", time.Time{})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Release blocked on a row lock = %v, want DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("Release took %s to give up", d)
	}
	t.Logf("gave up after %s: %v", time.Since(start).Round(time.Millisecond), err)
}

// A schema serves one endpoint: a second endpoint would lease the first
// one's timeouts and hand them to its own dispatcher queue.
func TestOpenClaimsTheSchemaForOneEndpoint(t *testing.T) {
	schema := pgtest.Schema(t)
	url := pgtest.Require(t)
	a, err := Open(ctx, url, Options{Schema: schema, Endpoint: "orders"})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	again, err := Open(ctx, url, Options{Schema: schema, Endpoint: "orders"})
	if err != nil {
		t.Fatalf("a second instance of the same endpoint was refused: %v", err)
	}
	_ = again.Close()
	other, err := Open(ctx, url, Options{Schema: schema, Endpoint: "billing"})
	if err == nil {
		_ = other.Close()
		t.Fatal("another endpoint was let into the schema")
	}
	if !errors.Is(err, ErrOtherEndpoint) || !strings.Contains(err.Error(), `"orders"`) ||
		!strings.Contains(err.Error(), "DELAYBRIDGE_POSTGRES_SCHEMA") {
		t.Fatalf("error does not say which endpoint holds the schema and what to do: %v", err)
	}
}

// TestPauseAcrossInstances: a pause made through one instance holds on
// another sharing the schema, for rows stored before and after it, and a
// resume through the other ends it for both.
func TestPauseAcrossInstances(t *testing.T) {
	schema := pgtest.Schema(t)
	s1, s2 := openSchema(t, schema, nil), openSchema(t, schema, nil)
	q := wire.Queue("orders")
	due := time.Now().Add(-time.Minute)
	before := newTimeout("before", due)
	before.Destination = "orders"
	storetest.MustInsert(t, s1, before)
	if ok, err := s2.Pause(ctx, q, "ops"); err != nil || !ok {
		t.Fatalf("Pause = %v, %v", ok, err)
	}
	after := newTimeout("after", due)
	after.Destination = "orders"
	storetest.MustInsert(t, s1, after)
	for i, s := range []*Store{s1, s2} {
		if ls, err := s.Lease(ctx, "o", time.Time{}, 10, time.Minute); err != nil || len(ls) != 0 {
			t.Fatalf("instance %d leased %v, %v while paused", i+1, ls, err)
		}
		if _, ok, err := s.NextDue(ctx); err != nil || ok {
			t.Fatalf("instance %d: NextDue reports a paused row (%v)", i+1, err)
		}
		if ps, err := s.Paused(ctx); err != nil || len(ps) != 1 || ps[0].Destination != q || ps[0].By != "ops" {
			t.Fatalf("instance %d: Paused = %+v, %v", i+1, ps, err)
		}
		if got, err := s.Get(ctx, "after"); err != nil || !got.Paused {
			t.Fatalf("instance %d: Get = %+v, %v; want paused", i+1, got, err)
		}
	}
	if ok, err := s1.Resume(ctx, q); err != nil || !ok {
		t.Fatalf("Resume = %v, %v", ok, err)
	}
	ls, err := s2.Lease(ctx, "o", time.Time{}, 10, time.Minute)
	if err != nil || len(ls) != 2 {
		t.Fatalf("Lease after Resume = %v, %v; want both rows", ls, err)
	}
}

// TestPauseInChunks: Pause marks, and Resume unmarks, a destination's rows
// in many chunks, leaving the others alone; a Resume that stopped midway
// (resuming set, rows still marked) stays listed and holds its rows until
// a Resume completes it, and a Pause turns it back into a pause.
func TestPauseInChunks(t *testing.T) {
	defer func(a, b int) { pauseScanChunk, resumeChunk = a, b }(pauseScanChunk, resumeChunk)
	pauseScanChunk, resumeChunk = 7, 3
	s := open(t, nil)
	q := wire.Queue("orders")
	due := time.Now().Add(-time.Minute)
	var ts []storage.Timeout
	for i := range 60 {
		r := newTimeout(fmt.Sprintf("r-%02d", i), due)
		if i%2 == 0 {
			r.Destination = "orders"
		}
		ts = append(ts, r)
	}
	storetest.MustInsert(t, s, ts...)
	marked := func() (n int) {
		t.Helper()
		if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM `+s.q.table+` WHERE paused`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if ok, err := s.Pause(ctx, q, ""); err != nil || !ok || marked() != 30 {
		t.Fatalf("Pause = %v, %v; %d rows marked, want 30", ok, err, marked())
	}
	if ls, err := s.Lease(ctx, "o", time.Time{}, 100, time.Minute); err != nil || len(ls) != 30 {
		t.Fatalf("Lease while paused = %d, %v; want the 30 others", len(ls), err)
	}
	// A resume that stopped after its first step.
	if _, err := s.pool.Exec(ctx, `UPDATE `+s.qs+`.paused SET resuming = true`); err != nil {
		t.Fatal(err)
	}
	if ps, err := s.Paused(ctx); err != nil || len(ps) != 1 {
		t.Fatalf("Paused with a resume under way = %v, %v", ps, err)
	}
	if ls, err := s.Lease(ctx, "o2", time.Time{}, 100, time.Minute); err != nil || len(ls) != 0 {
		t.Fatalf("Lease with a resume under way = %d, %v; want none", len(ls), err)
	}
	if ok, err := s.Pause(ctx, q, ""); err != nil || !ok {
		t.Fatalf("Pause of a destination being resumed = %v, %v; want true", ok, err)
	}
	if _, err := s.pool.Exec(ctx, `UPDATE `+s.qs+`.paused SET resuming = true`); err != nil {
		t.Fatal(err)
	}
	if ok, err := s.Resume(ctx, q); err != nil || !ok || marked() != 0 {
		t.Fatalf("Resume = %v, %v; %d rows marked, want none", ok, err, marked())
	}
	if ps, err := s.Paused(ctx); err != nil || len(ps) != 0 {
		t.Fatalf("Paused after Resume = %v, %v", ps, err)
	}
	if ls, err := s.Lease(ctx, "o3", time.Time{}, 100, time.Minute); err != nil || len(ls) != 30 {
		t.Fatalf("Lease after Resume = %d, %v; want 30", len(ls), err)
	}
}
