package bench

import (
	"strings"
	"testing"
)

// The resend rows: a lost send or an early one is a MISS in its workload,
// duplicates are counted without a target, and a skipped store says why.
func TestResendRows(t *testing.T) {
	r := &Results{Resend: &Resend{Rate: 50, Seconds: 10, Rounds: 3, Skipped: "postgres: no URL", Runs: []*ResendRun{{
		Store: "bbolt",
		Workloads: []*ResendWorkload{
			{Name: "ok", Messages: 500, Sends: 1500, Delivered: 1500, Duplicates: 2, Percentiles: Percentiles{P50Ms: 2, P99Ms: 9, MaxMs: 20}},
			{Name: "lossy", Messages: 500, Sends: 1500, Delivered: 1400, Lost: 100, Early: 1},
		}}}}}
	var lost, early []string
	skipped := false
	for _, row := range BuildRows(r) {
		if row.Step != StepResend {
			t.Errorf("row of step %q", row.Step)
		}
		switch {
		case strings.HasPrefix(row.Metric, "sends lost"):
			lost = append(lost, row.Result)
		case row.Metric == "early":
			early = append(early, row.Result)
		case row.Metric == "duplicates" && row.Result != "":
			t.Errorf("duplicates have a verdict: %+v", row)
		case row.Metric == "skipped":
			skipped = strings.Contains(row.Value, "postgres")
		}
	}
	if strings.Join(lost, ",") != "PASS,MISS" || strings.Join(early, ",") != "PASS,MISS" || !skipped {
		t.Errorf("lost verdicts %q, early %q, skipped shown %v; want PASS,MISS twice and the skip", lost, early, skipped)
	}
}
