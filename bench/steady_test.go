package bench

import (
	"context"
	"errors"
	"math"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestOwed(t *testing.T) {
	for _, c := range []struct {
		elapsed time.Duration
		rate    float64
		n, want int
	}{
		{-time.Millisecond, 1000, 100, 0}, // before the start: nothing
		{0, 1000, 100, 1},                 // message 0 goes at once
		{999 * time.Microsecond, 1000, 100, 1},
		{time.Millisecond, 1000, 100, 2},
		{5 * time.Millisecond, 1000, 100, 6},
		{2500 * time.Microsecond, 2000, 100, 6}, // a late wake-up owes all slots passed
		{time.Second, 1000, 100, 100},           // never more than n
		{time.Hour, 3000, 60000, 60000},
	} {
		if got := owed(c.elapsed, c.rate, c.n); got != c.want {
			t.Errorf("owed(%v, %v/s, %d) = %d, want %d", c.elapsed, c.rate, c.n, got, c.want)
		}
	}
}

func TestSlotAt(t *testing.T) {
	start := time.Unix(1000, 0)
	if got := slotAt(start, 0, 2000); !got.Equal(start) {
		t.Errorf("slot 0 = %v, want the start", got)
	}
	if got := slotAt(start, 3000, 2000); !got.Equal(start.Add(1500 * time.Millisecond)) {
		t.Errorf("slot 3000 at 2000/s = %v after the start, want 1.5s", got.Sub(start))
	}
}

// The pacer hands out every index once, in order, none before its slot; a
// schedule that started in the past is caught up, not shifted.
func TestPaceInOrderNeverEarly(t *testing.T) {
	const n, rate = 300, 2000.0
	start := time.Now().Add(-50 * time.Millisecond) // 100 slots already owed
	got := 0
	for i := range pace(context.Background(), start, rate, n, time.Millisecond) {
		now := time.Now()
		if i != got {
			t.Fatalf("index %d handed out as number %d", i, got)
		}
		if now.Before(slotAt(start, i, rate)) {
			t.Errorf("index %d handed out %v before its slot", i, slotAt(start, i, rate).Sub(now))
		}
		got++
	}
	if got != n {
		t.Errorf("%d of %d handed out", got, n)
	}
}

func TestPaceEndsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	tokens := pace(ctx, time.Now(), 10, 1000, time.Millisecond) // would take 100 s
	<-tokens
	cancel()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case _, ok := <-tokens:
			if !ok {
				return
			}
		case <-deadline:
			t.Fatal("the pacer did not close its channel after the context ended")
		}
	}
}

func TestPaceStats(t *testing.T) {
	start := time.Unix(1000, 0)
	const target = 1000.0
	schedule := func(n int, every time.Duration, lag func(i int) time.Duration) []time.Time {
		sent := make([]time.Time, n)
		for i := range sent {
			sent[i] = start.Add(time.Duration(i)*every + lag(i))
		}
		return sent
	}
	none := func(int) time.Duration { return 0 }

	p := paceStats(start, target, schedule(1000, time.Millisecond, none))
	if math.Abs(p.Rate-target) > 0.01 || p.LagMaxMs != 0 || p.Behind || p.Published != 1000 {
		t.Errorf("on schedule: %+v, want rate %v, no lag, not behind", p, target)
	}

	// Every message 0.5 ms late: a constant lag keeps the rate, not behind.
	p = paceStats(start, target, schedule(1000, time.Millisecond, func(int) time.Duration { return 500 * time.Microsecond }))
	if p.LagP50Ms != 0.5 || p.LagP99Ms != 0.5 || p.Behind {
		t.Errorf("0.5 ms late: %+v, want lag 0.5 ms, not behind", p)
	}

	// Sending at half the rate: behind, the rate about half.
	p = paceStats(start, target, schedule(1000, 2*time.Millisecond, none))
	if !p.Behind || p.Rate > 0.55*target || p.Rate < 0.45*target {
		t.Errorf("half the rate: %+v, want behind at about %v/s", p, target/2)
	}

	// On rate overall but a stall of 200 ms for the last 2%: the lag shows it.
	p = paceStats(start, target, schedule(1000, time.Millisecond, func(i int) time.Duration {
		if i >= 980 {
			return 200 * time.Millisecond
		}
		return 0
	}))
	if !p.Behind || p.LagMaxMs != 200 || p.LagP99Ms != 200 {
		t.Errorf("stalled: %+v, want behind with lag p99 and max 200 ms", p)
	}

	// A message never sent (zero time): behind, not counted.
	sent := schedule(100, time.Millisecond, none)
	sent[50] = time.Time{}
	if p = paceStats(start, target, sent); !p.Behind || p.Published != 99 || p.N != 100 {
		t.Errorf("one unsent: %+v, want 99 of 100 published, behind", p)
	}
	if p = paceStats(start, target, make([]time.Time, 3)); !p.Behind || p.Published != 0 {
		t.Errorf("none sent: %+v, want behind", p)
	}
}

func TestSteadyVerdicts(t *testing.T) {
	if got := steadyRatio(30, 6); got != 5 {
		t.Errorf("steadyRatio(30, 6) = %v, want 5", got)
	}
	if got := steadyRatio(30, 0); got != 0 {
		t.Errorf("steadyRatio with no hop = %v, want 0", got)
	}
	leg := func(p99 float64, behind bool, missing int) *SteadyLeg {
		l := &SteadyLeg{Pace: Pace{Behind: behind}}
		l.P99Ms, l.Missing, l.Received = p99, missing, 100-missing
		return l
	}
	for _, c := range []struct {
		l    *SteadyLeg
		want bool
	}{
		{leg(10, false, 0), true},
		{leg(10.01, false, 0), false},
		{leg(2, true, 0), false}, // the publisher could not keep the rate
		{leg(2, false, 1), false},
		{nil, false},
	} {
		if got := searchPass(c.l); got != c.want {
			t.Errorf("searchPass(%+v) = %v, want %v", c.l, got, c.want)
		}
	}
	if p99, mx := steadyTarget("bbolt", 2000); p99 != 10 || mx != 50 {
		t.Errorf("bbolt 2000/s targets %v, %v; want 10, 50", p99, mx)
	}
	if p99, _ := steadyTarget("postgres", 2000); p99 != 25 {
		t.Errorf("postgres 2000/s p99 target %v; want 25", p99)
	}
	if p99, _ := steadyTarget("bbolt", 1000); p99 != 0 {
		t.Errorf("bbolt 1000/s p99 target %v; want none", p99)
	}
}

func TestSteadyRows(t *testing.T) {
	bridge := &SteadyLeg{Pace: Pace{Rate: 2000, TargetRate: 2000}}
	bridge.P50Ms, bridge.P99Ms, bridge.P999Ms, bridge.MaxMs, bridge.Expected, bridge.Received = 3, 12, 30, 60, 40000, 40000
	hop := &SteadyLeg{Pace: Pace{Rate: 4000, TargetRate: 4000}}
	hop.P99Ms = 2
	r := &Results{Steady: &Steady{DurationS: 20, Stores: []*SteadyStore{
		{Store: "bbolt", Rates: []*SteadyRate{{Rate: 2000, Bridge: bridge, Hop: hop, Hop2: hop, RatioP99: 6}},
			Search: &SteadySearch{Steps: []SteadyPoint{{Rate: 1000, P99Ms: 4, Pass: true}, {Rate: 1500, P99Ms: 11}}, Best: 1000, Ceiling: 8000, Ratio: 0.125}},
		{Store: "postgres", Skipped: "no PostgreSQL URL"},
	}}}
	rows := BuildRows(r)
	find := func(prefix string) Row {
		for _, row := range rows {
			if strings.Contains(row.Metric, prefix) {
				return row
			}
		}
		t.Fatalf("no row %q in %+v", prefix, rows)
		return Row{}
	}
	if row := find("bbolt 2,000 msg/s for 20 s: bridge lateness"); row.Result != Miss || row.Value != "3.00 ms / 12.0 ms / 30.0 ms / 60.0 ms" {
		t.Errorf("bridge row %+v: want the four figures and a MISS of p99 ≤ 10 ms", row)
	}
	if row := find("early / duplicates / missing"); row.Result != Pass {
		t.Errorf("counts row %+v: want PASS", row)
	}
	if row := find("bridge p99 / hop p99 at 2R"); row.Result != Miss || row.Value != "6.00×" {
		t.Errorf("ratio row %+v: want 6.00× MISS", row)
	}
	if row := find("highest rate"); row.Value != "1,000 msg/s = 0.12× of the ceiling (8,000 msg/s)" {
		t.Errorf("search row %+v", row)
	}
	if row := find("postgres"); row.Value != "skipped: no PostgreSQL URL" {
		t.Errorf("skipped row %+v", row)
	}
	table := FormatSteady(r)
	if !strings.Contains(table, "bbolt") || !strings.Contains(table, "6.00×") || strings.Contains(table, "postgres") {
		t.Errorf("FormatSteady:\n%s", table)
	}
	for _, row := range rows {
		if strings.Contains(row.Metric, "CPU") {
			t.Errorf("a leg without CPU figures has a CPU row: %+v", row)
		}
	}

	bridge.CPU = &LegCPU{WindowS: 15, Bridge: 0.5, Broker: 0.9, Bench: 0.3, Other: 0.05, Busy: 0.875, Steal: 0.031}
	hop.CPU = &LegCPU{WindowS: 20, Bridge: -1, Broker: 0.8, Postgres: 0.1, Bench: 0.25, Busy: 0.6, Steal: 0.002}
	rows = BuildRows(r)
	if row := find("CPU, intake and delivery"); row.Value != "bridge 0.50, broker 0.90, bench 0.30, other 0.05 cores; machine busy 88%, steal 3.1%" {
		t.Errorf("bridge CPU row %+v", row)
	}
	if row := find("CPU, hop at 2R"); row.Value != "bridge ?, broker 0.80, postgres 0.10, bench 0.25, other 0.00 cores; machine busy 60%, steal 0.2%" {
		t.Errorf("hop CPU row %+v", row)
	}
	if table := FormatSteady(r); !strings.Contains(table, "88% / 3.1%") {
		t.Errorf("FormatSteady without the machine's busy and steal shares:\n%s", table)
	}
}

// legCPU turns two samples into cores over the window, from the machine's
// own clock (all CPUs' ticks), so a late sample does not inflate it.
func TestLegCPU(t *testing.T) {
	ncpu := int64(max(runtime.NumCPU(), 1))
	// 10 s on every CPU: the bridge took 5 CPU s, the broker 9, the bench
	// 3, PostgreSQL 1; the machine was busy 20 CPU s and had 1 stolen.
	total := 10 * clockTicks * ncpu
	a := cpuSample{procs: []int64{1000}, postgres: map[int]int64{7: 0}, pgExited: -1, broker: 500, bench: 40,
		machine: machineCPU{busy: 100, steal: 10, total: 5000}}
	b := cpuSample{procs: []int64{1500}, postgres: map[int]int64{7: 100}, pgExited: -1, broker: 1400, bench: 340,
		machine: machineCPU{busy: 2100, steal: 110, total: 5000 + total}}
	c := legCPU(a, b)
	near := func(got, want float64) bool { return math.Abs(got-want) < 1e-9 }
	if c == nil || !near(c.WindowS, 10) || !near(c.Bridge, 0.5) || !near(c.Broker, 0.9) || !near(c.Bench, 0.3) ||
		!near(c.Postgres, 0.1) || !near(c.Other, 0.2) ||
		!near(c.Busy, 2000/float64(total)) || !near(c.Steal, 100/float64(total)) {
		t.Errorf("legCPU = %+v", c)
	}
	b.procs[0] = -1 // the bridge's /proc/PID/stat unreadable
	if c := legCPU(a, b); c == nil || c.Bridge != -1 {
		t.Errorf("bridge unknown: legCPU = %+v, want Bridge -1", c)
	}
	if c := legCPU(a, a); c != nil {
		t.Errorf("no time between the samples: legCPU = %+v, want nil", c)
	}
}

// A run cut short expects only what it published: wait ends when those
// arrived, and the unsent do not count as missing.
func TestSteadyExpectsOnlyPublished(t *testing.T) {
	c := &collector{n: 10, want: 10, done: make(chan struct{})}
	c.distinct = 6
	c.expect(7)
	select {
	case <-c.done:
		t.Fatal("done with 6 of 7")
	default:
	}
	c.expect(6)
	select {
	case <-c.done:
	default:
		t.Fatal("not done with 6 of 6")
	}
	c.expect(5) // closing twice must not panic
	leg := &SteadyLeg{Pace: Pace{N: 10, Published: 7}}
	leg.counted(Lateness{Expected: 10, Received: 6, Missing: 4})
	if leg.Expected != 7 || leg.Missing != 1 {
		t.Errorf("counted: expected %d, missing %d; want 7, 1", leg.Expected, leg.Missing)
	}
}

// TestSearchRates: the search climbs while rates pass, and halves down from
// the start when even the start misses.
func TestSearchRates(t *testing.T) {
	for _, tc := range []struct {
		name  string
		p99   map[int]float64 // rate → p99 ms; absent: fails the test
		limit int
		steps []int
		best  int
	}{
		{"climbs to the last pass", map[int]float64{1000: 4, 1500: 8, 2000: 12}, 50000, []int{1000, 1500, 2000}, 1500},
		{"stops at the limit", map[int]float64{1000: 4, 1500: 8}, 1500, []int{1000, 1500}, 1500},
		{"halves down when the start misses", map[int]float64{1000: 10.1, 500: 9}, 50000, []int{1000, 500}, 500},
		{"down to the floor", map[int]float64{1000: 30, 500: 20, 250: 11}, 50000, []int{1000, 500, 250}, 0},
		{"a limit under the start", map[int]float64{250: 3}, 400, []int{250}, 250},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var s SteadySearch
			var reported []int
			err := searchRates(&s, tc.limit, func(r int) (*SteadyLeg, error) {
				p99, ok := tc.p99[r]
				if !ok {
					t.Fatalf("rate %d measured", r)
				}
				return &SteadyLeg{Lateness: Lateness{Received: 1, Percentiles: Percentiles{P99Ms: p99}}}, nil
			}, func(pt SteadyPoint) { reported = append(reported, pt.Rate) })
			if err != nil {
				t.Fatal(err)
			}
			var steps []int
			for _, pt := range s.Steps {
				steps = append(steps, pt.Rate)
			}
			if !slices.Equal(steps, tc.steps) || !slices.Equal(reported, tc.steps) || s.Best != tc.best {
				t.Errorf("steps %v, reported %v, best %d; want steps %v, best %d", steps, reported, s.Best, tc.steps, tc.best)
			}
		})
	}
	t.Run("a failed measurement ends the search", func(t *testing.T) {
		var s SteadySearch
		boom := errors.New("broker gone")
		err := searchRates(&s, 50000, func(r int) (*SteadyLeg, error) {
			if r == 1000 {
				return &SteadyLeg{Lateness: Lateness{Received: 1, Percentiles: Percentiles{P99Ms: 20}}}, nil
			}
			return nil, boom
		}, func(SteadyPoint) {})
		if !errors.Is(err, boom) || len(s.Steps) != 1 || s.Best != 0 {
			t.Errorf("err %v, steps %v, best %d", err, s.Steps, s.Best)
		}
	})
}
