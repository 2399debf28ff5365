package bench

import (
	"context"
	"fmt"
	mrand "math/rand/v2"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Crash is the crash step: a bridge on bbolt under the steady workload
// (messages due 1–5 s after their send, at CrashRate a second) is killed
// with SIGKILL several times and restarted on its store at once. What it
// had forwarded and not yet removed is forwarded again after the restart
// (docs/contract.md §3.3): the step counts those duplicates per kill and
// says how many milliseconds of forwards they are.
type Crash struct {
	Rate    int          `json:"rate"`
	Seconds float64      `json:"seconds"`
	Sent    int          `json:"sent"`
	Lost    int          `json:"lost"`
	Early   int          `json:"early"`
	Kills   []*CrashKill `json:"kills"`
	// Other are duplicates no kill explains by a forward before it: both
	// copies arrived after the same kill (a redelivery stored again while
	// its first commit was being dispatched, §3.3).
	Other int `json:"other_duplicates"`
}

// CrashKill is one SIGKILL.
type CrashKill struct {
	AtSeconds float64 `json:"at_seconds"` // after the first send
	// Duplicates are messages forwarded before the kill and again after it.
	Duplicates int `json:"duplicates"`
	// ForwardRate is the forwards a second in the second before the kill.
	ForwardRate float64 `json:"forward_rate"`
	// WindowMs is Duplicates in milliseconds of forwards at ForwardRate.
	WindowMs float64 `json:"window_ms"`
	// OldestMs is how long before the kill the earliest of them arrived.
	OldestMs float64 `json:"oldest_ms"`
	// RestartMs is the time from the kill to the new process's ready.
	RestartMs float64 `json:"restart_ms"`
}

// Crash defaults: 1,000 messages a second for 20 s, killed 3 times.
const (
	defaultCrashRate     = 1000
	defaultCrashDuration = 20 * time.Second
	crashKills           = 3
)

// stepCrash runs the workload and the kills.
func (b *bencher) stepCrash(ctx context.Context) error {
	rate, d := orDefault(b.opts.CrashRate, defaultCrashRate), orDefault(b.opts.CrashDuration, defaultCrashDuration)
	n := int(float64(rate) * d.Seconds())
	res := &Crash{Rate: rate, Seconds: d.Seconds()}
	b.res.Crash = res
	label := StepCrash
	endpoint, store := b.name(label), filepath.Join(b.dir, label, "delaybridge.db")
	p, _, err := b.startBridge(ctx, endpoint, store)
	if err != nil {
		return err
	}
	defer func() { b.stopBridge(p, label) }()
	dests, err := b.steadyQueues(label)
	if err != nil {
		return err
	}
	arr, err := b.arrivals(dests, n)
	if err != nil {
		return err
	}
	defer arr.stop()
	b.logf("   crash: %d/s for %v (%d messages), due 1–5 s after each send; %d kills", rate, d, n, crashKills)
	queue := p.timeoutsQueue() // every restart serves the same endpoint
	start := time.Now()
	var kills []crashKill
	killErr := make(chan error, 1)
	go func() { // the kills, evenly spread over the run
		defer close(killErr)
		var err error
		p, kills, err = b.crashKills(ctx, p, start, d, endpoint, store)
		if err != nil {
			killErr <- err
		}
	}()
	due, leg, err := b.pacedSteady(ctx, start, rate, n, dests, queue, killErr)
	if err != nil {
		return err
	}
	res.Sent = leg.Pace.Published
	arr.wait(ctx, res.Sent, time.Now().Add(steadyMaxDelay+collectGrace))
	time.Sleep(2 * time.Second) // late duplicates
	b.countCrash(res, arr.stop()[:res.Sent], due, kills, start)
	return nil
}

// countCrash does the step's accounting of the arrivals got of the
// messages due at due: lost, early, and the duplicates each kill explains.
func (b *bencher) countCrash(res *Crash, got [][]time.Time, due []time.Time, kills []crashKill, start time.Time) {
	for i, as := range got {
		if len(as) == 0 {
			res.Lost++
			continue
		}
		// By the wall clock, as the bridge keeps due times (a monotonic
		// comparison would count a clock step as an early delivery).
		if as[0].Round(0).Before(due[i].Round(0)) {
			res.Early++
			b.warnf("crash: message %d arrived %.3f ms EARLY (due %s, arrived %s)", i, ms(due[i].Sub(as[0])),
				due[i].Format("15:04:05.000000"), as[0].Format("15:04:05.000000"))
		}
	}
	explained := 0
	for _, k := range kills {
		ck := k.figures(got, start)
		res.Kills = append(res.Kills, ck)
		explained += ck.Duplicates
		b.logf("   crash: kill at +%.2f s: %d duplicates = %.0f ms of forwards at %.0f/s (oldest %.0f ms before the kill)",
			ck.AtSeconds, ck.Duplicates, ck.WindowMs, ck.ForwardRate, ck.OldestMs)
	}
	dups := 0
	for _, as := range got {
		dups += max(len(as)-1, 0)
	}
	res.Other = dups - explained
}

// crashKill is one kill: when, and when the bridge was ready again.
type crashKill struct {
	at, ready time.Time
}

// crashKills kills bridge p crashKills times, evenly spread over d from
// start, each time starting a new one on the same endpoint and store. It
// returns the bridge running at the end and the kills, and stops at the
// first bridge that does not start.
func (b *bencher) crashKills(ctx context.Context, p *bridgeProc, start time.Time, d time.Duration, endpoint, store string) (*bridgeProc, []crashKill, error) {
	var kills []crashKill
	for k := 1; k <= crashKills; k++ {
		at := start.Add(time.Duration(k) * d / (crashKills + 1))
		select {
		case <-ctx.Done():
			return p, kills, nil
		case <-time.After(time.Until(at)):
		}
		p.kill()
		killed := time.Now()
		np, _, err := b.startBridge(ctx, endpoint, store)
		if err != nil {
			return p, kills, err
		}
		p = np
		kills = append(kills, crashKill{at: killed, ready: time.Now()})
		b.logf("   crash: killed at +%.2f s, ready again after %.0f ms", killed.Sub(start).Seconds(), ms(time.Since(killed)))
	}
	return p, kills, nil
}

// figures are the kill's duplicates among the arrivals got: messages that
// first arrived before the kill and again after it, with the forwards in
// the second before the kill as the rate they are measured against.
func (k crashKill) figures(got [][]time.Time, start time.Time) *CrashKill {
	ck := &CrashKill{AtSeconds: k.at.Sub(start).Seconds(), RestartMs: ms(k.ready.Sub(k.at))}
	before := 0
	for _, as := range got {
		if len(as) > 0 && !as[0].Before(k.at.Add(-time.Second)) && as[0].Before(k.at) {
			before++
		}
		if len(as) < 2 || !as[0].Before(k.at) || as[1].Before(k.at) {
			continue
		}
		ck.Duplicates++
		ck.OldestMs = max(ck.OldestMs, ms(k.at.Sub(as[0])))
	}
	ck.ForwardRate = float64(before)
	if before > 0 {
		ck.WindowMs = float64(ck.Duplicates) / float64(before) * 1000
	}
	return ck
}

// pacedSteady publishes the steady workload, n messages at rate a second
// from start to queue, each due 1–5 s after its send, round-robin to
// dests; then it waits for the step's events to end (errs closed) and
// returns the due times and the first error.
func (b *bencher) pacedSteady(ctx context.Context, start time.Time, rate, n int, dests []string, queue string, errs <-chan error) ([]time.Time, *SteadyLeg, error) {
	due := make([]time.Time, n)
	leg, _, err := b.paced(ctx, start, rate, n, func(i int, now time.Time) outgoing {
		due[i] = now.Add(steadyMinDelay + time.Duration(mrand.Int64N(int64(steadyMaxDelay-steadyMinDelay))))
		dest := dests[i%len(dests)]
		return outgoing{key: queue, msg: b.message(dest, i, due[i], dest)}
	})
	if eerr := <-errs; err == nil {
		err = eerr
	}
	return due, leg, err
}

// arrivalLog records every arrival of the bench's messages by seq.
type arrivalLog struct {
	ch   *amqp.Channel
	mu   sync.Mutex
	at   [][]time.Time
	exit chan struct{}
}

// arrivals consumes queues (autoAck) and records when each of n messages
// arrives, every time it does.
func (b *bencher) arrivals(queues []string, n int) (*arrivalLog, error) {
	ch, err := b.consConn.Channel()
	if err != nil {
		return nil, err
	}
	a := &arrivalLog{ch: ch, at: make([][]time.Time, n), exit: make(chan struct{})}
	var all []<-chan amqp.Delivery
	for _, q := range queues {
		ds, err := ch.Consume(q, "", true, false, false, false, nil)
		if err != nil {
			_ = ch.Close()
			return nil, fmt.Errorf("consume %s: %w", q, err)
		}
		all = append(all, ds)
	}
	var wg sync.WaitGroup
	for _, ds := range all {
		wg.Go(func() {
			for d := range ds {
				now := time.Now()
				seq, ok := headerInt(d.Headers, hdrSeq)
				if !ok || seq < 0 || int(seq) >= n {
					continue
				}
				a.mu.Lock()
				a.at[seq] = append(a.at[seq], now)
				a.mu.Unlock()
			}
		})
	}
	go func() { wg.Wait(); close(a.exit) }()
	return a, nil
}

// wait waits until the first sent messages have each arrived, or deadline.
func (a *arrivalLog) wait(ctx context.Context, sent int, deadline time.Time) {
	for time.Now().Before(deadline) && ctx.Err() == nil {
		a.mu.Lock()
		done := true
		for i := range sent {
			if len(a.at[i]) == 0 {
				done = false
				break
			}
		}
		a.mu.Unlock()
		if done {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// stop ends the consumers and returns what arrived.
func (a *arrivalLog) stop() [][]time.Time {
	_ = a.ch.Close()
	<-a.exit
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([][]time.Time, len(a.at))
	for i, ts := range a.at {
		out[i] = slices.Clone(ts)
	}
	return out
}

// crashRows are the step's figures.
func crashRows(c *Crash) []Row {
	if c == nil {
		return nil
	}
	rows := []Row{
		{Step: StepCrash, Metric: fmt.Sprintf("lost, %d sent at %d/s, %d kills", c.Sent, c.Rate, len(c.Kills)), Value: strconv.Itoa(c.Lost), Target: "0", Result: verdict(c.Lost == 0)},
		{Step: StepCrash, Metric: "early", Value: strconv.Itoa(c.Early), Target: "0", Result: verdict(c.Early == 0)},
	}
	for i, k := range c.Kills {
		rows = append(rows, Row{Step: StepCrash, Metric: fmt.Sprintf("kill %d at +%.1f s: duplicates (ms of forwards at %.0f/s)", i+1, k.AtSeconds, k.ForwardRate),
			Value: fmt.Sprintf("%d (%.0f ms)", k.Duplicates, k.WindowMs), Target: "≤ 100 ms", Result: verdict(k.WindowMs <= 100)})
	}
	rows = append(rows, Row{Step: StepCrash, Metric: "other duplicates (both copies after one kill)", Value: strconv.Itoa(c.Other)})
	return rows
}
