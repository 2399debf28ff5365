package bench

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// Failover is the failover step: three bridges share one PostgreSQL store
// under the steady workload (FailoverRate a second, due 1–5 s after each
// send) and one of them is killed with SIGKILL, stopped with SIGTERM, or
// stalled with SIGSTOP for 40 s and continued; each event is repeated
// FailoverRepeats times, each run on a fresh endpoint and schema. A dead
// instance's leases are freed by the others within a take-over pass of
// the grace past due (docs/contract.md §7.1), so the messages due in the
// 10 s after the event are late by seconds at most, where they were late
// by a whole lease (5 min) when leases only expired.
type Failover struct {
	Rate    int            `json:"rate"`
	Seconds float64        `json:"seconds"`
	Skipped string         `json:"skipped,omitempty"`
	Runs    []*FailoverRun `json:"runs,omitempty"`
}

// FailoverRun is one event in one run.
type FailoverRun struct {
	Event     string  `json:"event"` // kill, term or stop
	Repeat    int     `json:"repeat"`
	AtSeconds float64 `json:"at_seconds"` // after the first send
	Sent      int     `json:"sent"`
	Lost      int     `json:"lost"`
	Early     int     `json:"early"`
	// Duplicates are extra deliveries, of every message sent.
	Duplicates int `json:"duplicates"`
	// After are the messages due in the 10 s after the event, and the
	// lateness of their first arrivals.
	After       int     `json:"due_in_10s_after"`
	AfterMaxMs  float64 `json:"lateness_max_ms"`
	AfterP99Ms  float64 `json:"lateness_p99_ms"`
	AllMaxMs    float64 `json:"lateness_max_all_ms"`
	VictimOwner string  `json:"victim_owner,omitempty"`
}

// Failover defaults.
const (
	defaultFailoverRate     = 1000
	defaultFailoverDuration = 20 * time.Second
	defaultFailoverRepeats  = 5
	failoverEventAt         = 8 * time.Second
	failoverStall           = 40 * time.Second
	failoverAfter           = 10 * time.Second
)

// failoverEvents are the step's events, in the order they run.
var failoverEvents = []string{"kill", "term", "stop"}

func (b *bencher) stepFailover(ctx context.Context) error {
	rate, d := orDefault(b.opts.FailoverRate, defaultFailoverRate), orDefault(b.opts.FailoverDuration, defaultFailoverDuration)
	repeats := orDefault(b.opts.FailoverRepeats, defaultFailoverRepeats)
	res := &Failover{Rate: rate, Seconds: d.Seconds()}
	b.res.Failover = res
	conn, appName, err := b.pgOrSkip(ctx, "failover:", &res.Skipped)
	if conn == nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for r := 1; r <= repeats; r++ {
		for _, ev := range failoverEvents {
			run := &FailoverRun{Event: ev, Repeat: r}
			res.Runs = append(res.Runs, run)
			if err := b.failoverRun(ctx, conn, appName, run, rate, d); err != nil {
				return fmt.Errorf("%s #%d: %w", ev, r, err)
			}
		}
	}
	return nil
}

func (b *bencher) failoverRun(ctx context.Context, conn *pgx.Conn, appName string, run *FailoverRun, rate int, d time.Duration) error {
	label := StepFailover + "-" + run.Event + strconv.Itoa(run.Repeat)
	schema := "bench_" + b.runID + "_" + run.Event + strconv.Itoa(run.Repeat)
	pg, env := b.pgSchema(conn, appName, schema)
	defer b.dropSchema(ctx, pg)
	endpoint := b.name(label)
	var procs []*bridgeProc
	defer func() { b.stopInstances(label, procs) }()
	for i := range 3 {
		store := filepath.Join(b.dir, label, "instance"+strconv.Itoa(i+1), "unused.db")
		p, _, err := b.startBridgeEnv(ctx, endpoint, store, env)
		if err != nil {
			return fmt.Errorf("start instance %d: %w", i+1, err)
		}
		procs = append(procs, p)
	}
	dests, err := b.steadyQueues(label)
	if err != nil {
		return err
	}
	n := int(float64(rate) * d.Seconds())
	arr, err := b.arrivals(dests, n)
	if err != nil {
		return err
	}
	defer arr.stop()
	victim := procs[1]
	start := time.Now()
	var eventAt time.Time
	evErr := make(chan error, 1)
	go func() {
		defer close(evErr)
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Until(start.Add(failoverEventAt))):
		}
		eventAt = time.Now()
		switch run.Event {
		case "kill":
			victim.kill()
		case "term":
			if _, err := b.stopBridge(victim, label+"/2"); err != nil {
				evErr <- err
			}
		case "stop":
			_ = victim.cmd.Process.Signal(syscall.SIGSTOP)
			select {
			case <-ctx.Done():
			case <-time.After(failoverStall):
			}
			_ = victim.cmd.Process.Signal(syscall.SIGCONT)
		}
	}()
	due, leg, err := b.pacedSteady(ctx, start, rate, n, dests, procs[0].timeoutsQueue(), evErr)
	if err != nil {
		return err
	}
	run.Sent = leg.Pace.Published
	run.AtSeconds = eventAt.Sub(start).Seconds()
	last := start.Add(d + steadyMaxDelay)
	if run.Event == "stop" {
		if t := eventAt.Add(failoverStall + steadyMaxDelay); t.After(last) {
			last = t
		}
	}
	arr.wait(ctx, run.Sent, last.Add(collectGrace))
	time.Sleep(2 * time.Second) // late duplicates
	got := arr.stop()
	var after, all []float64
	for i := range run.Sent {
		as := got[i]
		if len(as) == 0 {
			run.Lost++
			continue
		}
		run.Duplicates += len(as) - 1
		if as[0].Round(0).Before(due[i].Round(0)) {
			run.Early++
		}
		late := ms(as[0].Round(0).Sub(due[i].Round(0)))
		all = append(all, late)
		if !due[i].Before(eventAt) && due[i].Before(eventAt.Add(failoverAfter)) {
			after = append(after, late)
		}
	}
	slices.Sort(after)
	run.After = len(after)
	if len(after) > 0 {
		run.AfterMaxMs = after[len(after)-1]
		run.AfterP99Ms = after[min(len(after)-1, len(after)*99/100)]
	}
	if len(all) > 0 {
		run.AllMaxMs = slices.Max(all)
	}
	b.logf("   failover: %s #%d at +%.1f s: %d sent, %d lost, %d early, %d duplicates; due in the 10 s after: %d, lateness p99 %.0f ms, max %.0f ms (all: max %.0f ms)",
		run.Event, run.Repeat, run.AtSeconds, run.Sent, run.Lost, run.Early, run.Duplicates, run.After, run.AfterP99Ms, run.AfterMaxMs, run.AllMaxMs)
	return nil
}

// failoverRows are the step's figures: one row per run, then the checks.
func failoverRows(f *Failover) []Row {
	if f == nil {
		return nil
	}
	if f.Skipped != "" {
		return []Row{{Step: StepFailover, Metric: "three instances on PostgreSQL, one lost", Value: "skipped: " + f.Skipped}}
	}
	var rows []Row
	for _, r := range f.Runs {
		target, ok := "", true
		switch r.Event {
		case "kill":
			target, ok = "max ≤ 3 s", r.AfterMaxMs <= 3000
		case "term":
			target, ok = "max ≤ 1 s", r.AfterMaxMs <= 1000
		}
		rows = append(rows, Row{Step: StepFailover,
			Metric: fmt.Sprintf("%s #%d at +%.1f s (%d/s, 3 instances): lost / early / duplicates; due in the 10 s after: lateness p99 / max", r.Event, r.Repeat, r.AtSeconds, f.Rate),
			Value:  fmt.Sprintf("%d / %d / %d; %d: %s / %s", r.Lost, r.Early, r.Duplicates, r.After, FmtMs(r.AfterP99Ms), FmtMs(r.AfterMaxMs)),
			Target: "0 lost, 0 early; " + target, Result: verdict(r.Lost == 0 && r.Early == 0 && ok)})
	}
	return rows
}
