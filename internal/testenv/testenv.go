// Package testenv is the one place that decides what a test does when
// something outside the process that it needs is missing: RabbitMQ,
// PostgreSQL, a broker admin tool such as rabbitmqctl, a plain amqp:// URL.
//
// The rule: such a test is skipped, except under CI=true, where it fails
// (t.Fatalf). A developer without a broker still gets a green run of what
// can run, and CI never reports green for tests it did not run.
//
// It also gates the disruptive tests (see Disruptive): those that disturb
// the shared broker for every other test running at the time, and has the
// waits and the AMQP steps tests share (wait.go, amqp.go).
package testenv

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
)

// Environment variables read by this package.
const (
	// EnvCI is "true" on CI: a missing service fails the test.
	EnvCI = "CI"
	// EnvAMQPURL is the test broker's URL (default DefaultAMQPURL).
	EnvAMQPURL = "DELAYBRIDGE_TEST_AMQP_URL"
	// EnvPostgresURL is the test database's URL (default DefaultPostgresURL).
	EnvPostgresURL = "DELAYBRIDGE_TEST_POSTGRES_URL"
	// EnvDisruptive set to 1 (or true) runs the disruptive tests.
	EnvDisruptive = "DELAYBRIDGE_TEST_DISRUPTIVE"
	// EnvDisruptiveDefer names a file: a disruptive test skipped because
	// EnvDisruptive is unset appends "<package dir>\t<test name>" to it, so
	// that a later serial step runs exactly those tests (scripts/test.sh).
	EnvDisruptiveDefer = "DELAYBRIDGE_TEST_DISRUPTIVE_DEFER"
)

// Defaults: the local broker and the local PostgreSQL server with trust
// authentication (scripts/ensure-rabbitmq.sh and scripts/ensure-postgres.sh
// start them).
const (
	DefaultAMQPURL     = "amqp://guest:guest@127.0.0.1:5672/"
	DefaultPostgresURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
)

// dialTimeout bounds one reachability probe.
const dialTimeout = 5 * time.Second

// CI reports whether the tests run under CI=true.
func CI() bool { return os.Getenv(EnvCI) == "true" }

// Unavailable ends the test for want of something outside the process: it
// skips, or fails under CI=true. format and args say what is missing and
// how to provide it.
func Unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if CI() {
		t.Fatalf("%s\n(CI=true: a missing test environment is a failure, not a skip)", msg)
	}
	t.Skipf("%s\n(skipped; under CI=true this fails)", msg)
}

// Require calls Unavailable(t, format, args...) unless ok.
func Require(t testing.TB, ok bool, format string, args ...any) {
	t.Helper()
	if !ok {
		Unavailable(t, format, args...)
	}
}

// A service is a server the tests reach at a URL from the environment.
type service struct {
	name, env, def string
	start          string // what starts a local one
	check          func(url string) error
}

var (
	rabbitMQ = service{"RabbitMQ", EnvAMQPURL, DefaultAMQPURL, "scripts/ensure-rabbitmq.sh", func(u string) error {
		conn, err := amqp.DialConfig(u, amqp.Config{Dial: amqp.DefaultDial(dialTimeout)})
		if err != nil {
			return err
		}
		return conn.Close()
	}}
	postgreSQL = service{"PostgreSQL", EnvPostgresURL, DefaultPostgresURL, "scripts/ensure-postgres.sh", func(u string) error {
		ctx, cancel := context.WithTimeout(context.Background(), dialTimeout)
		defer cancel()
		conn, err := pgx.Connect(ctx, u)
		if err != nil {
			return err
		}
		defer conn.Close(context.Background())
		return conn.Ping(ctx)
	}}
)

// url is the service's URL from the environment, or its default.
func (s service) url() string {
	if v := os.Getenv(s.env); v != "" {
		return v
	}
	return s.def
}

var (
	probeMu   sync.Mutex
	probeErrs = map[string]error{}
)

// probe checks the service at its URL, once per URL and test binary.
func (s service) probe() error {
	u := s.url()
	key := s.name + " " + u
	probeMu.Lock()
	defer probeMu.Unlock()
	err, done := probeErrs[key]
	if !done {
		err = s.check(u)
		probeErrs[key] = err
	}
	return err
}

// require returns the service's URL once it answers there; if it does not,
// the test is Unavailable.
func (s service) require(t testing.TB) string {
	t.Helper()
	u := s.url()
	s.reachable(t, u, s.probe())
	return u
}

// reachable makes the test Unavailable when err, the failure to reach the
// service at u, is not nil.
func (s service) reachable(t testing.TB, u string, err error) {
	t.Helper()
	if err != nil {
		Unavailable(t, "%s is not reachable at %s: %v\nstart one (%s) or set %s", s.name, redact(u), err, s.start, s.env)
	}
}

// AMQPURLFromEnv returns $DELAYBRIDGE_TEST_AMQP_URL or DefaultAMQPURL,
// without checking it.
func AMQPURLFromEnv() string { return rabbitMQ.url() }

// PostgresURLFromEnv returns $DELAYBRIDGE_TEST_POSTGRES_URL or
// DefaultPostgresURL, without checking it.
func PostgresURLFromEnv() string { return postgreSQL.url() }

// AMQPReachable reports why the test broker cannot be dialled (nil if it
// can). A URL is probed once per test binary.
func AMQPReachable() error { return rabbitMQ.probe() }

// AMQPURL returns the test broker's URL (AMQPURLFromEnv) once it answers
// there; if it does not, the test is Unavailable.
func AMQPURL(t testing.TB) string {
	t.Helper()
	return rabbitMQ.require(t)
}

// PostgresURL returns the test database's URL (PostgresURLFromEnv) once the
// server answers there; if it does not, the test is Unavailable.
func PostgresURL(t testing.TB) string {
	t.Helper()
	return postgreSQL.require(t)
}

// DialAMQP connects to the test broker (the test is Unavailable if it
// cannot) and closes the connection when the test ends.
func DialAMQP(t testing.TB) *amqp.Connection {
	t.Helper()
	u := AMQPURL(t)
	conn, err := amqp.DialConfig(u, amqp.Config{Dial: amqp.DefaultDial(dialTimeout)})
	rabbitMQ.reachable(t, u, err)
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// Disruptive marks a test that disturbs the shared broker for every other
// test running at the same time: it raises a memory alarm (which blocks
// every publisher), stops the broker application, and the like. go test
// runs packages in parallel against one broker, and the other packages'
// tests would see that as unexplained failures or duplicates. Call it first
// in such a test.
//
// The test runs only when DELAYBRIDGE_TEST_DISRUPTIVE=1; scripts/test.sh
// sets it in a serial step of its own (go test -p 1) after the main one.
// Otherwise it is skipped, and when DELAYBRIDGE_TEST_DISRUPTIVE_DEFER names
// a file, the test is appended to it for that serial step. Under CI=true a
// test skipped without being deferred fails: CI runs every test.
func Disruptive(t testing.TB) {
	t.Helper()
	if on, _ := strconv.ParseBool(os.Getenv(EnvDisruptive)); on {
		return
	}
	name, _, _ := strings.Cut(t.Name(), "/")
	if file := os.Getenv(EnvDisruptiveDefer); file != "" {
		if err := deferTest(file, name); err != nil {
			t.Fatalf("disruptive test: cannot defer it to the serial step: %v", err)
		}
		t.Skipf("disruptive (it disturbs the shared broker): deferred to the serial step (%s=1, go test -p 1)", EnvDisruptive)
	}
	if CI() {
		t.Fatalf("disruptive test (it disturbs the shared broker) neither run (%s=1) nor deferred (%s); "+
			"under CI=true every test must run: use scripts/test.sh", EnvDisruptive, EnvDisruptiveDefer)
	}
	t.Skipf("disruptive (it disturbs the shared broker for other tests): runs with %s=1 (scripts/test.sh does, in a serial step)", EnvDisruptive)
}

var deferMu sync.Mutex

// deferTest appends "<package dir>\t<name>\n" to file. go test runs a test
// binary in its package's directory. One write per line, O_APPEND: test
// binaries of several packages append to the file at the same time.
func deferTest(file, name string) error {
	dir, err := os.Getwd()
	if err != nil {
		return err
	}
	if dir, err = filepath.Abs(dir); err != nil {
		return err
	}
	deferMu.Lock()
	defer deferMu.Unlock()
	f, err := os.OpenFile(file, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(dir + "\t" + name + "\n"); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// redact hides the password of a URL, for test logs.
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}
