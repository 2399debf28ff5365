package postgres

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/storage/postgres/pgtest"
	"github.com/delaybridge/delaybridge/storage/storetest"
)

// openOwner opens a store of owner on schema, with a liveness session; it
// is closed when the test ends.
func openOwner(t *testing.T, schema, owner string, now func() time.Time) *Store {
	t.Helper()
	s, err := Open(ctx, pgtest.Require(t), Options{Now: now, Schema: schema, Owner: owner})
	if err != nil {
		t.Fatalf("Open %s: %v", owner, err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// die ends s's liveness session as a killed process would: no hand-back,
// no reconnect.
func die(t *testing.T, s *Store) {
	t.Helper()
	l := s.live
	l.once.Do(func() { close(l.stop) })
	<-l.done
	l.mu.Lock()
	conn := l.conn
	l.conn = nil
	l.mu.Unlock()
	l.live.Store(false)
	closeConn(conn)
}

// takeOverUntil calls TakeOver until it frees want leases in all (the
// server frees a closed session's lock a moment after the close).
func takeOverUntil(t *testing.T, s *Store, want int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	total := 0
	for {
		n, err := s.TakeOver(ctx)
		if err != nil {
			t.Fatalf("TakeOver: %v", err)
		}
		total += n
		if total == want {
			return
		}
		if total > want || time.Now().After(deadline) {
			t.Fatalf("TakeOver freed %d leases, want %d", total, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func lockOf(t *testing.T, s *Store, id string) string {
	t.Helper()
	row, err := s.Get(ctx, id)
	if err != nil {
		t.Fatalf("Get %s: %v", id, err)
	}
	return row.Lock
}

func instances(t *testing.T, s *Store) []string {
	t.Helper()
	return queryStrings(t, s, `SELECT owner FROM `+s.qs+`.instances ORDER BY owner`)
}

// TestTakeOverDeadInstance: the leases of an instance whose session ended
// are freed by another, each once its row has been visible for the grace;
// a live instance's are not, however old; an owner whose name extends the
// dead one's keeps its leases; the dead instance is forgotten once it
// holds none.
func TestTakeOverDeadInstance(t *testing.T) {
	clock := storetest.NewClock(storetest.T0)
	schema := pgtest.Schema(t)
	a := openOwner(t, schema, "a", clock.Now)
	ab := openOwner(t, schema, "ab", clock.Now)
	b := openOwner(t, schema, "b", clock.Now)
	now := clock.Now()
	storetest.MustInsert(t, a, newTimeout("past", now.Add(-5*time.Second)), newTimeout("soon", now.Add(10*time.Second)),
		newTimeout("theirs", now.Add(-time.Minute)))
	if l, err := ab.Lease(ctx, "ab", now, 1, 5*time.Minute); err != nil || len(l) != 1 || l[0].ID != "theirs" {
		t.Fatalf("ab Lease = %v, %v", l, err)
	}
	if l, err := a.Lease(ctx, "a", now.Add(20*time.Second), 10, 5*time.Minute); err != nil || len(l) != 2 {
		t.Fatalf("a Lease = %v, %v", l, err)
	}
	// All alive: nothing is taken, however long past due.
	clock.Advance(time.Minute)
	if n, err := b.TakeOver(ctx); err != nil || n != 0 {
		t.Fatalf("TakeOver with every instance alive = %d, %v", n, err)
	}
	clock.Set(now)

	die(t, a)
	if _, err := a.Lease(ctx, "a", now, 10, time.Minute); !errors.Is(err, ErrNotLive) {
		t.Fatalf("Lease of a store whose session is gone = %v, want ErrNotLive", err)
	}
	takeOverUntil(t, b, 1)
	if lockOf(t, b, "past") != "" || lockOf(t, b, "soon") == "" || lockOf(t, b, "theirs") == "" {
		t.Fatalf("after the take-over: past %q, soon %q, theirs %q; want only past free",
			lockOf(t, b, "past"), lockOf(t, b, "soon"), lockOf(t, b, "theirs"))
	}
	// soon becomes visible at now+10s: still within the grace at +10.9s.
	clock.Set(now.Add(10*time.Second + 900*time.Millisecond))
	if n, err := b.TakeOver(ctx); err != nil || n != 0 {
		t.Fatalf("TakeOver within the grace = %d, %v", n, err)
	}
	clock.Set(now.Add(11 * time.Second))
	takeOverUntil(t, b, 1)
	if lockOf(t, b, "soon") != "" || lockOf(t, b, "theirs") == "" {
		t.Fatal("soon not freed, or theirs freed")
	}
	if got := instances(t, b); len(got) != 3 {
		t.Fatalf("instances before the dead one is forgotten = %v", got)
	}
	if _, err := b.TakeOver(ctx); err != nil {
		t.Fatal(err)
	}
	if got := instances(t, b); len(got) != 2 || got[0] != "ab" || got[1] != "b" {
		t.Fatalf("instances = %v, want [ab b]", got)
	}
	// The freed rows are leased again by the living.
	if l, err := b.Lease(ctx, "b", clock.Now(), 10, time.Minute); err != nil || len(l) != 2 {
		t.Fatalf("b Lease after the take-over = %v, %v", l, err)
	}
}

// TestTakeOverLeavesUnregisteredOwners: leases of an owner without a
// liveness session (a bridge of an older release, or the CLI) only expire.
func TestTakeOverLeavesUnregisteredOwners(t *testing.T) {
	clock := storetest.NewClock(storetest.T0)
	schema := pgtest.Schema(t)
	old := openSchema(t, schema, clock.Now)
	b := openOwner(t, schema, "b", clock.Now)
	storetest.MustInsert(t, old, newTimeout("x", clock.Now().Add(-time.Hour)))
	if l, err := old.Lease(ctx, "old", time.Time{}, 1, 5*time.Minute); err != nil || len(l) != 1 {
		t.Fatalf("Lease = %v, %v", l, err)
	}
	clock.Advance(time.Minute)
	if n, err := b.TakeOver(ctx); err != nil || n != 0 {
		t.Fatalf("TakeOver = %d, %v; want 0", n, err)
	}
	if lockOf(t, b, "x") == "" {
		t.Fatal("an unregistered owner's lease was freed")
	}
}

// TestCloseHandsBack: a graceful Close frees at once the leases of rows
// visible for the grace, and leaves those due later (their tokens may be
// forwarded on time by another dispatcher) to a take-over past the grace.
func TestCloseHandsBack(t *testing.T) {
	clock := storetest.NewClock(storetest.T0)
	schema := pgtest.Schema(t)
	a := openOwner(t, schema, "a", clock.Now)
	b := openOwner(t, schema, "b", clock.Now)
	now := clock.Now()
	storetest.MustInsert(t, a, newTimeout("past", now.Add(-5*time.Second)), newTimeout("soon", now.Add(200*time.Millisecond)))
	if l, err := a.Lease(ctx, "a", now.Add(time.Second), 10, 5*time.Minute); err != nil || len(l) != 2 {
		t.Fatalf("Lease = %v, %v", l, err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if lockOf(t, b, "past") != "" || lockOf(t, b, "soon") == "" {
		t.Fatal("Close did not hand back the overdue lease, or handed back one in flight")
	}
	clock.Advance(1200 * time.Millisecond)
	takeOverUntil(t, b, 1)
	if lockOf(t, b, "soon") != "" {
		t.Fatal("soon still leased")
	}
}

// TestLivenessSessionRestored: a liveness session the server ends (an
// administrator, a restart) stops leasing until a new one holds the lock.
func TestLivenessSessionRestored(t *testing.T) {
	schema := pgtest.Schema(t)
	a := openOwner(t, schema, "a", nil)
	b := openOwner(t, schema, "b", nil)
	a.live.mu.Lock()
	pid := a.live.conn.PgConn().PID()
	a.live.mu.Unlock()
	if _, err := b.pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
		t.Fatal(err)
	}
	// A new session (another backend) that is live: the store noticed the
	// loss and registered again. Sampling Live for false would miss a loss
	// restored between two samples, as it is on a busy machine.
	deadline := time.Now().Add(10 * time.Second)
	for {
		a.live.mu.Lock()
		var now uint32
		if a.live.conn != nil {
			now = a.live.conn.PgConn().PID()
		}
		a.live.mu.Unlock()
		if now != 0 && now != pid && a.Live() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the liveness session was not restored (backend %d, was %d; live %v)", now, pid, a.Live())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if _, err := a.Lease(ctx, "a", time.Time{}, 1, time.Minute); err != nil {
		t.Fatalf("Lease after the session was restored: %v", err)
	}
	// Restored under the same row: b finds a alive.
	storetest.MustInsert(t, a, newTimeout("x", time.Now().Add(-time.Minute)))
	if l, err := a.Lease(ctx, "a", time.Time{}, 1, time.Minute); err != nil || len(l) != 1 {
		t.Fatalf("Lease = %v, %v", l, err)
	}
	if n, err := b.TakeOver(ctx); err != nil || n != 0 {
		t.Fatalf("TakeOver of a restored instance = %d, %v", n, err)
	}
}

var _ storage.TakerOver = (*Store)(nil)

// TestSessionsRunWithoutJIT: the pool's and the liveness session's
// statements are never JIT-compiled (the take-over statement's estimate
// passes jit_above_cost while the instances table has no statistics, and
// compiling it cost about 0.4 s of server CPU a run), unless the URL sets
// jit.
func TestSessionsRunWithoutJIT(t *testing.T) {
	schema := pgtest.Schema(t)
	s := openOwner(t, schema, "a", time.Now)
	var pool, live string
	if err := s.pool.QueryRow(ctx, `SHOW jit`).Scan(&pool); err != nil {
		t.Fatal(err)
	}
	s.live.mu.Lock()
	err := s.live.conn.QueryRow(ctx, `SHOW jit`).Scan(&live)
	s.live.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	if pool != "off" || live != "off" {
		t.Errorf("jit: pool %q, liveness session %q; want off", pool, live)
	}

	u := pgtest.Require(t)
	switch {
	case !strings.Contains(u, "://"): // key=value
		u += " jit=on"
	case strings.Contains(u, "?"):
		u += "&jit=on"
	default:
		u += "?jit=on"
	}
	o, err := Open(ctx, u, Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	if err := o.pool.QueryRow(ctx, `SHOW jit`).Scan(&pool); err != nil {
		t.Fatal(err)
	}
	if pool != "on" {
		t.Errorf("jit with jit=on in the URL: %q, want on", pool)
	}
}
