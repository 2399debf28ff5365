package status

import (
	"math"
	"time"
)

// Percentiles are lateness percentiles over some span, from the deltas of
// the delaybridge_lateness_seconds histogram's buckets (not the mean, which
// one stuck message drags for minutes).
type Percentiles struct {
	Count    float64
	P50, P99 time.Duration
	// Over50, Over99: the percentile is past the histogram's last finite
	// bucket; P50/P99 then hold that bound ("> 60s").
	Over50, Over99 bool
}

// Known reports whether any forward was measured.
func (p Percentiles) Known() bool { return p.Count > 0 }

// latenessBetween is the lateness of the forwards confirmed between two
// samples (first older).
func latenessBetween(first, last *sample) Percentiles {
	count := last.latCount - first.latCount
	if count <= 0 || len(last.latBounds) == 0 {
		return Percentiles{}
	}
	buckets := make([]float64, len(last.latBounds))
	for i := range buckets {
		var before float64
		if i < len(first.latBuckets) {
			before = first.latBuckets[i]
		}
		buckets[i] = nonNeg(last.latBuckets[i] - before)
	}
	p := Percentiles{Count: count}
	p.P50, p.Over50 = quantile(0.5, last.latBounds, buckets, count)
	p.P99, p.Over99 = quantile(0.99, last.latBounds, buckets, count)
	return p
}

// quantile estimates the q-quantile from cumulative bucket counts by upper
// bound, with count the total (the +Inf bucket), interpolating linearly
// within a bucket as Prometheus's histogram_quantile does. Past the last
// finite bound it answers that bound and over.
func quantile(q float64, bounds, cumulative []float64, count float64) (time.Duration, bool) {
	rank := q * count
	lower, below := 0.0, 0.0
	for i, upper := range bounds {
		if cumulative[i] >= rank && cumulative[i] > below {
			v := lower + (upper-lower)*(rank-below)/(cumulative[i]-below)
			return time.Duration(v * float64(time.Second)), false
		}
		lower, below = upper, math.Max(below, cumulative[i])
	}
	return time.Duration(bounds[len(bounds)-1] * float64(time.Second)), true
}
