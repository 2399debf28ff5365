package status

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/delaybridge/delaybridge/circuit"
	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/metrics"
	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/storage/storetest"
	"github.com/delaybridge/delaybridge/wire"
)

// t0 is the tests' fixed time: their clock's start, or their only now.
var t0 = time.Date(2026, 11, 21, 20, 0, 0, 0, time.UTC)

// registry is a bridge's real metrics (package metrics), so the page is
// tested against the series the bridge exports, under their real names: a
// renamed metric leaves the page without its figures and fails these tests.
type registry struct {
	m   *metrics.Metrics
	reg *prometheus.Registry
}

func newRegistry() *registry {
	m := metrics.New()
	return &registry{m: m, reg: m.Registry()}
}

// setConnected has the metrics report the broker connection name up or down.
func (r *registry) setConnected(name string, up bool) {
	r.m.WatchConnection(name, func() bool { return up })
}

// TestReadsTheBridgesMetricNames: every series the page reads is one the
// bridge's metrics export (a metric renamed in either package fails here).
func TestReadsTheBridgesMetricNames(t *testing.T) {
	r := newRegistry()
	r.setConnected("publish", true)
	mfs, err := r.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	exported := map[string]bool{}
	for _, mf := range mfs {
		exported[mf.GetName()] = true
	}
	for _, name := range []string{metricIngested, metricDispatched, metricFailures, metricErrorQueue,
		metricLateness, metricBreaker, metricConnected, metricDropped} {
		if !exported[name] {
			t.Errorf("the page reads %s, which package metrics does not export", name)
		}
	}
}

func get(t *testing.T, h http.Handler) string {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("status %d", rec.Code)
	}
	if ct := rec.Header().Get("Content-Type"); !strings.HasPrefix(ct, "text/html") {
		t.Fatalf("content type %q", ct)
	}
	b, _ := io.ReadAll(rec.Body)
	return string(b)
}

func mustContain(t *testing.T, page string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(page, w) {
			t.Errorf("page lacks %q", w)
		}
	}
}

func TestPageShowsCountsStatesAndEscapes(t *testing.T) {
	clk := storetest.NewClock(t0)
	r := newRegistry()
	r.m.BreakerState("store", circuit.Disarmed)
	r.m.BreakerState("dispatch", circuit.Triggered)
	r.setConnected("publish", true) // Broker below takes precedence
	evil := `<script>alert(1)</script>`
	h := New(Options{
		Endpoint: "orders-bridge",
		Stats:    func(context.Context) (int, int, error) { return 1234, 56, nil },
		NextDue: func(context.Context) (time.Time, bool, error) {
			return clk.Now().Add(90 * time.Second), true, nil
		},
		List: func(_ context.Context, f storage.ListFilter) ([]storage.Timeout, string, error) {
			if f.Limit != PageRows && f.Limit != overdueCountLimit {
				t.Errorf("asked for %d rows", f.Limit)
			}
			return []storage.Timeout{
				{ID: evil, Destination: "q-" + evil, DueAt: clk.Now().Add(90 * time.Second), Message: []byte("SECRET-BODY")},
				{ID: "late-one", Destination: "orders", DueAt: clk.Now().Add(-2 * time.Second), Attempts: 3,
					LastError: "returned: NO_ROUTE", Lock: "tok", LockExpiresAt: clk.Now().Add(time.Minute)},
			}, "", nil
		},
		Broker:   func() map[string]bool { return map[string]bool{"consume": true, "publish": false} },
		Gatherer: r.reg,
		Now:      clk.Now,
		Refresh:  5 * time.Second,
	})
	page := get(t, h)
	mustContain(t, page,
		`id="pending">1234<`, `id="leased">56<`, "in 1m30s", "orders-bridge",
		"consume connection", "connected", "publish connection", "disconnected",
		"store breaker", "disarmed", "dispatch breaker", "triggered", "breaker dispatch triggered",
		"late-one", "2s overdue", "returned: NO_ROUTE", "leased", `http-equiv="refresh" content="5"`,
		"&lt;script&gt;alert(1)&lt;/script&gt;", "q-&lt;script&gt;")
	if strings.Contains(page, evil) {
		t.Error("page contains an unescaped script tag")
	}
	if strings.Contains(page, "SECRET-BODY") {
		t.Error("page shows a message body")
	}
	if strings.Contains(page, ">healthy<") {
		t.Error("page says healthy with a triggered breaker and a connection down")
	}
}

func TestBreakersAndConnectionsFromGatherer(t *testing.T) {
	r := newRegistry()
	r.m.BreakerState("fetch", circuit.Armed)
	r.setConnected("publish", true)
	page := get(t, New(Options{Gatherer: r.reg}))
	// An armed breaker is a problem already: its operations keep
	// failing, and it triggers unless they recover.
	mustContain(t, page, "fetch breaker", "armed", "publish connection", "connected", ">attention<", "breaker fetch armed")
	if strings.Contains(page, ">healthy<") {
		t.Error("healthy with an armed breaker")
	}
	r.m.BreakerState("fetch", circuit.Disarmed)
	mustContain(t, get(t, New(Options{Gatherer: r.reg})), ">healthy<")
}

func TestThroughputAndLateness(t *testing.T) {
	clk := storetest.NewClock(t0)
	r := newRegistry()
	h := New(Options{Gatherer: r.reg, Now: clk.Now})
	h.sample(false)
	// Two minutes at 120 ingested and 60 dispatched per minute, each
	// dispatch 20 ms late.
	for range 12 {
		clk.Advance(SampleInterval)
		r.m.Ingested(20)
		for range 10 {
			r.m.Dispatched(1)
			r.m.ObserveLateness(20 * time.Millisecond)
		}
		h.sample(false)
	}
	page := get(t, h)
	// 20 ms is in the bucket (10 ms, 25 ms]: interpolated as Prometheus's
	// histogram_quantile does, p50 is 17.5 ms.
	mustContain(t, page, "last minute", "1–2 min ago", ">120<", ">60<", "17.5ms", "no samples yet",
		">240<", ">120<") // totals since start
	rows := minutes(append([]sample(nil), h.samples...), clk.Now())
	if !rows[0].Known || rows[0].Ingested != 120 || rows[0].Dispatched != 60 || rows[0].Lateness.P50 != 17500*time.Microsecond {
		t.Errorf("last minute: %+v", rows[0])
	}
	if !rows[1].Known || rows[1].Ingested != 120 {
		t.Errorf("minute before: %+v", rows[1])
	}
	if rows[2].Known {
		t.Errorf("minute without samples: %+v", rows[2])
	}
}

// Messages taken in and not stored show per minute and since start, by
// reason; a later send of an id pending twice is marked with its number.
func TestDroppedAndSendsShown(t *testing.T) {
	clk := storetest.NewClock(t0)
	r := newRegistry()
	h := New(Options{Gatherer: r.reg, Now: clk.Now,
		List: func(context.Context, storage.ListFilter) ([]storage.Timeout, string, error) {
			return []storage.Timeout{
				{ID: "m", Destination: "q", DueAt: clk.Now().Add(time.Minute)},
				{ID: wire.SendKey("m", 2), Destination: "q", DueAt: clk.Now().Add(time.Minute)},
			}, "", nil
		}})
	h.sample(false)
	for range 6 {
		clk.Advance(SampleInterval)
		r.m.Dropped("duplicate", 3)
		r.m.Dropped("cancelled", 1)
		h.sample(false)
	}
	page := get(t, h)
	mustContain(t, page, "not stored /min", ">24<", // 4 each 10 s
		"duplicate 18", "cancelled 6", "replaced 0", `>m <span class="sub">(send 2)</span><`)
	if strings.Contains(page, "\x1f") || strings.Contains(page, "\u001f") || strings.Contains(page, "&#x1f;") {
		t.Error("the page shows a row key, not the id and its send")
	}
}

func TestSamplesAreBoundedAndRateLimited(t *testing.T) {
	clk := storetest.NewClock(t0)
	h := New(Options{Gatherer: newRegistry().reg, Now: clk.Now})
	for range 1000 {
		h.sample(false)
		clk.Advance(time.Second)
	}
	if n, limit := len(h.samples), int(h.keep()/SampleInterval)+1; n > limit {
		t.Errorf("%d samples kept, want at most %d", n, limit)
	}
}

func TestStoreErrorsAreShown(t *testing.T) {
	boom := errors.New("store is closed")
	page := get(t, New(Options{
		Stats:   func(context.Context) (int, int, error) { return 0, 0, boom },
		NextDue: func(context.Context) (time.Time, bool, error) { return time.Time{}, false, boom },
		List:    func(context.Context, storage.ListFilter) ([]storage.Timeout, string, error) { return nil, "", boom },
	}))
	mustContain(t, page, "store is closed", "store counts unavailable", "Metrics not available")
}

func TestNothingPending(t *testing.T) {
	page := get(t, New(Options{
		Stats:   func(context.Context) (int, int, error) { return 0, 0, nil },
		NextDue: func(context.Context) (time.Time, bool, error) { return time.Time{}, false, nil },
		List:    func(context.Context, storage.ListFilter) ([]storage.Timeout, string, error) { return nil, "", nil },
	}))
	mustContain(t, page, "nothing pending", "Nothing pending.", `id="pending">0<`)
}

func TestRunStops(t *testing.T) {
	h := New(Options{Gatherer: newRegistry().reg})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- h.Run(ctx) }()
	cancel()
	testenv.WaitNil(t, done, 5*time.Second, "Run to stop")
}

func TestEmptyOptionsRender(t *testing.T) {
	mustContain(t, get(t, New(Options{})), "delaybridge", "Metrics not available", "not available")
}

func TestRetryHoldIsNotOverdue(t *testing.T) {
	now := t0
	page := get(t, New(Options{Now: func() time.Time { return now },
		List: rows(storage.Timeout{ID: "r", Destination: "d", DueAt: now.Add(-time.Minute), NotBefore: now.Add(4 * time.Second)})}))
	mustContain(t, page, "retry in 4s")
	if strings.Contains(page, "overdue") {
		t.Error("a row held for a retry is shown overdue")
	}
}

// An exchange destination is shown as one, never as a bare routing key that
// reads like a queue's name, and escaped like everything else.
func TestExchangeDestinationsAreShownAsSuch(t *testing.T) {
	now := t0
	page := get(t, New(Options{Now: func() time.Time { return now },
		List: rows(
			storage.Timeout{ID: "q-row", Destination: "orders", DueAt: now.Add(time.Minute)},
			storage.Timeout{ID: "x-row", Exchange: "events<b>", Destination: "order.<i>created", DueAt: now.Add(2 * time.Minute)},
			storage.Timeout{ID: "fan-row", Exchange: "fanout.x", DueAt: now.Add(3 * time.Minute)},
		)}))
	mustContain(t, page,
		`<td class="mono">orders</td>`,
		`<td class="mono">exchange &#34;events&lt;b&gt;&#34; routing key &#34;order.&lt;i&gt;created&#34;</td>`,
		`<td class="mono">exchange &#34;fanout.x&#34; routing key &#34;&#34;</td>`)
	if strings.Contains(page, "<b>") || strings.Contains(page, "<i>") {
		t.Error("page contains an unescaped exchange or routing key")
	}
}

// A row of a paused destination is shown paused, and its being past due is
// not flagged: the pause holds it there.
func TestPausedRowsShowPaused(t *testing.T) {
	now := t0
	page := get(t, New(Options{Now: func() time.Time { return now },
		List: rows(storage.Timeout{ID: "p", Destination: "d", DueAt: now.Add(-time.Hour), Paused: true})}))
	mustContain(t, page, `<span class="badge warn">paused</span>`)
	if strings.Contains(page, `nowrap err`) || strings.Contains(page, ">waiting<") {
		t.Error("a paused row is shown overdue or waiting")
	}
	if strings.Contains(page, "messages overdue") || !strings.Contains(page, `id="health">healthy`) {
		t.Error("a paused destination's messages held past due make the page unhealthy")
	}
}
