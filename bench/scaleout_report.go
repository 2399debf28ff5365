package bench

import (
	"fmt"
	"strings"
)

// scaleOutLine is one figure of the scaleout step: its value for each run
// (1 instance, 2 instances) and, where it makes sense, 2 vs 1.
type scaleOutLine struct {
	metric string
	values []string // by run, in the order of ScaleOut.Runs
	ratio  string
}

// scaleOutLines are the figures shown for the scaleout step, both in the
// table (one row per run) and side by side (FormatScaleOut).
func scaleOutLines(s *ScaleOut) []scaleOutLine {
	var lines []scaleOutLine
	add := func(metric, ratio string, f func(r *ScaleOutRun) string) {
		l := scaleOutLine{metric: metric, ratio: ratio}
		for _, r := range s.Runs {
			l.values = append(l.values, f(r))
		}
		lines = append(lines, l)
	}
	ratio := func(v float64) string {
		if v <= 0 {
			return ""
		}
		return FmtRatio(v)
	}
	phase := func(get func(*ScaleOutRun) *ScaleOutPhase, f func(*ScaleOutPhase) string) func(*ScaleOutRun) string {
		return func(r *ScaleOutRun) string {
			if ph := get(r); ph != nil {
				return f(ph)
			}
			return "-"
		}
	}
	ingest := func(r *ScaleOutRun) *ScaleOutPhase { return r.Ingest }
	burst := func(r *ScaleOutRun) *ScaleOutPhase { return r.Burst }
	punct := func(r *ScaleOutRun) *ScaleOutPhase { return r.Punctual }
	lateness := func(ph *ScaleOutPhase) string {
		if ph.Lateness == nil || ph.Lateness.Received == 0 {
			return "-"
		}
		l := ph.Lateness
		return FmtMs(l.P50Ms) + " / " + FmtMs(l.P99Ms) + " / " + FmtMs(l.MaxMs)
	}
	split := func(ph *ScaleOutPhase) string { return fmtSplit(ph.PerInstance) }

	add(fmt.Sprintf("ingest: %s due in 1 h, stored/s", groupThousands(int64(s.N))), ratio(s.IngestRatio),
		phase(ingest, func(ph *ScaleOutPhase) string { return FmtRate(ph.Rate) }))
	add("ingest: ingested by instance", "", phase(ingest, split))
	add("ingest: PostgreSQL CPU us per stored message", "", phase(ingest, func(ph *ScaleOutPhase) string {
		if ph.N <= 0 || ph.PostgresCPUSeconds <= 0 {
			return "-"
		}
		return fmt.Sprintf("%.0f", ph.PostgresCPUSeconds/float64(ph.N)*1e6)
	}))
	add(fmt.Sprintf("burst: %s due at once, due instant to last delivered", groupThousands(int64(s.N))), "",
		phase(burst, func(ph *ScaleOutPhase) string {
			if ph.Seconds < 0 {
				return "never"
			}
			return FmtMs(1000 * ph.Seconds)
		}))
	add("burst: delivered/s from the due instant", ratio(s.BurstRatio),
		phase(burst, func(ph *ScaleOutPhase) string {
			if ph.Seconds < 0 {
				return "-"
			}
			return FmtRate(ph.Rate)
		}))
	add("burst: lateness p50 / p99 / max", "", phase(burst, lateness))
	add("burst: dispatched by instance", "", phase(burst, split))
	add(fmt.Sprintf("punctuality: %s over %s, lateness p50 / p99 / max", groupThousands(int64(s.N)), FmtMs(s.WindowMs)), "",
		phase(punct, lateness))
	add("punctuality: dispatched by instance", "", phase(punct, split))
	add("CPU busy, share of all cores: ingest / burst / punctuality", "", func(r *ScaleOutRun) string {
		var parts []string
		for _, ph := range []*ScaleOutPhase{r.Ingest, r.Burst, r.Punctual} {
			if ph == nil {
				parts = append(parts, "-")
				continue
			}
			parts = append(parts, fmt.Sprintf("%.0f%%", 100*ph.MachineBusy))
		}
		return strings.Join(parts, " / ")
	})
	cpuLine := func(ph *ScaleOutPhase) string { return fmtCPU(ph) }
	add("ingest CPU s: bridges / PostgreSQL / RabbitMQ / bench / rest", "", phase(ingest, cpuLine))
	add("burst CPU s: bridges / PostgreSQL / RabbitMQ / bench / rest", "", phase(burst, cpuLine))
	add("punctuality CPU s: bridges / PostgreSQL / RabbitMQ / bench / rest", "", phase(punct, cpuLine))
	return lines
}

// scaleOutCounts are the early, duplicate and missing deliveries of a run's
// burst and punctuality workloads together; ok is false when the run has
// neither.
func scaleOutCounts(r *ScaleOutRun) (early, dups, missing, expected int, ok bool) {
	for _, ph := range []*ScaleOutPhase{r.Burst, r.Punctual} {
		if ph == nil || ph.Lateness == nil {
			continue
		}
		ok = true
		early += ph.Lateness.Early
		dups += ph.Lateness.Duplicates
		missing += ph.Lateness.Missing
		expected += ph.Lateness.Expected
	}
	return early, dups, missing, expected, ok
}

// scaleOutRows are the table rows of the scaleout step: every figure for
// each run, then the checks that hold whatever the machine (none early,
// duplicated or missing; no row left behind).
func scaleOutRows(s *ScaleOut) []Row {
	if s.Skipped != "" {
		return []Row{{Step: StepScaleOut, Metric: "one vs two instances on PostgreSQL", Value: "skipped: " + s.Skipped}}
	}
	var rows []Row
	lines := scaleOutLines(s)
	for i, r := range s.Runs {
		prefix := instances(r.Instances) + ": "
		for _, l := range lines {
			rows = append(rows, Row{Step: StepScaleOut, Metric: prefix + l.metric, Value: l.values[i]})
		}
		if early, dups, missing, expected, ok := scaleOutCounts(r); ok {
			rows = append(rows, Row{Step: StepScaleOut, Metric: prefix + "early / duplicates / missing (burst + punctuality)",
				Value:  fmt.Sprintf("%d / %d / %d of %d", early, dups, missing, expected),
				Target: "0 / 0 / 0", Result: verdict(early == 0 && dups == 0 && missing == 0)})
		}
		if r.RowsLeft >= 0 {
			rows = append(rows, Row{Step: StepScaleOut, Metric: prefix + "rows left in the store after the run",
				Value: groupThousands(r.RowsLeft), Target: "0", Result: verdict(r.RowsLeft == 0)})
		}
	}
	for _, c := range []struct {
		metric string
		v      float64
	}{{"2 vs 1: ingest, stored/s", s.IngestRatio}, {"2 vs 1: burst, delivered/s from the due instant", s.BurstRatio}} {
		if c.v > 0 {
			rows = append(rows, Row{Step: StepScaleOut, Metric: c.metric, Value: FmtRatio(c.v)})
		}
	}
	return rows
}

// FormatScaleOut renders the scaleout step's figures with one column per
// number of instances and the 2-vs-1 ratio, or "" when it did not run.
func FormatScaleOut(r *Results) string {
	s := r.ScaleOut
	if s == nil || s.Skipped != "" || len(s.Runs) == 0 {
		return ""
	}
	header := []string{"scale-out, one PostgreSQL store"}
	for _, run := range s.Runs {
		header = append(header, instances(run.Instances))
	}
	header = append(header, "2 vs 1")
	cells := [][]string{header}
	for _, l := range scaleOutLines(s) {
		cells = append(cells, append(append([]string{l.metric}, l.values...), l.ratio))
	}
	counts := []string{"early / duplicates / missing"}
	for _, run := range s.Runs {
		if early, dups, missing, _, ok := scaleOutCounts(run); ok {
			counts = append(counts, fmt.Sprintf("%d / %d / %d", early, dups, missing))
		} else {
			counts = append(counts, "-")
		}
	}
	cells = append(cells, append(counts, ""))
	return formatGrid(cells)
}

// fmtSplit formats per-instance counts: "20,000", or "10,240 (51%) /
// 9,760 (49%)"; "?" for an unknown count (and then no shares).
func fmtSplit(v []int64) string {
	if len(v) == 0 {
		return "-"
	}
	var total int64
	known := true
	for _, n := range v {
		total += max(n, 0)
		known = known && n >= 0
	}
	parts := make([]string, len(v))
	for i, n := range v {
		switch {
		case n < 0:
			parts[i] = "?"
		case len(v) == 1 || total == 0 || !known:
			parts[i] = groupThousands(n)
		default:
			parts[i] = fmt.Sprintf("%s (%.0f%%)", groupThousands(n), 100*float64(n)/float64(total))
		}
	}
	return strings.Join(parts, " / ")
}

// fmtCPU breaks a phase's busy CPU seconds down: the bridges (with each
// instance's share when there are several), PostgreSQL, the broker, the
// bench, and the rest (interrupts and whatever else ran on the machine).
func fmtCPU(ph *ScaleOutPhase) string {
	var bridges float64
	var each []string
	for _, s := range ph.BridgeCPUSeconds {
		if s < 0 {
			each = append(each, "?")
			continue
		}
		bridges += s
		each = append(each, fmt.Sprintf("%.2f", s))
	}
	b := fmt.Sprintf("%.2f", bridges)
	if len(each) > 1 {
		b += " (" + strings.Join(each, " + ") + ")"
	}
	return fmt.Sprintf("%s / %.2f / %.2f / %.2f / %.2f", b, ph.PostgresCPUSeconds, ph.BrokerCPUSeconds, ph.BenchCPUSeconds, ph.otherCPUSeconds())
}
