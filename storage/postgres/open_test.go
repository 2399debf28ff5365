package postgres

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"

	"github.com/delaybridge/delaybridge/internal/logtest"
	"github.com/delaybridge/delaybridge/storage/postgres/pgtest"
)

// fastProgress makes a running migration say so every 100 ms for the
// test's duration.
func fastProgress(t *testing.T) {
	old := migrationProgressEvery
	migrationProgressEvery = 100 * time.Millisecond
	t.Cleanup(func() { migrationProgressEvery = old })
}

// holdFor runs stmts on a connection of its own, then after d the closing
// statement, and returns a function that waits for that to be done.
func holdFor(t *testing.T, d time.Duration, closing string, stmts ...string) (wait func()) {
	t.Helper()
	conn, err := pgx.Connect(ctx, pgtest.Require(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range stmts {
		if _, err := conn.Exec(ctx, q); err != nil {
			conn.Close(ctx)
			t.Fatal(err)
		}
	}
	done := make(chan error, 1)
	go func() {
		time.Sleep(d)
		_, err := conn.Exec(ctx, closing)
		conn.Close(ctx)
		done <- err
	}()
	return func() {
		if err := <-done; err != nil {
			t.Errorf("%s: %v", closing, err)
		}
	}
}

// TestMigrationOutlastsConnectTimeout: waiting for another instance's
// migration is not bounded by the connect timeout, and says that it waits.
// Before, the bridge bounded all of Open by 30 s, so a migration longer
// than that rolled back at every start.
func TestMigrationOutlastsConnectTimeout(t *testing.T) {
	fastProgress(t)
	schema := pgtest.Schema(t)
	_ = openSchema(t, schema, nil).Close()
	key := migrationLockKey(schema)
	const held = 1500 * time.Millisecond
	released := holdFor(t, held, "SELECT pg_advisory_unlock("+strconv.FormatInt(key, 10)+")", "SELECT pg_advisory_lock("+strconv.FormatInt(key, 10)+")")
	defer released()

	var logs logtest.Buffer
	start := time.Now()
	s, err := Open(ctx, pgtest.URL(), Options{Schema: schema, ConnectTimeout: 300 * time.Millisecond, Logger: zerolog.New(&logs)})
	if err != nil {
		t.Fatalf("Open while another instance migrates for %v, connect timeout 300 ms: %v", held, err)
	}
	defer s.Close()
	if d := time.Since(start); d < held-100*time.Millisecond {
		t.Fatalf("Open returned after %v, before the other instance's migration lock was released", d)
	}
	if n := logs.Count("waiting for another instance's migration"); n == 0 {
		t.Fatalf("no progress line while waiting:\n%s", logs.String())
	}
}

// TestMigrationStepSaysItRuns: a migration step that takes long (here it
// waits for a table lock, as an index build over millions of rows takes
// long) logs which version it is applying, and then completes.
func TestMigrationStepSaysItRuns(t *testing.T) {
	fastProgress(t)
	schema := pgtest.Schema(t)
	s := openSchema(t, schema, nil)
	for _, q := range []string{undoSchedules, undoInstances, undoFingerprints, `DELETE FROM {{s}}.schema_version WHERE version >= 8`} {
		if _, err := s.pool.Exec(ctx, strings.ReplaceAll(q, "{{s}}", s.qs)); err != nil {
			t.Fatal(err)
		}
	}
	table := s.qs + ".timeouts"
	_ = s.Close()
	// A reader's open transaction holds off version 8's ALTER TABLE.
	released := holdFor(t, time.Second, "COMMIT", "BEGIN", "SELECT 1 FROM "+table+" LIMIT 1")
	defer released()

	var logs logtest.Buffer
	s, err := Open(ctx, pgtest.URL(), Options{Schema: schema, ConnectTimeout: 300 * time.Millisecond, Logger: zerolog.New(&logs)})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer s.Close()
	checkVersions(t, s)
	if n := logs.Count("still applying version 8 (send fingerprints)"); n == 0 {
		t.Fatalf("no progress line while version 8 waited:\n%s", logs.String())
	}
	// Versions 8, 9 and 10 (liveness and recurring schedules follow it).
	if n := logs.Count("applied schema migration"); n != 3 {
		t.Fatalf("%d lines say a migration was applied, want 3:\n%s", n, logs.String())
	}
}

// TestFailedMigrationLeavesTheOldData: a schema as the build before send
// fingerprints left it (version 7) whose migration fails midway (Open's
// context ends while version 8's ALTER TABLE waits behind a reader) is
// left as it was: version 7, no fingerprint column, its row unchanged, so
// that build still opens it. The next Open migrates it once.
func TestFailedMigrationLeavesTheOldData(t *testing.T) {
	schema := pgtest.Schema(t)
	s := openSchema(t, schema, nil)
	for _, q := range []string{undoSchedules, undoInstances, undoFingerprints, `DELETE FROM {{s}}.schema_version WHERE version >= 8`,
		`INSERT INTO {{s}}.timeouts (id, destination, due_at, received_at, message)
			VALUES ('old', 'orders', '2026-03-01T12:00:00Z', '2026-03-01T11:00:00Z', 'body')`} {
		if _, err := s.pool.Exec(ctx, strings.ReplaceAll(q, "{{s}}", s.qs)); err != nil {
			t.Fatal(err)
		}
	}
	qs := s.qs
	_ = s.Close()
	released := holdFor(t, 4*time.Second, "COMMIT", "BEGIN", "SELECT 1 FROM "+qs+".timeouts LIMIT 1")
	octx, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
	failed, err := Open(octx, pgtest.URL(), Options{Schema: schema})
	cancel()
	released()
	if err == nil {
		_ = failed.Close()
		t.Fatal("Open succeeded while version 8's ALTER TABLE waited past Open's deadline")
	}
	if !strings.Contains(err.Error(), "version 8 (send fingerprints)") {
		t.Fatalf("Open = %v; want the failure of version 8", err)
	}

	conn, err := pgx.Connect(ctx, pgtest.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var version int
	var hasFingerprint bool
	var id, dest, body string
	err = conn.QueryRow(ctx, `SELECT (SELECT max(version) FROM `+qs+`.schema_version),
		EXISTS (SELECT 1 FROM information_schema.columns WHERE table_schema = $1 AND table_name = 'timeouts' AND column_name = 'fingerprint'),
		id, destination, convert_from(message, 'UTF8') FROM `+qs+`.timeouts`, schema).Scan(&version, &hasFingerprint, &id, &dest, &body)
	if err != nil || version != 7 || hasFingerprint || id != "old" || dest != "orders" || body != "body" {
		t.Fatalf("after the failed migration: version %d, fingerprint column %v, row %q %q %q, %v; want version 7 and its row as it was",
			version, hasFingerprint, id, dest, body, err)
	}

	s = openSchema(t, schema, nil)
	checkVersions(t, s)
	if got, err := s.Get(ctx, "old"); err != nil || got.Destination != "orders" || string(got.Message) != "body" || got.Fingerprint != nil {
		t.Fatalf("the old row after the migration: %+v, %v", got, err)
	}
}

// TestMigrationEndsWithContext: Open's context still ends a migration that
// waits, promptly, with an error that says where it was.
func TestMigrationEndsWithContext(t *testing.T) {
	schema := pgtest.Schema(t)
	_ = openSchema(t, schema, nil).Close()
	key := migrationLockKey(schema)
	released := holdFor(t, 3*time.Second, "SELECT pg_advisory_unlock("+strconv.FormatInt(key, 10)+")", "SELECT pg_advisory_lock("+strconv.FormatInt(key, 10)+")")
	defer released()

	octx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	s, err := Open(octx, pgtest.URL(), Options{Schema: schema})
	if err == nil {
		_ = s.Close()
		t.Fatal("Open succeeded while another instance held the migration lock past Open's deadline")
	}
	if !errors.Is(err, context.DeadlineExceeded) || !strings.HasPrefix(err.Error(), "postgres: migrate: ") {
		t.Fatalf("Open = %v; want a migrate error wrapping the deadline", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("Open took %v to give up", d)
	}
}

// TestConnectTimeout: a server that accepts the connection and never
// answers fails Open at the connect timeout.
func TestConnectTimeout(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held = append(held, c) // read nothing, answer nothing
		}
	}()
	start := time.Now()
	s, err := Open(ctx, "postgres://u@"+ln.Addr().String()+"/db?sslmode=disable", Options{ConnectTimeout: 300 * time.Millisecond})
	if err == nil {
		_ = s.Close()
		t.Fatal("Open succeeded against a server that never answers")
	}
	if !strings.HasPrefix(err.Error(), "postgres: connect: ") {
		t.Fatalf("Open = %v; want a connect error", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("Open took %v to give up; the connect timeout is 300 ms", d)
	}
}
