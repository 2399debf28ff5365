package bench

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/wire"
)

// Recurring is the recurring step: N schedules firing every second
// (docs/contract.md §2.11) to one destination queue, consumed for a window,
// then cancelled. Each fire is checked against its schedule's fire times:
// on time (lateness from x-delaybridge-fire-time), none missed, none
// doubled; and the store is sampled so that a schedule that leaves rows
// behind shows as growth.
type Recurring struct {
	N       int     `json:"n"`
	Cron    string  `json:"cron"`
	Seconds float64 `json:"window_seconds"`
	// CreateSeconds is how long publishing the N schedule messages took.
	CreateSeconds float64 `json:"create_seconds"`
	RecurringCount
	// Lateness is the receive time minus the fire time, of each fire's
	// first delivery in the window.
	Lateness Percentiles `json:"lateness"`
	// AfterCancel are deliveries whose fire time is more than a second
	// after every cancel was confirmed: a schedule the cancel did not end.
	AfterCancel int `json:"after_cancel"`
	// Store samples, one a second through the window.
	Samples     []RecurringSample `json:"samples,omitempty"`
	PendingFrom int64             `json:"pending_start"`
	PendingTo   int64             `json:"pending_end"`
	PendingMax  int64             `json:"pending_max"`
	StoreFrom   int64             `json:"store_bytes_start"`
	StoreTo     int64             `json:"store_bytes_end"`
	HasPending  bool              `json:"has_pending"`
	// PendingSlope is the least-squares trend of pending over the window,
	// rows a second: about 0 when the store is flat.
	PendingSlope float64 `json:"pending_slope_per_s"`
}

// RecurringSample is the store at one moment of the window.
type RecurringSample struct {
	AtSeconds  float64 `json:"at_s"`
	Pending    int64   `json:"pending"`
	StoreBytes int64   `json:"store_bytes"`
}

// RecurringCount is the accounting of the fires received against the fires
// expected.
type RecurringCount struct {
	Schedules int `json:"schedules"`
	// Silent are schedules with no fire in the window at all.
	Silent   int `json:"silent"`
	Expected int `json:"expected"` // fire times in the window, from each schedule's first fire
	Received int `json:"received"` // distinct (schedule, fire time) pairs in the window
	Missed   int `json:"missed"`   // expected fire times never delivered
	Doubled  int `json:"doubled"`  // extra deliveries of one (schedule, fire time)
	Early    int `json:"early"`    // delivered before their fire time
	// Foreign are deliveries without a readable schedule or fire time, or
	// of a schedule that is not the run's.
	Foreign int `json:"foreign"`
	// OffGrid are fire times not on the schedule's period from its first
	// fire (a second schedule's fire or a wrong fire time).
	OffGrid int `json:"off_grid"`
}

// recArrival is one delivery of a fire: its schedule (index), the fire time
// it stands for and when it was received.
type recArrival struct {
	Schedule int // -1 when unreadable
	Fire     time.Time
	At       time.Time
}

// Recurring defaults.
const (
	defaultRecurringN        = 1000
	defaultRecurringDuration = 20 * time.Second
	recurringCron            = "* * * * * ?" // Quartz: every second
	// recurringGrace is how long the consumer keeps going past the window,
	// for the window's last fires (in flight) to arrive.
	recurringGrace = 3 * time.Second
)

// countRecurring does the step's accounting. Fires with a fire time in
// [from, to] count; each schedule is expected to fire every period from its
// first fire in the window to the last fire time ≤ to. A schedule with no
// fire at all is silent and all its fire times after from are missed. It
// returns the lateness (receive − fire) of each first delivery.
func countRecurring(arr []recArrival, n int, from, to time.Time, period time.Duration) (RecurringCount, []time.Duration) {
	c := RecurringCount{Schedules: n}
	type key struct {
		s    int
		fire int64
	}
	seen := make(map[key]bool)
	first := make([]time.Time, n)
	var late []time.Duration
	inWindow := func(t time.Time) bool { return !t.Before(from) && !t.After(to) }
	for _, a := range arr {
		if a.Schedule < 0 || a.Schedule >= n || a.Fire.IsZero() {
			c.Foreign++
			continue
		}
		if !inWindow(a.Fire) {
			continue
		}
		if f := first[a.Schedule]; f.IsZero() || a.Fire.Before(f) {
			first[a.Schedule] = a.Fire
		}
	}
	for _, a := range arr {
		if a.Schedule < 0 || a.Schedule >= n || a.Fire.IsZero() || !inWindow(a.Fire) {
			continue
		}
		k := key{a.Schedule, a.Fire.UnixNano()}
		if seen[k] {
			c.Doubled++
			continue
		}
		seen[k] = true
		if a.Fire.Sub(first[a.Schedule])%period != 0 {
			c.OffGrid++
			continue
		}
		c.Received++
		d := a.At.Round(0).Sub(a.Fire)
		if d < 0 {
			c.Early++
		}
		late = append(late, d)
	}
	expected := 0 // of the schedules that fired
	for s := range n {
		f := first[s]
		if f.IsZero() {
			c.Silent++
			// Every fire time in the window: the schedule existed by then.
			k := int(to.Sub(from.Add(period-1).Truncate(period))/period) + 1
			c.Expected += k
			c.Missed += k
			continue
		}
		expected += int(to.Sub(f)/period) + 1
	}
	c.Expected += expected
	c.Missed += expected - c.Received
	return c, late
}

// slope is the least-squares slope of ys over xs.
func slope(xs []float64, ys []float64) float64 {
	n := float64(len(xs))
	if n < 2 {
		return 0
	}
	var sx, sy, sxx, sxy float64
	for i := range xs {
		sx += xs[i]
		sy += ys[i]
		sxx += xs[i] * xs[i]
		sxy += xs[i] * ys[i]
	}
	den := n*sxx - sx*sx
	if den == 0 {
		return 0
	}
	return (n*sxy - sx*sy) / den
}

func (b *bencher) stepRecurring(ctx context.Context) error {
	n, d := orDefault(b.opts.RecurringN, defaultRecurringN), orDefault(b.opts.RecurringDuration, defaultRecurringDuration)
	res := &Recurring{N: n, Cron: recurringCron, Seconds: d.Seconds()}
	b.res.Recurring = res
	label := StepRecurring
	store := filepath.Join(b.dir, label, "store.db")
	p, _, err := b.startBridge(ctx, b.name(label), store)
	if err != nil {
		return err
	}
	defer func() {
		if _, err := b.stopBridge(p, label); err != nil {
			b.warnf("%s: %v", label, err)
		}
	}()
	dest := b.name(label, "dest")
	if err := b.declareQueue(dest, nil); err != nil {
		return err
	}
	ids := make([]string, n)
	index := make(map[string]int, n)
	for i := range ids {
		ids[i] = b.name(label, "s"+strconv.Itoa(i))
		index[ids[i]] = i
	}
	fires, err := b.consumeFires(dest, index)
	if err != nil {
		return err
	}
	defer fires.close()

	pub, err := b.createSchedules(ctx, p, ids, dest)
	if err != nil {
		return err
	}
	res.CreateSeconds = pub.End.Sub(pub.Start).Seconds()
	b.logf("   recurring: %d schedules published in %.2f s", n, res.CreateSeconds)

	// The window starts at the first whole second after every schedule
	// message was confirmed; the bridge may take a moment longer to store
	// them all, which each schedule's own first fire accounts for.
	from := pub.End.Truncate(time.Second).Add(time.Second)
	to := from.Add(d)
	if err := sampleRecurring(ctx, p, store, res, from, to); err != nil {
		return err
	}
	if !broker.Sleep(ctx, time.Until(to.Add(recurringGrace))) {
		return ctx.Err()
	}
	cancelled, err := b.cancelRecurring(ctx, p, ids)
	if err != nil {
		return err
	}
	res.count(fires.stop(), from, to, cancelled)
	b.logf("   recurring: %d schedules, %d fires expected, %d received, %d missed, %d doubled, %d early, %d silent, %d foreign, %d after cancel; lateness p50 %.1f ms, p99 %.1f ms, max %.1f ms; pending %d → %d (max %d, trend %.2f/s), store %s → %s",
		n, res.Expected, res.Received, res.Missed, res.Doubled, res.Early, res.Silent, res.Foreign, res.AfterCancel,
		res.Lateness.P50Ms, res.Lateness.P99Ms, res.Lateness.MaxMs, res.PendingFrom, res.PendingTo, res.PendingMax, res.PendingSlope,
		FmtBytes(res.StoreFrom), FmtBytes(res.StoreTo))
	return nil
}

// createSchedules publishes a schedule for each of ids, firing every
// second to dest, through bridge p.
func (b *bencher) createSchedules(ctx context.Context, p *bridgeProc, ids []string, dest string) (pubResult, error) {
	pub, err := b.publishAll(ctx, len(ids), func(i int) outgoing {
		return outgoing{key: p.timeoutsQueue(), msg: amqp.Publishing{
			MessageId:    ids[i],
			DeliveryMode: amqp.Persistent,
			Headers: amqp.Table{
				wire.HeaderDestination: dest,
				wire.HeaderCron:        recurringCron,
				wire.HeaderTimeZone:    "UTC",
				hdrSeq:                 int64(i),
			},
			Body: b.body,
		}}
	})
	if err != nil {
		return pubResult{}, fmt.Errorf("create schedules: %w", err)
	}
	return pub, nil
}

// fireLog records the fires delivered to the step's destination.
type fireLog struct {
	ch       *amqp.Channel
	consumer string
	mu       sync.Mutex
	arr      []recArrival
	done     chan struct{}
}

// consumeFires consumes dest (autoAck) and records each delivery's schedule
// (its index by id) and fire time.
func (b *bencher) consumeFires(dest string, index map[string]int) (*fireLog, error) {
	ch, err := b.consConn.Channel()
	if err != nil {
		return nil, fmt.Errorf("open consume channel: %w", err)
	}
	l := &fireLog{ch: ch, consumer: "bench-" + dest, done: make(chan struct{})}
	deliveries, err := ch.Consume(dest, l.consumer, true, false, false, false, nil)
	if err != nil {
		_ = ch.Close()
		return nil, fmt.Errorf("consume %s: %w", dest, err)
	}
	go func() {
		defer close(l.done)
		for dl := range deliveries {
			at := time.Now()
			a := recArrival{Schedule: -1, At: at}
			if id, ok := dl.Headers[wire.HeaderScheduleID].(string); ok {
				if i, ok := index[id]; ok {
					a.Schedule = i
				}
			}
			if s, ok := dl.Headers[wire.HeaderFireTime].(string); ok {
				if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
					a.Fire = t
				}
			}
			l.mu.Lock()
			l.arr = append(l.arr, a)
			l.mu.Unlock()
		}
	}()
	return l, nil
}

// stop ends the consumer and returns what arrived.
func (l *fireLog) stop() []recArrival {
	_ = l.ch.Cancel(l.consumer, false)
	<-l.done
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.arr
}

func (l *fireLog) close() { _ = l.ch.Close() }

// sampleRecurring samples the store once a second from from to to.
func sampleRecurring(ctx context.Context, p *bridgeProc, store string, res *Recurring, from, to time.Time) error {
	sample := func() {
		v, verr := p.vars()
		size, _ := storeSize(store)
		s := RecurringSample{AtSeconds: time.Since(from).Seconds(), StoreBytes: size}
		if verr == nil && v.HasPending {
			s.Pending, res.HasPending = v.Pending, true
		}
		res.Samples = append(res.Samples, s)
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	if !broker.Sleep(ctx, time.Until(from)) {
		return ctx.Err()
	}
	sample()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case now := <-tick.C:
			sample()
			if !now.Before(to) {
				return nil
			}
		}
	}
}

// cancelRecurring cancels every schedule and waits for the bridge to take
// the cancels; it returns when they were confirmed. The consumer keeps going
// meanwhile: fire times after that (plus a second for one being
// dispatched) must not come.
func (b *bencher) cancelRecurring(ctx context.Context, p *bridgeProc, ids []string) (time.Time, error) {
	cpub, err := b.publishAll(ctx, len(ids), func(i int) outgoing {
		return outgoing{key: p.timeoutsQueue(), msg: amqp.Publishing{
			DeliveryMode: amqp.Persistent,
			Headers:      amqp.Table{wire.HeaderCancel: ids[i]},
		}}
	})
	if err != nil {
		return time.Time{}, fmt.Errorf("cancel schedules: %w", err)
	}
	// The bridge takes the cancels off E.Timeouts in order; give it time.
	if !broker.Sleep(ctx, time.Until(cpub.End.Add(3*time.Second))) {
		return time.Time{}, ctx.Err()
	}
	if n, err := b.queueDepth(p.timeoutsQueue()); err == nil && n > 0 {
		b.warnf("%s: %d messages still on %s after the cancels", StepRecurring, n, p.timeoutsQueue())
	}
	return cpub.End, nil
}

// count does the step's accounting of the fires got: those in the window
// [from, to] (countRecurring), those after the cancels, and the store
// samples.
func (r *Recurring) count(got []recArrival, from, to, cancelled time.Time) {
	for _, a := range got {
		if !a.Fire.IsZero() && a.Fire.After(cancelled.Add(time.Second)) {
			r.AfterCancel++
		}
	}
	var late []time.Duration
	r.RecurringCount, late = countRecurring(got, r.N, from, to, time.Second)
	r.Lateness = summarize(late)
	r.sampleFigures()
}

// sampleFigures sums up the store samples: pending and the file's size at
// the start and end, the most pending and its trend.
func (r *Recurring) sampleFigures() {
	if len(r.Samples) == 0 {
		return
	}
	first, last := r.Samples[0], r.Samples[len(r.Samples)-1]
	r.PendingFrom, r.PendingTo = first.Pending, last.Pending
	r.StoreFrom, r.StoreTo = first.StoreBytes, last.StoreBytes
	xs, ys := make([]float64, len(r.Samples)), make([]float64, len(r.Samples))
	for i, s := range r.Samples {
		xs[i], ys[i] = s.AtSeconds, float64(s.Pending)
		r.PendingMax = max(r.PendingMax, s.Pending)
	}
	r.PendingSlope = slope(xs, ys)
}

// recurringFlat tells whether the store stayed flat: pending grew by no
// more than the fires in flight (one a schedule) over the window.
func recurringFlat(r *Recurring) bool {
	return !r.HasPending || r.PendingTo-r.PendingFrom <= int64(r.N)
}

// recurringRows are the step's figures and checks.
func recurringRows(r *Recurring) []Row {
	if r == nil {
		return nil
	}
	what := fmt.Sprintf("%s schedules every second (%q), %.0f s", groupThousands(int64(r.N)), r.Cron, r.Seconds)
	rows := []Row{
		{Step: StepRecurring, Metric: what + ": fires expected / received / missed / doubled / early",
			Value:  fmt.Sprintf("%d / %d / %d / %d / %d", r.Expected, r.Received, r.Missed, r.Doubled, r.Early),
			Target: "0 missed, 0 doubled, 0 early", Result: verdict(r.Missed == 0 && r.Doubled == 0 && r.Early == 0 && r.Foreign == 0 && r.OffGrid == 0)},
		{Step: StepRecurring, Metric: "fire lateness p50 / p99 / max",
			Value: fmt.Sprintf("%s / %s / %s", FmtMs(r.Lateness.P50Ms), FmtMs(r.Lateness.P99Ms), FmtMs(r.Lateness.MaxMs))},
		{Step: StepRecurring, Metric: "fires after the cancels",
			Value: strconv.Itoa(r.AfterCancel), Target: "0", Result: verdict(r.AfterCancel == 0)},
	}
	if r.HasPending {
		rows = append(rows, Row{Step: StepRecurring, Metric: "pending start → end (max; trend)",
			Value:  fmt.Sprintf("%d → %d (%d; %+.2f/s)", r.PendingFrom, r.PendingTo, r.PendingMax, r.PendingSlope),
			Target: fmt.Sprintf("growth ≤ %d (fires in flight)", r.N), Result: verdict(recurringFlat(r))})
	}
	rows = append(rows, Row{Step: StepRecurring, Metric: "bbolt file start → end",
		Value: FmtBytes(r.StoreFrom) + " → " + FmtBytes(r.StoreTo)})
	return rows
}
