package bench

import (
	"slices"
	"testing"
	"time"
)

func TestPercentileNearestRank(t *testing.T) {
	var sorted []time.Duration
	for i := 1; i <= 100; i++ {
		sorted = append(sorted, time.Duration(i)*time.Millisecond)
	}
	for _, c := range []struct {
		p    float64
		want time.Duration
	}{
		{0, 1 * time.Millisecond},
		{1, 1 * time.Millisecond},
		{50, 50 * time.Millisecond},
		{90, 90 * time.Millisecond},
		{99, 99 * time.Millisecond},
		{99.9, 100 * time.Millisecond},
		{100, 100 * time.Millisecond},
	} {
		if got := Percentile(sorted, c.p); got != c.want {
			t.Errorf("Percentile(1..100 ms, %v) = %v, want %v", c.p, got, c.want)
		}
	}
	if got := Percentile(nil, 50); got != 0 {
		t.Errorf("Percentile(empty) = %v, want 0", got)
	}
	one := []time.Duration{7}
	for _, p := range []float64{0, 50, 99.9, 100} {
		if got := Percentile(one, p); got != 7 {
			t.Errorf("Percentile([7], %v) = %v, want 7", p, got)
		}
	}
	// Nearest rank on 1000 values: p99.9 is the 999th, not the maximum.
	sorted = sorted[:0]
	for i := 1; i <= 1000; i++ {
		sorted = append(sorted, time.Duration(i))
	}
	if got := Percentile(sorted, 99.9); got != 999 {
		t.Errorf("Percentile(1..1000, 99.9) = %v, want 999", got)
	}
}

func TestSummarizeSortsAndIncludesEarly(t *testing.T) {
	late := []time.Duration{5 * time.Millisecond, -2 * time.Millisecond, 1 * time.Millisecond, 100 * time.Millisecond}
	l := Summarize(late)
	if l.MinMs != -2 || l.MaxMs != 100 || l.P50Ms != 1 || l.P99Ms != 100 {
		t.Errorf("Summarize = %+v", l)
	}
	if want := (5 - 2 + 1 + 100) / 4.0; l.MeanMs != want {
		t.Errorf("mean = %v, want %v", l.MeanMs, want)
	}
	if z := Summarize(nil); z.Received != 0 || z.MaxMs != 0 || z.P50Ms != 0 || z.BySecond != nil {
		t.Errorf("Summarize(nil) not zero")
	}
}

func TestSpreadIsUniformInsideTheWindow(t *testing.T) {
	first := time.Unix(1000, 0)
	dues := spread(first, 10*time.Second, 4)
	want := []time.Duration{0, 2500 * time.Millisecond, 5 * time.Second, 7500 * time.Millisecond}
	for i, d := range dues {
		if d.Sub(first) != want[i] {
			t.Errorf("due %d at +%v, want +%v", i, d.Sub(first), want[i])
		}
	}
}

func TestWindowRates(t *testing.T) {
	t0 := time.Unix(0, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	pts := []progressPoint{{at(0), 0}, {at(1), 50}, {at(2), 100}, {at(5), 850}, {at(9), 900}, {at(10), 1000}}
	first, last := windowRates(1000, func(yield func(time.Time, int64)) {
		for _, p := range pts {
			yield(p.at, p.stored)
		}
	})
	// 100 (10%) reached at 2 s; 900 (90%) at 9 s and 1000 at 10 s.
	if first != 50 || last != 100 {
		t.Errorf("windowRates = %v, %v; want 50, 100", first, last)
	}
}

func TestBySecond(t *testing.T) {
	base := int64(5 * time.Second)
	dues := []int64{base + int64(2500*time.Millisecond), base, base + int64(300*time.Millisecond), base + int64(2*time.Second)}
	late := []time.Duration{4 * time.Millisecond, 1 * time.Millisecond, 3 * time.Millisecond, 2 * time.Millisecond}
	got := bySecond(dues, late)
	want := []SecondStats{
		{Second: 0, Count: 2, P50Ms: 1, P99Ms: 3, MaxMs: 3},
		{Second: 2, Count: 2, P50Ms: 2, P99Ms: 4, MaxMs: 4},
	}
	if !slices.Equal(got, want) {
		t.Errorf("bySecond = %+v, want %+v", got, want)
	}
}
