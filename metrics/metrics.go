// Package metrics holds the bridge's Prometheus metrics (docs/contract.md §6: GET
// /metrics). Every bridge has its own registry, never the global one, so
// several bridges can run in one process (tests do). All methods are safe for
// concurrent use, and a nil *Metrics is a no-op, so components work without.
package metrics

import (
	"context"
	"math"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/delaybridge/delaybridge/circuit"
	"github.com/delaybridge/delaybridge/internal/buildinfo"
)

const namespace = "delaybridge"

// Error-queue stages, the values of the stage label (wire.StageIngest and
// wire.StageDispatch).
const (
	StageIngest   = "ingest"
	StageDispatch = "dispatch"
)

// Breakers are the breaker label values created (at 0, disarmed) up front, so
// the series exist before anything happens.
var Breakers = []string{"store", "fetch", "dispatch"}

// DropReasons are the values of messages_dropped_total's reason label
// (ingest.DropDuplicate, DropCancelled, DropReplaced): every series exists
// from the start, at zero.
var DropReasons = []string{"duplicate", "cancelled", "replaced"}

// LatenessBuckets run from 0.5 ms to 60 s.
var LatenessBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}

// LatencyBuckets are for store commits and broker confirms: 0.1 ms to 10 s.
var LatencyBuckets = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}

// scrapeTimeout bounds the store reads of one scrape.
const scrapeTimeout = 5 * time.Second

// Metrics is one bridge's set of series on its own registry.
type Metrics struct {
	reg     *prometheus.Registry
	handler http.Handler

	ingested         prometheus.Counter
	dispatched       prometheus.Counter
	dispatchFailures prometheus.Counter
	errorQueued      *prometheus.CounterVec
	duplicates       prometheus.Counter
	dropped          *prometheus.CounterVec
	staleTokens      prometheus.Counter
	scheduleFires    prometheus.Counter
	scheduleMisfires prometheus.Counter

	lateness        prometheus.Histogram
	ingestCommit    prometheus.Histogram
	dispatchConfirm prometheus.Histogram
	pollLease       prometheus.Histogram
	handover        prometheus.Histogram

	breakers *prometheus.GaugeVec
	// foreignBindings counts, per delayed exchange, the bindings on it
	// that are not the bridge's own.
	foreignBindings *prometheus.GaugeVec

	store *storeCollector
	dests *destCollector
	// schedules counts the recurring schedules by state (schedules.go).
	schedules *scheduleCollector
	conns     *connCollector
	blocked   *connCollector

	errorQueueRefusing atomic.Pointer[func() bool]
}

// New returns metrics registered on a new registry of their own, together
// with the Go runtime and process collectors.
func New() *Metrics {
	reg := prometheus.NewRegistry()
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Name: name, Help: help})
	}
	histogram := func(name, help string, buckets []float64) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: namespace, Name: name, Help: help, Buckets: buckets})
	}
	m := &Metrics{
		reg: reg,
		ingested: counter("messages_ingested_total",
			"Messages stored from E.Timeouts (committed; duplicates not included)."),
		dispatched: counter("messages_dispatched_total",
			"Messages forwarded to their destination, confirmed by the broker and removed from the store."),
		dispatchFailures: counter("dispatch_failures_total",
			"Dispatch failures counted against their message: forwards returned as unroutable, nacked or unpublishable, and attempts held back while their destination refuses."),
		errorQueued: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "error_queue_messages_total",
			Help: "Messages moved to the error queue (copy confirmed by the broker), by stage.",
		}, []string{"stage"}),
		duplicates: counter("duplicates_suppressed_total",
			"Messages not stored: redeliveries of a pending send, and sends of an id cancelled within the cancel window."),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "messages_dropped_total",
			Help: "Messages taken in that will not be delivered, by reason: duplicate (a redelivery of a pending send), cancelled (an id cancelled within the cancel window), replaced (removed by a later message of its group).",
		}, []string{"reason"}),
		staleTokens: counter("stale_tokens_total",
			"Dispatcher tokens skipped because their timeout was gone, released, leased again or its lease expired."),
		lateness: histogram("lateness_seconds",
			"Time from a message's due time (or, when later, when it was stored or its retry hold ended) to the broker's confirm of its forward.", LatenessBuckets),
		ingestCommit: histogram("ingest_commit_seconds",
			"Duration of one successful store commit of a batch of incoming messages.", LatencyBuckets),
		dispatchConfirm: histogram("dispatch_confirm_seconds",
			"Time from publishing a forward to the broker's confirm of it.", LatencyBuckets),
		pollLease: histogram("poll_lease_seconds",
			"Duration of one successful lease of due timeouts from the store.", LatencyBuckets),
		handover: histogram("handover_confirm_seconds",
			"Time from publishing a batch of lease tokens to E.TimeoutsDispatcher to the broker's confirm of it.", LatencyBuckets),
		breakers: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Name: "circuit_breaker_state",
			Help: "State of each circuit breaker: 0 disarmed, 1 armed, 2 triggered.",
		}, []string{"breaker"}),
		foreignBindings: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Name: "delayed_exchange_foreign_bindings",
			Help: "Bindings on a delayed exchange other than the bridge's own, at the last check through the management API: each gets every message published to the exchange at once, delays ignored. Absent until a check succeeded.",
		}, []string{"exchange"}),
		scheduleFires: counter("schedule_fires_total",
			"Fires of recurring schedules stored (each forwarded as a message), on-time and catch-up fires alike."),
		scheduleMisfires: counter("schedule_misfires_total",
			"Fire times of recurring schedules missed by more than the misfire threshold: fired late once or skipped, as the schedule's misfire policy says."),
		schedules: newScheduleCollector(),
		store:     newStoreCollector(),
		dests:     newDestCollector(),
		conns: newConnCollector("broker_connected",
			"1 while the broker connection is up, 0 while it is down or reconnecting."),
		blocked: newConnCollector("broker_blocked",
			"1 while the broker blocks the connection's publishes (a memory or disk alarm)."),
	}
	for _, s := range []string{StageIngest, StageDispatch} {
		m.errorQueued.WithLabelValues(s)
	}
	for _, b := range Breakers {
		m.breakers.WithLabelValues(b)
	}
	for _, r := range DropReasons {
		m.dropped.WithLabelValues(r)
	}
	bi := buildinfo.Get()
	buildInfo := prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: namespace, Name: "build_info",
		Help:        "Always 1; the labels name the build (delaybridge version prints the same).",
		ConstLabels: prometheus.Labels{"version": bi.Version, "revision": bi.Revision, "goversion": bi.GoVersion},
	})
	buildInfo.Set(1)
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.ingested, m.dispatched, m.dispatchFailures, m.errorQueued, m.duplicates, m.dropped, m.staleTokens,
		m.lateness, m.ingestCommit, m.dispatchConfirm, m.pollLease, m.handover,
		m.scheduleFires, m.scheduleMisfires, m.schedules,
		m.breakers, m.foreignBindings, m.store, m.dests, m.conns, m.blocked, buildInfo,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: namespace, Name: "error_queue_refusing",
			Help: "1 while the error queue refuses copies (returned or nacked: deleted and not declarable, or full); 0 otherwise.",
		}, func() float64 {
			if f := m.errorQueueRefusing.Load(); f != nil && (*f)() {
				return 1
			}
			return 0
		}),
	)
	// A scrape that cannot read the store still serves everything else.
	m.handler = promhttp.InstrumentMetricHandler(reg, promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		ErrorHandling: promhttp.ContinueOnError,
		Registry:      reg,
	}))
	return m
}

// Registry is the registry the metrics are on (nil for nil metrics).
func (m *Metrics) Registry() *prometheus.Registry {
	if m == nil {
		return nil
	}
	return m.reg
}

// Handler serves the registry in the Prometheus exposition formats (nil for
// nil metrics).
func (m *Metrics) Handler() http.Handler {
	if m == nil {
		return nil
	}
	return m.handler
}

// WatchStore has every scrape report delaybridge_pending and
// delaybridge_leased from stats, and delaybridge_next_due_seconds from
// nextDue against now. Either function may be nil; a series whose read fails
// is left out of that scrape.
func (m *Metrics) WatchStore(stats func(context.Context) (pending, leased int, err error),
	nextDue func(context.Context) (time.Time, bool, error), now func() time.Time) {
	if m == nil {
		return
	}
	if now == nil {
		now = time.Now
	}
	m.store.mu.Lock()
	m.store.stats, m.store.nextDue, m.store.now = stats, nextDue, now
	m.store.mu.Unlock()
}

// WatchConnection has every scrape report
// delaybridge_broker_connected{connection=name} from connected.
func (m *Metrics) WatchConnection(name string, connected func() bool) {
	if m == nil {
		return
	}
	m.conns.mu.Lock()
	m.conns.funcs[name] = connected
	m.conns.mu.Unlock()
}

// WatchBlocked has every scrape report
// delaybridge_broker_blocked{connection=name} from blocked.
func (m *Metrics) WatchBlocked(name string, blocked func() bool) {
	if m == nil {
		return
	}
	m.blocked.mu.Lock()
	m.blocked.funcs[name] = blocked
	m.blocked.mu.Unlock()
}

// WatchErrorQueue has every scrape report delaybridge_error_queue_refusing
// from refusing.
func (m *Metrics) WatchErrorQueue(refusing func() bool) {
	if m == nil {
		return
	}
	m.errorQueueRefusing.Store(&refusing)
}

// Ingested counts n messages committed to the store.
func (m *Metrics) Ingested(n int) {
	if m == nil || n <= 0 {
		return
	}
	m.ingested.Add(float64(n))
}

// DuplicatesSuppressed counts n messages not stored: redeliveries of a
// pending send and sends of a cancelled id.
func (m *Metrics) DuplicatesSuppressed(n int) {
	if m == nil || n <= 0 {
		return
	}
	m.duplicates.Add(float64(n))
}

// Dropped counts n messages taken in that will not be delivered, for
// reason (one of DropReasons).
func (m *Metrics) Dropped(reason string, n int) {
	if m == nil || n <= 0 {
		return
	}
	m.dropped.WithLabelValues(reason).Add(float64(n))
}

// ErrorQueued counts n messages whose error-queue copy the broker confirmed;
// stage is StageIngest or StageDispatch.
func (m *Metrics) ErrorQueued(stage string, n int) {
	if m == nil || n <= 0 {
		return
	}
	m.errorQueued.WithLabelValues(stage).Add(float64(n))
}

// Dispatched counts n messages forwarded, confirmed and removed.
func (m *Metrics) Dispatched(n int) {
	if m == nil || n <= 0 {
		return
	}
	m.dispatched.Add(float64(n))
}

// DispatchFailed counts one dispatch failure counted against its message.
func (m *Metrics) DispatchFailed() {
	if m == nil {
		return
	}
	m.dispatchFailures.Inc()
}

// StaleToken counts one dispatcher token skipped as stale.
func (m *Metrics) StaleToken() {
	if m == nil {
		return
	}
	m.staleTokens.Inc()
}

// ObserveLateness records how long after its due time a forward was confirmed.
func (m *Metrics) ObserveLateness(d time.Duration) {
	if m == nil {
		return
	}
	m.lateness.Observe(d.Seconds())
}

// ObserveIngestCommit records the duration of one successful ingest commit.
func (m *Metrics) ObserveIngestCommit(d time.Duration) {
	if m == nil {
		return
	}
	m.ingestCommit.Observe(d.Seconds())
}

// ObserveDispatchConfirm records the time from publishing one forward to its
// confirm.
func (m *Metrics) ObserveDispatchConfirm(d time.Duration) {
	if m == nil {
		return
	}
	m.dispatchConfirm.Observe(d.Seconds())
}

// ObservePollLease records the duration of one successful lease.
func (m *Metrics) ObservePollLease(d time.Duration) {
	if m == nil {
		return
	}
	m.pollLease.Observe(d.Seconds())
}

// BreakerState sets delaybridge_circuit_breaker_state{breaker=name}.
func (m *Metrics) BreakerState(name string, s circuit.State) {
	if m == nil {
		return
	}
	m.breakers.WithLabelValues(name).Set(float64(s))
}

// ForeignBindings sets delaybridge_delayed_exchange_foreign_bindings{exchange}.
func (m *Metrics) ForeignBindings(exchange string, n int) {
	if m == nil {
		return
	}
	m.foreignBindings.WithLabelValues(exchange).Set(float64(n))
}

// storeCollector reads the store's counts and next due time at scrape time.
type storeCollector struct {
	pending, leased, nextDueDesc *prometheus.Desc

	mu      sync.Mutex
	stats   func(context.Context) (int, int, error)
	nextDue func(context.Context) (time.Time, bool, error)
	now     func() time.Time
}

func newStoreCollector() *storeCollector {
	return &storeCollector{
		pending: prometheus.NewDesc(namespace+"_pending",
			"Messages in the store waiting to be forwarded, leased ones included.", nil, nil),
		leased: prometheus.NewDesc(namespace+"_leased",
			"Messages in the store currently leased to the dispatcher.", nil, nil),
		nextDueDesc: prometheus.NewDesc(namespace+"_next_due_seconds",
			"Seconds until the store's next row becomes leasable (due time, retry time or lease expiry); "+
				"negative when overdue, absent when nothing is pending.", nil, nil),
	}
}

func (c *storeCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.pending
	ch <- c.leased
	ch <- c.nextDueDesc
}

func (c *storeCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	stats, nextDue, now := c.stats, c.nextDue, c.now
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
	defer cancel()
	// A failed read (a closed store during shutdown, say) leaves the series
	// out of this scrape rather than failing it or reporting a wrong zero.
	if stats != nil {
		if pending, leased, err := stats(ctx); err == nil {
			ch <- prometheus.MustNewConstMetric(c.pending, prometheus.GaugeValue, float64(pending))
			ch <- prometheus.MustNewConstMetric(c.leased, prometheus.GaugeValue, float64(leased))
		}
	}
	if nextDue != nil {
		if at, ok, err := nextDue(ctx); err == nil && ok {
			secs := at.Sub(now()).Seconds()
			if !math.IsNaN(secs) {
				ch <- prometheus.MustNewConstMetric(c.nextDueDesc, prometheus.GaugeValue, secs)
			}
		}
	}
}

// connCollector reports whether each broker connection is up.
type connCollector struct {
	desc  *prometheus.Desc
	mu    sync.Mutex
	funcs map[string]func() bool
}

func newConnCollector(name, help string) *connCollector {
	return &connCollector{
		desc:  prometheus.NewDesc(namespace+"_"+name, help, []string{"connection"}, nil),
		funcs: map[string]func() bool{},
	}
}

func (c *connCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *connCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	funcs := make(map[string]func() bool, len(c.funcs))
	for k, f := range c.funcs {
		funcs[k] = f
	}
	c.mu.Unlock()
	for name, connected := range funcs {
		v := 0.0
		if connected != nil && connected() {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, v, name)
	}
}

// ObserveHandover records the time from publishing one batch of lease tokens
// to the dispatcher queue to the broker's confirm of it.
func (m *Metrics) ObserveHandover(d time.Duration) {
	if m == nil {
		return
	}
	m.handover.Observe(d.Seconds())
}
