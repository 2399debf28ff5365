// Package pgtest connects tests to the PostgreSQL server they run against,
// for the store's own tests and for test/integration alike.
//
// The server is taken from DELAYBRIDGE_TEST_POSTGRES_URL (default DefaultURL,
// the local server with trust authentication; scripts/ensure-postgres.sh
// starts one). When it cannot be reached the test is skipped, except under
// CI=true, where that is a failure.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// EnvURL names the environment variable holding the test server's URL.
const EnvURL = "DELAYBRIDGE_TEST_POSTGRES_URL"

// DefaultURL is the test server when EnvURL is unset.
const DefaultURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// URL returns the test server's URL: $DELAYBRIDGE_TEST_POSTGRES_URL or DefaultURL.
func URL() string {
	if u := os.Getenv(EnvURL); u != "" {
		return u
	}
	return DefaultURL
}

var (
	reachOnce sync.Once
	reachErr  error
)

// Require returns URL() once the server answers there; it skips the test
// when it does not (t.Fatal under CI=true). The server is probed once per
// test binary.
func Require(t testing.TB) string {
	t.Helper()
	u := URL()
	reachOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, u)
		if err != nil {
			reachErr = err
			return
		}
		defer conn.Close(context.Background())
		reachErr = conn.Ping(ctx)
	})
	if reachErr != nil {
		msg := fmt.Sprintf("PostgreSQL not reachable at %s (%s): %v\n"+
			"  start one with scripts/ensure-postgres.sh, or set %s", Redact(u), EnvURL, reachErr, EnvURL)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg + "; under CI=true this is a failure")
		}
		t.Skip(msg)
	}
	return u
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

// Redact hides the password of a URL for logs.
func Redact(u string) string {
	p, err := url.Parse(u)
	if err != nil || p.User == nil {
		return u
	}
	if _, has := p.User.Password(); has {
		p.User = url.UserPassword(p.User.Username(), "***")
	}
	return p.String()
}
