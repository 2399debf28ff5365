package status

import (
	"cmp"
	"context"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"time"

	"github.com/delaybridge/delaybridge/admin"
	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/wire"
)

// page is the template's data.
type page struct {
	Endpoint    string
	Now         string
	RefreshSecs int
	Healthy     bool
	Problems    []Problem
	Instance    instanceView
	HaveStats   bool
	Pending     int
	Leased      int
	StatsErr    string
	NextDue     string
	NextDueAt   string
	NextDueErr  string
	Overdue     bool
	Breakers    []Named
	Connections []Named
	Window      string

	HaveRates bool
	Minutes   []Minute
	Totals    Minute // cumulative counts since start
	// DroppedBy: messages taken in and not stored since start, by reason.
	DroppedBy    []Dropped
	Lateness     Percentiles
	Destinations []DestRow
	DestCapped   bool

	HaveErrorQueue bool
	ErrorQueue     ErrorQueue
	ErrorsShown    []ErrorEntry
	ErrorsAt       string
	ErrorsErr      string
	MoreErrors     string // the link to more copies; "" when all are shown

	Search     search
	Rows       []Row
	RowsErr    string
	NextPage   string
	FirstPage  string
	HaveSearch bool

	HaveSchedules bool
	Schedules     []ScheduleRow
	SchedulesErr  string
	SchedulesMore string

	Session session
}

// instanceView is Instance worded for the page.
type instanceView struct {
	Owner, Hostname, Version, Revision, Uptime, Started string
}

// DestRow is one destination in the per-destination table.
type DestRow struct {
	Name                 string
	Overflow             bool // the destinations past the metrics' cap, summed
	Pending, DueSoon     float64
	HaveCounts           bool
	Dispatched, Failures float64 // in the window
	DispatchedRate       float64 // per minute
	FailureRate          float64
	Failing              bool
}

// Row is one pending message. Destination is the queue's name, or the
// exchange and routing key worded by wire.Destination.String.
type Row struct {
	ID, Destination string
	// Send is 2, 3, ... for a later send of an id of which more than one
	// is pending (docs/contract.md §2.4), 0 otherwise. The actions act on
	// every send of the id.
	Send    int
	DueAt   string
	In      string
	Overdue bool
	// State is "dispatching" (leased), "retrying" (failed, held back for
	// its next attempt), "failing" (failed, due again), "overdue" or
	// "waiting"; Class its badge's colour.
	State, Class string
	Attempts     int
	LastError    string
}

// search is the pending list's query, as the form shows it.
type search struct {
	IDPrefix, Destination, Exchange, RoutingKey, DueFrom, DueTo string
	Cursor                                                      string
	Err                                                         string
	Active                                                      bool // a filter or a page past the first
}

func (h *Handler) page(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), readTimeout)
	defer cancel()
	o := h.opts
	g := h.sample(false)
	now := g.at
	p := &page{Endpoint: o.Endpoint, Now: now.UTC().Format("2006-01-02 15:04:05 MST"), Window: fmtDur(o.Window)}
	p.Instance = instanceView{Owner: o.Instance.Owner, Hostname: o.Instance.Hostname,
		Version: o.Instance.Version, Revision: o.Instance.Revision}
	if !o.Instance.Started.IsZero() {
		p.Instance.Uptime = fmtDur(now.Sub(o.Instance.Started).Round(time.Second))
		p.Instance.Started = o.Instance.Started.UTC().Format(time.RFC3339)
	}
	p.Session = h.sessionOf(w, r)
	problem := func(name, detail string) { p.Problems = append(p.Problems, Problem{Name: name, Detail: detail}) }

	if o.Stats != nil {
		if pending, leased, err := o.Stats(ctx); err != nil {
			p.StatsErr = err.Error()
			problem("store counts unavailable", err.Error())
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
		if s != "disarmed" {
			problem("breaker "+name+" "+s, breakerDetail(s))
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
			problem("broker connection down", "the "+name+" connection to RabbitMQ is down; the bridge reconnects on its own")
		}
		p.Connections = append(p.Connections, n)
	}

	if o.Problems != nil {
		p.Problems = append(p.Problems, o.Problems()...)
	}
	if g.ok {
		h.rates(p, g, problem)
	}
	h.overdue(ctx, p, now, problem)
	h.errorQueue(ctx, r, p, now)
	h.list(ctx, r, p, now)
	h.schedules(ctx, p, now)

	p.Healthy = len(p.Problems) == 0
	// No reload under a search (the operator's place) or while logged in
	// (a form being filled in).
	if o.Refresh > 0 && !p.Search.Active && !p.Session.LoggedIn {
		p.RefreshSecs = max(1, int(o.Refresh/time.Second))
	}
	h.render(w, p)
}

func breakerDetail(state string) string {
	if state == "triggered" {
		return "the bridge stops so that its supervisor restarts it"
	}
	return "its operations keep failing; it triggers (and the bridge stops) unless they recover"
}

// window returns the samples with the current values last, and the
// baseline of the window's deltas.
func (h *Handler) window(g gathered) (samples []sample, base *sample) {
	h.mu.Lock()
	samples = append([]sample(nil), h.samples...)
	h.mu.Unlock()
	// The current values count as a sample for the newest minute (and
	// replace one taken at the same instant: they are newer).
	switch n := len(samples); {
	case n > 0 && g.at.Equal(samples[n-1].at):
		samples[n-1] = g.sample
	case n == 0 || g.at.After(samples[n-1].at):
		samples = append(samples, g.sample)
	}
	// The latest sample at or before the window's start, so the window is
	// covered (by up to a SampleInterval more); else the oldest.
	from := g.at.Add(-h.opts.Window)
	base = &samples[0]
	for i := range samples[:len(samples)-1] {
		if samples[i].at.After(from) {
			break
		}
		base = &samples[i]
	}
	return samples, base
}

// rates fills the throughput table, the window's lateness, the
// per-destination table, and the problems the counters show.
func (h *Handler) rates(p *page, g gathered, problem func(name, detail string)) {
	samples, base := h.window(g)
	cur := &samples[len(samples)-1]
	p.HaveRates = true
	p.Minutes = minutes(samples, g.at)
	p.Totals = Minute{Ingested: g.ingested, Dispatched: g.dispatched, Failures: g.failures, ErrorQueued: g.errorQueued, Dropped: g.dropped}
	p.DroppedBy = g.droppedBy
	p.Lateness = latenessBetween(base, cur)
	mins := max(cur.at.Sub(base.at).Minutes(), 1.0/6)
	span := "in the last " + fmtDur(max(cur.at.Sub(base.at), SampleInterval).Round(time.Second))

	failures, dispatched := nonNeg(cur.failures-base.failures), nonNeg(cur.dispatched-base.dispatched)
	defer func() { // after the dispatch problems, which say why
		if queued := nonNeg(cur.errorQueued - base.errorQueued); queued > 0 {
			problem("error queue growing", trimFloat(queued, 0)+" messages moved to the error queue "+span)
		}
	}()

	dests := map[wire.Destination]bool{}
	for d := range g.pending {
		dests[d] = true
	}
	for d := range cur.dests {
		dests[d] = true
	}
	var failingDests []string
	for d := range dests {
		row := DestRow{Name: d.String(), Overflow: d == (wire.Destination{})}
		if row.Overflow {
			row.Name = "other destinations (past the metrics' cap)"
			p.DestCapped = true
		}
		row.Pending, row.HaveCounts = g.pending[d]
		row.DueSoon = g.dueSoon[d]
		c, b := cur.dests[d], base.dests[d]
		row.Dispatched, row.Failures = nonNeg(c.dispatched-b.dispatched), nonNeg(c.failures-b.failures)
		row.DispatchedRate, row.FailureRate = row.Dispatched/mins, row.Failures/mins
		row.Failing = failing(row.Failures, row.Dispatched)
		if row.Failing {
			failingDests = append(failingDests, row.Name)
		}
		p.Destinations = append(p.Destinations, row)
	}
	slices.SortFunc(p.Destinations, func(a, b DestRow) int {
		return cmp.Or(boolFirst(a.Failing, b.Failing), boolFirst(!a.Overflow, !b.Overflow),
			cmp.Compare(b.Failures, a.Failures), cmp.Compare(b.Pending, a.Pending), cmp.Compare(a.Name, b.Name))
	})
	slices.Sort(failingDests)
	switch {
	case len(failingDests) > 0:
		for _, name := range failingDests {
			for _, row := range p.Destinations {
				if row.Name == name {
					problem("dispatch failing", "to "+name+": "+trimFloat(row.Failures, 0)+" failures, "+
						trimFloat(row.Dispatched, 0)+" dispatched "+span)
				}
			}
		}
	case failing(failures, dispatched):
		problem("dispatch failing", trimFloat(failures, 0)+" failures, "+trimFloat(dispatched, 0)+" dispatched "+span)
	}
}

// failing: failures with no or few successes (fewer than the failures).
func failing(failures, dispatched float64) bool { return failures > 0 && dispatched < failures }

func boolFirst(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return -1
	}
	return 1
}

// overdue counts the pending messages due more than OverdueAfter ago.
func (h *Handler) overdue(ctx context.Context, p *page, now time.Time, problem func(name, detail string)) {
	if h.opts.List == nil {
		return
	}
	limit := h.opts.OverdueAfter
	rows, next, err := h.opts.List(ctx, storage.ListFilter{DueTo: now.Add(-limit), Limit: overdueCountLimit})
	// A paused destination's messages are held past due on purpose.
	rows = slices.DeleteFunc(rows, func(t storage.Timeout) bool { return t.Paused })
	if err != nil || len(rows) == 0 {
		return
	}
	n := strconv.Itoa(len(rows))
	if next != "" {
		n += " or more"
	}
	problem("messages overdue", n+" pending messages are more than "+fmtDur(limit)+" past their due time (the oldest by "+
		span(rows[0].DueAt, now)+")")
}

// errorQueue shows the error queue as last read. A read starts when the
// last one is ErrorQueueInterval old; it runs on its own (a slow broker
// must not hold the page or its store reads up), and the page waits for it
// errorQueueWait at most.
func (h *Handler) errorQueue(ctx context.Context, r *http.Request, p *page, now time.Time) {
	if h.opts.ErrorQueue == nil {
		return
	}
	h.errMu.Lock()
	if h.errBusy == nil && (h.errAt.IsZero() || now.Sub(h.errAt) >= ErrorQueueInterval || now.Before(h.errAt)) {
		busy := make(chan struct{})
		h.errBusy, h.errAt = busy, now
		go func() {
			defer close(busy)
			rctx, cancel := context.WithTimeout(context.Background(), errorQueueTimeout)
			defer cancel()
			eq, err := h.opts.ErrorQueue(rctx)
			h.errMu.Lock()
			h.errLast, h.errErr, h.errDone, h.errBusy = eq, err, h.opts.Now(), nil
			h.errMu.Unlock()
		}()
	}
	busy := h.errBusy
	h.errMu.Unlock()
	if busy != nil {
		t := time.NewTimer(errorQueueWait)
		select {
		case <-busy:
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
	}
	h.errMu.Lock()
	eq, err, done := h.errLast, h.errErr, h.errDone
	h.errMu.Unlock()
	switch {
	case done.IsZero():
		p.ErrorsErr = "still reading it; reload in a moment"
		return
	case err != nil:
		p.ErrorsErr = err.Error()
		return
	}
	p.ErrorsAt = done.UTC().Format("15:04:05")
	p.HaveErrorQueue, p.ErrorQueue = true, eq
	shown := ErrorRows
	if r.URL.Query().Get("errors") == "more" {
		shown = MoreErrorRows
	}
	p.ErrorsShown = eq.Newest[:min(shown, len(eq.Newest))]
	if len(eq.Newest) > shown {
		p.MoreErrors = "/?errors=more#errors"
	}
}

// list fills the pending messages' table from the query's search and page.
func (h *Handler) list(ctx context.Context, r *http.Request, p *page, now time.Time) {
	if h.opts.List == nil {
		return
	}
	p.HaveSearch = true
	q := r.URL.Query()
	s := &p.Search
	s.IDPrefix, s.Destination, s.Exchange, s.RoutingKey, s.DueFrom, s.DueTo, s.Cursor = q.Get("id_prefix"), q.Get("destination"),
		q.Get("exchange"), q.Get("routing_key"), q.Get("due_from"), q.Get("due_to"), q.Get("cursor")
	// The admin API's filters, checked by its parser: the page searches as
	// GET /api/v1/timeouts lists. Empty fields are no filter.
	sel := url.Values{}
	for k, v := range map[string]string{"id_prefix": s.IDPrefix, "destination": s.Destination, "exchange": s.Exchange,
		"routing_key": s.RoutingKey, "due_from": s.DueFrom, "due_to": s.DueTo} {
		if v != "" {
			sel.Set(k, v)
		}
	}
	f, err := admin.ParseListFilter(sel)
	if err != nil {
		s.Err = err.Error()
		return
	}
	s.Active = !f.Empty() || s.Cursor != ""
	f.After, f.Limit = s.Cursor, PageRows
	ts, next, err := h.opts.List(ctx, f)
	if err != nil {
		p.RowsErr = err.Error()
		return
	}
	if next != "" {
		sel.Set("cursor", next)
		p.NextPage = "/?" + sel.Encode() + "#pending"
	}
	if s.Cursor != "" {
		sel.Del("cursor")
		p.FirstPage = "/?" + sel.Encode() + "#pending"
	}
	for i := range ts {
		p.Rows = append(p.Rows, h.row(&ts[i], now))
	}
}

// row words one pending message: a message that failed is "retrying" or
// "failing", never "waiting".
func (h *Handler) row(t *storage.Timeout, now time.Time) Row {
	in, overdue := relative(t.DueAt, now)
	id, send := wire.SplitKey(t.ID)
	if send == 1 {
		send = 0
	}
	row := Row{ID: id, Send: send, Destination: t.Dest().String(), DueAt: t.DueAt.UTC().Format("2006-01-02 15:04:05.000"),
		In: in, Overdue: overdue, Attempts: t.Attempts, LastError: truncate(t.LastError, 160)}
	held := t.NotBefore.After(now)
	if held {
		row.In, row.Overdue = "retry in "+fmtDur(t.NotBefore.Sub(now)), false
	}
	switch {
	case t.Lock != "" && t.LockExpiresAt.After(now):
		row.State, row.Class = "dispatching", "warn"
		if t.Attempts > 0 {
			row.State, row.Class = "retrying", "bad"
		}
	case t.Paused:
		// Held by an operator's pause (admin API): past due is expected.
		row.State, row.Class, row.Overdue = "paused", "warn", false
	case t.Attempts > 0 && held:
		row.State, row.Class = "retrying", "bad"
	case t.Attempts > 0:
		row.State, row.Class = "failing", "bad"
	case overdue && now.Sub(t.DueAt) > h.opts.OverdueAfter:
		row.State, row.Class = "overdue", "bad"
	default:
		row.State, row.Class = "waiting", "ok"
	}
	return row
}
