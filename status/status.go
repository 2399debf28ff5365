// Package status serves the bridge's human status page at GET /: an honest
// health badge with the problems that make it so (dispatch failing, messages
// overdue, the error queue growing, a breaker armed or triggered, a broker
// connection down), per-destination counts and rates, the error queue's
// depth and newest copies, lateness percentiles, the instance and its build,
// throughput by minute, and the pending messages, searchable and paged. With
// an admin token configured, an operator who logs in with it can cancel or
// dispatch a message now and replay an error copy from the page (actions.go).
//
// The page is rendered on the server with html/template (everything escaped;
// message ids, destinations and reasons are user data), needs no JavaScript
// and no build step, and never shows message bodies or headers.
package status

import (
	"bytes"
	"context"
	"html/template"
	"math"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/wire"
)

// Metric names read from the Gatherer.
const (
	metricIngested       = "delaybridge_messages_ingested_total"
	metricDispatched     = "delaybridge_messages_dispatched_total"
	metricFailures       = "delaybridge_dispatch_failures_total"
	metricErrorQueue     = "delaybridge_error_queue_messages_total"
	metricDropped        = "delaybridge_messages_dropped_total"
	metricLateness       = "delaybridge_lateness_seconds"
	metricBreaker        = "delaybridge_circuit_breaker_state"
	metricConnected      = "delaybridge_broker_connected"
	metricDestPending    = "delaybridge_destination_pending"
	metricDestDueSoon    = "delaybridge_destination_due_soon"
	metricDestDispatched = "delaybridge_destination_dispatched_total"
	metricDestFailures   = "delaybridge_destination_dispatch_failures_total"
)

const (
	// SampleInterval is how often Run samples the counters; page requests
	// also sample, at most this often.
	SampleInterval = 10 * time.Second
	// Minutes is how many one-minute rows the throughput table shows.
	Minutes = 5
	// DefaultWindow is the recent window of the health checks, the
	// per-destination rates and the lateness percentiles.
	DefaultWindow = 5 * time.Minute
	// DefaultOverdueAfter is how far past its due time a pending message
	// must be to count as overdue.
	DefaultOverdueAfter = time.Minute
	// PageRows is how many pending messages one page of the list shows.
	PageRows = 25
	// ErrorRows is how many of the error queue's newest copies the page
	// shows, and MoreErrorRows how many its "more" link shows.
	ErrorRows, MoreErrorRows = 5, 100
	// ErrorQueueInterval is the least time between two reads of the error
	// queue: each read takes its messages off the queue until it puts them
	// back (admin/errors.go), so a page reloading every few seconds must
	// not read it each time.
	ErrorQueueInterval = 30 * time.Second
	// readTimeout bounds the store reads of one page.
	readTimeout = 5 * time.Second
	// errorQueueTimeout bounds a read of the error queue (a connection of
	// its own and a pass over up to 1000 messages), and errorQueueWait how
	// long a page waits for one before it shows the previous result.
	errorQueueTimeout, errorQueueWait = 30 * time.Second, 3 * time.Second
	// overdueCountLimit bounds the count of overdue messages.
	overdueCountLimit = 1000
)

// Options feed the page. Every field is optional; a missing source leaves its
// part of the page out (or shows it as unknown).
type Options struct {
	// Endpoint is shown in the title (the bridge's DELAYBRIDGE_ENDPOINT).
	Endpoint string
	// Instance names this process and its build.
	Instance Instance
	// Stats returns the pending (leased included) and leased counts.
	Stats func(ctx context.Context) (pending, leased int, err error)
	// NextDue returns when the store's next row becomes leasable.
	NextDue func(ctx context.Context) (at time.Time, ok bool, err error)
	// List is the store's List (rows without their Message): the pending
	// messages' table, its search and paging, and the overdue count.
	List func(ctx context.Context, f storage.ListFilter) ([]storage.Timeout, string, error)
	// Schedules is the store's ListSchedules (storage.Scheduler): the
	// recurring schedules section (schedules.go). Nil: no section.
	Schedules func(ctx context.Context, after string, limit int) ([]storage.Schedule, string, error)
	// ErrorQueue reads this endpoint's copies on the error queue; asked at
	// most once per ErrorQueueInterval.
	ErrorQueue func(ctx context.Context) (ErrorQueue, error)
	// Breakers returns each circuit breaker's state by name ("disarmed",
	// "armed", "triggered"). Nil: read delaybridge_circuit_breaker_state
	// from Gatherer.
	Breakers func() map[string]string
	// Broker returns whether each broker connection is up. Nil: read
	// delaybridge_broker_connected from Gatherer.
	Broker func() map[string]bool
	// Problems returns further reasons the badge is not green, found
	// outside the page's own sources (foreign bindings on a delayed
	// exchange); nil: none.
	Problems func() []Problem
	// Gatherer is the bridge's registry; its counters, per-destination
	// series and lateness histogram give rates, counts and lateness.
	Gatherer prometheus.Gatherer
	// Window is the recent window of the health checks and rates;
	// DefaultWindow when zero. OverdueAfter: DefaultOverdueAfter when zero.
	Window, OverdueAfter time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Refresh, when positive, makes browsers reload the page this often
	// (not while searching or paging, nor while logged in).
	Refresh time.Duration

	// Token is the admin token (DELAYBRIDGE_ADMIN_TOKEN). Empty: the page
	// offers no actions, as the admin API is then disabled.
	Token string
	// Actions are the admin API's operations the page's forms call.
	Actions Actions
	// Log records the actions taken (never the token); nil: none.
	Log func(action, id, outcome string)
}

// Instance names the process: the bridge's owner name (the lock tokens'
// prefix), its host, its build and when it started.
type Instance struct {
	Owner, Hostname   string
	Version, Revision string
	Started           time.Time
}

// ErrorQueue is what a read of the error queue found: Depth copies of this
// endpoint (at least, when Partial: the read stopped before the end of the
// queue) and the newest of them, newest first.
type ErrorQueue struct {
	Depth   int
	Partial bool
	Newest  []ErrorEntry
}

// ErrorEntry is one copy on the error queue.
type ErrorEntry struct {
	ID, Destination, Stage, Reason string
	FailedAt                       time.Time
}

// Handler serves the status page and its actions. Create it with New; call
// Run to sample the counters in the background (without Run it samples only
// when the page is requested).
type Handler struct {
	opts Options
	mux  *http.ServeMux

	mu      sync.Mutex
	samples []sample // oldest first

	errMu   sync.Mutex
	errAt   time.Time     // when the last read started; zero: never
	errDone time.Time     // when it ended; zero: not yet
	errBusy chan struct{} // closes when the read under way ends; nil: none
	errLast ErrorQueue
	errErr  error

	refusedMu     sync.Mutex
	refused       int       // refused logins not yet logged
	refusedLogged time.Time // when they were last logged
}

type sample struct {
	at                    time.Time
	ingested, dispatched  float64
	failures, errorQueued float64
	dropped               float64
	latSum, latCount      float64
	// latBuckets are the lateness histogram's cumulative bucket counts, by
	// upper bound (latBounds, ascending; the +Inf bucket is latCount).
	latBounds, latBuckets []float64
	// dests are the per-destination counters.
	dests map[wire.Destination]destCounters
}

type destCounters struct{ dispatched, failures float64 }

// Dropped is how many messages were taken in and not stored, for one
// reason (the reason label of delaybridge_messages_dropped_total).
type Dropped struct {
	Reason string
	Count  float64
}

// New returns the handler for opts.
func New(opts Options) *Handler {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Window <= 0 {
		opts.Window = DefaultWindow
	}
	if opts.OverdueAfter <= 0 {
		opts.OverdueAfter = DefaultOverdueAfter
	}
	h := &Handler{opts: opts, mux: http.NewServeMux()}
	h.mux.HandleFunc("GET /{$}", h.page)
	h.routeActions()
	return h
}

// keep is how long samples are kept: the throughput table's minutes and the
// window, whichever is longer.
func (h *Handler) keep() time.Duration {
	return max((Minutes+1)*time.Minute, h.opts.Window+SampleInterval)
}

// Run samples the counters every SampleInterval until ctx ends.
func (h *Handler) Run(ctx context.Context) error {
	t := time.NewTicker(SampleInterval)
	defer t.Stop()
	h.sample(false)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			h.sample(false)
		}
	}
}

// gathered is what one Gather yields.
type gathered struct {
	sample
	breakers  map[string]string
	connected map[string]bool
	// pending and dueSoon are the per-destination gauges.
	pending, dueSoon map[wire.Destination]float64
	// droppedBy are the dropped messages since start, by reason.
	droppedBy []Dropped
	ok        bool
}

func (h *Handler) gather() gathered {
	g := gathered{breakers: map[string]string{}, connected: map[string]bool{},
		pending: map[wire.Destination]float64{}, dueSoon: map[wire.Destination]float64{}}
	g.at = h.opts.Now()
	g.dests = map[wire.Destination]destCounters{}
	if h.opts.Gatherer == nil {
		return g
	}
	mfs, err := h.opts.Gatherer.Gather()
	if err != nil && len(mfs) == 0 {
		return g
	}
	g.ok = true
	for _, mf := range mfs {
		switch mf.GetName() {
		case metricIngested:
			g.ingested = sumCounter(mf)
		case metricDispatched:
			g.dispatched = sumCounter(mf)
		case metricFailures:
			g.failures = sumCounter(mf)
		case metricErrorQueue:
			g.errorQueued = sumCounter(mf)
		case metricDropped:
			g.dropped = sumCounter(mf)
			for _, m := range mf.GetMetric() {
				g.droppedBy = append(g.droppedBy, Dropped{Reason: label(m, "reason"), Count: m.GetCounter().GetValue()})
			}
		case metricLateness:
			for _, m := range mf.GetMetric() {
				hh := m.GetHistogram()
				if hh == nil {
					continue
				}
				g.latSum += hh.GetSampleSum()
				g.latCount += float64(hh.GetSampleCount())
				if g.latBounds == nil {
					for _, b := range hh.GetBucket() {
						if !math.IsInf(b.GetUpperBound(), 1) {
							g.latBounds = append(g.latBounds, b.GetUpperBound())
						}
					}
					g.latBuckets = make([]float64, len(g.latBounds))
				}
				for i, b := range hh.GetBucket() {
					if i < len(g.latBuckets) && b.GetUpperBound() == g.latBounds[i] {
						g.latBuckets[i] += float64(b.GetCumulativeCount())
					}
				}
			}
		case metricBreaker:
			for _, m := range mf.GetMetric() {
				g.breakers[label(m, "breaker")] = breakerState(m.GetGauge().GetValue())
			}
		case metricConnected:
			for _, m := range mf.GetMetric() {
				g.connected[label(m, "connection")] = m.GetGauge().GetValue() == 1
			}
		case metricDestPending, metricDestDueSoon:
			into := g.pending
			if mf.GetName() == metricDestDueSoon {
				into = g.dueSoon
			}
			for _, m := range mf.GetMetric() {
				into[destOf(m)] = m.GetGauge().GetValue()
			}
		case metricDestDispatched, metricDestFailures:
			for _, m := range mf.GetMetric() {
				d := destOf(m)
				c := g.dests[d]
				if mf.GetName() == metricDestDispatched {
					c.dispatched = m.GetCounter().GetValue()
				} else {
					c.failures = m.GetCounter().GetValue()
				}
				g.dests[d] = c
			}
		}
	}
	return g
}

// destOf reads a per-destination series' labels (metrics/destinations.go):
// both empty is the overflow series past the cap.
func destOf(m *dto.Metric) wire.Destination {
	return wire.Destination{Exchange: label(m, "exchange"), Key: label(m, "destination")}
}

func sumCounter(mf *dto.MetricFamily) float64 {
	var v float64
	for _, m := range mf.GetMetric() {
		v += m.GetCounter().GetValue()
	}
	return v
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

func breakerState(v float64) string {
	switch v {
	case 0:
		return "disarmed"
	case 1:
		return "armed"
	case 2:
		return "triggered"
	}
	return "unknown"
}

// sample records the counters (unless the latest sample is younger than
// SampleInterval and force is false) and returns the gathered values.
func (h *Handler) sample(force bool) gathered {
	g := h.gather()
	if !g.ok {
		return g
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	n := len(h.samples)
	if force || n == 0 || g.at.Sub(h.samples[n-1].at) >= SampleInterval || g.at.Before(h.samples[n-1].at) {
		h.samples = append(h.samples, g.sample)
	}
	cut := 0
	for cut < len(h.samples) && g.at.Sub(h.samples[cut].at) > h.keep() {
		cut++
	}
	h.samples = append(h.samples[:0], h.samples[cut:]...)
	return g
}

// Minute is one row of the throughput table.
type Minute struct {
	Label                 string
	Known                 bool // false: no samples cover this minute yet
	Ingested, Dispatched  float64
	Failures, ErrorQueued float64
	// Dropped: taken in and not to be delivered (a redelivery of a
	// pending send, a cancelled id, a replaced group).
	Dropped                    float64
	Lateness                   Percentiles
	IngestedBar, DispatchedBar int // 0-100, relative to the busiest minute
}

// minutes computes per-minute rates over the samples, newest first. A minute
// partly covered by samples is scaled up to a full minute.
func minutes(samples []sample, now time.Time) []Minute {
	rows := make([]Minute, Minutes)
	for k := range rows {
		end := now.Add(-time.Duration(k) * time.Minute)
		start := end.Add(-time.Minute)
		r := &rows[k]
		if k == 0 {
			r.Label = "last minute"
		} else {
			r.Label = strconv.Itoa(k) + "–" + strconv.Itoa(k+1) + " min ago"
		}
		var first, last *sample
		for i := range samples {
			s := &samples[i]
			if s.at.Before(start) || s.at.After(end) {
				continue
			}
			if first == nil {
				first = s
			}
			last = s
		}
		// Extend back to the sample just before the minute when there is
		// one, so adjacent minutes share their boundary sample.
		for i := len(samples) - 1; i >= 0; i-- {
			if samples[i].at.Before(start) {
				if first == nil || first.at.Sub(samples[i].at) <= 2*SampleInterval {
					first = &samples[i]
				}
				break
			}
		}
		if first == nil || last == nil || !last.at.After(first.at) {
			continue
		}
		span := last.at.Sub(first.at).Seconds()
		scale := 60 / span // per minute
		r.Known = true
		if span < 55 {
			r.Label += " (" + strconv.Itoa(int(math.Round(span))) + " s sampled)"
		}
		r.Ingested = nonNeg(last.ingested-first.ingested) * scale
		r.Dispatched = nonNeg(last.dispatched-first.dispatched) * scale
		r.Failures = nonNeg(last.failures-first.failures) * scale
		r.ErrorQueued = nonNeg(last.errorQueued-first.errorQueued) * scale
		r.Dropped = nonNeg(last.dropped-first.dropped) * scale
		r.Lateness = latenessBetween(first, last)
	}
	var maxRate float64
	for _, r := range rows {
		maxRate = max(maxRate, r.Ingested, r.Dispatched)
	}
	if maxRate > 0 {
		for i := range rows {
			rows[i].IngestedBar = int(rows[i].Ingested / maxRate * 100)
			rows[i].DispatchedBar = int(rows[i].Dispatched / maxRate * 100)
		}
	}
	return rows
}

func nonNeg(v float64) float64 {
	if v < 0 { // a counter reset (a new registry)
		return 0
	}
	return v
}

// Named is a name with a state, for breakers and connections.
type Named struct {
	Name, State string
	OK, Bad     bool
}

// Problem is one reason the badge is not green.
type Problem struct {
	Name   string // short, stable: "dispatch failing", "messages overdue", …
	Detail string
}

// ServeHTTP serves the page and its actions.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.mux.ServeHTTP(w, r)
}

func (h *Handler) render(w http.ResponseWriter, p *page) {
	var buf bytes.Buffer
	if err := tmpl.Execute(&buf, p); err != nil {
		http.Error(w, "status page: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("X-Frame-Options", "DENY")
	w.Header().Set("Referrer-Policy", "same-origin")
	// No script at all; forms post to this origin only; no framing.
	w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	_, _ = w.Write(buf.Bytes())
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// relative words when at is from now: "in 4m2s" or "3.2s overdue".
func relative(at, now time.Time) (string, bool) {
	if at.Before(now) {
		return span(at, now) + " overdue", true
	}
	return "in " + span(now, at), false
}

// span words the time from a to b (a ≤ b). Due times reach years 0000 and
// 2262, further apart than a time.Duration holds (b.Sub(a) saturates at
// about 292 years, and negating the lowest Duration overflows), so spans of
// a year or more are counted in calendar years and days.
func span(a, b time.Time) string {
	years := b.Year() - a.Year()
	if a.AddDate(years, 0, 0).After(b) {
		years--
	}
	if years < 1 {
		return fmtDur(b.Sub(a))
	}
	days := int(b.Sub(a.AddDate(years, 0, 0)) / (24 * time.Hour))
	return strconv.Itoa(years) + "y " + strconv.Itoa(days) + "d"
}

// fmtDur rounds a duration for people.
func fmtDur(d time.Duration) string {
	switch {
	case d < time.Millisecond:
		return d.Round(time.Microsecond).String()
	case d < time.Second:
		return d.Round(100 * time.Microsecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	case d < 24*time.Hour:
		s := d.Round(time.Second).String()
		if strings.HasSuffix(s, "m0s") {
			s = strings.TrimSuffix(s, "0s") // 1h0m, 5m
		}
		return s
	}
	days := int(d / (24 * time.Hour))
	rest := (d % (24 * time.Hour)).Round(time.Minute)
	return strconv.Itoa(days) + "d " + rest.String()
}

func truncate(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n]) + "…"
}

var tmpl = template.Must(template.New("status").Funcs(template.FuncMap{
	"rate": func(v float64) string {
		switch {
		case v == 0:
			return "0"
		case v < 10:
			return trimFloat(v, 1)
		}
		return trimFloat(v, 0)
	},
	"dur":  fmtDur,
	"int":  func(v float64) string { return trimFloat(v, 0) },
	"path": url.PathEscape,
}).Parse(pageHTML))

func trimFloat(v float64, prec int) string {
	return strconv.FormatFloat(v, 'f', prec, 64)
}
