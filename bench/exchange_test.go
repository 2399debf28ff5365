package bench

import (
	"context"
	"encoding/json"
	"math"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/admin"
	"github.com/delaybridge/delaybridge/wire"
)

func TestDelayMsRoundsUp(t *testing.T) {
	now := time.Unix(100, 0)
	for _, c := range []struct {
		ahead time.Duration
		want  int64
	}{
		{5 * time.Second, 5000},
		{5*time.Second + 1, 5001}, // never before the due time
		{999 * time.Microsecond, 1},
		{0, 0},
		{-time.Second, 0}, // already due: now
	} {
		if got := delayMs(now.Add(c.ahead), now); got != c.want {
			t.Errorf("delayMs(now+%v) = %d, want %d", c.ahead, got, c.want)
		}
	}
}

func TestWorkloadMessages(t *testing.T) {
	b := &bencher{body: []byte("x")}
	now := time.Unix(100, 0)
	due := now.Add(1500*time.Millisecond + 1)

	x := b.exchangeMessage("t", 7, due, "orders", "orders.eu.paid")
	if _, ok := x.Headers[wire.HeaderDestination]; ok {
		t.Errorf("exchange message has %s: %v", wire.HeaderDestination, x.Headers)
	}
	if x.Headers[wire.HeaderDestinationExchange] != "orders" || x.Headers[wire.HeaderDestinationRoutingKey] != "orders.eu.paid" ||
		x.Headers[wire.HeaderDueAt] == nil || x.MessageId != "t-7" {
		t.Errorf("exchange message: id %q, headers %v", x.MessageId, x.Headers)
	}

	d := b.delayedMessage("t", 7, due, now)
	for _, h := range []string{wire.HeaderDestination, wire.HeaderDueAt, wire.HeaderDestinationExchange} {
		if _, ok := d.Headers[h]; ok {
			t.Errorf("delayed message has %s, which a plugin publisher does not send: %v", h, d.Headers)
		}
	}
	if got, ok := d.Headers[wire.HeaderDelay].(int32); !ok || got != 1501 {
		t.Errorf("x-delay = %#v, want int32 1501", d.Headers[wire.HeaderDelay])
	}
	if got, _ := headerInt(d.Headers, hdrDue); got != due.UnixNano() {
		t.Errorf("bench-due = %d, want the due time meant, %d", got, due.UnixNano())
	}

	// The forward carries x-delay negated, as the plugin leaves it.
	fwd := amqp.Table{wire.HeaderDelay: int64(-1501), hdrDelay: d.Headers[hdrDelay]}
	if !delayNegated(fwd) {
		t.Errorf("delayNegated(%v) = false", fwd)
	}
	for _, h := range []amqp.Table{
		{wire.HeaderDelay: int32(1501), hdrDelay: int64(1501)}, // not negated
		{hdrDelay: int64(1501)},                                // dropped
		{wire.HeaderDelay: "-1501", hdrDelay: int64(1501)},     // not an integer
	} {
		if delayNegated(h) {
			t.Errorf("delayNegated(%v) = true", h)
		}
	}
}

func TestCollectorCountsMismatched(t *testing.T) {
	c := &collector{done: make(chan struct{}), exit: make(chan struct{}), n: 3, got: make([]bool, 3), arrived: make([]int64, 3),
		check: func(seq int, d *amqp.Delivery) bool { return d.RoutingKey == exchangeKeys[seq%len(exchangeKeys)] }}
	due := time.Now().Add(-time.Second).UnixNano()
	msg := func(seq int64, key string) amqp.Delivery {
		return amqp.Delivery{RoutingKey: key, Headers: amqp.Table{hdrDue: due, hdrSeq: seq}}
	}
	deliveries := make(chan amqp.Delivery, 4)
	deliveries <- msg(0, exchangeKeys[0])
	deliveries <- msg(1, "elsewhere")
	deliveries <- msg(1, exchangeKeys[1]) // a duplicate is not checked again
	deliveries <- msg(2, exchangeKeys[2])
	close(deliveries)
	c.loop(deliveries)
	if c.mismatched != 1 || c.dups != 1 || c.distinct != 3 {
		t.Errorf("mismatched %d, dups %d, distinct %d; want 1, 1, 3", c.mismatched, c.dups, c.distinct)
	}
	late, arrived := c.samples()
	if len(late) != 3 || slices.Contains(arrived, 0) {
		t.Errorf("samples: late %v, arrived %v", late, arrived)
	}
}

func TestReceiptFigures(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	pubAt := []time.Time{at(0), at(time.Millisecond), at(2 * time.Millisecond)}
	arrived := []int64{at(5020 * time.Millisecond).UnixNano(), 0, at(5030 * time.Millisecond).UnixNano()}
	rows := map[string]storedRow{
		"q-0": {received: at(10 * time.Millisecond), due: at(5010 * time.Millisecond)},
		// q-1 was stored but never arrived; q-2 was not read.
		"q-1":     {received: at(40 * time.Millisecond), due: at(5040 * time.Millisecond)},
		"other-2": {received: at(time.Second), due: at(time.Second)},
	}
	lag, dispatch := receiptFigures("q", pubAt, arrived, rows)
	if want := []time.Duration{10 * time.Millisecond, 39 * time.Millisecond}; !slices.Equal(lag, want) {
		t.Errorf("lag = %v, want %v", lag, want)
	}
	if want := []time.Duration{10 * time.Millisecond}; !slices.Equal(dispatch, want) {
		t.Errorf("dispatch = %v, want %v", dispatch, want)
	}
	if lag, dispatch := receiptFigures("q", pubAt, arrived, nil); lag != nil || dispatch != nil {
		t.Errorf("no rows read: %v, %v", lag, dispatch)
	}
}

// adminServer serves pages of GET /api/v1/timeouts as the bridge does, each
// of one row, and counts the requests.
func adminServer(t *testing.T, token string, ids []string) (*bridgeProc, *int) {
	t.Helper()
	var requests int
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests++
		if r.URL.Path != "/api/v1/timeouts" || r.Header.Get("Authorization") != "Bearer "+token {
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte(`{"error":"no"}`))
			return
		}
		i := 0
		if c := r.URL.Query().Get("cursor"); c != "" {
			i = slices.Index(ids, c) + 1
		}
		due := time.Unix(2000, int64(i))
		page := admin.ListJSON{Timeouts: []admin.TimeoutJSON{{ID: ids[i], DueAt: due, ReceivedAt: due.Add(-time.Second)}}}
		if i+1 < len(ids) {
			page.Next = ids[i]
		}
		_ = json.NewEncoder(w).Encode(page)
	}))
	t.Cleanup(srv.Close)
	return &bridgeProc{httpAddr: strings.TrimPrefix(srv.URL, "http://")}, &requests
}

func TestListStored(t *testing.T) {
	ids := []string{"a-0", "a-1", "a-2"}
	p, requests := adminServer(t, "tok", ids)
	rows, complete, err := p.listStored(context.Background(), "tok", time.Now().Add(time.Minute))
	if err != nil || !complete || len(rows) != 3 || *requests != 3 {
		t.Fatalf("listStored: %d rows, complete %v, %v, %d requests", len(rows), complete, err, *requests)
	}
	if r := rows["a-2"]; !r.due.Equal(time.Unix(2000, 2)) || !r.received.Equal(time.Unix(1999, 2)) {
		t.Errorf("a-2 = %+v", r)
	}

	// Past the deadline it reads nothing more and says so.
	rows, complete, err = p.listStored(context.Background(), "tok", time.Now().Add(-time.Second))
	if err != nil || complete || len(rows) != 0 {
		t.Errorf("past the deadline: %d rows, complete %v, %v", len(rows), complete, err)
	}

	// A refused request is an error that quotes the bridge.
	_, complete, err = p.listStored(context.Background(), "wrong", time.Now().Add(time.Minute))
	if err == nil || complete || !strings.Contains(err.Error(), "401") || !strings.Contains(err.Error(), `{"error":"no"}`) {
		t.Errorf("wrong token: complete %v, %v", complete, err)
	}
}

func TestListStoredUndecodable(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("<html>")) }))
	defer srv.Close()
	p := &bridgeProc{httpAddr: strings.TrimPrefix(srv.URL, "http://")}
	if _, _, err := p.listStored(context.Background(), "tok", time.Now().Add(time.Minute)); err == nil {
		t.Errorf("undecodable page: no error")
	}
}

func TestExchangePathPoolsRounds(t *testing.T) {
	ep := &ExchangePath{Path: PathDelayed}
	ms := func(v ...int) []time.Duration {
		var d []time.Duration
		for _, x := range v {
			d = append(d, time.Duration(x)*time.Millisecond)
		}
		return d
	}
	ep.add(&ExchangeRound{Round: 1, Punctual: Punctual{Lateness: Lateness{Expected: 3, Received: 3, Percentiles: Percentiles{P99Ms: 30}}}},
		ms(10, 20, 30), ms(1, 2), ms(9, 18))
	ep.add(&ExchangeRound{Round: 2, Punctual: Punctual{Lateness: Lateness{Expected: 3, Received: 2, Missing: 1, Mismatched: 1, Percentiles: Percentiles{P99Ms: 50}}}},
		ms(40, 50), ms(3), ms(37, 47, 60))
	l := ep.Lateness
	if l.Expected != 6 || l.Received != 5 || l.Missing != 1 || l.Mismatched != 1 || l.MaxMs != 50 || l.P50Ms != 30 {
		t.Errorf("pooled lateness %+v", l)
	}
	if !slices.Equal(ep.RoundP99Ms, []float64{30, 50}) {
		t.Errorf("round p99 %v", ep.RoundP99Ms)
	}
	if ep.Listed != 5 || ep.ReceiptLag.N != 5 || ep.ReceiptLag.MaxMs != 60 || ep.Dispatch.N != 3 || ep.Dispatch.MaxMs != 3 {
		t.Errorf("listed %d, lag %+v, dispatch %+v", ep.Listed, ep.ReceiptLag, ep.Dispatch)
	}
	if distOf(nil) != nil {
		t.Errorf("distOf(nil) not nil")
	}
}

func exchangeFixture() *Exchange {
	ok := Lateness{Expected: 20000, Received: 20000, Percentiles: Percentiles{P50Ms: 0.5, P90Ms: 1, P99Ms: 3, MaxMs: 9}}
	lag := &Dist{N: 20000, Percentiles: Percentiles{P50Ms: 150, P99Ms: 400, MaxMs: 450}}
	return &Exchange{N: 10000, WindowMs: 10000, Paths: []*ExchangePath{
		{Path: PathQueue, Lateness: ok, Receipt: Receipt{ReceiptLag: lag, Dispatch: &Dist{Percentiles: Percentiles{P99Ms: 3}}},
			RoundP99Ms: []float64{2.5, 3}, Rounds: []*ExchangeRound{{Round: 1, Receipt: Receipt{ReceiptLag: lag}}, {Round: 2}}},
		{Path: PathExchange, Lateness: Lateness{Expected: 20000, Received: 20000, Mismatched: 2, Percentiles: Percentiles{P99Ms: 25, MaxMs: 99}},
			Rounds: []*ExchangeRound{{Round: 1}, {Round: 2}}},
		// From the due time meant it misses the targets; from the bridge's due, not.
		{Path: PathDelayed, Lateness: Lateness{Expected: 20000, Received: 20000, Percentiles: Percentiles{P50Ms: 150, P99Ms: 400, MaxMs: 450}},
			Receipt: Receipt{ReceiptLag: lag, Dispatch: &Dist{N: 20000, Percentiles: Percentiles{P50Ms: 0.6, P99Ms: 4, MaxMs: 101}}},
			Rounds:  []*ExchangeRound{{Round: 1, Receipt: Receipt{ReceiptLag: lag, Dispatch: &Dist{Percentiles: Percentiles{P99Ms: 4}}}}, {Round: 2, OtherCores: 0.314}}},
	}}
}

func TestExchangeRows(t *testing.T) {
	checkRows(t, BuildRows(&Results{Exchange: exchangeFixture()}), StepExchange, [][2]string{
		{"queue (x-destination): lateness p50 / p90, 10000 over 10.00 s × 2 rounds", "0.50 ms / 1.00 ms|"},
		{"queue (x-destination): lateness p99", "3.00 ms|PASS"},
		{"queue (x-destination): early / duplicates / missing / mismatched", "0 / 0 / 0 / 0 of 20000|PASS"},
		{"exchange (x-destination-exchange, topic): lateness p99", "25.0 ms|MISS"},
		{"exchange (x-destination-exchange, topic): lateness max", "99.0 ms|PASS"},
		{"exchange (x-destination-exchange, topic): early / duplicates / missing / mismatched", "0 / 0 / 0 / 2 of 20000|MISS"},
		{"delayed topic exchange (x-delay): lateness p99 / max from the due time x-delay was computed for", "400.0 ms / 450.0 ms|"},
		{"delayed topic exchange (x-delay): of which publish → bridge receipt, p50 / p99 / max (20000 read)", "150.0 ms / 400.0 ms / 450.0 ms|"},
		{"delayed topic exchange (x-delay): lateness p99 from the bridge's due (receipt + x-delay)", "4.00 ms|PASS"},
		{"delayed topic exchange (x-delay): lateness max from the bridge's due", "101.0 ms|MISS"},
	})

	// Without the stored rows there is no figure to check, and no verdict.
	x := exchangeFixture()
	x.Paths[2].Dispatch = nil
	for _, r := range BuildRows(&Results{Exchange: x}) {
		if strings.Contains(r.Metric, "from the bridge's due") && (r.Result != "" || !strings.HasPrefix(r.Value, "n/a")) {
			t.Errorf("no stored rows: %+v", r)
		}
	}
}

func TestFormatExchange(t *testing.T) {
	if FormatExchange(&Results{}) != "" {
		t.Errorf("not run: not empty")
	}
	out := FormatExchange(&Results{Exchange: exchangeFixture()})
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2+3+1+1+2 { // header, rule, three paths, one lag line each for queue and exchange, two for delayed
		t.Fatalf("FormatExchange:\n%s", out)
	}
	for i, want := range []string{
		"10,000 msgs due over 10.00 s, 2 rounds each",
		"",
		"queue (x-destination)  ",
		"  (publish → bridge receipt)  ",
		"exchange (x-destination-exchange, topic)",
		"  (publish → bridge receipt)  ",
		"delayed topic exchange (x-delay), from the due time meant",
		"  of which publish → bridge receipt  ",
		"  and the bridge's due (receipt + x-delay) → consumer",
	} {
		if !strings.HasPrefix(lines[i], want) {
			t.Errorf("line %d %q, want it to start with %q", i, lines[i], want)
		}
	}
	for i, want := range map[int]string{2: "2.50 ms / 3.00 ms", 3: "400.0 ms / -", 8: "4.00 ms / -"} {
		if !strings.Contains(lines[i], want) {
			t.Errorf("line %d %q lacks %q", i, lines[i], want)
		}
	}
	if !strings.HasSuffix(lines[6], " 0.00 / 0.31") { // other CPU by round
		t.Errorf("line 6 %q: no other CPU by round", lines[6])
	}
	if strings.Contains(lines[5], "ms") { // no rows read for the exchange path
		t.Errorf("line 5 %q: figures without samples", lines[5])
	}
}

func TestOtherCores(t *testing.T) {
	ncpu := int64(max(runtime.NumCPU(), 1))
	// 10 s of wall clock on every CPU; the machine busy for 8 CPU s, of
	// which the bridge took 2, the broker 3 and the bench 1.
	a := cpuSample{procs: []int64{100}, broker: 1000, bench: 50, machine: machineCPU{busy: 5000, total: 20000}}
	b := cpuSample{procs: []int64{300}, broker: 1300, bench: 150,
		machine: machineCPU{busy: 5800, total: 20000 + 10*clockTicks*ncpu}}
	busy, cores := otherCores(a, b)
	if want := 800.0 / float64(10*clockTicks*ncpu); math.Abs(busy-want) > 1e-9 {
		t.Errorf("busy %v, want %v", busy, want)
	}
	if math.Abs(cores-0.2) > 1e-9 { // 2 CPU s over 10 s
		t.Errorf("other cores %v, want 0.2", cores)
	}
	if _, cores := otherCores(a, a); cores != 0 {
		t.Errorf("no time between the samples: %v cores", cores)
	}
}
