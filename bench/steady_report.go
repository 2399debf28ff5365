package bench

import (
	"fmt"
	"strings"
)

// fmtPct is p50 / p99 / p99.9 / max of a leg.
func fmtPct(l *SteadyLeg) string {
	if l == nil {
		return "-"
	}
	return FmtMs(l.P50Ms) + " / " + FmtMs(l.P99Ms) + " / " + FmtMs(l.P999Ms) + " / " + FmtMs(l.MaxMs)
}

// fmtPace is the achieved rate and the send lag, flagged when behind.
func fmtPace(p Pace) string {
	s := fmt.Sprintf("%s, lag p99 %s / max %s", FmtRate(p.Rate), FmtMs(p.LagP99Ms), FmtMs(p.LagMaxMs))
	if p.Behind {
		s += " BEHIND"
	}
	return s
}

// fmtBusy is the machine's busy and stolen shares of a leg's CPU.
func fmtBusy(c *LegCPU) string {
	if c == nil {
		return "-"
	}
	return fmt.Sprintf("%.0f%% / %.1f%%", 100*c.Busy, 100*c.Steal)
}

// steadyRows are the steady step's table rows: per store and rate the
// bridge's lateness, its counts, the publisher's pace, the broker's own hop
// at R and 2R and the p99 ratio; then the search.
func steadyRows(s *Steady) []Row {
	rs := stepRows{step: StepSteady}
	for _, st := range s.Stores {
		if st.Skipped != "" {
			rs.add(st.Store, "skipped: "+st.Skipped, "", "")
			continue
		}
		for _, r := range st.Rates {
			head := fmt.Sprintf("%s %s for %.0f s", st.Store, FmtRate(float64(r.Rate)), s.DurationS)
			if l := r.Bridge; l != nil {
				target, result := "", ""
				if p99, mx := steadyTarget(st.Store, r.Rate); p99 > 0 {
					target = "p99 ≤ " + FmtMs(p99)
					ok := l.Missing == 0 && l.P99Ms <= p99
					if mx > 0 {
						target += ", max ≤ " + FmtMs(mx)
						ok = ok && l.MaxMs <= mx
					}
					result = verdict(ok)
				}
				rs.add(head+": bridge lateness p50 / p99 / p99.9 / max", fmtPct(l), target, result)
				rs.add("  early / duplicates / missing", fmt.Sprintf("%d / %d / %d of %d", l.Early, l.Duplicates, l.Missing, l.Expected),
					"0", verdict(l.Early+l.Duplicates+l.Missing == 0))
				rs.add("  publisher (bridge)", fmtPace(l.Pace), "", "")
				if l.CPU != nil {
					rs.add("  CPU, intake and delivery at full rate", l.CPU.String(), "", "")
				}
			}
			if r.Hop != nil {
				rs.add(fmt.Sprintf("  broker hop at %s: latency p50 / p99 / p99.9 / max", FmtRate(float64(r.Rate))), fmtPct(r.Hop), "", "")
			}
			if r.Hop2 != nil {
				rs.add(fmt.Sprintf("  broker hop at %s: latency p50 / p99 / p99.9 / max", FmtRate(float64(2*r.Rate))), fmtPct(r.Hop2), "", "")
				if r.Hop2.Pace.Behind {
					rs.add("  publisher (hop at 2R)", fmtPace(r.Hop2.Pace), "", "")
				}
				if r.Hop2.CPU != nil {
					rs.add("  CPU, hop at 2R", r.Hop2.CPU.String(), "", "")
				}
			}
			if r.RatioP99 > 0 {
				rs.add("  bridge p99 / hop p99 at 2R", FmtRatio(r.RatioP99), "≤ "+FmtRatio(steadyMaxRatio), verdict(r.RatioP99 <= steadyMaxRatio))
			}
		}
		if x := st.Search; x != nil {
			v := "none"
			if x.Best > 0 {
				v = FmtRate(float64(x.Best))
				if x.Ceiling > 0 {
					v += fmt.Sprintf(" = %s of the ceiling (%s)", FmtRatio(x.Ratio), FmtRate(x.Ceiling))
				}
			}
			rs.add(fmt.Sprintf("%s: highest rate with bridge p99 ≤ %s", st.Store, FmtMs(ms(steadySearchP99))), v, "", "")
			var steps []string
			for _, p := range x.Steps {
				steps = append(steps, fmt.Sprintf("%d: %s%s", p.Rate, FmtMs(p.P99Ms), map[bool]string{true: " (behind)"}[p.Behind]))
			}
			rs.add("  search: rate: p99", strings.Join(steps, "; "), "", "")
		}
	}
	return rs.rows
}

// FormatSteady renders the steady step side by side, one line per store
// and rate, or "" when it did not run.
func FormatSteady(r *Results) string {
	s := r.Steady
	if s == nil {
		return ""
	}
	cells := [][]string{{"steady", "rate", "sent/s", "bridge p50", "p99", "p99.9", "max", "early/dup/miss", "hop p99 at R", "at 2R", "p99 / hop(2R)", "busy / steal"}}
	for _, st := range s.Stores {
		for _, x := range st.Rates {
			l := x.Bridge
			if l == nil {
				continue
			}
			sent := FmtRate(l.Pace.Rate)
			if l.Pace.Behind {
				sent += " BEHIND"
			}
			hop, hop2 := "-", "-"
			if x.Hop != nil {
				hop = FmtMs(x.Hop.P99Ms)
			}
			if x.Hop2 != nil {
				hop2 = FmtMs(x.Hop2.P99Ms)
			}
			cells = append(cells, []string{st.Store, FmtRate(float64(x.Rate)), sent, FmtMs(l.P50Ms), FmtMs(l.P99Ms), FmtMs(l.P999Ms),
				FmtMs(l.MaxMs), fmt.Sprintf("%d/%d/%d", l.Early, l.Duplicates, l.Missing), hop, hop2, FmtRatio(x.RatioP99), fmtBusy(l.CPU)})
		}
	}
	if len(cells) == 1 {
		return ""
	}
	return formatGrid(cells)
}
