package status

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/metrics"
	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/storage/storetest"
	"github.com/delaybridge/delaybridge/wire"
)

// An incident: every forward to a destination fails, none is
// dispatched. The page said "healthy" and showed the messages as "waiting".
func TestFailingDispatchIsAProblemAndRowsAreNotWaiting(t *testing.T) {
	clk := storetest.NewClock(t0)
	r := newRegistry()
	r.setConnected("publish", true)
	broken := wire.Destination{Key: "billing"}
	fine := wire.Destination{Key: "orders"}
	end := clk.Now().Add(6 * SampleInterval) // when the page is read
	h := New(Options{Gatherer: r.reg, Now: clk.Now,
		List: rows(
			storage.Timeout{ID: "b-1", Destination: "billing", DueAt: end.Add(-10 * time.Second), Attempts: 4,
				LastError: "returned: 312 NO_ROUTE", NotBefore: end.Add(8 * time.Second)},
			storage.Timeout{ID: "b-2", Destination: "billing", DueAt: end.Add(-5 * time.Second), Attempts: 2, LastError: "nacked"},
			storage.Timeout{ID: "o-1", Destination: "orders", DueAt: end.Add(time.Hour)},
		)})
	h.sample(false)
	for range 6 {
		clk.Advance(SampleInterval)
		for range 300 {
			r.m.DispatchFailed()
			r.m.DestinationDispatchFailed(broken)
		}
		r.m.Dispatched(5)
		r.m.DestinationDispatched(fine, 5)
		h.sample(false)
	}
	page := get(t, h)
	mustContain(t, page, ">attention<", `class="problem">dispatch failing<`, "to billing: 1800 failures, 0 dispatched",
		">retrying<", ">failing<", "returned: 312 NO_ROUTE", "retry in 8s", ">waiting<")
	if strings.Contains(page, ">healthy<") {
		t.Error("healthy while every forward to billing fails")
	}
	// The destination table: billing failing first, orders fine.
	bi, oi := strings.Index(page, `<td class="mono">billing</td>`), strings.Index(page, `<td class="mono">orders</td>`)
	if bi < 0 || oi < 0 || bi > oi {
		t.Errorf("destination rows: billing at %d, orders at %d; want both, billing (failing) first", bi, oi)
	}
	// b-1 and b-2 failed: neither is shown waiting (only o-1 is).
	if n := strings.Count(page, ">waiting<"); n != 1 {
		t.Errorf("%d rows waiting, want 1 (o-1)", n)
	}
}

func TestAFewFailuresAmongForwardsAreNotFailing(t *testing.T) {
	clk := storetest.NewClock(t0)
	r := newRegistry()
	d := wire.Destination{Key: "orders"}
	h := New(Options{Gatherer: r.reg, Now: clk.Now})
	h.sample(false)
	clk.Advance(SampleInterval)
	r.m.DispatchFailed()
	r.m.DestinationDispatchFailed(d)
	r.m.Dispatched(100)
	r.m.DestinationDispatched(d, 100)
	page := get(t, h)
	mustContain(t, page, ">healthy<", "some failures")
	if strings.Contains(page, "dispatch failing") {
		t.Error("one failure among 100 forwards reads as dispatch failing")
	}
	// Past the window, the failures no longer count.
	clk.Advance(DefaultWindow + 2*SampleInterval)
	h.sample(false)
	r.m.DispatchFailed()
	r.m.DispatchFailed()
	page = get(t, h)
	mustContain(t, page, "dispatch failing", "2 failures, 0 dispatched")
}

func TestErrorQueueGrowingAndOverdueAreProblems(t *testing.T) {
	clk := storetest.NewClock(t0)
	r := newRegistry()
	h := New(Options{Gatherer: r.reg, Now: clk.Now, OverdueAfter: time.Minute,
		List: rows(
			storage.Timeout{ID: "stuck", Destination: "q", DueAt: clk.Now().Add(-3 * time.Minute)},
			storage.Timeout{ID: "just-due", Destination: "q", DueAt: clk.Now().Add(-2 * time.Second)},
		)})
	h.sample(false)
	clk.Advance(SampleInterval)
	r.m.ErrorQueued(metrics.StageDispatch, 3)
	page := get(t, h)
	mustContain(t, page, ">attention<", "error queue growing", "3 messages moved to the error queue",
		"messages overdue", "1 pending messages are more than 1m past their due time (the oldest by 3m10s)", ">overdue<")
}

func TestLatenessIsPercentilesNotTheMean(t *testing.T) {
	clk := storetest.NewClock(t0)
	r := newRegistry()
	h := New(Options{Gatherer: r.reg, Now: clk.Now})
	h.sample(false)
	clk.Advance(SampleInterval)
	// 990 forwards at 3 ms, 10 at 50 s: the mean (0.5 s) describes none.
	for range 990 {
		r.m.ObserveLateness(3 * time.Millisecond)
	}
	for range 10 {
		r.m.ObserveLateness(50 * time.Second)
	}
	// Lateness observed before the window is left out of it.
	samples, base := h.window(h.gather())
	p := latenessBetween(base, &samples[len(samples)-1])
	if p.Count != 1000 || p.P50 <= 2500*time.Microsecond || p.P50 > 5*time.Millisecond {
		t.Errorf("p50 %s of %v forwards; want within (2.5ms, 5ms] of 1000", p.P50, p.Count)
	}
	if p.P99 < 2500*time.Microsecond || p.P99 > 5*time.Millisecond {
		t.Errorf("p99 %s; want within the 3 ms bucket (990 of 1000 are there)", p.P99)
	}
	for range 100 {
		r.m.ObserveLateness(90 * time.Second) // past the last bucket
	}
	samples, base = h.window(h.gather())
	p = latenessBetween(base, &samples[len(samples)-1])
	if !p.Over99 || p.P99 != time.Minute {
		t.Errorf("p99 %s over %v; want > 60s", p.P99, p.Over99)
	}
	mustContain(t, get(t, h), "p99 &gt; 1m")
}

func TestQuantile(t *testing.T) {
	bounds := []float64{1, 2, 4}
	for _, c := range []struct {
		q          float64
		cumulative []float64
		count      float64
		want       time.Duration
		over       bool
	}{
		{0.5, []float64{0, 10, 10}, 10, 1500 * time.Millisecond, false},
		{0.5, []float64{10, 10, 10}, 10, 500 * time.Millisecond, false},
		{0.99, []float64{5, 5, 5}, 10, 4 * time.Second, true},
		{0.5, []float64{0, 0, 4}, 4, 3 * time.Second, false},
	} {
		got, over := quantile(c.q, bounds, c.cumulative, c.count)
		if got != c.want || over != c.over {
			t.Errorf("quantile(%v, %v, %v) = %s, %v; want %s, %v", c.q, c.cumulative, c.count, got, over, c.want, c.over)
		}
	}
}

func TestErrorQueueSection(t *testing.T) {
	clk := storetest.NewClock(t0)
	reads := 0
	var newest []ErrorEntry
	for i := range 15 {
		newest = append(newest, ErrorEntry{ID: "err-" + string(rune('a'+i)), Destination: "billing<x>", Stage: "dispatch",
			Reason: "returned: NO_ROUTE", FailedAt: clk.Now().Add(-time.Duration(i) * time.Minute)})
	}
	h := New(Options{Now: clk.Now, ErrorQueue: func(context.Context) (ErrorQueue, error) {
		reads++
		return ErrorQueue{Depth: 15, Newest: newest}, nil
	}})
	page := get(t, h)
	mustContain(t, page, `id="error-depth">15<`, "err-a", "err-e", "billing&lt;x&gt;", "returned: NO_ROUTE",
		"2026-11-21 20:00:00", `href="/?errors=more#errors"`)
	if strings.Contains(page, "err-f") {
		t.Error("more than ErrorRows copies shown by default")
	}
	mustContain(t, getURL(t, h, "/?errors=more"), "err-o")
	if reads != 1 {
		t.Errorf("the error queue was read %d times for two page views within %s; want once", reads, ErrorQueueInterval)
	}
	clk.Advance(ErrorQueueInterval)
	get(t, h)
	if reads != 2 {
		t.Errorf("%d reads after %s; want 2", reads, ErrorQueueInterval)
	}
	bad := New(Options{ErrorQueue: func(context.Context) (ErrorQueue, error) { return ErrorQueue{}, errors.New("no broker") }})
	mustContain(t, get(t, bad), "The error queue: no broker")
}

func TestInstance(t *testing.T) {
	now := t0
	page := get(t, New(Options{Now: func() time.Time { return now }, Instance: Instance{Owner: "host-1-ab12cd34", Hostname: "host-1",
		Version: "v1.2.3", Revision: "0123456789abcdef", Started: now.Add(-(3*time.Hour + 4*time.Minute))}}))
	mustContain(t, page, "host-1-ab12cd34", "v1.2.3", "0123456789abcdef", `id="uptime">3h4m<`)
}

func TestSearchAndPaging(t *testing.T) {
	now := t0
	var ts []storage.Timeout
	for i := range 60 {
		dest := "orders"
		if i%2 == 1 {
			dest = "billing"
		}
		ts = append(ts, storage.Timeout{ID: "m-" + string(rune('A'+i/26)) + string(rune('a'+i%26)), Destination: dest,
			DueAt: now.Add(time.Duration(i+1) * time.Minute)})
	}
	h := New(Options{Now: func() time.Time { return now }, List: rows(ts...), Refresh: 5 * time.Second})
	first := get(t, h)
	if n := strings.Count(first, `class="mono msgid"`); n != PageRows {
		t.Errorf("%d rows on the first page, want %d", n, PageRows)
	}
	mustContain(t, first, `id="next-page"`, `http-equiv="refresh"`)
	page := getURL(t, h, "/?destination=billing&due_from=2026-11-21T20:10:00Z&due_to=2026-11-21T20:20:00Z")
	for _, id := range []string{"m-Aj", "m-Al", "m-Ar"} { // due 20:10, 20:12, 20:18
		mustContain(t, page, ">"+id+"<")
	}
	for _, id := range []string{"m-Ah", "m-Ak", "m-At"} { // due 20:08 (before), orders, 20:20 (not before due_to)
		if strings.Contains(page, ">"+id+"<") {
			t.Errorf("search shows %s", id)
		}
	}
	if strings.Contains(page, `http-equiv="refresh"`) {
		t.Error("a search reloads itself (and would lose the operator's place)")
	}
	mustContain(t, getURL(t, h, "/?id_prefix=m-B"), ">m-Ba<", ">m-By<")
	mustContain(t, getURL(t, h, "/?id_prefix=m-Bc"), ">m-Bc<", `value="m-Bc"`)
	// The next page link carries the search and the cursor.
	second := getURL(t, h, "/?destination=orders")
	i := strings.Index(second, `href="/?cursor=`)
	if i < 0 {
		t.Fatalf("no next page link on a full page of orders")
	}
	link := second[i+len(`href="`):]
	link = strings.ReplaceAll(link[:strings.Index(link, `"`)], "&amp;", "&")
	link, _, _ = strings.Cut(link, "#") // as a browser does
	next := getURL(t, h, link)
	mustContain(t, next, ">m-By<", ">m-Ca<", "first page") // the 26th row of orders on
	if strings.Contains(next, ">m-Ac<") || strings.Contains(next, ">m-Ab<") {
		t.Error("the second page repeats the first or shows billing")
	}
	mustContain(t, getURL(t, h, "/?due_from=yesterday"), "due_from &#34;yesterday&#34; is not an RFC 3339 time")
	mustContain(t, getURL(t, h, "/?destination=orders&exchange=x"), "destination (a queue) and exchange exclude each other")
}

// Exchange destinations are searched by exchange, and routing key.
func TestSearchByExchange(t *testing.T) {
	now := t0
	h := New(Options{Now: func() time.Time { return now }, List: rows(
		storage.Timeout{ID: "q-1", Destination: "events", DueAt: now.Add(time.Minute)},
		storage.Timeout{ID: "x-1", Exchange: "events", Destination: "order.created", DueAt: now.Add(2 * time.Minute)},
		storage.Timeout{ID: "x-2", Exchange: "events", Destination: "order.paid", DueAt: now.Add(3 * time.Minute)},
	)})
	page := getURL(t, h, "/?exchange=events&routing_key=")
	mustContain(t, page, ">x-1<", ">x-2<", `name="exchange" value="events"`)
	if strings.Contains(page, ">q-1<") {
		t.Error("the queue events is listed under the exchange events")
	}
	page = getURL(t, h, "/?exchange=events&routing_key=order.paid")
	mustContain(t, page, ">x-2<")
	if strings.Contains(page, ">x-1<") {
		t.Error("routing key filter ignored")
	}
}

func getURL(t *testing.T, h http.Handler, target string) string {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, target, nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("GET %s: status %d", target, rec.Code)
	}
	return rec.Body.String()
}

// A slow error queue (a broker slow to connect) holds neither the page nor
// its store reads up: the page shows the previous result, or that it is
// still reading, and the read goes on on its own.
func TestSlowErrorQueueDoesNotHoldThePage(t *testing.T) {
	now := t0
	release := make(chan struct{})
	done := make(chan struct{})
	h := New(Options{Now: func() time.Time { return now },
		List: rows(storage.Timeout{ID: "listed-1", Destination: "q", DueAt: now.Add(time.Minute)}),
		ErrorQueue: func(ctx context.Context) (ErrorQueue, error) {
			defer close(done)
			<-release
			return ErrorQueue{Depth: 7}, ctx.Err()
		}})
	page := get(t, h)
	mustContain(t, page, ">listed-1<", "The error queue: still reading it")
	close(release)
	<-done
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(get(t, h), `id="error-depth">7<`) {
		if time.Now().After(deadline) {
			t.Fatal("the read's result is not shown once it ended")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Problems found elsewhere (a foreign binding on a delayed exchange) make
// the badge attention and are named under it; none, and it stays healthy.
func TestProblemsFromOptions(t *testing.T) {
	var problems []Problem
	h := New(Options{Problems: func() []Problem { return problems }})
	if page := get(t, h); !strings.Contains(page, ">healthy<") {
		t.Fatalf("not healthy without problems")
	}
	problems = []Problem{{Name: "foreign binding on a delayed exchange", Detail: `orders: queue "orders-q" <b>`}}
	page := get(t, h)
	mustContain(t, page, ">attention<", `class="problem">foreign binding on a delayed exchange<`, `orders: queue &#34;orders-q&#34; &lt;b&gt;`)
}
