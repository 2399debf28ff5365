package metrics

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/delaybridge/delaybridge/circuit"
)

// lint fails t for each problem the Prometheus linter finds in m's
// series.
func lint(t *testing.T, m *Metrics) {
	t.Helper()
	problems, err := testutil.GatherAndLint(m.Registry())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}

func TestLint(t *testing.T) {
	m := New()
	m.WatchStore(func(context.Context) (int, int, error) { return 3, 1, nil },
		func(context.Context) (time.Time, bool, error) { return time.Now().Add(time.Second), true, nil }, nil)
	m.WatchConnection("consume", func() bool { return true })
	m.ObserveLateness(time.Millisecond)
	lint(t, m)
}

func TestCounters(t *testing.T) {
	m := New()
	m.Ingested(3)
	m.Ingested(0)
	m.Ingested(-1)
	m.DuplicatesSuppressed(2)
	m.ErrorQueued(StageIngest, 1)
	m.ErrorQueued(StageDispatch, 2)
	m.Dispatched(5)
	m.DispatchFailed()
	m.DispatchFailed()
	m.StaleToken()
	for name, c := range map[string]struct {
		got  float64
		want float64
	}{
		"ingested":         {testutil.ToFloat64(m.ingested), 3},
		"duplicates":       {testutil.ToFloat64(m.duplicates), 2},
		"error ingest":     {testutil.ToFloat64(m.errorQueued.WithLabelValues(StageIngest)), 1},
		"error dispatch":   {testutil.ToFloat64(m.errorQueued.WithLabelValues(StageDispatch)), 2},
		"dispatched":       {testutil.ToFloat64(m.dispatched), 5},
		"dispatch failure": {testutil.ToFloat64(m.dispatchFailures), 2},
		"stale":            {testutil.ToFloat64(m.staleTokens), 1},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", name, c.got, c.want)
		}
	}
}

func TestHistograms(t *testing.T) {
	m := New()
	m.ObserveLateness(2 * time.Millisecond)
	m.ObserveLateness(-time.Millisecond) // a clock hair early still counts
	m.ObserveIngestCommit(time.Millisecond)
	m.ObserveDispatchConfirm(time.Millisecond)
	m.ObservePollLease(time.Millisecond)
	err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(`
# HELP delaybridge_lateness_seconds Time from a message's due time (or, when later, when it was stored or its retry hold ended) to the broker's confirm of its forward.
# TYPE delaybridge_lateness_seconds histogram
delaybridge_lateness_seconds_bucket{le="0.0005"} 1
delaybridge_lateness_seconds_bucket{le="0.001"} 1
delaybridge_lateness_seconds_bucket{le="0.0025"} 2
delaybridge_lateness_seconds_bucket{le="0.005"} 2
delaybridge_lateness_seconds_bucket{le="0.01"} 2
delaybridge_lateness_seconds_bucket{le="0.025"} 2
delaybridge_lateness_seconds_bucket{le="0.05"} 2
delaybridge_lateness_seconds_bucket{le="0.1"} 2
delaybridge_lateness_seconds_bucket{le="0.25"} 2
delaybridge_lateness_seconds_bucket{le="0.5"} 2
delaybridge_lateness_seconds_bucket{le="1"} 2
delaybridge_lateness_seconds_bucket{le="2.5"} 2
delaybridge_lateness_seconds_bucket{le="5"} 2
delaybridge_lateness_seconds_bucket{le="10"} 2
delaybridge_lateness_seconds_bucket{le="30"} 2
delaybridge_lateness_seconds_bucket{le="60"} 2
delaybridge_lateness_seconds_bucket{le="+Inf"} 2
delaybridge_lateness_seconds_sum 0.001
delaybridge_lateness_seconds_count 2
`), "delaybridge_lateness_seconds")
	if err != nil {
		t.Error(err)
	}
	for _, name := range []string{"delaybridge_ingest_commit_seconds", "delaybridge_dispatch_confirm_seconds", "delaybridge_poll_lease_seconds"} {
		if n := testutil.CollectAndCount(m.Registry(), name); n != 1 {
			t.Errorf("%s: %d series, want 1", name, n)
		}
	}
}

func TestBreakers(t *testing.T) {
	m := New()
	if n := testutil.CollectAndCount(m.breakers); n != len(Breakers) {
		t.Fatalf("%d breaker series before any change, want %d", n, len(Breakers))
	}
	for _, b := range Breakers {
		if v := testutil.ToFloat64(m.breakers.WithLabelValues(b)); v != 0 {
			t.Errorf("breaker %s starts at %v, want 0", b, v)
		}
	}
	m.BreakerState("store", circuit.Armed)
	m.BreakerState("dispatch", circuit.Triggered)
	if v := testutil.ToFloat64(m.breakers.WithLabelValues("store")); v != 1 {
		t.Errorf("store breaker = %v, want 1 (armed)", v)
	}
	if v := testutil.ToFloat64(m.breakers.WithLabelValues("dispatch")); v != 2 {
		t.Errorf("dispatch breaker = %v, want 2 (triggered)", v)
	}
	m.BreakerState("store", circuit.Disarmed)
	if v := testutil.ToFloat64(m.breakers.WithLabelValues("store")); v != 0 {
		t.Errorf("store breaker = %v after disarming, want 0", v)
	}
}

func TestStoreGauges(t *testing.T) {
	m := New()
	// Nothing watched: the series are absent, not zero.
	if n := testutil.CollectAndCount(m.store); n != 0 {
		t.Errorf("%d store series before WatchStore, want 0", n)
	}
	now := time.Date(2026, 11, 21, 20, 0, 0, 0, time.UTC)
	var (
		statsErr, nextErr error
		next              = now.Add(1500 * time.Millisecond)
		pendingAny        = true
	)
	m.WatchStore(func(context.Context) (int, int, error) { return 7, 2, statsErr },
		func(context.Context) (time.Time, bool, error) { return next, pendingAny, nextErr },
		func() time.Time { return now })
	err := testutil.CollectAndCompare(m.store, strings.NewReader(`
# HELP delaybridge_leased Messages in the store currently leased to the dispatcher.
# TYPE delaybridge_leased gauge
delaybridge_leased 2
# HELP delaybridge_next_due_seconds Seconds until the store's next row becomes leasable (due time, retry time or lease expiry); negative when overdue, absent when nothing is pending.
# TYPE delaybridge_next_due_seconds gauge
delaybridge_next_due_seconds 1.5
# HELP delaybridge_pending Messages in the store waiting to be forwarded, leased ones included.
# TYPE delaybridge_pending gauge
delaybridge_pending 7
`))
	if err != nil {
		t.Error(err)
	}

	next = now.Add(-250 * time.Millisecond)
	err = testutil.CollectAndCompare(m.store, strings.NewReader(`
# HELP delaybridge_next_due_seconds Seconds until the store's next row becomes leasable (due time, retry time or lease expiry); negative when overdue, absent when nothing is pending.
# TYPE delaybridge_next_due_seconds gauge
delaybridge_next_due_seconds -0.25
`), "delaybridge_next_due_seconds")
	if err != nil {
		t.Errorf("overdue: %v", err)
	}

	pendingAny = false
	if n := testutil.CollectAndCount(m.store, "delaybridge_next_due_seconds"); n != 0 {
		t.Errorf("next_due_seconds with nothing pending: %d series, want none", n)
	}
	statsErr, nextErr = errors.New("store is closed"), errors.New("store is closed")
	if n := testutil.CollectAndCount(m.store); n != 0 {
		t.Errorf("%d store series when the store fails, want 0", n)
	}
}

func TestConnections(t *testing.T) {
	m := New()
	up := true
	m.WatchConnection("consume", func() bool { return up })
	m.WatchConnection("publish", func() bool { return true })
	wantConsume := func(v int) {
		t.Helper()
		err := testutil.CollectAndCompare(m.conns, strings.NewReader(fmt.Sprintf(`
# HELP delaybridge_broker_connected 1 while the broker connection is up, 0 while it is down or reconnecting.
# TYPE delaybridge_broker_connected gauge
delaybridge_broker_connected{connection="consume"} %d
delaybridge_broker_connected{connection="publish"} 1
`, v)))
		if err != nil {
			t.Error(err)
		}
	}
	wantConsume(1)
	up = false
	wantConsume(0)
}

func TestErrorQueueRefusing(t *testing.T) {
	m := New()
	scrape := func() string {
		rec := httptest.NewRecorder()
		m.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
		return rec.Body.String()
	}
	if !strings.Contains(scrape(), "\ndelaybridge_error_queue_refusing 0\n") {
		t.Error("without a watch, the gauge is not 0")
	}
	refusing := true
	m.WatchErrorQueue(func() bool { return refusing })
	if !strings.Contains(scrape(), "\ndelaybridge_error_queue_refusing 1\n") {
		t.Error("while refusing, the gauge is not 1")
	}
	refusing = false
	if !strings.Contains(scrape(), "\ndelaybridge_error_queue_refusing 0\n") {
		t.Error("after refusing, the gauge is not 0")
	}
}

func TestNilIsNoop(t *testing.T) {
	var m *Metrics
	m.Ingested(1)
	m.DuplicatesSuppressed(1)
	m.ErrorQueued(StageIngest, 1)
	m.Dispatched(1)
	m.DispatchFailed()
	m.StaleToken()
	m.ObserveLateness(time.Second)
	m.ObserveIngestCommit(time.Second)
	m.ObserveDispatchConfirm(time.Second)
	m.ObservePollLease(time.Second)
	m.BreakerState("store", circuit.Armed)
	m.WatchStore(nil, nil, nil)
	m.WatchConnection("consume", nil)
	m.WatchErrorQueue(nil)
	if m.Registry() != nil || m.Handler() != nil {
		t.Error("nil metrics have a registry or handler")
	}
}

func TestSeparateRegistries(t *testing.T) {
	a, b := New(), New() // must not panic on duplicate registration
	a.Ingested(1)
	if v := testutil.ToFloat64(b.ingested); v != 0 {
		t.Errorf("a second Metrics sees the first one's counter: %v", v)
	}
}

func TestHandler(t *testing.T) {
	m := New()
	m.Dispatched(4)
	m.WatchConnection("publish", func() bool { return true })
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %s", resp.Status)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Errorf("Content-Type %q, want the text format", ct)
	}
	for _, want := range []string{
		"delaybridge_messages_dispatched_total 4",
		`delaybridge_broker_connected{connection="publish"} 1`,
		`delaybridge_circuit_breaker_state{breaker="fetch"} 0`,
		`delaybridge_error_queue_messages_total{stage="dispatch"} 0`,
		"delaybridge_build_info{",
		"go_goroutines ",
		"process_",
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}
