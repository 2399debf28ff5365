package metrics

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/wire"
)

// Per-destination series (docs/contract.md §6). Label cardinality is capped
// at MaxDestinations series per metric plus one, the overflow series
// {exchange="",destination=""} (no queue has an empty name), which sums
// every destination past the cap:
//
//   - the gauges (pending, due soon) show the destinations with the most
//     pending rows at each refresh; the others are summed in the overflow
//     series, so a destination may move in and out of it;
//   - the counters (dispatched, failures) give a series of its own to each
//     of the first MaxDestinations destinations they count, for the life of
//     the process, and count the others in the overflow series: a counter
//     never moves between series, so rate() stays right.
//
// delaybridge_destination_paused is 1 for each paused destination
// (storage.Pauser), for the first MaxDestinations of them in order of
// exchange and name; the overflow series, when there are more, counts the
// others.
//
// The gauges come from the store's storage.DestinationCounter and
// storage.Pauser, asked at most once per Interval: a scrape in between
// serves the last answers.

// Defaults of DestinationOptions.
const (
	DefaultMaxDestinations     = 50
	DefaultDestinationInterval = 15 * time.Second
	// DueSoonWindow is the window of delaybridge_destination_due_soon.
	DueSoonWindow = time.Minute
)

// DestinationOptions configure the per-destination series.
type DestinationOptions struct {
	// Count reads the store's counts (storage.DestinationCounter); nil:
	// no gauges.
	Count func(ctx context.Context, soonFrom, soonTo time.Time) (map[wire.Destination]storage.DestinationCount, error)
	// Paused lists the paused destinations (storage.Pauser); nil: no
	// paused gauge.
	Paused func(ctx context.Context) ([]storage.PausedDestination, error)
	// MaxDestinations caps the series per metric (plus the overflow
	// series); zero or negative: DefaultMaxDestinations.
	MaxDestinations int
	// Interval is the least time between two Counts; zero or negative:
	// DefaultDestinationInterval.
	Interval time.Duration
	// Now is the clock of the due-soon window; nil: time.Now.
	Now func() time.Time
}

var destLabels = []string{"exchange", "destination"}

// overflow is the series past the cap.
var overflow = wire.Destination{}

type destCollector struct {
	pending, dueSoon *prometheus.Desc
	paused           *prometheus.Desc
	dispatched       *prometheus.CounterVec
	failures         *prometheus.CounterVec

	mu   sync.Mutex
	opts DestinationOptions
	// The last answers of opts.Count and opts.Paused.
	countsAsked asked[map[wire.Destination]storage.DestinationCount]
	pausedAsked asked[[]storage.PausedDestination]
	counters    map[wire.Destination]bool // the destinations with counter series of their own

	refresh sync.Mutex // one Count at a time
}

func newDestCollector() *destCollector {
	counter := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: name, Help: help}, destLabels)
	}
	return &destCollector{
		pending: prometheus.NewDesc(namespace+"_destination_pending",
			"Messages in the store for each destination (exchange \"\": a queue; otherwise destination is the routing key), "+
				"leased ones included; destinations past the cap are summed in the series with both labels empty.", destLabels, nil),
		dueSoon: prometheus.NewDesc(namespace+"_destination_due_soon",
			"Messages in the store for each destination due within the next minute (not those overdue); capped as destination_pending.", destLabels, nil),
		paused: prometheus.NewDesc(namespace+"_destination_paused",
			"1 for each paused destination (its messages are held past their due time until it is resumed); "+
				"past the cap, the series with both labels empty counts the others.", destLabels, nil),
		dispatched: counter("destination_dispatched_total",
			"Messages forwarded to each destination, confirmed and removed from the store; past the cap, in the series with both labels empty."),
		failures: counter("destination_dispatch_failures_total",
			"Dispatch failures counted against messages for each destination; past the cap, in the series with both labels empty."),
		opts:     DestinationOptions{MaxDestinations: DefaultMaxDestinations, Interval: DefaultDestinationInterval, Now: time.Now},
		counters: map[wire.Destination]bool{},
	}
}

func (c *destCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.pending
	ch <- c.dueSoon
	ch <- c.paused
	c.dispatched.Describe(ch)
	c.failures.Describe(ch)
}

func (c *destCollector) Collect(ch chan<- prometheus.Metric) {
	c.dispatched.Collect(ch)
	c.failures.Collect(ch)
	c.mu.Lock()
	max := c.opts.MaxDestinations
	c.mu.Unlock()
	if paused, ok := c.pausedList(); ok {
		for i, p := range paused {
			if i == max {
				ch <- prometheus.MustNewConstMetric(c.paused, prometheus.GaugeValue, float64(len(paused)-max), overflow.Exchange, overflow.Key)
				break
			}
			ch <- prometheus.MustNewConstMetric(c.paused, prometheus.GaugeValue, 1, p.Destination.Exchange, p.Destination.Key)
		}
	}
	counts, ok := c.counts()
	if !ok {
		return // a failed count leaves the gauges out, as storeCollector does
	}
	for d, n := range capCounts(counts, max) {
		ch <- prometheus.MustNewConstMetric(c.pending, prometheus.GaugeValue, float64(n.Pending), d.Exchange, d.Key)
		ch <- prometheus.MustNewConstMetric(c.dueSoon, prometheus.GaugeValue, float64(n.DueSoon), d.Exchange, d.Key)
	}
}

// asked is the last answer of a store query, served until Interval has
// passed; guarded by destCollector.mu.
type asked[T any] struct {
	at   time.Time // wall clock of the question; zero: ask again
	last T
	ok   bool
}

// refreshed returns a's answer, asked again once Interval has passed since
// the last question; query picks the question from the options (nil: there
// is none, and no answer).
func refreshed[T any](c *destCollector, a *asked[T], query func(DestinationOptions) func(context.Context) (T, error)) (T, bool) {
	c.refresh.Lock()
	defer c.refresh.Unlock()
	c.mu.Lock()
	opts, last := c.opts, *a
	c.mu.Unlock()
	ask := query(opts)
	if ask == nil {
		var none T
		return none, false
	}
	if !last.at.IsZero() && time.Since(last.at) < opts.Interval {
		return last.last, last.ok
	}
	ctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
	defer cancel()
	started := time.Now()
	got, err := ask(ctx)
	c.mu.Lock()
	*a = asked[T]{at: started, last: got, ok: err == nil}
	c.mu.Unlock()
	return got, err == nil
}

// counts returns the store's counts (DestinationOptions.Count).
func (c *destCollector) counts() (map[wire.Destination]storage.DestinationCount, bool) {
	return refreshed(c, &c.countsAsked, func(o DestinationOptions) func(context.Context) (map[wire.Destination]storage.DestinationCount, error) {
		if o.Count == nil {
			return nil
		}
		return func(ctx context.Context) (map[wire.Destination]storage.DestinationCount, error) {
			now := o.Now()
			return o.Count(ctx, now, now.Add(DueSoonWindow))
		}
	})
}

// pausedList returns the paused destinations (DestinationOptions.Paused).
func (c *destCollector) pausedList() ([]storage.PausedDestination, bool) {
	return refreshed(c, &c.pausedAsked, func(o DestinationOptions) func(context.Context) ([]storage.PausedDestination, error) {
		return o.Paused
	})
}

// capCounts keeps the max destinations with the most pending rows (ties by
// exchange, then name) and sums the others under overflow.
func capCounts(counts map[wire.Destination]storage.DestinationCount, max int) map[wire.Destination]storage.DestinationCount {
	if len(counts) <= max {
		return counts
	}
	dests := make([]wire.Destination, 0, len(counts))
	for d := range counts {
		dests = append(dests, d)
	}
	slices.SortFunc(dests, func(a, b wire.Destination) int {
		return cmp.Or(cmp.Compare(counts[b].Pending, counts[a].Pending), cmp.Compare(a.Exchange, b.Exchange), cmp.Compare(a.Key, b.Key))
	})
	out := make(map[wire.Destination]storage.DestinationCount, max+1)
	var rest storage.DestinationCount
	for i, d := range dests {
		if i < max {
			out[d] = counts[d]
			continue
		}
		rest.Pending += counts[d].Pending
		rest.DueSoon += counts[d].DueSoon
	}
	out[overflow] = rest
	return out
}

// series returns the counter series of d: its own while under the cap.
func (c *destCollector) series(d wire.Destination) wire.Destination {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.counters[d] {
		return d
	}
	if len(c.counters) < c.opts.MaxDestinations {
		c.counters[d] = true
		return d
	}
	return overflow
}

// WatchDestinations configures the per-destination series.
func (m *Metrics) WatchDestinations(opts DestinationOptions) {
	if m == nil {
		return
	}
	if opts.MaxDestinations <= 0 {
		opts.MaxDestinations = DefaultMaxDestinations
	}
	if opts.Interval <= 0 {
		opts.Interval = DefaultDestinationInterval
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	m.dests.mu.Lock()
	m.dests.opts = opts
	m.dests.countsAsked.at, m.dests.pausedAsked.at = time.Time{}, time.Time{}
	m.dests.mu.Unlock()
}

// DestinationDispatched counts n messages forwarded to d, confirmed and
// removed (dispatch.DestinationMetrics).
func (m *Metrics) DestinationDispatched(d wire.Destination, n int) {
	if m == nil || n <= 0 {
		return
	}
	s := m.dests.series(d)
	m.dests.dispatched.WithLabelValues(s.Exchange, s.Key).Add(float64(n))
}

// DestinationDispatchFailed counts one dispatch failure of a message for d
// (dispatch.DestinationMetrics).
func (m *Metrics) DestinationDispatchFailed(d wire.Destination) {
	if m == nil {
		return
	}
	s := m.dests.series(d)
	m.dests.failures.WithLabelValues(s.Exchange, s.Key).Inc()
}
