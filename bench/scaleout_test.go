package bench

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func scaleOutFixture() *ScaleOut {
	s := &ScaleOut{N: 20000, WindowMs: 10000, Runs: []*ScaleOutRun{
		{Instances: 1, RowsLeft: 0,
			Ingest: &ScaleOutPhase{N: 20000, Rate: 4000, PerInstance: []int64{20000}, MachineBusy: 0.95,
				BridgeCPUSeconds: []float64{2.5}, MachineCPUSeconds: 9.5, PostgresCPUSeconds: 3, BrokerCPUSeconds: 2.25, BenchCPUSeconds: 1},
			Burst: &ScaleOutPhase{N: 20000, Seconds: 2, Rate: 10000, PerInstance: []int64{20000}, MachineBusy: 0.9,
				BridgeCPUSeconds: []float64{1.2},
				Lateness:         &Lateness{Expected: 20000, Received: 20000, Percentiles: Percentiles{P50Ms: 900, P99Ms: 1950, MaxMs: 2000}}},
			Punctual: &ScaleOutPhase{N: 20000, Seconds: 10, PerInstance: []int64{20000}, MachineBusy: 0.3,
				Lateness: &Lateness{Expected: 20000, Received: 20000, Percentiles: Percentiles{P50Ms: 0.8, P99Ms: 5.25, MaxMs: 12}}}},
		{Instances: 2, RowsLeft: 3,
			Ingest: &ScaleOutPhase{N: 20000, Rate: 3000, PerInstance: []int64{10200, 9800}, MachineBusy: 1,
				BridgeCPUSeconds: []float64{2, -1}},
			Burst: &ScaleOutPhase{N: 20000, Seconds: -1, PerInstance: []int64{-1, 9000}, MachineBusy: 0.99,
				Lateness: &Lateness{Expected: 20000, Received: 19999, Missing: 1, Percentiles: Percentiles{P50Ms: 1000, P99Ms: 2500, MaxMs: 2600}}},
			Punctual: &ScaleOutPhase{N: 20000, Seconds: 10, PerInstance: []int64{15000, 5000}, MachineBusy: 0.4,
				Lateness: &Lateness{Expected: 20000, Received: 20000, Duplicates: 2, Percentiles: Percentiles{P50Ms: 1.5, P99Ms: 9, MaxMs: 30}}}},
	}}
	s.IngestRatio, s.BurstRatio = s.ratios()
	return s
}

func TestScaleOutRatios(t *testing.T) {
	s := scaleOutFixture()
	if s.IngestRatio != 0.75 {
		t.Errorf("ingest ratio %v, want 0.75", s.IngestRatio)
	}
	if s.BurstRatio != 0 { // two instances missed one: no rate
		t.Errorf("burst ratio %v, want 0", s.BurstRatio)
	}
	s.Runs[1].Burst.Rate = 12000
	if _, b := s.ratios(); b != 1.2 {
		t.Errorf("burst ratio %v, want 1.2", b)
	}
	if i, b := (&ScaleOut{Runs: s.Runs[:1]}).ratios(); i != 0 || b != 0 {
		t.Errorf("one run only: %v %v, want 0 0", i, b)
	}
}

func TestScaleOutRows(t *testing.T) {
	checkRows(t, BuildRows(&Results{ScaleOut: scaleOutFixture()}), StepScaleOut, [][2]string{
		{"1 instance: ingest: 20,000 due in 1 h, stored/s", "4,000 msg/s|"},
		{"2 instances: ingest: ingested by instance", "10,200 (51%) / 9,800 (49%)|"},
		{"1 instance: ingest: PostgreSQL CPU us per stored message", "150|"},
		{"2 instances: ingest: PostgreSQL CPU us per stored message", "-|"},
		{"1 instance: burst: 20,000 due at once, due instant to last delivered", "2.00 s|"},
		{"2 instances: burst: 20,000 due at once, due instant to last delivered", "never|"},
		{"2 instances: burst: delivered/s from the due instant", "-|"},
		{"2 instances: burst: dispatched by instance", "? / 9,000|"},
		{"1 instance: punctuality: 20,000 over 10.00 s, lateness p50 / p99 / max", "0.80 ms / 5.25 ms / 12.0 ms|"},
		{"1 instance: CPU busy, share of all cores: ingest / burst / punctuality", "95% / 90% / 30%|"},
		{"1 instance: ingest CPU s: bridges / PostgreSQL / RabbitMQ / bench / rest", "2.50 / 3.00 / 2.25 / 1.00 / 0.75|"},
		{"1 instance: burst CPU s: bridges / PostgreSQL / RabbitMQ / bench / rest", "1.20 / 0.00 / 0.00 / 0.00 / 0.00|"},
		{"2 instances: ingest CPU s: bridges / PostgreSQL / RabbitMQ / bench / rest", "2.00 (2.00 + ?) / 0.00 / 0.00 / 0.00 / 0.00|"},
		{"1 instance: early / duplicates / missing (burst + punctuality)", "0 / 0 / 0 of 40000|" + Pass},
		{"2 instances: early / duplicates / missing (burst + punctuality)", "0 / 2 / 1 of 40000|" + Miss},
		{"1 instance: rows left in the store after the run", "0|" + Pass},
		{"2 instances: rows left in the store after the run", "3|" + Miss},
		{"2 vs 1: ingest, stored/s", "0.75×|"},
		{"2 vs 1: burst, delivered/s from the due instant", "(no row)"},
	})

	skipped := BuildRows(&Results{ScaleOut: &ScaleOut{Skipped: "no PostgreSQL URL"}})
	if len(skipped) != 1 || !strings.Contains(skipped[0].Value, "skipped: no PostgreSQL URL") || skipped[0].Result != "" {
		t.Errorf("skipped step rows: %+v", skipped)
	}
}

func TestFormatScaleOut(t *testing.T) {
	s := scaleOutFixture()
	s.Runs[1].Burst = nil
	s.Runs[1].Punctual.Lateness.Duplicates = 0
	s.Runs[1].Ingest.BridgeCPUSeconds = []float64{2, 1.75}
	got := FormatScaleOut(&Results{ScaleOut: s})
	checkLines(t, "FormatScaleOut", got,
		"scale-out, one PostgreSQL store                                    1 instance                        2 instances                                     2 vs 1",
		"-----------------------------------------------------------------  --------------------------------  ----------------------------------------------  ------",
		"ingest: 20,000 due in 1 h, stored/s                                4,000 msg/s                       3,000 msg/s                                     0.75×",
		"ingest: ingested by instance                                       20,000                            10,200 (51%) / 9,800 (49%)",
		"ingest: PostgreSQL CPU us per stored message                       150                               -",
		"burst: 20,000 due at once, due instant to last delivered           2.00 s                            -",
		"burst: delivered/s from the due instant                            10,000 msg/s                      -",
		"burst: lateness p50 / p99 / max                                    900.0 ms / 1.95 s / 2.00 s        -",
		"burst: dispatched by instance                                      20,000                            -",
		"punctuality: 20,000 over 10.00 s, lateness p50 / p99 / max         0.80 ms / 5.25 ms / 12.0 ms       1.50 ms / 9.00 ms / 30.0 ms",
		"punctuality: dispatched by instance                                20,000                            15,000 (75%) / 5,000 (25%)",
		"CPU busy, share of all cores: ingest / burst / punctuality         95% / 90% / 30%                   100% / - / 40%",
		"ingest CPU s: bridges / PostgreSQL / RabbitMQ / bench / rest       2.50 / 3.00 / 2.25 / 1.00 / 0.75  3.75 (2.00 + 1.75) / 0.00 / 0.00 / 0.00 / 0.00",
		"burst CPU s: bridges / PostgreSQL / RabbitMQ / bench / rest        1.20 / 0.00 / 0.00 / 0.00 / 0.00  -",
		"punctuality CPU s: bridges / PostgreSQL / RabbitMQ / bench / rest  0.00 / 0.00 / 0.00 / 0.00 / 0.00  0.00 / 0.00 / 0.00 / 0.00 / 0.00",
		"early / duplicates / missing                                       0 / 0 / 0                         0 / 0 / 0",
		"",
	)
	if FormatScaleOut(&Results{}) != "" || FormatScaleOut(&Results{ScaleOut: &ScaleOut{Skipped: "x"}}) != "" {
		t.Errorf("FormatScaleOut without a run is not empty")
	}
}

func TestFmtSplit(t *testing.T) {
	for _, c := range []struct {
		in   []int64
		want string
	}{
		{nil, "-"},
		{[]int64{20000}, "20,000"},
		{[]int64{1, 3}, "1 (25%) / 3 (75%)"},
		{[]int64{0, 0}, "0 / 0"},
		{[]int64{-1, 5}, "? / 5"},
	} {
		if got := fmtSplit(c.in); got != c.want {
			t.Errorf("fmtSplit(%v) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestParseCounter(t *testing.T) {
	text := `# HELP delaybridge_messages_dispatched_total Messages forwarded.
# TYPE delaybridge_messages_dispatched_total counter
delaybridge_messages_dispatched_total 12345
delaybridge_messages_dispatched_total_extra 7
delaybridge_messages_ingested_total 2.0001e+06
delaybridge_error_queue_messages_total{stage="ingest"} 3
`
	for _, c := range []struct {
		name string
		want int64
	}{{metricDispatched, 12345}, {metricIngested, 2000100}} {
		if got, err := parseCounter(strings.NewReader(text), c.name); err != nil || got != c.want {
			t.Errorf("parseCounter(%s) = %d, %v; want %d", c.name, got, err, c.want)
		}
	}
	if _, err := parseCounter(strings.NewReader(text), "delaybridge_error_queue_messages_total"); err == nil {
		t.Errorf("labelled counter: want an error")
	}
}

func TestCounterDeltas(t *testing.T) {
	d, sum := counterDeltas([]int64{10, -1, 5}, []int64{30, 7, -1})
	if !slices.Equal(d, []int64{20, -1, -1}) || sum != 20 {
		t.Errorf("counterDeltas = %v, %d", d, sum)
	}
	d, sum = counterDeltas([]int64{1}, []int64{4, 9}) // an instance the base lacks
	if !slices.Equal(d, []int64{3, -1}) || sum != 3 {
		t.Errorf("counterDeltas = %v, %d", d, sum)
	}
}

func TestParseCPU(t *testing.T) {
	st, err := parseProcStat("4242 (delay (bridge)) S 17 4242 4242 0 -1 4194560 1000 0 0 0 250 75 30 12 20 0 12 0 100 0 0")
	if err != nil || st != (procStat{comm: "delay (bridge)", ppid: 17, ticks: 325, childTicks: 42}) {
		t.Errorf("parseProcStat = %+v, %v", st, err)
	}
	if _, err := parseProcStat("4242 (x) S 1"); err == nil {
		t.Errorf("short stat: want an error")
	}
	m, err := parseMachineCPU("cpu  100 5 50 800 10 3 2 30 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n")
	if err != nil || m != (machineCPU{busy: 160, steal: 30, total: 1000}) {
		t.Errorf("parseMachineCPU = %+v, %v", m, err)
	}
	var ph ScaleOutPhase
	ph.cpu(cpuSample{procs: []int64{100, -1}, postgres: map[int]int64{7: 10, 8: 20}, pgExited: 100, broker: 5, bench: 1,
		machine: machineCPU{busy: 100, steal: 10, total: 1000}},
		cpuSample{procs: []int64{350, 50}, postgres: map[int]int64{7: 15, 9: 30}, pgExited: 125, broker: 20, bench: 6,
			machine: machineCPU{busy: 250, steal: 30, total: 1200}})
	// Postgres: pid 7 used 5 ticks, pid 9 (new) 30, pid 8 ended (and its
	// time is among the 25 of the ended children).
	if !slices.Equal(ph.BridgeCPUSeconds, []float64{2.5, -1}) || ph.MachineBusy != 0.75 || ph.MachineSteal != 0.1 ||
		ph.MachineCPUSeconds != 1.5 || ph.PostgresCPUSeconds != 0.6 || ph.PostgresExitedCPUSeconds != 0.25 ||
		ph.BrokerCPUSeconds != 0.15 || ph.BenchCPUSeconds != 0.05 {
		t.Errorf("cpu: %+v", ph)
	}
	if o := ph.otherCPUSeconds(); o != 0 { // more measured than the machine's busy time: clamped
		t.Errorf("other = %v, want 0", o)
	}
	ph.MachineCPUSeconds = 4.3
	if o := ph.otherCPUSeconds(); o < 0.999 || o > 1.001 {
		t.Errorf("other = %v, want 1", o)
	}
}

func TestWithAppName(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"postgres://u@h:5432/db?sslmode=disable", "postgres://u@h:5432/db?application_name=x&sslmode=disable"},
		{"postgres://u:p%40ss@h/db", "postgres://u:p%40ss@h/db?application_name=x"},
		{"host=h user=u", "host=h user=u application_name=x"},
	} {
		if got := withAppName(c.in, "x"); got != c.want {
			t.Errorf("withAppName(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestLeadFor(t *testing.T) {
	if got := leadFor(20000, 10000); got != 4*time.Second {
		t.Errorf("leadFor(20000, 10000) = %v, want 4s", got)
	}
	if got := leadFor(100, 10000); got != defaultLeadMin {
		t.Errorf("leadFor small = %v, want %v", got, defaultLeadMin)
	}
	if got := leadFor(20000, 0); got != 16*time.Second {
		t.Errorf("leadFor unknown rate = %v, want 16s", got)
	}
}

func TestFailoverRows(t *testing.T) {
	f := &Failover{Rate: 1000, Runs: []*FailoverRun{
		{Event: "kill", Repeat: 1, AtSeconds: 8, After: 10000, AfterP99Ms: 900, AfterMaxMs: 1500},
		{Event: "kill", Repeat: 2, AtSeconds: 8, After: 10000, AfterP99Ms: 900, AfterMaxMs: 60000},
		{Event: "term", Repeat: 1, AtSeconds: 8, After: 10000, AfterP99Ms: 5, AfterMaxMs: 1200},
		{Event: "stop", Repeat: 1, AtSeconds: 8, After: 10000, AfterP99Ms: 40000, AfterMaxMs: 40100, Duplicates: 3},
		{Event: "stop", Repeat: 2, AtSeconds: 8, Lost: 1},
	}}
	var got []string
	for _, r := range failoverRows(f) {
		got = append(got, r.Value+"|"+r.Result)
	}
	want := []string{
		"0 / 0 / 0; 10000: 900.0 ms / 1.50 s|" + Pass,
		"0 / 0 / 0; 10000: 900.0 ms / 60.00 s|" + Miss,
		"0 / 0 / 0; 10000: 5.00 ms / 1.20 s|" + Miss,
		"0 / 0 / 3; 10000: 40.00 s / 40.10 s|" + Pass,
		"1 / 0 / 0; 0: 0.00 ms / 0.00 ms|" + Miss,
	}
	if !slices.Equal(got, want) {
		t.Errorf("failover rows:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if rows := failoverRows(&Failover{Skipped: "no PostgreSQL URL"}); len(rows) != 1 || rows[0].Result != "" {
		t.Errorf("skipped: %+v", rows)
	}
}
