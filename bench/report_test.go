package bench

import (
	"math"
	"slices"
	"strings"
	"testing"
)

func TestFormatTable(t *testing.T) {
	got := FormatTable([]Row{
		{Step: "ingest", Metric: "ingest / ceiling", Value: "0.92×", Target: "≥ 0.80×", Result: Pass},
		{Step: "punctuality", Metric: "lateness p50", Value: "0.66 ms"},
	})
	checkLines(t, "FormatTable", got,
		"step         metric            value    target   result",
		"-----------  ----------------  -------  -------  ------",
		"ingest       ingest / ceiling  0.92×    ≥ 0.80×  PASS",
		"punctuality  lateness p50      0.66 ms",
		"",
	)
}

// checkLines checks that got, what printed, is the lines of want.
func checkLines(t *testing.T, what, got string, want ...string) {
	t.Helper()
	if w := strings.Join(want, "\n"); got != w {
		t.Errorf("%s:\n%s\nwant:\n%s", what, got, w)
	}
}

// checkRows checks that rows has a row of step for each metric of want
// (metric, then "value|result", or "(no row)" for none).
func checkRows(t *testing.T, rows []Row, step string, want [][2]string) {
	t.Helper()
	for _, c := range want {
		got := "(no row)"
		for _, r := range rows {
			if r.Step == step && r.Metric == c[0] {
				got = r.Value + "|" + r.Result
				break
			}
		}
		if got != c[1] {
			t.Errorf("%q = %q, want %q", c[0], got, c[1])
		}
	}
}

func TestFormatters(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{FmtMs(0.661), "0.66 ms"},
		{FmtMs(12.34), "12.3 ms"},
		{FmtMs(1879), "1.88 s"},
		{FmtMs(-2.5), "-2.50 ms"},
		{FmtMs(math.Inf(1)), "never"},
		{FmtRate(11719.4), "11,719 msg/s"},
		{FmtRate(1234567), "1,234,567 msg/s"},
		{FmtRate(999), "999 msg/s"},
		{FmtRatio(0.8), "0.80×"},
		{FmtBytes(64 << 20), "64.0 MiB"},
		{groupThousands(-1234), "-1,234"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}

func result(rows []Row, step, metricPrefix string) string {
	for _, r := range rows {
		if r.Step == step && strings.HasPrefix(r.Metric, metricPrefix) {
			return r.Result
		}
	}
	return "(no row)"
}

func TestBuildRowsVerdicts(t *testing.T) {
	r := &Results{
		Ceiling:     &Ceiling{N: 10, Rate: 10000},
		Ingest:      &Ingest{N: 10, Rate: 7900},
		Punctuality: &Punctual{N: 10, WindowMs: 10000, Lateness: Lateness{Expected: 10, Received: 10, Percentiles: Percentiles{P99Ms: 20, MaxMs: 100.5}}},
		Burst:       &Burst{N: 10, LastAfterDueMs: 2999, Lateness: Lateness{Expected: 10, Received: 9, Missing: 1}},
		Scale: &Scale{N: 100, HeapAvailable: true, HeapPeak: 65 << 20, RestartReadyMs: 999, PendingRestart: -1,
			Punctual: &Punctual{N: 10, Lateness: Lateness{Expected: 10, Received: 10, Early: 1}}},
		Rebus: &Punctual{N: 10, WindowMs: 10000, Lateness: Lateness{Expected: 10, Received: 10, Percentiles: Percentiles{P99Ms: 25, MaxMs: 50}}},
	}
	r.Ingest.Ratio = r.Ingest.Rate / r.Ceiling.Rate
	rows := BuildRows(r)
	for _, c := range []struct{ step, metric, want string }{
		{StepIngest, "ingest / ceiling", Miss},
		{StepPunctuality, "lateness p99", Pass},
		{StepPunctuality, "lateness max", Miss},
		{StepBurst, "due instant to last delivered", Miss}, // one missing
		{StepBurst, "missing", Miss},
		{StepScale, "early deliveries", Miss},
		{StepScale, "Go heap (HeapAlloc peak", Miss},
		{StepScale, "restart", Pass},
		{StepRebus, "lateness p99", Miss},
		{StepRebus, "lateness max", Pass},
		{StepRebus, "early deliveries", Pass},
	} {
		if got := result(rows, c.step, c.metric); got != c.want {
			t.Errorf("%s %q: %s, want %s", c.step, c.metric, got, c.want)
		}
	}
	if slices.ContainsFunc(rows, func(r Row) bool { return strings.HasPrefix(r.Metric, "pending after restart") }) {
		t.Errorf("unknown pending count shown")
	}
	if slices.ContainsFunc(rows, func(r Row) bool { return strings.HasPrefix(r.Metric, "CPU") }) {
		t.Errorf("CPU row without CPU figures")
	}
	r.Punctuality.CPU = &LegCPU{WindowS: 10, Bridge: 0.2, Broker: 0.3, Bench: 0.1, Busy: 0.3, Steal: 0.15}
	if !slices.ContainsFunc(BuildRows(r), func(r Row) bool {
		return r.Step == StepPunctuality && r.Metric == "CPU, first due time to last delivery" &&
			r.Value == "bridge 0.20, broker 0.30, bench 0.10, other 0.00 cores; machine busy 30%, steal 15.0%"
	}) {
		t.Errorf("punctuality without its CPU row")
	}
	// Without /debug/vars the heap is n/a, not a miss.
	r.Scale.HeapAvailable = false
	if got := result(BuildRows(r), StepScale, "Go heap"); got != "" {
		t.Errorf("heap without /debug/vars: %q, want no verdict", got)
	}
}

func TestParseVars(t *testing.T) {
	v, err := parseVars(strings.NewReader(`{"cmdline":["x"],"memstats":{"HeapAlloc":123,"HeapInuse":456,"Sys":789,"NumGC":3},"delaybridge":{"pending":1000000,"leased":0}}`))
	if err != nil || v.HeapAlloc != 123 || v.HeapInuse != 456 || v.Sys != 789 || !v.HasPending || v.Pending != 1000000 {
		t.Errorf("parseVars = %+v, %v", v, err)
	}
	v, err = parseVars(strings.NewReader(`{"memstats":{"HeapAlloc":1}}`))
	if err != nil || v.HasPending {
		t.Errorf("without delaybridge: %+v, %v", v, err)
	}
	if _, err := parseVars(strings.NewReader(`{"cmdline":[]}`)); err != errNoVars {
		t.Errorf("without memstats: %v, want errNoVars", err)
	}
}

func TestBridgeEnv(t *testing.T) {
	env := bridgeEnv(
		[]string{"PATH=/bin", "DELAYBRIDGE_ENDPOINT=prod", "DELAYBRIDGE_TLS_CA_FILE=/ca.pem", "DELAYBRIDGE_MAX_DELAY=1h"},
		map[string]string{"DELAYBRIDGE_ENDPOINT": "bench-1"},
		[]string{"DELAYBRIDGE_BATCH_SIZE=2000"},
	)
	want := []string{"PATH=/bin", "DELAYBRIDGE_TLS_CA_FILE=/ca.pem", "DELAYBRIDGE_ENDPOINT=bench-1", "DELAYBRIDGE_BATCH_SIZE=2000"}
	if !slices.Equal(env, want) {
		t.Errorf("bridgeEnv = %q, want %q", env, want)
	}
}

// TestScaleTargetRows: the fill is judged against the empty store's ingest
// and the steady p99 with N pending against the steady step's bbolt p99 at
// the same rate; without those steps the ratios are left out.
func TestScaleTargetRows(t *testing.T) {
	s := &Scale{N: 1000, FillRate: 700, SteadyRate: 1000, Steady: &SteadyLeg{Lateness: Lateness{Percentiles: Percentiles{P50Ms: 2, P99Ms: 16, MaxMs: 30}}}}
	verdicts := func(r *Results) map[string]string {
		m := map[string]string{}
		for _, row := range scaleTargetRows(r, s) {
			m[row.Metric] = row.Result
		}
		return m
	}
	alone := verdicts(&Results{})
	if _, ok := alone["fill rate / empty-store ingest rate"]; ok {
		t.Error("fill ratio without an ingest step")
	}
	if _, ok := alone["steady p99 / empty-store p99 at the same rate"]; ok {
		t.Error("steady ratio without a steady step")
	}
	r := &Results{Ingest: &Ingest{Rate: 1000}, Steady: &Steady{Stores: []*SteadyStore{
		{Store: "postgres", Rates: []*SteadyRate{{Rate: 1000, Bridge: &SteadyLeg{Lateness: Lateness{Percentiles: Percentiles{P99Ms: 100}}}}}},
		{Store: "bbolt", Rates: []*SteadyRate{{Rate: 1000, Bridge: &SteadyLeg{Lateness: Lateness{Percentiles: Percentiles{P99Ms: 10}}}}}},
	}}}
	got := verdicts(r)
	if got["fill rate / empty-store ingest rate"] != Pass {
		t.Errorf("fill 0.70× of ingest: %q, want PASS", got["fill rate / empty-store ingest rate"])
	}
	if got["steady p99 / empty-store p99 at the same rate"] != Miss {
		t.Errorf("steady p99 1.6× the bbolt figure: %q, want MISS", got["steady p99 / empty-store p99 at the same rate"])
	}
}
