// Package pgtest connects tests to the PostgreSQL server they run against,
// for the store's own tests and for test/integration alike.
//
// The server is taken from DELAYBRIDGE_TEST_POSTGRES_URL (default: the local
// server with trust authentication; scripts/ensure-postgres.sh starts one).
// When it cannot be reached the test is skipped, except under CI=true, where
// that is a failure (the rule of internal/testenv).
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/delaybridge/delaybridge/internal/testenv"
)

// URL returns the test server's URL: $DELAYBRIDGE_TEST_POSTGRES_URL or
// testenv.DefaultPostgresURL.
func URL() string { return testenv.PostgresURLFromEnv() }

// Require returns URL() once the server answers there (testenv.PostgresURL:
// probed once per test binary; skipped when it does not, failed under
// CI=true).
func Require(t testing.TB) string {
	t.Helper()
	return testenv.PostgresURL(t)
}

// Schema returns a new schema name, unique to this call and readable after
// the test's name, and drops that schema (CASCADE) when the test ends. It
// does not create it: the store does.
func Schema(t testing.TB) string {
	t.Helper()
	u := Require(t)
	var b strings.Builder
	b.WriteString("t_")
	for _, r := range strings.ToLower(t.Name()) {
		if b.Len() >= 44 {
			break
		}
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	name := b.String() + "_" + hex.EncodeToString(rnd[:])
	t.Cleanup(func() { Drop(t, u, name) })
	return name
}

// Drop drops schema name and everything in it, if it exists.
func Drop(t testing.TB, u, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Errorf("drop schema %s: %v", name, err)
		return
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{name}.Sanitize()+" CASCADE"); err != nil {
		t.Errorf("drop schema %s: %v", name, err)
	}
}
