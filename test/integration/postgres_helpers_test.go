package integration

// PostgreSQL helpers for the tests that run bridges on DELAYBRIDGE_STORE=
// postgres. The database is taken from DELAYBRIDGE_TEST_POSTGRES_URL (default
// postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable). Without a
// reachable database those tests are skipped, except under CI=true where
// that is a failure (the same rule as for the broker: internal/testenv).

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/storage/postgres/pgtest"
)

// pgTest is a test's own schema in the shared database and a connection to
// inspect it. The connection is for the test's goroutine only (a pgx.Conn is
// not safe for concurrent use).
// sharedEnv is the environment of bridges sharing pg's schema as one new
// endpoint, with extra; endpoint and error queue are returned too. The
// endpoint's queues are deleted when t ends.
func (pg *pgTest) sharedEnv(t testing.TB, extra map[string]string) (env map[string]string, endpoint, errorQ string) {
	endpoint = uniqueEndpoint(t)
	errorQ = endpoint + ".error"
	env = map[string]string{
		"DELAYBRIDGE_ENDPOINT":        endpoint,
		"DELAYBRIDGE_ERROR_QUEUE":     errorQ,
		"DELAYBRIDGE_STORE":           "postgres",
		"DELAYBRIDGE_POSTGRES_URL":    pg.URL,
		"DELAYBRIDGE_POSTGRES_SCHEMA": pg.Schema,
	}
	for k, v := range extra {
		env[k] = v
	}
	// Registered before the processes' own cleanups: runs after they are gone.
	deleteQueuesOnCleanup(t, endpoint+".Timeouts", endpoint+".TimeoutsDispatcher", errorQ)
	return env, endpoint, errorQ
}

type pgTest struct {
	URL    string
	Schema string
	conn   *pgx.Conn
}

// requirePostgres connects to the test database and picks a unique schema
// ("it_" + random hex) that is dropped (CASCADE) when the test ends. The
// schema itself is created by the first bridge that opens the store. It
// skips the test when the database is unreachable, or fails it under
// CI=true. Call it before starting the bridges, so that the schema is
// dropped only after they are gone.
func requirePostgres(t testing.TB) *pgTest {
	t.Helper()
	requireBroker(t)
	url := pgtest.Require(t) // the database the bridges under test share, as in the store's own tests
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect to PostgreSQL at %s: %v", broker.Redact(url), err)
	}
	p := &pgTest{URL: url, Schema: "it_" + randomHex(6), conn: conn}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		if _, err := conn.Exec(ctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{p.Schema}.Sanitize()+` CASCADE`); err != nil {
			t.Logf("cleanup: drop schema %s: %v", p.Schema, err)
		}
		_ = conn.Close(ctx)
	})
	return p
}

// table is the schema-qualified, quoted name of one of the store's tables.
func (p *pgTest) table(name string) string { return pgx.Identifier{p.Schema, name}.Sanitize() }

// pendingRow is one row of the store's timeouts table.
type pendingRow struct {
	ID, Lock      string
	LockExpiresAt *time.Time
	DueAt         time.Time
	Attempts      int64
	LastError     string
}

// rows returns up to limit rows of the timeouts table (due order) and the
// total count.
func (p *pgTest) rows(t testing.TB, limit int) ([]pendingRow, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var total int
	if err := p.conn.QueryRow(ctx, `SELECT count(*) FROM `+p.table("timeouts")).Scan(&total); err != nil {
		t.Fatalf("count rows of %s: %v", p.table("timeouts"), err)
	}
	rs, err := p.conn.Query(ctx, `SELECT id, coalesce(lock_token, ''), lock_expires_at, due_at, attempts, last_error
		FROM `+p.table("timeouts")+` ORDER BY due_at, id LIMIT $1`, limit)
	if err != nil {
		t.Fatalf("read rows of %s: %v", p.table("timeouts"), err)
	}
	out, err := pgx.CollectRows(rs, func(r pgx.CollectableRow) (pendingRow, error) {
		var pr pendingRow
		err := r.Scan(&pr.ID, &pr.Lock, &pr.LockExpiresAt, &pr.DueAt, &pr.Attempts, &pr.LastError)
		return pr, err
	})
	if err != nil {
		t.Fatalf("read rows of %s: %v", p.table("timeouts"), err)
	}
	return out, total
}

// leasedBy returns the rows whose lease (lock token "owner:n") belongs to
// owner and is still live at the instant at (the bridges write
// lock_expires_at from this host's clock, so this host's clock decides),
// with the instant each lease expires.
func (p *pgTest) leasedBy(t testing.TB, owner string, at time.Time) map[string]time.Time {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rs, err := p.conn.Query(ctx, `SELECT id, lock_expires_at FROM `+p.table("timeouts")+`
		WHERE lock_token IS NOT NULL AND starts_with(lock_token, $1) AND lock_expires_at > $2`,
		owner+":", at)
	if err != nil {
		t.Fatalf("read the leases of %s: %v", owner, err)
	}
	leases := map[string]time.Time{}
	var id string
	var exp time.Time
	if _, err := pgx.ForEachRow(rs, []any{&id, &exp}, func() error { leases[id] = exp; return nil }); err != nil {
		t.Fatalf("read the leases of %s: %v", owner, err)
	}
	return leases
}
