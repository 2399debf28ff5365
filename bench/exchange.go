package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/admin"
	"github.com/delaybridge/delaybridge/wire"
)

// The destinations the exchange step compares, in run order.
const (
	PathQueue    = "queue"    // x-destination: the punctuality workload
	PathExchange = "exchange" // x-destination-exchange to a topic exchange
	PathDelayed  = "delayed"  // x-delay, published to a delayed topic exchange
)

// exchangeKeys are the routing keys of the exchange and delayed paths, one
// per message in turn; exchangeBinding binds the destination queue to all.
var (
	exchangeKeys    = []string{"orders.eu.created", "orders.us.created", "orders.eu.paid", "orders.us.refunded"}
	exchangeBinding = "orders.#"
)

// listMargin: the bench stops reading the bridge's stored rows this long
// before the first due time, so the reading never overlaps the dispatch
// being measured.
const listMargin = 300 * time.Millisecond

// Exchange is the punctuality workload through each kind of destination, on
// one bridge, in rounds: the paths run one after another, in reverse order
// every other round, so that drift in the machine's load falls on each alike.
type Exchange struct {
	N               int             `json:"n"`
	WindowMs        float64         `json:"window_ms"`
	LeadMs          float64         `json:"lead_ms"`
	Rounds          int             `json:"rounds"`
	TopicExchange   string          `json:"topic_exchange"`
	DelayedExchange string          `json:"delayed_exchange"`
	Binding         string          `json:"binding"`
	RoutingKeys     []string        `json:"routing_keys"`
	Order           []string        `json:"order"` // the path of each workload, in the order they ran
	Paths           []*ExchangePath `json:"paths"`
}

// ExchangePath is one destination's figures over every round.
type ExchangePath struct {
	Path string `json:"path"`
	// Lateness pools every round: arrival at the consumer minus the due time
	// the bench meant (x-due-at, or the one x-delay was computed from).
	Lateness
	Receipt
	// RoundP99Ms is each round's lateness p99, in run order.
	RoundP99Ms []float64        `json:"round_p99_ms"`
	Rounds     []*ExchangeRound `json:"rounds"`

	late, dispatch, lag []time.Duration // pooled samples
}

// ExchangeRound is one workload of one path.
type ExchangeRound struct {
	Round int `json:"round"`
	Punctual
	Receipt
	// From the first due time to the last delivery: the share of the
	// machine's CPU time spent busy, and the CPU that processes other than
	// the bridge, the broker and the bench took, in cores. The broker may
	// serve other clients too, so this does not count all other work.
	MachineBusy float64 `json:"machine_cpu_busy"`
	OtherCores  float64 `json:"other_cpu_cores"`
}

// Receipt splits a lateness at the bridge's receipt, for the messages whose
// stored rows the bench read (Listed). Dispatch is the arrival minus the due
// time the bridge stored; for the delayed path that is receipt + x-delay.
// ReceiptLag is the bridge's receipt (received_at) minus the bench's publish.
type Receipt struct {
	Dispatch   *Dist `json:"dispatch_lateness,omitempty"`
	ReceiptLag *Dist `json:"receipt_lag,omitempty"`
	Listed     int   `json:"listed"`
}

// Dist summarizes durations that are not a lateness (no early count).
type Dist struct {
	N int `json:"n"`
	Percentiles
}

func distOf(d []time.Duration) *Dist {
	if len(d) == 0 {
		return nil
	}
	return &Dist{N: len(d), Percentiles: summarize(slices.Clone(d))}
}

func (b *bencher) stepExchange(ctx context.Context) error {
	n, window, rounds := b.opts.PunctualN, b.opts.Window, b.opts.ExchangeRounds
	topic, delayed := b.name(StepExchange, "topic"), b.name(StepExchange, "delayed")
	route := wire.DelayedRoute(delayed)
	// The bridge declares the delayed exchange and its route; the bench
	// deletes them at the end, as its own.
	for _, x := range []string{topic, delayed, route} {
		b.reg.exchange(x)
	}
	if err := b.declareExchange(topic, amqp.ExchangeTopic); err != nil {
		return err
	}
	token := randHex(16)
	p, ready, err := b.startBridgeEnv(ctx, b.name(StepExchange), filepath.Join(b.dir, StepExchange, "delaybridge.db"), map[string]string{
		"DELAYBRIDGE_DELAYED_EXCHANGES": delayed + ":" + amqp.ExchangeTopic,
		"DELAYBRIDGE_ADMIN_TOKEN":       token,
	})
	if err != nil {
		return err
	}
	defer b.stopBridge(p, StepExchange)
	b.logf("   bridge %s ready in %.0f ms (pid %d, http %s)", p.endpoint, ms(ready), p.cmd.Process.Pid, p.httpAddr)
	paths := []string{PathQueue, PathExchange, PathDelayed}
	if !b.exchangeExists(route) {
		b.warnf("exchange: the bridge did not declare %s for DELAYBRIDGE_DELAYED_EXCHANGES (a build without delayed exchanges?); the delayed path is not measured", route)
		paths = paths[:2]
	}
	lead := b.lead(n)
	res := &Exchange{N: n, WindowMs: ms(window), LeadMs: ms(lead), Rounds: rounds, TopicExchange: topic,
		DelayedExchange: delayed, Binding: exchangeBinding, RoutingKeys: exchangeKeys}
	for _, path := range paths {
		res.Paths = append(res.Paths, &ExchangePath{Path: path})
	}
	b.res.Exchange = res
	for r := range rounds {
		for i := range res.Paths {
			if r%2 == 1 {
				i = len(res.Paths) - 1 - i
			}
			ep := res.Paths[i]
			res.Order = append(res.Order, ep.Path)
			if err := b.exchangeRound(ctx, p, res, ep, r+1, lead, token); err != nil {
				return fmt.Errorf("%s round %d: %w", ep.Path, r+1, err)
			}
		}
	}
	return ctx.Err()
}

// exchangeRound runs one round of one path and adds it to ep.
func (b *bencher) exchangeRound(ctx context.Context, p *bridgeProc, x *Exchange, ep *ExchangePath, round int, lead time.Duration, token string) error {
	label := StepExchange + "-" + ep.Path + "-" + strconv.Itoa(round)
	dest := b.name(label, "dest")
	if err := b.declareQueue(dest, nil); err != nil {
		return err
	}
	// Bound by the same pattern as the next round's, it would take copies of
	// that round's messages.
	defer func() {
		if err := b.deleteQueue(dest); err != nil {
			b.warnf("%s: %v", label, err)
		}
	}()
	key := func(seq int) string { return exchangeKeys[seq%len(exchangeKeys)] }
	w := timedWorkload{label: label, n: x.N, window: time.Duration(x.WindowMs * float64(time.Millisecond)), lead: lead, dest: dest, cpu: true}
	switch ep.Path {
	case PathQueue:
		w.build = func(seq int, due, _ time.Time) outgoing {
			return outgoing{key: p.timeoutsQueue(), msg: b.message(dest, seq, due, dest)}
		}
		w.check = func(seq int, d *amqp.Delivery) bool { return d.Exchange == "" && d.RoutingKey == dest }
	case PathExchange:
		if err := b.bindQueue(dest, exchangeBinding, x.TopicExchange); err != nil {
			return err
		}
		w.build = func(seq int, due, _ time.Time) outgoing {
			return outgoing{key: p.timeoutsQueue(), msg: b.exchangeMessage(dest, seq, due, x.TopicExchange, key(seq))}
		}
		w.check = func(seq int, d *amqp.Delivery) bool {
			return d.Exchange == x.TopicExchange && d.RoutingKey == key(seq)
		}
	case PathDelayed:
		route := wire.DelayedRoute(x.DelayedExchange)
		if err := b.bindQueue(dest, exchangeBinding, route); err != nil {
			return err
		}
		w.build = func(seq int, due, now time.Time) outgoing {
			return outgoing{exchange: x.DelayedExchange, key: key(seq), msg: b.delayedMessage(dest, seq, due, now)}
		}
		w.check = func(seq int, d *amqp.Delivery) bool {
			return d.Exchange == route && d.RoutingKey == key(seq) && delayNegated(d.Headers)
		}
	}
	var rows map[string]storedRow
	w.stored = func(ctx context.Context, first time.Time) {
		var complete bool
		var err error
		rows, complete, err = p.listStored(ctx, token, first.Add(-listMargin))
		switch {
		case err != nil:
			b.warnf("%s: reading the stored rows: %v", label, err)
		case !complete:
			b.warnf("%s: read %d of %d stored rows before the first due time; receipt figures cover those", label, len(rows), x.N)
		}
	}
	run, err := b.timed(ctx, p, w)
	if err != nil {
		return err
	}
	lag, dispatch := receiptFigures(dest, run.pubAt, run.arrived, rows)
	rr := &ExchangeRound{Round: round, Punctual: *run.Punctual, Receipt: receiptOf(dispatch, lag)}
	rr.MachineBusy, rr.OtherCores = otherCores(run.cpu0, run.cpu1)
	if rr.OtherCores > quietCores {
		b.warnf("%s: other work on the machine took %.2f cores while the messages fell due; its figures are disturbed", label, rr.OtherCores)
	}
	ep.add(rr, run.late, dispatch, lag)
	l := run.Lateness
	if l.Mismatched > 0 {
		b.warnf("%s: %d messages came with another exchange, routing key or x-delay than expected", label, l.Mismatched)
	}
	if rr.ReceiptLag != nil && rr.Dispatch != nil {
		b.logf("   %s: publish to bridge receipt p50 %.1f ms, p99 %.1f ms, max %.1f ms; stored due to consumer p50 %.1f ms, p99 %.1f ms, max %.1f ms (%d read)",
			label, rr.ReceiptLag.P50Ms, rr.ReceiptLag.P99Ms, rr.ReceiptLag.MaxMs, rr.Dispatch.P50Ms, rr.Dispatch.P99Ms, rr.Dispatch.MaxMs, rr.Listed)
	}
	return nil
}

// add records one round and recomputes the pooled figures.
func (ep *ExchangePath) add(r *ExchangeRound, late, dispatch, lag []time.Duration) {
	ep.Rounds = append(ep.Rounds, r)
	ep.RoundP99Ms = append(ep.RoundP99Ms, r.P99Ms)
	ep.late = append(ep.late, late...)
	ep.dispatch = append(ep.dispatch, dispatch...)
	ep.lag = append(ep.lag, lag...)
	l := Summarize(slices.Clone(ep.late))
	for _, r := range ep.Rounds {
		l.Expected += r.Expected
		l.Received += r.Received
		l.Missing += r.Missing
		l.Early += r.Early
		l.Duplicates += r.Duplicates
		l.Foreign += r.Foreign
		l.Mismatched += r.Mismatched
	}
	ep.Lateness = l
	ep.Receipt = receiptOf(ep.dispatch, ep.lag)
}

func receiptOf(dispatch, lag []time.Duration) Receipt {
	return Receipt{Dispatch: distOf(dispatch), ReceiptLag: distOf(lag), Listed: len(lag)}
}

// quietCores: above this much CPU taken by other work, a round is marked
// disturbed (as checkQuiet does for the scaleout step).
const quietCores = 0.25

// otherCores returns the share of the machine's CPU time spent busy between
// two samples, and the CPU that the processes not sampled took, in cores.
func otherCores(a, b cpuSample) (busy, cores float64) {
	c := legCPU(a, b)
	if c == nil {
		return 0, 0
	}
	return c.Busy, c.Other
}

// exchangeMessage is message seq with an exchange destination instead of a
// queue.
func (b *bencher) exchangeMessage(tag string, seq int, due time.Time, exchange, key string) amqp.Publishing {
	m := b.message(tag, seq, due, "")
	delete(m.Headers, wire.HeaderDestination)
	m.Headers[wire.HeaderDestinationExchange] = exchange
	m.Headers[wire.HeaderDestinationRoutingKey] = key
	return m
}

// hdrDelay carries the x-delay the bench asked for, to check that the
// forward carries it negated.
const hdrDelay = "bench-delay"

// delayedMessage is message seq as a delayed-message-exchange plugin's
// publisher sends it: no headers of the bridge's, only x-delay, computed at
// now from due, as a 32-bit integer (as Spring AMQP sends it).
func (b *bencher) delayedMessage(tag string, seq int, due, now time.Time) amqp.Publishing {
	m := b.message(tag, seq, due, "")
	delete(m.Headers, wire.HeaderDestination)
	delete(m.Headers, wire.HeaderDueAt)
	d := delayMs(due, now)
	m.Headers[wire.HeaderDelay] = int32(min(d, math.MaxInt32))
	m.Headers[hdrDelay] = d
	return m
}

// delayMs is the x-delay for due, read at now: whole milliseconds, rounded
// up, so that receipt + delay is never before due.
func delayMs(due, now time.Time) int64 {
	d := due.Sub(now)
	if d <= 0 {
		return 0
	}
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// delayNegated tells whether a forwarded delayed message carries x-delay as
// the plugin leaves it: the delay asked for, negated.
func delayNegated(h amqp.Table) bool {
	got, ok1 := headerInt(h, wire.HeaderDelay)
	asked, ok2 := headerInt(h, hdrDelay)
	return ok1 && ok2 && got == -asked
}

// storedRow is what the bridge's admin API says of one pending message.
type storedRow struct {
	due, received time.Time
}

// listStored reads every pending row from the bridge's admin API, page by
// page, until deadline. complete is false when it stopped at the deadline.
func (p *bridgeProc) listStored(ctx context.Context, token string, deadline time.Time) (rows map[string]storedRow, complete bool, err error) {
	rows = map[string]storedRow{}
	cursor := ""
	for {
		if time.Now().After(deadline) {
			return rows, false, nil
		}
		u := "http://" + p.httpAddr + "/api/v1/timeouts?limit=" + strconv.Itoa(admin.MaxLimit)
		if cursor != "" {
			u += "&cursor=" + url.QueryEscape(cursor)
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		if err != nil {
			return rows, false, err
		}
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := httpClient.Do(req)
		if err != nil {
			return rows, false, err
		}
		next, err := parseTimeoutsPage(resp, rows)
		resp.Body.Close()
		if err != nil {
			return rows, false, err
		}
		if next == "" {
			return rows, true, nil
		}
		cursor = next
	}
}

// parseTimeoutsPage adds one GET /api/v1/timeouts page to rows and returns
// the next page's cursor ("" after the last).
func parseTimeoutsPage(resp *http.Response, rows map[string]storedRow) (string, error) {
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return "", fmt.Errorf("GET /api/v1/timeouts: %s: %s", resp.Status, body)
	}
	var page admin.ListJSON
	if err := json.NewDecoder(resp.Body).Decode(&page); err != nil {
		return "", fmt.Errorf("GET /api/v1/timeouts: %w", err)
	}
	for _, t := range page.Timeouts {
		rows[t.ID] = storedRow{due: t.DueAt, received: t.ReceivedAt}
	}
	return page.Next, nil
}

// receiptFigures joins what the bench and the bridge recorded of each
// message tag-<seq>: lag is the bridge's receipt minus the publish (pubAt),
// dispatch the arrival at the consumer minus the due time the bridge stored.
// Messages with no stored row read are left out of both, and those that
// never arrived out of dispatch.
func receiptFigures(tag string, pubAt []time.Time, arrived []int64, rows map[string]storedRow) (lag, dispatch []time.Duration) {
	for seq := range pubAt {
		r, ok := rows[tag+"-"+strconv.Itoa(seq)]
		if !ok {
			continue
		}
		lag = append(lag, r.received.Sub(pubAt[seq]))
		if seq < len(arrived) && arrived[seq] != 0 {
			dispatch = append(dispatch, time.Unix(0, arrived[seq]).Sub(r.due))
		}
	}
	return lag, dispatch
}

// exchangeExists tells whether the broker has exchange name.
func (b *bencher) exchangeExists(name string) bool {
	return b.withAdmin(func(ch *amqp.Channel) error {
		return ch.ExchangeDeclarePassive(name, amqp.ExchangeTopic, true, false, false, false, nil)
	}) == nil
}
