package bench

import (
	"fmt"
	"strings"
)

// exchangePathNames name the paths in the table and the side-by-side view.
var exchangePathNames = map[string]string{
	PathQueue:    "queue (x-destination)",
	PathExchange: "exchange (x-destination-exchange, topic)",
	PathDelayed:  "delayed topic exchange (x-delay)",
}

func exchangePathName(path string) string {
	if s, ok := exchangePathNames[path]; ok {
		return s
	}
	return path
}

// exchangeRows are the exchange step's table rows. The punctuality targets
// apply to what the bridge controls: the lateness from the due time it
// stored. For the queue and exchange paths that is x-due-at, the due time
// meant; for the delayed path it is receipt + x-delay, and the lateness from
// the due time meant, which adds the time from publish to the bridge's
// receipt, is shown without a target.
func exchangeRows(x *Exchange) []Row {
	rs := stepRows{step: StepExchange}
	p99Target, maxTarget := "≤ "+FmtMs(ms(TargetP99)), "≤ "+FmtMs(ms(TargetMax))
	for _, ep := range x.Paths {
		name := exchangePathName(ep.Path)
		l := ep.Lateness
		ok := l.Received > 0 && l.Missing == 0
		rs.add(fmt.Sprintf("%s: lateness p50 / p90, %d over %s × %d rounds", name, x.N, FmtMs(x.WindowMs), len(ep.Rounds)),
			FmtMs(l.P50Ms)+" / "+FmtMs(l.P90Ms), "", "")
		if ep.Path != PathDelayed {
			rs.add(name+": lateness p99", FmtMs(l.P99Ms), p99Target, verdict(ok && l.P99Ms <= ms(TargetP99)))
			rs.add(name+": lateness max", FmtMs(l.MaxMs), maxTarget, verdict(ok && l.MaxMs <= ms(TargetMax)))
		} else {
			rs.add(name+": lateness p99 / max from the due time x-delay was computed for", FmtMs(l.P99Ms)+" / "+FmtMs(l.MaxMs), "", "")
			if lag := ep.ReceiptLag; lag != nil {
				rs.add(fmt.Sprintf("%s: of which publish → bridge receipt, p50 / p99 / max (%d read)", name, lag.N),
					FmtMs(lag.P50Ms)+" / "+FmtMs(lag.P99Ms)+" / "+FmtMs(lag.MaxMs), "", "")
			}
			if d := ep.Dispatch; d != nil {
				rs.add(name+": lateness p99 from the bridge's due (receipt + x-delay)", FmtMs(d.P99Ms), p99Target, verdict(ok && d.P99Ms <= ms(TargetP99)))
				rs.add(name+": lateness max from the bridge's due", FmtMs(d.MaxMs), maxTarget, verdict(ok && d.MaxMs <= ms(TargetMax)))
			} else {
				rs.add(name+": lateness from the bridge's due (receipt + x-delay)", "n/a (stored rows not read)", p99Target, "")
			}
		}
		rs.add(name+": early / duplicates / missing / mismatched",
			fmt.Sprintf("%d / %d / %d / %d of %d", l.Early, l.Duplicates, l.Missing, l.Mismatched, l.Expected),
			"0", verdict(l.Received > 0 && l.Early+l.Duplicates+l.Missing+l.Mismatched == 0))
	}
	return rs.rows
}

// FormatExchange renders the exchange step's paths side by side, or "" when
// it did not run.
func FormatExchange(r *Results) string {
	x := r.Exchange
	if x == nil || len(x.Paths) == 0 {
		return ""
	}
	rounds := 0
	for _, ep := range x.Paths {
		rounds = max(rounds, len(ep.Rounds))
	}
	cells := [][]string{{fmt.Sprintf("%s msgs due over %s, %d rounds each", groupThousands(int64(x.N)), FmtMs(x.WindowMs), rounds),
		"p50", "p90", "p99", "max", "p99 by round", "early", "dups", "missing", "mismatched", "other CPU by round"}}
	dist := func(name string, d *Dist, byRound []string) []string {
		if d == nil {
			return []string{name, "-", "-", "-", "-", "-"}
		}
		return []string{name, FmtMs(d.P50Ms), FmtMs(d.P90Ms), FmtMs(d.P99Ms), FmtMs(d.MaxMs), strings.Join(byRound, " / ")}
	}
	for _, ep := range x.Paths {
		l := ep.Lateness
		var byRound []string
		for _, v := range ep.RoundP99Ms {
			byRound = append(byRound, FmtMs(v))
		}
		name := exchangePathName(ep.Path)
		if ep.Path == PathDelayed {
			name += ", from the due time meant"
		}
		var others []string
		for _, rr := range ep.Rounds {
			others = append(others, fmt.Sprintf("%.2f", rr.OtherCores))
		}
		cells = append(cells, []string{name, FmtMs(l.P50Ms), FmtMs(l.P90Ms), FmtMs(l.P99Ms), FmtMs(l.MaxMs), strings.Join(byRound, " / "),
			fmt.Sprint(l.Early), fmt.Sprint(l.Duplicates), fmt.Sprint(l.Missing), fmt.Sprint(l.Mismatched), strings.Join(others, " / ")})
		var lagRounds, dispRounds []string
		for _, rr := range ep.Rounds {
			lagRounds = append(lagRounds, fmtDistP99(rr.ReceiptLag))
			dispRounds = append(dispRounds, fmtDistP99(rr.Dispatch))
		}
		if ep.Path != PathDelayed {
			// The due time is absolute: the lag before the bridge's receipt
			// does not add to the lateness.
			cells = append(cells, dist("  (publish → bridge receipt)", ep.ReceiptLag, lagRounds))
			continue
		}
		cells = append(cells,
			dist("  of which publish → bridge receipt", ep.ReceiptLag, lagRounds),
			dist("  and the bridge's due (receipt + x-delay) → consumer", ep.Dispatch, dispRounds))
	}
	return formatGrid(cells)
}

func fmtDistP99(d *Dist) string {
	if d == nil {
		return "-"
	}
	return FmtMs(d.P99Ms)
}
