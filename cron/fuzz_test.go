package cron

import (
	"testing"
	"time"
)

// Parse never panics, and whatever it accepts yields increasing fire times.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"* * * * *", "0 0 12 L-3W * ?", "0 0 12 ? * 6#3 2030", "0 0 22-2 ? * FRI-MON", "@daily", "0 */7 * 31W 2 ?", "5-1 * * * *"} {
		f.Add(s)
	}
	berlin, _ := LoadLocation("Europe/Berlin")
	f.Fuzz(func(t *testing.T, expr string) {
		s, err := Parse(expr)
		if err != nil {
			return
		}
		after := time.Date(2026, 10, 24, 23, 0, 0, 0, time.UTC)
		for _, t2 := range s.NextN(after, berlin, 3) {
			if !t2.After(after) {
				t.Fatalf("%q: %s not after %s", expr, t2, after)
			}
			after = t2
		}
	})
}
