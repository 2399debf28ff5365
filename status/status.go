// Package status serves the bridge's human status page at GET /: pending and
// leased counts, the next due time, throughput and lateness of the last
// minutes, breaker and broker state, and the next due messages. The page is
// rendered on the server with html/template (everything escaped; message ids
// and destinations are user data), needs no JavaScript and no build step, and
// never shows message bodies or headers.
package status

import (
	"bytes"
	"context"
	"html/template"
	"math"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/delaybridge/delaybridge/storage"
)

// Metric names read from the Gatherer.
const (
	metricIngested   = "delaybridge_messages_ingested_total"
	metricDispatched = "delaybridge_messages_dispatched_total"
	metricFailures   = "delaybridge_dispatch_failures_total"
	metricErrorQueue = "delaybridge_error_queue_messages_total"
	metricLateness   = "delaybridge_lateness_seconds"
	metricBreaker    = "delaybridge_circuit_breaker_state"
	metricConnected  = "delaybridge_broker_connected"
)

const (
	// SampleInterval is how often Run samples the counters; page requests
	// also sample, at most this often.
	SampleInterval = 10 * time.Second
	// Minutes is how many one-minute rows the throughput table shows.
	Minutes = 5
	// NextDueRows is how many of the next due messages the page lists.
	NextDueRows = 10
	// readTimeout bounds the store reads of one page.
	readTimeout = 5 * time.Second
	// keep is how long samples are kept.
	keep = (Minutes + 1) * time.Minute
)

// Options feed the page. Every field is optional; a missing source leaves its
// part of the page out (or shows it as unknown).
type Options struct {
	// Endpoint is shown in the title (the bridge's DELAYBRIDGE_ENDPOINT).
	Endpoint string
	// Stats returns the pending (leased included) and leased counts.
	Stats func(ctx context.Context) (pending, leased int, err error)
	// NextDue returns when the store's next row becomes leasable.
	NextDue func(ctx context.Context) (at time.Time, ok bool, err error)
	// NextDueMessages returns up to n pending timeouts in due order (their
	// Message is never shown; storage.Store.List leaves it out).
	NextDueMessages func(ctx context.Context, n int) ([]storage.Timeout, error)
	// Breakers returns each circuit breaker's state by name ("disarmed",
	// "armed", "triggered"). Nil: read delaybridge_circuit_breaker_state
	// from Gatherer.
	Breakers func() map[string]string
	// Broker returns whether each broker connection is up. Nil: read
	// delaybridge_broker_connected from Gatherer.
	Broker func() map[string]bool
	// Gatherer is the bridge's registry; its counters and lateness histogram
	// give throughput and lateness.
	Gatherer prometheus.Gatherer
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Refresh, when positive, makes browsers reload the page this often.
	Refresh time.Duration
}

// Handler serves the status page. Create it with New; call Run to sample the
// counters in the background (without Run it samples only when the page is
// requested).
type Handler struct {
	opts Options

	mu      sync.Mutex
	samples []sample // oldest first
}

type sample struct {
	at                    time.Time
	ingested, dispatched  float64
	failures, errorQueued float64
	latSum, latCount      float64
}

// New returns the handler for opts.
func New(opts Options) *Handler {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Handler{opts: opts}
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
	ok        bool
}

func (h *Handler) gather() gathered {
	g := gathered{breakers: map[string]string{}, connected: map[string]bool{}}
	g.at = h.opts.Now()
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
		case metricLateness:
			for _, m := range mf.GetMetric() {
				if hh := m.GetHistogram(); hh != nil {
					g.latSum += hh.GetSampleSum()
					g.latCount += float64(hh.GetSampleCount())
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
		}
	}
	return g
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
	for cut < len(h.samples) && g.at.Sub(h.samples[cut].at) > keep {
		cut++
	}
	h.samples = append(h.samples[:0], h.samples[cut:]...)
	return g
}

// Minute is one row of the throughput table.
type Minute struct {
	Label                      string
	Known                      bool // false: no samples cover this minute yet
	Ingested, Dispatched       float64
	Failures, ErrorQueued      float64
	MeanLateness               time.Duration
	HasLateness                bool
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
		if dc := last.latCount - first.latCount; dc > 0 {
			r.HasLateness = true
			r.MeanLateness = time.Duration((last.latSum - first.latSum) / dc * float64(time.Second))
		}
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

// Row is one of the next due messages. Destination is the queue's name, or
// the exchange and routing key worded by wire.Destination.String.
type Row struct {
	ID, Destination string
	DueAt           string
	In              string
	Overdue         bool
	Leased          bool
	// Paused: its destination is paused (storage.Pauser), so it is held
	// past its due time; being past due is then no problem to flag.
	Paused    bool
	Attempts  int
	LastError string
}

// Named is a name with a state, for breakers and connections.
type Named struct {
	Name, State string
	OK, Bad     bool
}

// page is the template's data.
type page struct {
	Endpoint     string
	Now          string
	RefreshSecs  int
	Healthy      bool
	Problems     []string
	HaveStats    bool
	Pending      int
	Leased       int
	StatsErr     string
	NextDue      string
	NextDueAt    string
	NextDueErr   string
	Overdue      bool
	Breakers     []Named
	Connections  []Named
	HaveRates    bool
	Minutes      []Minute
	Totals       Minute // cumulative counts since start (Ingested, Dispatched, Failures, ErrorQueued)
	MeanLateness string
	Rows         []Row
	RowsErr      string
}

// ServeHTTP renders the page.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), readTimeout)
	defer cancel()
	o := h.opts
	g := h.sample(false)
	now := g.at
	p := page{Endpoint: o.Endpoint, Now: now.UTC().Format("2006-01-02 15:04:05 MST"), Healthy: true}
	if o.Refresh > 0 {
		p.RefreshSecs = max(1, int(o.Refresh/time.Second))
	}
	if o.Stats != nil {
		if pending, leased, err := o.Stats(ctx); err != nil {
			p.StatsErr = err.Error()
			p.Problems = append(p.Problems, "store counts unavailable")
		} else {
			p.HaveStats, p.Pending, p.Leased = true, pending, leased
		}
	}
	if o.NextDue != nil {
		switch at, ok, err := o.NextDue(ctx); {
		case err != nil:
			p.NextDueErr = err.Error()
		case !ok:
			p.NextDue = "nothing pending"
		default:
			p.NextDue, p.Overdue = relative(at, now)
			p.NextDueAt = at.UTC().Format(time.RFC3339Nano)
		}
	}

	breakers := g.breakers
	if o.Breakers != nil {
		breakers = o.Breakers()
	}
	for _, name := range sortedKeys(breakers) {
		s := breakers[name]
		p.Breakers = append(p.Breakers, Named{Name: name, State: s, OK: s == "disarmed", Bad: s == "triggered"})
		if s == "triggered" {
			p.Problems = append(p.Problems, "breaker "+name+" triggered")
		}
	}
	conns := g.connected
	if o.Broker != nil {
		conns = o.Broker()
	}
	for _, name := range sortedKeys(conns) {
		n := Named{Name: name, State: "connected", OK: true}
		if !conns[name] {
			n = Named{Name: name, State: "disconnected", Bad: true}
			p.Problems = append(p.Problems, name+" connection down")
		}
		p.Connections = append(p.Connections, n)
	}

	if g.ok {
		h.mu.Lock()
		samples := append([]sample(nil), h.samples...)
		h.mu.Unlock()
		// The current values count as a sample for the newest minute.
		if n := len(samples); n == 0 || g.at.After(samples[n-1].at) {
			samples = append(samples, g.sample)
		}
		p.HaveRates = true
		p.Minutes = minutes(samples, now)
		p.Totals = Minute{Ingested: g.ingested, Dispatched: g.dispatched, Failures: g.failures, ErrorQueued: g.errorQueued}
		if g.latCount > 0 {
			p.MeanLateness = fmtDur(time.Duration(g.latSum / g.latCount * float64(time.Second)))
		}
	}

	if o.NextDueMessages != nil {
		ts, err := o.NextDueMessages(ctx, NextDueRows)
		if err != nil {
			p.RowsErr = err.Error()
		}
		for _, t := range ts {
			in, overdue := relative(t.DueAt, now)
			if t.NotBefore.After(now) { // held back for a retry
				in, overdue = "retry in "+fmtDur(t.NotBefore.Sub(now)), false
			}
			if t.Paused {
				overdue = false
			}
			p.Rows = append(p.Rows, Row{
				ID: t.ID, Destination: t.Dest().String(), DueAt: t.DueAt.UTC().Format("2006-01-02 15:04:05.000"),
				In: in, Overdue: overdue, Leased: t.Lock != "" && t.LockExpiresAt.After(now), Paused: t.Paused,
				Attempts: t.Attempts, LastError: truncate(t.LastError, 120),
			})
		}
	}
	p.Healthy = len(p.Problems) == 0

	h.render(w, p)
}

func (h *Handler) render(w http.ResponseWriter, p page) {
	var buf bytes.Buffer
	if err := tmpl.Execute(&buf, p); err != nil {
		http.Error(w, "status page: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'")
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
	"dur": fmtDur,
	"int": func(v float64) string { return trimFloat(v, 0) },
}).Parse(pageHTML))

func trimFloat(v float64, prec int) string {
	return strconv.FormatFloat(v, 'f', prec, 64)
}
