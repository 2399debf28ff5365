package bench

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"strings"
	"unicode/utf8"
)

// Row is one line of the results table.
type Row struct {
	Step   string `json:"step"`
	Metric string `json:"metric"`
	Value  string `json:"value"`
	Target string `json:"target,omitempty"`
	Result string `json:"result,omitempty"` // PASS, MISS, or empty for information
}

// Results of a check against a target.
const (
	Pass = "PASS"
	Miss = "MISS"
)

func verdict(ok bool) string {
	if ok {
		return Pass
	}
	return Miss
}

// BuildRows turns the results into table rows, with targets where the issue
// sets them.
func BuildRows(r *Results) []Row {
	var rows []Row
	rows = append(rows, ceilingRows(r.Ceiling)...)
	rows = append(rows, ingestRows(r.Ingest)...)
	if p := r.Punctuality; p != nil {
		rows = append(rows, punctualityRows(StepPunctuality, fmt.Sprintf("%d over %s", p.N, FmtMs(p.WindowMs)), p)...)
	}
	rows = append(rows, burstRows(r.Burst)...)
	if t := r.TTL; t != nil {
		label := fmt.Sprintf("%d over %s, %d levels, %s queues", t.N, FmtMs(t.WindowMs), t.Levels, t.QueueType)
		rows = append(rows, latenessRows(StepTTL, label, t.Lateness, false)...)
	}
	if p := r.Rebus; p != nil {
		rows = append(rows, punctualityRows(StepRebus, fmt.Sprintf("%d Rebus deferrals over %s", p.N, FmtMs(p.WindowMs)), p)...)
	}
	if x := r.NSB; x != nil {
		label := fmt.Sprintf("%d over %s, from time sent + delay", x.N, FmtMs(x.WindowMs))
		rows = append(rows, latenessRows(StepNSB, "NServiceBus v2 chain alone, "+label, x.Chain.Lateness, false)...)
		rows = append(rows, latenessRows(StepNSB, "bridge consuming the chain, "+label, x.Bridge.Lateness, false)...)
	}
	rows = append(rows, protocolRows(StepMassTransit, "MassTransit ScheduleMessages", "MassTransit's scheduler (Quartz, Hangfire)", r.MassTransit)...)
	rows = append(rows, protocolRows(StepNSBTimeouts, "NServiceBus timeouts", "NServiceBus's timeout manager", r.NSBTimeouts)...)
	rows = append(rows, resendRows(r.Resend)...)
	rows = append(rows, crashRows(r.Crash)...)
	rows = append(rows, failoverRows(r.Failover)...)
	rows = append(rows, recurringRows(r.Recurring)...)
	if x := r.Exchange; x != nil {
		rows = append(rows, exchangeRows(x)...)
	}
	if s := r.Scale; s != nil {
		rows = append(rows, scaleRows(r, s)...)
	}
	if s := r.ScaleOut; s != nil {
		rows = append(rows, scaleOutRows(s)...)
	}
	if s := r.Steady; s != nil {
		rows = append(rows, steadyRows(s)...)
	}
	rows = append(rows, bigMsgRows(r.BigMsg)...)
	for _, e := range r.Errors {
		rows = append(rows, Row{Step: e.Step, Metric: "step failed (error below)", Value: "error", Result: Miss})
	}
	return rows
}

// stepRows collects the rows of one step.
type stepRows struct {
	step string
	rows []Row
}

func (s *stepRows) add(metric, value, target, result string) {
	s.rows = append(s.rows, Row{Step: s.step, Metric: metric, Value: value, Target: target, Result: result})
}

// ceilingRows are the broker's own rate, the ceiling.
func ceilingRows(c *Ceiling) []Row {
	if c == nil {
		return nil
	}
	return []Row{{Step: StepCeiling, Metric: fmt.Sprintf("broker single hop, %d msgs (persistent, confirms, acks), best of %d", c.N, max(len(c.Rounds), 1)), Value: FmtRate(c.Rate)}}
}

// ingestRows are the stored rate and its ratio to the ceiling.
func ingestRows(in *Ingest) []Row {
	if in == nil {
		return nil
	}
	rs := stepRows{step: StepIngest}
	rs.add(fmt.Sprintf("stored/s, %d msgs due in 1 h, best of %d", in.N, max(len(in.Rounds), 1)), FmtRate(in.Rate), "", "")
	if in.Ratio > 0 {
		rs.add("ingest / ceiling", FmtRatio(in.Ratio), "≥ "+FmtRatio(TargetIngestRatio), verdict(in.Ratio >= TargetIngestRatio))
	} else {
		rs.add("ingest / ceiling", "n/a (ceiling not run)", "≥ "+FmtRatio(TargetIngestRatio), "")
	}
	rs.add("publish rate while ingesting", FmtRate(in.PublishRate), "", "")
	if in.DrainRate > 0 {
		rs.add(fmt.Sprintf("drain: %d queued before the bridge started, stored/s", in.N), FmtRate(in.DrainRate), "", "")
	}
	rs.add("bridge start to ready (empty store)", FmtMs(in.ReadyMs), "", "")
	return rs.rows
}

// punctualityRows are the lateness of a punctuality workload (the plain
// one, or Rebus's, which has no CPU figures), label naming it, and whether
// all was stored in time.
func punctualityRows(step, label string, p *Punctual) []Row {
	rs := stepRows{step: step, rows: latenessRows(step, label, p.Lateness, true)}
	rs.add("all stored before first due", storedValue(p.Stored, p.StoredMarginMs, p.Method), "", "")
	if p.CPU != nil {
		rs.add("CPU, first due time to last delivery", p.CPU.String(), "", "")
	}
	return rs.rows
}

// burstRows are the time from the burst's due instant to its last delivery
// and its lateness.
func burstRows(b *Burst) []Row {
	if b == nil {
		return nil
	}
	rs := stepRows{step: StepBurst}
	label := fmt.Sprintf("%d due at once", b.N)
	rs.add("due instant to last delivered, "+label, FmtMs(b.LastAfterDueMs), "≤ "+FmtMs(ms(TargetBurst)),
		verdict(b.Missing == 0 && b.LastAfterDueMs <= ms(TargetBurst)))
	rs.add("lateness p50", FmtMs(b.P50Ms), "", "")
	rs.add("lateness p99", FmtMs(b.P99Ms), "", "")
	rs.rows = append(rs.rows, countRows(StepBurst, b.Lateness)...)
	rs.add("all stored before due", storedValue(b.Stored, b.StoredMarginMs, ""), "", "")
	return rs.rows
}

// scaleRows are the fill rate, punctuality and memory with s.N pending.
func scaleRows(r *Results, s *Scale) []Row {
	rs := stepRows{step: StepScale}
	rs.add(fmt.Sprintf("fill %d pending (due in 30 days), stored/s", s.N), FmtRate(s.FillRate), "", "")
	if s.FillRateFirst > 0 || s.FillRateLast > 0 {
		rs.add("fill rate first 10% / last 10%", FmtRate(s.FillRateFirst)+" / "+FmtRate(s.FillRateLast), "", "")
	}
	if r.Ceiling != nil && r.Ceiling.Rate > 0 && s.FillRate > 0 {
		rs.add("fill rate / ceiling", FmtRatio(s.FillRate/r.Ceiling.Rate), "", "")
	}
	if p := s.Punctual; p != nil {
		rs.rows = append(rs.rows, latenessRows(StepScale, fmt.Sprintf("%d over %s with %d pending", p.N, FmtMs(p.WindowMs), s.N), p.Lateness, true)...)
	}
	rs.rows = append(rs.rows, scaleTargetRows(r, s)...)
	if s.HeapAvailable {
		rs.add("Go heap (HeapAlloc peak during due stream)", FmtBytes(int64(s.HeapPeak)), "≤ "+FmtBytes(int64(TargetHeap)), verdict(s.HeapPeak <= TargetHeap))
		rs.add("Go heap at end / HeapInuse / Go Sys", FmtBytes(int64(s.HeapAlloc))+" / "+FmtBytes(int64(s.HeapInuse))+" / "+FmtBytes(int64(s.Sys)), "", "")
		rs.add("Go heap peak while filling", FmtBytes(int64(s.HeapFillPeak)), "", "")
	} else {
		rs.add("Go heap", "n/a (no /debug/vars)", "≤ "+FmtBytes(int64(TargetHeap)), "")
	}
	if s.VarsMs > 0 {
		rs.add("slowest GET /debug/vars (sampled 1/s)", FmtMs(s.VarsMs), "", "")
	}
	rs.add("RSS (anon + file-backed) / peak RSS", fmt.Sprintf("%s (%s + %s) / %s",
		FmtBytes(s.RSS), FmtBytes(s.RSSAnon), FmtBytes(s.RSSFile), FmtBytes(s.HWM)), "", "")
	rs.add("store file / on disk", FmtBytes(s.StoreBytes)+" / "+FmtBytes(s.StoreOnDisk), "", "")
	if s.StopMs > 0 {
		rs.add("SIGTERM to exit", FmtMs(s.StopMs), "", "")
	}
	if s.RestartReadyMs > 0 {
		rs.add("restart: process start to ready", FmtMs(s.RestartReadyMs), "≤ "+FmtMs(ms(TargetRestartReady)),
			verdict(s.RestartReadyMs <= ms(TargetRestartReady)))
	}
	if s.PendingRestart >= 0 {
		rs.add("pending after restart", fmt.Sprint(s.PendingRestart), "", "")
	}
	return rs.rows
}

// bigMsgRows are the bridge's memory with large messages due, and their
// counts and lateness.
func bigMsgRows(m *BigMsg) []Row {
	if m == nil {
		return nil
	}
	rs := stepRows{step: StepBigMsg}
	label := fmt.Sprintf("%d × %d MiB due over %s", m.N, m.Bytes>>20, FmtMs(m.WindowMs))
	rs.add("bridge peak RSS (VmHWM), "+label, FmtBytes(m.PeakRSS), "≤ "+FmtBytes(TargetBigMsgRSS),
		verdict(m.PeakRSS > 0 && m.PeakRSS <= TargetBigMsgRSS))
	rs.add("highest RSS / RssAnon sampled / Go heap peak", FmtBytes(m.SampledRSS)+" / "+FmtBytes(m.AnonRSS)+" / "+FmtBytes(int64(m.HeapPeak)), "", "")
	rs.add("missing / duplicates / early", fmt.Sprintf("%d / %d / %d", m.Lateness.Missing, m.Lateness.Duplicates, m.Lateness.Early), "0 / 0 / 0",
		verdict(m.Lateness.Missing == 0 && m.Lateness.Duplicates == 0 && m.Lateness.Early == 0))
	rs.add("lateness p50 / p99 / max", FmtMs(m.Lateness.P50Ms)+" / "+FmtMs(m.Lateness.P99Ms)+" / "+FmtMs(m.Lateness.MaxMs), "", "")
	return rs.rows
}

// latenessRows are the lateness figures of one timed workload; with targets
// they are checked against the punctuality targets.
func latenessRows(step, label string, l Lateness, targets bool) []Row {
	rows := []Row{
		{Step: step, Metric: "lateness p50, " + label, Value: FmtMs(l.P50Ms)},
		{Step: step, Metric: "lateness p90", Value: FmtMs(l.P90Ms)},
		{Step: step, Metric: "lateness p99", Value: FmtMs(l.P99Ms)},
		{Step: step, Metric: "lateness p99.9", Value: FmtMs(l.P999Ms)},
		{Step: step, Metric: "lateness max", Value: FmtMs(l.MaxMs)},
	}
	if targets {
		ok := l.Received > 0 && l.Missing == 0
		rows[2].Target, rows[2].Result = "≤ "+FmtMs(ms(TargetP99)), verdict(ok && l.P99Ms <= ms(TargetP99))
		rows[4].Target, rows[4].Result = "≤ "+FmtMs(ms(TargetMax)), verdict(ok && l.MaxMs <= ms(TargetMax))
	}
	return append(rows, countRows(step, l)...)
}

// protocolRows are the lateness figures of a protocol step: the plain
// workload and the protocol's, both checked against the targets, and why the
// framework's own mechanism has none.
func protocolRows(step, what, own string, x *Protocol) []Row {
	if x == nil {
		return nil
	}
	var rows []Row
	for _, r := range []struct {
		label string
		p     *Punctual
	}{{"plain x-due-at", x.Plain}, {what, x.Via}} {
		if r.p == nil {
			continue
		}
		rows = append(rows, latenessRows(step, fmt.Sprintf("%d %s over %s", r.p.N, r.label, FmtMs(r.p.WindowMs)), r.p.Lateness, true)...)
		rows = append(rows, Row{Step: step, Metric: "all stored before first due", Value: storedValue(r.p.Stored, r.p.StoredMarginMs, r.p.Method)})
	}
	return append(rows, Row{Step: step, Metric: own, Value: x.Framework})
}

// countRows are the early, duplicate and missing counts, which must be 0.
func countRows(step string, l Lateness) []Row {
	var rows []Row
	for _, c := range []struct {
		name string
		n    int
	}{{"early deliveries", l.Early}, {"duplicates", l.Duplicates}, {"missing", l.Missing}} {
		rows = append(rows, Row{Step: step, Metric: c.name, Value: fmt.Sprintf("%d of %d", c.n, l.Expected), Target: "0", Result: verdict(c.n == 0)})
	}
	return rows
}

func storedValue(stored bool, marginMs float64, method string) string {
	by := ""
	if method != "" {
		by = " (by " + method + ")"
	}
	if marginMs == 0 && !stored {
		return "unknown" + by
	}
	if stored {
		return FmtMs(marginMs) + " ahead" + by
	}
	return FmtMs(-marginMs) + " LATE" + by
}

// FormatTable renders rows as an aligned text table with a header.
func FormatTable(rows []Row) string {
	cells := [][]string{{"step", "metric", "value", "target", "result"}}
	for _, r := range rows {
		cells = append(cells, []string{r.Step, r.Metric, r.Value, r.Target, r.Result})
	}
	return formatGrid(cells)
}

// FormatComparison renders the punctuality workload through the bridge and
// through the TTL topology side by side, or "" when either did not run.
func FormatComparison(r *Results) string {
	if r.Punctuality == nil || r.TTL == nil {
		return ""
	}
	line := func(name string, l Lateness) []string {
		return []string{name, FmtMs(l.P50Ms), FmtMs(l.P90Ms), FmtMs(l.P99Ms), FmtMs(l.MaxMs),
			fmt.Sprint(l.Early), fmt.Sprint(l.Missing)}
	}
	p, t := r.Punctuality, r.TTL
	cells := [][]string{
		{fmt.Sprintf("%d msgs due over %s", p.N, FmtMs(p.WindowMs)), "p50", "p90", "p99", "max", "early", "missing"},
		line("delaybridge", p.Lateness),
		line(fmt.Sprintf("TTL + dead-letter, %d levels (%s)", t.Levels, t.QueueType), t.Lateness),
	}
	return formatGrid(cells)
}

// formatGrid aligns cells in columns two spaces apart, with a rule under the
// first row. Trailing spaces are trimmed.
func formatGrid(cells [][]string) string {
	var widths []int
	for _, row := range cells {
		for i, c := range row {
			if i >= len(widths) {
				widths = append(widths, 0)
			}
			widths[i] = max(widths[i], utf8.RuneCountInString(c))
		}
	}
	var sb strings.Builder
	writeRow := func(row []string) {
		var line strings.Builder
		for i, c := range row {
			if i > 0 {
				line.WriteString("  ")
			}
			line.WriteString(c)
			line.WriteString(strings.Repeat(" ", widths[i]-utf8.RuneCountInString(c)))
		}
		sb.WriteString(strings.TrimRight(line.String(), " "))
		sb.WriteByte('\n')
	}
	for i, row := range cells {
		writeRow(row)
		if i == 0 {
			rule := make([]string, len(widths))
			for j, w := range widths {
				rule[j] = strings.Repeat("-", w)
			}
			writeRow(rule)
		}
	}
	return sb.String()
}

// FmtMs formats milliseconds: "0.84 ms", "12.3 ms", "1.25 s"; +Inf is "never".
func FmtMs(v float64) string {
	switch {
	case math.IsInf(v, 1) || math.IsNaN(v):
		return "never"
	case math.Abs(v) >= 1000:
		return fmt.Sprintf("%.2f s", v/1000)
	case math.Abs(v) >= 10:
		return fmt.Sprintf("%.1f ms", v)
	default:
		return fmt.Sprintf("%.2f ms", v)
	}
}

// FmtRate formats a rate with thousands separators: "12,345 msg/s".
func FmtRate(v float64) string {
	return groupThousands(int64(math.Round(v))) + " msg/s"
}

// FmtRatio formats a ratio: "0.83×".
func FmtRatio(v float64) string { return fmt.Sprintf("%.2f×", v) }

// FmtBytes formats a byte count in MiB: "41.2 MiB".
func FmtBytes(b int64) string { return fmt.Sprintf("%.1f MiB", mib(b)) }

func groupThousands(n int64) string {
	s := fmt.Sprint(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var out []byte
	for i := range len(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	if neg {
		return "-" + string(out)
	}
	return string(out)
}

// WriteJSON writes the results, indented, to path.
func WriteJSON(r *Results, path string) error {
	data, err := json.MarshalIndent(jsonSafe(r), "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(data, '\n'), 0o644)
}

// jsonSafe replaces the one non-finite figure (a burst that never completed)
// with -1, which JSON can carry.
func jsonSafe(r *Results) *Results {
	if r.Burst == nil || !math.IsInf(r.Burst.LastAfterDueMs, 0) {
		return r
	}
	c := *r
	b := *r.Burst
	b.LastAfterDueMs = -1
	c.Burst = &b
	return &c
}

// scaleTargetRows are the scale step's figures against its targets
// that need another step's: the steady workload while N are pending against
// the same rate on an empty store (steady step), and the fill rate against
// the empty store's ingest rate (ingest step).
func scaleTargetRows(r *Results, s *Scale) []Row {
	rs := stepRows{step: StepScale}
	if r.Ingest != nil && r.Ingest.Rate > 0 && s.FillRate > 0 {
		ratio := s.FillRate / r.Ingest.Rate
		rs.add("fill rate / empty-store ingest rate", FmtRatio(ratio), "≥ "+FmtRatio(TargetScaleFillRatio), verdict(ratio >= TargetScaleFillRatio))
	}
	if l := s.Steady; l != nil {
		rs.add(fmt.Sprintf("steady %d/s with %d pending: p50 / p99 / max", s.SteadyRate, s.N),
			FmtMs(l.P50Ms)+" / "+FmtMs(l.P99Ms)+" / "+FmtMs(l.MaxMs), "", "")
		rs.add("steady: early / duplicates / missing", fmt.Sprintf("%d / %d / %d", l.Early, l.Duplicates, l.Missing), "0", verdict(l.Early+l.Duplicates+l.Missing == 0))
		if empty := emptySteadyP99(r, s.SteadyRate); empty > 0 {
			ratio := l.P99Ms / empty
			rs.add("steady p99 / empty-store p99 at the same rate", FmtRatio(ratio), "≤ "+FmtRatio(TargetScaleSteadyRatio), verdict(ratio <= TargetScaleSteadyRatio))
		}
	}
	return rs.rows
}

// emptySteadyP99 is the steady step's bbolt p99 at rate (0: not run).
func emptySteadyP99(r *Results, rate int) float64 {
	if r.Steady == nil {
		return 0
	}
	for _, st := range r.Steady.Stores {
		if st.Store != "bbolt" {
			continue
		}
		for _, x := range st.Rates {
			if x.Rate == rate && x.Bridge != nil {
				return x.Bridge.P99Ms
			}
		}
	}
	return 0
}
