package bench

import (
	"math"
	"slices"
	"time"
)

// Lateness summarizes when the messages of one workload arrived at the
// consumer of their destination queue, relative to their due times.
type Lateness struct {
	Expected   int `json:"expected"`
	Received   int `json:"received"` // distinct messages received
	Missing    int `json:"missing"`
	Early      int `json:"early"`      // received before their due time
	Duplicates int `json:"duplicates"` // deliveries of a message already received
	Foreign    int `json:"foreign"`    // deliveries that were not this workload's
	// Mismatched are messages that came with another exchange, routing key
	// or header than the workload expects (only checked where it says).
	Mismatched int `json:"mismatched,omitempty"`

	Percentiles

	// BySecond breaks the lateness down by due time, one entry per second
	// from the first due time: where in the run the late ones were.
	BySecond []SecondStats `json:"by_second,omitempty"`
}

// Percentiles summarize a set of durations, in milliseconds.
type Percentiles struct {
	MinMs  float64 `json:"min_ms"`
	MeanMs float64 `json:"mean_ms"`
	P50Ms  float64 `json:"p50_ms"`
	P90Ms  float64 `json:"p90_ms"`
	P99Ms  float64 `json:"p99_ms"`
	P999Ms float64 `json:"p999_ms"`
	MaxMs  float64 `json:"max_ms"`
}

// SecondStats is the lateness of the messages due in one second.
type SecondStats struct {
	Second int     `json:"second"` // seconds after the first due time
	Count  int     `json:"count"`
	P50Ms  float64 `json:"p50_ms"`
	P99Ms  float64 `json:"p99_ms"`
	MaxMs  float64 `json:"max_ms"`
}

// bySecond groups late[i], due at dues[i] (unix ns), by the second after
// the earliest due time.
func bySecond(dues []int64, late []time.Duration) []SecondStats {
	if len(dues) == 0 || len(dues) != len(late) {
		return nil
	}
	first := slices.Min(dues)
	groups := map[int][]time.Duration{}
	for i, d := range dues {
		sec := int((d - first) / int64(time.Second))
		groups[sec] = append(groups[sec], late[i])
	}
	var out []SecondStats
	for sec := 0; len(groups) > 0; sec++ {
		g, ok := groups[sec]
		if !ok {
			continue
		}
		delete(groups, sec)
		slices.Sort(g)
		out = append(out, SecondStats{Second: sec, Count: len(g), P50Ms: ms(Percentile(g, 50)),
			P99Ms: ms(Percentile(g, 99)), MaxMs: ms(g[len(g)-1])})
	}
	return out
}

// Percentile returns the p-th percentile (0 < p <= 100) of sorted by the
// nearest-rank method: the smallest value such that at least p% of the values
// are less than or equal to it. It returns 0 for an empty slice and the
// minimum for p <= 0.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	if p <= 0 {
		return sorted[0]
	}
	// The epsilon keeps float error (99.9/100*1000 = 999.0000000000001)
	// from pushing the rank up by one.
	rank := int(math.Ceil(p/100*float64(n) - 1e-9))
	rank = min(max(rank, 1), n)
	return sorted[rank-1]
}

// Summarize computes the lateness figures of late (one entry per distinct
// message received; it is sorted in place). The counters are left to the
// caller.
func Summarize(late []time.Duration) Lateness {
	return Lateness{Percentiles: summarize(late)}
}

// summarize computes the percentiles of d, which it sorts in place.
func summarize(d []time.Duration) Percentiles {
	var p Percentiles
	if len(d) == 0 {
		return p
	}
	slices.Sort(d)
	var sum float64
	for _, v := range d {
		sum += float64(v)
	}
	p.MinMs = ms(d[0])
	p.MeanMs = sum / float64(len(d)) / float64(time.Millisecond)
	p.P50Ms = ms(Percentile(d, 50))
	p.P90Ms = ms(Percentile(d, 90))
	p.P99Ms = ms(Percentile(d, 99))
	p.P999Ms = ms(Percentile(d, 99.9))
	p.MaxMs = ms(d[len(d)-1])
	return p
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// orDefault is v, or def when v is not positive (an option left unset).
func orDefault[T int | time.Duration](v, def T) T {
	if v <= 0 {
		return def
	}
	return v
}

// rate is n per second over d, 0 when d is not positive.
func rate(n int, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}
