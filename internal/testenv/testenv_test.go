package testenv

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

// fakeT records how a helper ended the test it was given. Skipf and Fatalf
// end the calling goroutine, as testing.T's do.
type fakeT struct {
	testing.TB // nil: any method not overridden here panics
	name       string
	outcome    string // "", "skip" or "fail"
	msg        string
	cleanups   int
}

func (f *fakeT) Helper()        {}
func (f *fakeT) Name() string   { return f.name }
func (f *fakeT) Cleanup(func()) { f.cleanups++ }
func (f *fakeT) Skipf(format string, args ...any) {
	f.outcome, f.msg = "skip", fmt.Sprintf(format, args...)
	runtime.Goexit()
}
func (f *fakeT) Fatalf(format string, args ...any) {
	f.outcome, f.msg = "fail", fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// run calls fn with a fakeT named name and reports how it ended ("" when it
// returned).
func run(name string, fn func(testing.TB)) *fakeT {
	f := &fakeT{name: name}
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(f)
	}()
	<-done
	return f
}

func TestUnavailableSkipsOrFailsUnderCI(t *testing.T) {
	for _, tc := range []struct {
		ci   string
		want string
	}{{"", "skip"}, {"false", "skip"}, {"1", "skip"}, {"true", "fail"}} {
		t.Run("CI="+tc.ci, func(t *testing.T) {
			t.Setenv(EnvCI, tc.ci)
			f := run("TestX", func(t testing.TB) { Unavailable(t, "the %s is missing", "broker") })
			if f.outcome != tc.want || !strings.Contains(f.msg, "the broker is missing") {
				t.Errorf("outcome %q (%q), want %q with the message", f.outcome, f.msg, tc.want)
			}
			if f = run("TestX", func(t testing.TB) { Require(t, false, "no %d", 1) }); f.outcome != tc.want {
				t.Errorf("Require(false): outcome %q, want %q", f.outcome, tc.want)
			}
			if f = run("TestX", func(t testing.TB) { Require(t, true, "no") }); f.outcome != "" {
				t.Errorf("Require(true): outcome %q (%s), want the test to go on", f.outcome, f.msg)
			}
		})
	}
}

func TestUnreachableServicesAreUnavailable(t *testing.T) {
	// Port 1 on the loopback refuses at once.
	t.Setenv(EnvAMQPURL, "amqp://guest:secret@127.0.0.1:1/")
	t.Setenv(EnvPostgresURL, "postgres://postgres:secret@127.0.0.1:1/postgres?sslmode=disable&connect_timeout=5")
	for _, ci := range []string{"", "true"} {
		t.Setenv(EnvCI, ci)
		want := map[string]string{"": "skip", "true": "fail"}[ci]
		for name, fn := range map[string]func(testing.TB){
			"AMQPURL":     func(t testing.TB) { AMQPURL(t) },
			"DialAMQP":    func(t testing.TB) { DialAMQP(t) },
			"PostgresURL": func(t testing.TB) { PostgresURL(t) },
		} {
			f := run("TestX", fn)
			if f.outcome != want {
				t.Errorf("CI=%q %s: outcome %q (%s), want %q", ci, name, f.outcome, f.msg, want)
			}
			if strings.Contains(f.msg, "secret") || !strings.Contains(f.msg, "127.0.0.1:1") {
				t.Errorf("%s: the message must name the URL without its password: %q", name, f.msg)
			}
		}
	}
}

func TestURLsFromEnv(t *testing.T) {
	t.Setenv(EnvAMQPURL, "")
	t.Setenv(EnvPostgresURL, "")
	if AMQPURLFromEnv() != DefaultAMQPURL || PostgresURLFromEnv() != DefaultPostgresURL {
		t.Errorf("defaults: %q %q", AMQPURLFromEnv(), PostgresURLFromEnv())
	}
	t.Setenv(EnvAMQPURL, "amqp://a/")
	t.Setenv(EnvPostgresURL, "postgres://p/")
	if AMQPURLFromEnv() != "amqp://a/" || PostgresURLFromEnv() != "postgres://p/" {
		t.Errorf("from env: %q %q", AMQPURLFromEnv(), PostgresURLFromEnv())
	}
}

// The real services, when the machine has them (CI has): the helpers let
// the test go on.
func TestReachableServices(t *testing.T) {
	if u := AMQPURL(t); u != AMQPURLFromEnv() {
		t.Errorf("AMQPURL %q", u)
	}
	if conn := DialAMQP(t); conn.IsClosed() {
		t.Error("DialAMQP returned a closed connection")
	}
	if u := PostgresURL(t); u != PostgresURLFromEnv() {
		t.Errorf("PostgresURL %q", u)
	}
}

func TestDisruptiveGate(t *testing.T) {
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, ci, on string
		deferred     bool
		want         string
	}{
		{name: "on", on: "1", want: ""},
		{name: "on under CI", ci: "true", on: "true", want: ""},
		{name: "off", want: "skip"},
		{name: "off, deferred", deferred: true, want: "skip"},
		{name: "off under CI, deferred", ci: "true", deferred: true, want: "skip"},
		{name: "off under CI, not deferred", ci: "true", want: "fail"},
		{name: "set to 0", on: "0", want: "skip"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(EnvCI, tc.ci)
			t.Setenv(EnvDisruptive, tc.on)
			file := filepath.Join(t.TempDir(), "deferred")
			t.Setenv(EnvDisruptiveDefer, "")
			if tc.deferred {
				t.Setenv(EnvDisruptiveDefer, file)
			}
			f := run("TestStopsTheBroker/sub", Disruptive)
			if f.outcome != tc.want {
				t.Fatalf("outcome %q (%s), want %q", f.outcome, f.msg, tc.want)
			}
			run("TestAlarm", Disruptive) // a second test appends
			got, err := os.ReadFile(file)
			switch {
			case tc.deferred && tc.want == "skip":
				if want := dir + "\tTestStopsTheBroker\n" + dir + "\tTestAlarm\n"; string(got) != want {
					t.Errorf("deferred file %q, want %q", got, want)
				}
			case !os.IsNotExist(err):
				t.Errorf("deferred file written (%q, %v) though nothing was deferred", got, err)
			}
		})
	}
}

// A vhost of the test's own is there while the test runs, the test's user
// may use it, and it is gone afterwards.
func TestVhost(t *testing.T) {
	var vhost string
	t.Run("uses", func(t *testing.T) {
		u, vh := Vhost(t)
		vhost = vh
		conn, err := amqp.Dial(u)
		if err != nil {
			t.Fatalf("dial the vhost: %v", err)
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ch.QueueDeclare("q", false, true, false, false, nil); err != nil {
			t.Fatalf("declare on the vhost: %v", err)
		}
		if conn.Config.Vhost != vh {
			t.Fatalf("connected to vhost %q, want %q", conn.Config.Vhost, vh)
		}
	})
	if vhost == "" {
		return
	}
	if _, err := managementDo(context.Background(), ManagementURLFromEnv(), http.MethodGet, "api/vhosts/"+url.PathEscape(vhost), nil); err == nil {
		t.Fatalf("vhost %s is still there after its test", vhost)
	}
}
