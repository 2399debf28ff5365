package bench

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/internal/confirmed"
	"github.com/delaybridge/delaybridge/internal/nsbendpoint"
	"github.com/delaybridge/delaybridge/wire"
	"github.com/delaybridge/delaybridge/wire/nsbdelay"
)

// Resend is the resend step: clients that send a message again, with the
// same id, the moment it arrives (NServiceBus's delayed retries of a
// handler that fails fast, a saga setting its timeout again, a publisher
// re-publishing), at a steady rate of new messages, through one bridge
// (bbolt) and, with --postgres-url, two sharing PostgreSQL. Every send must
// arrive (docs/contract.md §2.4): lost must be 0.
type Resend struct {
	Rate    int          `json:"rate"`    // new messages a second, per workload
	Seconds float64      `json:"seconds"` // of new messages
	Rounds  int          `json:"rounds"`  // sends of each message
	DelayMs float64      `json:"delay_ms"`
	Runs    []*ResendRun `json:"runs"`
	Skipped string       `json:"skipped,omitempty"`
}

// ResendRun is the step through one store.
type ResendRun struct {
	Store     string            `json:"store"` // bbolt, or postgres (2 instances)
	Workloads []*ResendWorkload `json:"workloads"`
}

// ResendWorkload is one way of sending again.
type ResendWorkload struct {
	Name       string `json:"name"`
	Messages   int    `json:"messages"`
	Sends      int    `json:"sends"`     // expected: messages × rounds
	Delivered  int    `json:"delivered"` // sends that arrived (first arrival of each)
	Lost       int    `json:"lost"`      // sends that never arrived (and their later rounds, never sent)
	Duplicates int    `json:"duplicates"`
	Early      int    `json:"early"`
	Percentiles
}

// Resend defaults: each workload sends 50 new messages a second for 10 s,
// each sent 3 times, each send due 1 s after it is sent (the shortest
// NServiceBus delay).
const (
	defaultResendRate     = 50
	defaultResendDuration = 10 * time.Second
	resendRounds          = 3
	resendDelay           = time.Second
)

// resendWorkload sends message i's send r (0 first) and returns when it is
// due at the earliest.
type resendWorkload struct {
	name  string
	dest  string
	send  func(p *confirmed.Publisher, i, r int) (time.Time, error)
	state *ResendWorkload
}

// stepResend runs the loop through bbolt, then through two instances on
// PostgreSQL. The NServiceBus workload uses the transport's names: it
// holds nsbendpoint's lock, as stepNSB does.
func (b *bencher) stepResend(ctx context.Context) error {
	rate, d := orDefault(b.opts.ResendRate, defaultResendRate), orDefault(b.opts.ResendDuration, defaultResendDuration)
	res := &Resend{Rate: rate, Seconds: d.Seconds(), Rounds: resendRounds, DelayMs: ms(resendDelay)}
	b.res.Resend = res
	release, err := b.holdNSBChain(ctx)
	if err != nil {
		return err
	}
	defer release()
	stores := []string{"bbolt"}
	if b.opts.PostgresURL != "" {
		stores = append(stores, "postgres")
	} else {
		res.Skipped = "postgres: " + noPostgres
	}
	for _, store := range stores {
		run, err := b.resendRun(ctx, store, res)
		if run != nil {
			res.Runs = append(res.Runs, run)
		}
		if err != nil {
			return err
		}
	}
	return ctx.Err()
}

// resendRun starts the bridges of store and runs every workload through
// them at once.
func (b *bencher) resendRun(ctx context.Context, store string, res *Resend) (*ResendRun, error) {
	label := StepResend + "-" + store
	endpoint := b.name(label)
	env := map[string]string{"DELAYBRIDGE_NSB_NATIVE_DELAYS": "true"}
	instances := 1
	if store == "postgres" {
		conn, appName, err := b.pgConnect(ctx)
		if err != nil {
			return nil, err
		}
		defer conn.Close(context.WithoutCancel(ctx))
		pg, pgEnv := b.pgSchema(conn, appName, "bench_"+b.runID+"_resend")
		defer b.dropSchema(ctx, pg)
		maps.Copy(env, pgEnv)
		instances = 2
	}
	var procs []*bridgeProc
	defer func() { b.stopInstances(label, procs) }()
	for i := range instances {
		p, _, err := b.startBridgeEnv(ctx, endpoint, filepath.Join(b.dir, label, strconv.Itoa(i), "delaybridge.db"), env)
		if err != nil {
			return nil, err
		}
		procs = append(procs, p)
	}
	if err := b.waitNSBConsumers(ctx); err != nil {
		return nil, err
	}
	run := &ResendRun{Store: store}
	ws, err := b.resendWorkloads(endpoint, label, resendDelay)
	if err != nil {
		return nil, err
	}
	for _, w := range ws {
		w.state = &ResendWorkload{Name: w.name}
		run.Workloads = append(run.Workloads, w.state)
	}
	b.logf("   %s: %d workloads, %d new messages a second each for %v, each sent %d times the moment it arrives",
		label, len(ws), res.Rate, time.Duration(res.Seconds*float64(time.Second)), res.Rounds)
	err = b.resendLoop(ctx, ws, res)
	for _, w := range run.Workloads {
		b.logf("   %s %s: %d of %d sends delivered, %d lost, %d duplicates, %d early; lateness p50 %.1f ms, p99 %.1f ms, max %.1f ms",
			label, w.Name, w.Delivered, w.Sends, w.Lost, w.Duplicates, w.Early, w.P50Ms, w.P99Ms, w.MaxMs)
	}
	return run, err
}

// resendWorkloads are the ways of sending again, each to a destination of
// its own: a delayed retry through NServiceBus's v2 chain, a second-level
// retry to the timeout manager (E.Timeouts), and the very same message
// re-published with x-delay.
func (b *bencher) resendWorkloads(endpoint, label string, delay time.Duration) ([]*resendWorkload, error) {
	timeouts := wire.TimeoutsQueue(endpoint)
	var ws []*resendWorkload
	for _, name := range []string{"nsb-native-v2-retry", "nsb-timeout-manager-retry", "x-delay-republish"} {
		dest := b.name(label, name)
		if err := b.declareQueue(dest, nil); err != nil {
			return nil, err
		}
		ws = append(ws, &resendWorkload{name: name, dest: dest})
	}
	if err := b.bindNSB(ws[0].dest); err != nil {
		return nil, err
	}
	id := func(w *resendWorkload, i int) string { return w.name + "-" + strconv.Itoa(i) }
	var mu sync.Mutex
	sent := map[int]time.Time{} // NServiceBus: each message's time sent, kept by its retries
	secs := int32(delay / time.Second)
	ws[0].send = func(p *confirmed.Publisher, i, r int) (time.Time, error) {
		now := time.Now()
		mu.Lock()
		if r == 0 {
			sent[i] = now
		}
		s := nsbendpoint.Send{MessageID: id(ws[0], i), Address: ws[0].dest, Delay: secs, TimeSent: sent[i], Body: b.body, SeqNo: int64(i)}
		mu.Unlock()
		if r > 0 {
			s.Retried = now
			s.Headers = map[string]string{"NServiceBus.Retries": strconv.Itoa(r)}
		}
		key, level := s.Key()
		return now.Truncate(time.Microsecond).Add(time.Duration(secs) * time.Second), p.Publish(nsbdelay.V2.Level(level), key, s.Publishing())
	}
	ws[1].send = func(p *confirmed.Publisher, i, r int) (time.Time, error) {
		msg, due := nsbTimeout(id(ws[1], i), ws[1].dest, time.Now().Add(delay), time.Now(), b.body, i)
		delete(msg.Headers, hdrDue)
		delete(msg.Headers, hdrSeq)
		msg.Headers["NServiceBus.Retries"] = strconv.Itoa(r)
		return due, p.Publish("", timeouts, msg)
	}
	ws[2].send = func(p *confirmed.Publisher, i, r int) (time.Time, error) {
		due := time.Now().Add(delay)
		return due, p.Publish("", timeouts, amqp.Publishing{MessageId: id(ws[2], i), DeliveryMode: amqp.Persistent, Body: b.body,
			Headers: amqp.Table{wire.HeaderDestination: ws[2].dest, wire.HeaderDelay: int32(delay / time.Millisecond)}})
	}
	return ws, nil
}

// resendLoop sends each workload's new messages at res.Rate for
// res.Seconds, and each next send of a message the moment its previous
// one arrives; then waits for the last sends and counts.
func (b *bencher) resendLoop(ctx context.Context, ws []*resendWorkload, res *Resend) error {
	n := int(float64(res.Rate) * res.Seconds)
	t := &resendTally{state: make(map[*resendWorkload][]resendMsg, len(ws))}
	for _, w := range ws {
		t.state[w] = make([]resendMsg, n)
	}
	conn, err := b.dial("resend")
	if err != nil {
		return err
	}
	defer conn.Close()
	lctx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	for _, w := range ws {
		again, err := confirmed.NewPublisher(conn)
		if err != nil {
			return err
		}
		cch, err := conn.Channel()
		if err != nil {
			return err
		}
		ds, err := cch.Consume(w.dest, "", true, false, false, false, nil)
		if err != nil {
			return fmt.Errorf("consume %s: %w", w.dest, err)
		}
		wg.Go(func() { t.resendOnArrival(lctx, ds, w, again, n, res.Rounds) })
		first, err := confirmed.NewPublisher(conn)
		if err != nil {
			return err
		}
		wg.Go(func() { t.sendNew(lctx, w, first, n, res.Rate) })
	}
	// Every send arrives within rounds × (delay + a grace) of the last new
	// message; the loop ends there, or once everything arrived.
	deadline := time.Now().Add(time.Duration(res.Seconds*float64(time.Second)) + time.Duration(res.Rounds)*(resendDelay+5*time.Second))
	for time.Now().Before(deadline) && ctx.Err() == nil && t.complete(res.Rounds) < n*len(ws) {
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(duplicateLinger)
	stop()
	wg.Wait()
	return t.count(n, res.Rounds)
}

// resendTally is what resendLoop records: for each workload's messages the
// due time of each send and the time of each arrival, and the sends that
// failed.
type resendTally struct {
	mu    sync.Mutex
	state map[*resendWorkload][]resendMsg
	errs  []error
}

type resendMsg struct{ due, at []time.Time }

// send sends message i of w the r-th time, through p.
func (t *resendTally) send(w *resendWorkload, p *confirmed.Publisher, i, r int) {
	due, err := w.send(p, i, r)
	t.mu.Lock()
	defer t.mu.Unlock()
	if err != nil {
		t.errs = append(t.errs, fmt.Errorf("%s: send %d of message %d: %w", w.name, r, i, err))
		return
	}
	t.state[w][i].due = append(t.state[w][i].due, due)
}

// sendNew sends w's n new messages, rate a second.
func (t *resendTally) sendNew(ctx context.Context, w *resendWorkload, p *confirmed.Publisher, n, rate int) {
	start := time.Now()
	for i := range n {
		at := start.Add(time.Duration(i) * time.Second / time.Duration(rate))
		if d := time.Until(at); d > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(d):
			}
		}
		t.send(w, p, i, 0)
	}
}

// resendOnArrival records the arrivals of w's messages from ds and sends
// each again through p until it has arrived rounds times.
func (t *resendTally) resendOnArrival(ctx context.Context, ds <-chan amqp.Delivery, w *resendWorkload, p *confirmed.Publisher, n, rounds int) {
	for {
		select {
		case <-ctx.Done():
			return
		case d, ok := <-ds:
			if !ok {
				return
			}
			at := time.Now()
			i, err := strconv.Atoi(d.MessageId[len(w.name)+1:])
			if err != nil || i < 0 || i >= n {
				continue
			}
			t.mu.Lock()
			s := &t.state[w][i]
			s.at = append(s.at, at)
			r := len(s.at)
			t.mu.Unlock()
			if r < rounds {
				t.send(w, p, i, r)
			}
		}
	}
}

// complete counts the messages, of every workload, that arrived rounds
// times.
func (t *resendTally) complete(rounds int) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	done := 0
	for _, msgs := range t.state {
		for _, s := range msgs {
			if len(s.at) >= rounds {
				done++
			}
		}
	}
	return done
}

// count fills in each workload's figures, n messages sent rounds times
// each, and returns the failed sends.
func (t *resendTally) count(n, rounds int) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	for w, msgs := range t.state {
		r := w.state
		r.Messages, r.Sends = n, n*rounds
		var late []time.Duration
		for _, s := range msgs {
			got := min(len(s.at), rounds)
			r.Delivered += got
			r.Lost += rounds - got
			r.Duplicates += len(s.at) - got
			for k := range min(len(s.at), len(s.due)) {
				l := s.at[k].Sub(s.due[k])
				if l < 0 {
					r.Early++
				}
				late = append(late, l)
			}
		}
		r.Percentiles = summarize(late)
	}
	return errors.Join(t.errs...)
}

// resendRows are the step's figures: lost must be 0 in every workload.
func resendRows(r *Resend) []Row {
	if r == nil {
		return nil
	}
	var rows []Row
	for _, run := range r.Runs {
		for _, w := range run.Workloads {
			label := fmt.Sprintf("%s, %s: %d messages (%d/s for %.0f s) × %d sends", run.Store, w.Name, w.Messages, r.Rate, r.Seconds, r.Rounds)
			rows = append(rows,
				Row{Step: StepResend, Metric: "sends lost, " + label, Value: fmt.Sprintf("%d of %d", w.Lost, w.Sends), Target: "0", Result: verdict(w.Lost == 0)},
				Row{Step: StepResend, Metric: "duplicates", Value: fmt.Sprintf("%d of %d", w.Duplicates, w.Sends)},
				Row{Step: StepResend, Metric: "early", Value: fmt.Sprintf("%d of %d", w.Early, w.Sends), Target: "0", Result: verdict(w.Early == 0)},
				Row{Step: StepResend, Metric: "lateness p50 / p99 / max", Value: FmtMs(w.P50Ms) + " / " + FmtMs(w.P99Ms) + " / " + FmtMs(w.MaxMs)},
			)
		}
	}
	if r.Skipped != "" {
		rows = append(rows, Row{Step: StepResend, Metric: "skipped", Value: r.Skipped})
	}
	return rows
}
