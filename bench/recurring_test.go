package bench

import (
	"strings"
	"testing"
	"time"
)

func TestCountRecurring(t *testing.T) {
	from := time.Date(2026, 11, 28, 7, 0, 0, 0, time.UTC)
	to := from.Add(5 * time.Second) // fire times 07:00:00 … 07:00:05
	sec := func(k int) time.Time { return from.Add(time.Duration(k) * time.Second) }
	ms := func(k int) time.Duration { return time.Duration(k) * time.Millisecond }
	var arr []recArrival
	add := func(s, fire int, late time.Duration) {
		arr = append(arr, recArrival{Schedule: s, Fire: sec(fire), At: sec(fire).Add(late)})
	}
	// Schedule 0: every fire time, each 10 ms late; and one before the
	// window, which does not count.
	add(0, -1, ms(1))
	for k := 0; k <= 5; k++ {
		add(0, k, ms(10))
	}
	// Schedule 1: first fires at +2 (stored late), misses +4, +3 doubled.
	add(1, 2, ms(20))
	add(1, 3, ms(30))
	add(1, 3, ms(500))
	add(1, 5, ms(40))
	// Schedule 2: never fires.
	// Schedule 3: one early delivery, and one after the window.
	add(3, 5, -ms(1))
	add(3, 6, ms(5))
	// Unreadable and foreign.
	arr = append(arr, recArrival{Schedule: -1, Fire: sec(1), At: sec(1)},
		recArrival{Schedule: 1, At: sec(1)},
		recArrival{Schedule: 9, Fire: sec(1), At: sec(1)})
	// Off the one-second grid of schedule 0.
	arr = append(arr, recArrival{Schedule: 0, Fire: sec(2).Add(ms(500)), At: sec(3)})

	c, late := countRecurring(arr, 4, from, to, time.Second)
	want := RecurringCount{
		Schedules: 4,
		Silent:    1,
		Expected:  6 + 4 + 6 + 1, // 0: +0…+5; 1: +2…+5; 2: all 6; 3: +5
		Received:  6 + 3 + 1,
		Missed:    1 + 6, // 1's +4, and 2's
		Doubled:   1,
		Early:     1,
		Foreign:   3,
		OffGrid:   1,
	}
	if c != want {
		t.Fatalf("count = %+v\nwant   %+v", c, want)
	}
	if len(late) != c.Received {
		t.Fatalf("%d lateness samples, want one per fire received (%d)", len(late), c.Received)
	}
	p := summarize(late)
	if p.MaxMs != 40 || p.MinMs != -1 {
		t.Fatalf("lateness min %v max %v, want -1 and 40 (the doubled one's 500 ms not counted)", p.MinMs, p.MaxMs)
	}
	if p.P50Ms != 10 {
		t.Fatalf("lateness p50 %v, want 10", p.P50Ms)
	}
}

func TestCountRecurringAllOnTime(t *testing.T) {
	from := time.Date(2026, 11, 28, 7, 0, 0, 0, time.UTC)
	to := from.Add(19 * time.Second)
	var arr []recArrival
	for s := range 50 {
		for k := 0; k < 20; k++ {
			f := from.Add(time.Duration(k) * time.Second)
			arr = append(arr, recArrival{Schedule: s, Fire: f, At: f.Add(time.Duration(s) * time.Millisecond)})
		}
	}
	c, late := countRecurring(arr, 50, from, to, time.Second)
	if c.Expected != 1000 || c.Received != 1000 || c.Missed != 0 || c.Doubled != 0 || c.Early != 0 || c.Silent != 0 {
		t.Fatalf("count = %+v, want 1000 expected and received, nothing else", c)
	}
	if p := summarize(late); p.P99Ms != 49 || p.MaxMs != 49 {
		t.Fatalf("p99 %v max %v, want 49", p.P99Ms, p.MaxMs)
	}
}

func TestSlope(t *testing.T) {
	if s := slope([]float64{0, 1, 2, 3}, []float64{5, 7, 9, 11}); s != 2 {
		t.Fatalf("slope = %v, want 2", s)
	}
	if s := slope([]float64{0, 1, 2}, []float64{1000, 1000, 1000}); s != 0 {
		t.Fatalf("flat slope = %v, want 0", s)
	}
	if s := slope([]float64{1}, []float64{3}); s != 0 {
		t.Fatalf("one sample: slope = %v, want 0", s)
	}
}

func TestRecurringRows(t *testing.T) {
	r := &Recurring{N: 1000, Cron: recurringCron, Seconds: 20, HasPending: true, PendingFrom: 1000, PendingTo: 1800,
		RecurringCount: RecurringCount{Schedules: 1000, Expected: 20000, Received: 20000}}
	for _, row := range recurringRows(r) {
		if row.Result != "" && row.Result != verdict(true) {
			t.Fatalf("row %q: %s, want a pass", row.Metric, row.Result)
		}
	}
	r.Missed, r.PendingTo = 1, 2001
	var failed []string
	for _, row := range recurringRows(r) {
		if row.Result == verdict(false) {
			failed = append(failed, row.Metric)
		}
	}
	if len(failed) != 2 || !strings.Contains(failed[0], "missed") || !strings.Contains(failed[1], "pending") {
		t.Fatalf("failed rows %q, want the fires row and the pending row", failed)
	}
	if recurringRows(nil) != nil {
		t.Fatal("rows of a step not run")
	}
}
