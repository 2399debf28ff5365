package bench

import (
	"context"
	"fmt"
	"io"
	"maps"
	mrand "math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"time"
)

// The steady step: messages published at a constant rate R for a
// fixed time, each due U[1 s, 5 s] after its own send, to four destination
// queues, so that the bridge takes messages in while others fall due. The
// baseline is the broker's own single hop at R and at 2R (the bridge's path
// is two hops), measured in the same run.
const (
	steadyDests        = 4
	steadyMinDelay     = time.Second
	steadyMaxDelay     = 5 * time.Second
	steadySearchStart  = 1000
	steadySearchStep   = 500
	steadySearchFloor  = 250 // below the start, the search halves down to this
	steadySearchP99    = 10 * time.Millisecond
	steadyMaxRatio     = 5.0                    // bridge p99 within 5× of the hop at 2R
	steadyBehindLag    = 100 * time.Millisecond // p99 send lag beyond which the publisher fell behind
	steadyBehindRate   = 0.98                   // achieved / target below which it fell behind
	steadyPaceTick     = time.Millisecond
	steadyProfileStart = 5 * time.Second // deliveries run at the full rate from here on
)

// Steady is the steady step's results, per store.
type Steady struct {
	DurationS float64        `json:"duration_s"`
	Rates     []int          `json:"rates"`
	Stores    []*SteadyStore `json:"stores"`
}

// SteadyStore is the steady workload through a bridge on one store.
type SteadyStore struct {
	Store   string         `json:"store"` // bbolt or postgres
	Skipped string         `json:"skipped,omitempty"`
	Rates   []*SteadyRate  `json:"rates"`
	Search  *SteadySearch  `json:"search,omitempty"`
	Profile map[int]string `json:"profiles,omitempty"` // rate → CPU profile file
}

// SteadyRate is one rate R: the bridge, and the broker's single hop at R and
// at 2R.
type SteadyRate struct {
	Rate   int        `json:"rate"`
	Bridge *SteadyLeg `json:"bridge"`
	Hop    *SteadyLeg `json:"hop"`
	Hop2   *SteadyLeg `json:"hop_2x"`
	// RatioP99 is the bridge's p99 over the hop's at 2R (0: unknown).
	RatioP99 float64 `json:"ratio_p99_to_hop_2x,omitempty"`
}

// SteadyLeg is one paced run: how the publisher kept pace and, at the
// consumer, the lateness (bridge: receive − due; hop: receive − send).
type SteadyLeg struct {
	Pace Pace    `json:"pace"`
	CPU  *LegCPU `json:"cpu,omitempty"` // nil: not measured (no /proc)
	Lateness
}

// LegCPU is where the machine's CPU went while a leg ran at its full rate,
// in cores (CPU seconds per second of the window): the bridge's from
// steadyProfileStart after its first send, when deliveries have reached
// the full rate, to its last send; a hop's from its first send to its
// last. Busy and Steal are shares of all the machine's CPUs. Steal is time
// the hypervisor gave to other guests while this one had work to run: on
// a shared cloud machine it makes a tail that nothing here causes, so a
// figure read without it can blame the bridge (or the broker) wrongly.
type LegCPU struct {
	WindowS  float64 `json:"window_s"`
	Bridge   float64 `json:"bridge_cores"` // -1: unknown
	Broker   float64 `json:"broker_cores"`
	Postgres float64 `json:"postgres_cores,omitempty"`
	Bench    float64 `json:"bench_cores"`
	Other    float64 `json:"other_cores"` // busy time none of the above took
	Busy     float64 `json:"machine_busy"`
	Steal    float64 `json:"machine_steal"`
}

// legCPU is the CPU between two samples of one bridge (nil: no time
// between them).
func legCPU(a, b cpuSample) *LegCPU {
	var ph ScaleOutPhase
	ph.cpu(a, b)
	wall := float64(b.machine.total-a.machine.total) / clockTicks / float64(max(runtime.NumCPU(), 1))
	if wall <= 0 {
		return nil
	}
	c := &LegCPU{WindowS: wall, Bridge: -1, Broker: ph.BrokerCPUSeconds / wall, Postgres: ph.PostgresCPUSeconds / wall,
		Bench: ph.BenchCPUSeconds / wall, Other: ph.otherCPUSeconds() / wall, Busy: ph.MachineBusy, Steal: ph.MachineSteal}
	if len(ph.BridgeCPUSeconds) == 1 && ph.BridgeCPUSeconds[0] >= 0 {
		c.Bridge = ph.BridgeCPUSeconds[0] / wall
	}
	return c
}

// String is the leg's CPU as the step's log and table show it.
func (c *LegCPU) String() string {
	if c == nil {
		return "-"
	}
	bridge := "?"
	if c.Bridge >= 0 {
		bridge = fmt.Sprintf("%.2f", c.Bridge)
	}
	s := fmt.Sprintf("bridge %s, broker %.2f", bridge, c.Broker)
	if c.Postgres > 0 {
		s += fmt.Sprintf(", postgres %.2f", c.Postgres)
	}
	return s + fmt.Sprintf(", bench %.2f, other %.2f cores; machine busy %.0f%%, steal %.1f%%",
		c.Bench, c.Other, 100*c.Busy, 100*c.Steal)
}

// steadyStealWarn: above this share of the CPUs stolen by the hypervisor
// during a leg, the step warns that the leg's tail is the host's as much
// as this machine's.
const steadyStealWarn = 0.02

// SteadySearch is the highest rate at which the bridge's p99 stayed within
// steadySearchP99 with the publisher keeping pace.
type SteadySearch struct {
	Steps   []SteadyPoint `json:"steps"`
	Best    int           `json:"best_rate"` // 0: not even the first
	Ceiling float64       `json:"ceiling_msgs_per_s,omitempty"`
	Ratio   float64       `json:"ratio_to_ceiling,omitempty"`
}

// SteadyPoint is one rate of the search.
type SteadyPoint struct {
	Rate    int     `json:"rate"`
	P99Ms   float64 `json:"p99_ms"`
	MaxMs   float64 `json:"max_ms"`
	Behind  bool    `json:"publisher_behind"`
	Missing int     `json:"missing"`
	Pass    bool    `json:"pass"`
}

// Pace is how well a paced publisher kept to its schedule: message i was
// meant to go at start + i/R.
type Pace struct {
	TargetRate float64 `json:"target_msgs_per_s"`
	N          int     `json:"n"`
	Published  int     `json:"published"`
	Rate       float64 `json:"achieved_msgs_per_s"`
	LagP50Ms   float64 `json:"send_lag_p50_ms"` // send time − slot
	LagP99Ms   float64 `json:"send_lag_p99_ms"`
	LagMaxMs   float64 `json:"send_lag_max_ms"`
	Behind     bool    `json:"behind"`
}

// slotAt is when message i of a schedule at rate per second from start is
// meant to go.
func slotAt(start time.Time, i int, rate float64) time.Time {
	return start.Add(time.Duration(float64(i) / rate * float64(time.Second)))
}

// owed is how many of n messages a schedule at rate per second has released
// elapsed after its start: message 0 at once, message i at i/rate.
func owed(elapsed time.Duration, rate float64, n int) int {
	if elapsed < 0 {
		return 0
	}
	return min(int(elapsed.Seconds()*rate)+1, n)
}

// pace releases the indexes 0..n-1 on the returned channel, index i no
// sooner than its slot. It wakes every tick and releases everything owed by
// then, so a late wake-up (a loaded machine) catches up rather than shifting
// the rest of the schedule. The channel is closed after the last index or
// when ctx ends.
func pace(ctx context.Context, start time.Time, rate float64, n int, tick time.Duration) <-chan int {
	out := make(chan int, 4096)
	go func() {
		defer close(out)
		t := time.NewTicker(tick)
		defer t.Stop()
		released := 0
		for released < n {
			for k := owed(time.Since(start), rate, n); released < k; released++ {
				select {
				case out <- released:
				case <-ctx.Done():
					return
				}
			}
			if released >= n {
				return
			}
			select {
			case <-t.C:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out
}

// paceStats compares the send times (zero: never sent) with the schedule.
func paceStats(start time.Time, target float64, sent []time.Time) Pace {
	p := Pace{TargetRate: target, N: len(sent)}
	lags := make([]time.Duration, 0, len(sent))
	var last time.Time
	for i, at := range sent {
		if at.IsZero() {
			continue
		}
		p.Published++
		lags = append(lags, max(at.Sub(slotAt(start, i, target)), 0))
		if at.After(last) {
			last = at
		}
	}
	if p.Published == 0 {
		p.Behind = true
		return p
	}
	// A perfect schedule sends its last message (n-1)/R after the start:
	// one interval more makes its rate exactly R.
	p.Rate = rate(p.Published, last.Sub(start)+time.Duration(float64(time.Second)/target))
	slices.Sort(lags)
	p.LagP50Ms, p.LagP99Ms, p.LagMaxMs = ms(Percentile(lags, 50)), ms(Percentile(lags, 99)), ms(lags[len(lags)-1])
	p.Behind = p.Published < p.N || p.Rate < steadyBehindRate*target || p.LagP99Ms > ms(steadyBehindLag)
	return p
}

// steadyRatio is the bridge's p99 over the hop's (0 when the hop's is 0).
func steadyRatio(bridgeP99, hopP99 float64) float64 {
	if hopP99 <= 0 {
		return 0
	}
	return bridgeP99 / hopP99
}

// searchPass tells whether a rate of the search kept the bridge's p99
// within steadySearchP99 with nothing missing and the publisher on pace.
func searchPass(l *SteadyLeg) bool {
	return l != nil && !l.Pace.Behind && l.Missing == 0 && l.Received > 0 && l.P99Ms <= ms(steadySearchP99)
}

// steadyTarget is the p99 and max targets for a store at a rate
// (0: none).
func steadyTarget(store string, r int) (p99, maxMs float64) {
	switch {
	case store == "bbolt" && r == 2000:
		return 10, 50
	case store == "bbolt" && r == 3000:
		return 25, 0
	case store == "postgres" && r == 2000:
		return 25, 0
	}
	return 0, 0
}

// ---------------------------------------------------------------------------

func (b *bencher) stepSteady(ctx context.Context) error {
	res := &Steady{DurationS: b.opts.SteadyDuration.Seconds(), Rates: b.opts.SteadyRates}
	b.res.Steady = res
	if b.opts.SteadySearch && b.res.Ceiling == nil {
		b.logf("   steady: measuring the single-hop ceiling for the search")
		if err := b.stepThroughput(ctx, true, false); err != nil {
			return fmt.Errorf("ceiling: %w", err)
		}
	}
	for _, store := range b.opts.SteadyStores {
		st := &SteadyStore{Store: store}
		res.Stores = append(res.Stores, st)
		if err := b.steadyStore(ctx, st); err != nil {
			return fmt.Errorf("%s: %w", store, err)
		}
	}
	return nil
}

// steadyStore runs every rate (and the search) through one bridge on store.
func (b *bencher) steadyStore(ctx context.Context, st *SteadyStore) error {
	label := StepSteady + "-" + st.Store
	env := map[string]string{}
	if b.opts.SteadyProfile != "" {
		env["DELAYBRIDGE_PPROF"] = "true"
		if err := os.MkdirAll(b.opts.SteadyProfile, 0o755); err != nil {
			return err
		}
	}
	var pg *scaleOutPg // nil: bbolt
	if st.Store == "postgres" {
		conn, appName, err := b.pgOrSkip(ctx, "steady: postgres", &st.Skipped)
		if conn == nil {
			return err
		}
		defer conn.Close(context.WithoutCancel(ctx))
		var pgEnv map[string]string
		pg, pgEnv = b.pgSchema(conn, appName, "bench_"+b.runID+"_steady")
		defer b.dropSchema(ctx, pg)
		maps.Copy(env, pgEnv)
	}
	p, ready, err := b.startBridgeEnv(ctx, b.name(label), filepath.Join(b.dir, label, "delaybridge.db"), env)
	if err != nil {
		return err
	}
	defer b.stopBridge(p, label)
	b.logf("   bridge %s (%s) ready in %.0f ms (pid %d, http %s)", p.endpoint, st.Store, ms(ready), p.cmd.Process.Pid, p.httpAddr)

	for _, r := range b.opts.SteadyRates {
		sr := &SteadyRate{Rate: r}
		st.Rates = append(st.Rates, sr)
		if sr.Bridge, err = b.steadyBridge(ctx, p, st, pg, r); err != nil {
			return err
		}
		if sr.Hop, err = b.steadyHop(ctx, p, pg, label, r); err != nil {
			return err
		}
		if sr.Hop2, err = b.steadyHop(ctx, p, pg, label, 2*r); err != nil {
			return err
		}
		sr.RatioP99 = steadyRatio(sr.Bridge.P99Ms, sr.Hop2.P99Ms)
		b.logf("   steady %s %d/s: bridge p99 %.1f ms; hop p99 %.2f ms at %d/s, %.2f ms at %d/s; ratio %.1f×",
			st.Store, r, sr.Bridge.P99Ms, sr.Hop.P99Ms, r, sr.Hop2.P99Ms, 2*r, sr.RatioP99)
	}
	if b.opts.SteadySearch {
		return b.steadySearch(ctx, p, st, pg)
	}
	return nil
}

// steadySearch steps R up from steadySearchStart by steadySearchStep until
// the bridge's p99 exceeds steadySearchP99 or the publisher cannot keep up,
// reusing the rates already measured.
func (b *bencher) steadySearch(ctx context.Context, p *bridgeProc, st *SteadyStore, pg *scaleOutPg) error {
	s := &SteadySearch{}
	st.Search = s
	if c := b.res.Ceiling; c != nil {
		s.Ceiling = c.Rate
	}
	limit := 50000
	if s.Ceiling > 0 {
		limit = int(2 * s.Ceiling)
	}
	err := searchRates(s, limit, func(r int) (*SteadyLeg, error) {
		for _, sr := range st.Rates {
			if sr.Rate == r {
				return sr.Bridge, nil
			}
		}
		return b.steadyBridge(ctx, p, st, pg, r)
	}, func(pt SteadyPoint) {
		b.logf("   steady search %s %d/s: p99 %.1f ms, publisher behind %v: %s", st.Store, pt.Rate, pt.P99Ms, pt.Behind, verdict(pt.Pass))
	})
	if s.Ceiling > 0 {
		s.Ratio = float64(s.Best) / s.Ceiling
	}
	return err
}

// searchRates fills s.Steps and s.Best: up from steadySearchStart by
// steadySearchStep to limit while each rate passes; when even the start
// misses, down by halves to steadySearchFloor until one passes, so that a
// machine slower than the start still gets a figure rather than none.
func searchRates(s *SteadySearch, limit int, measure func(r int) (*SteadyLeg, error), report func(SteadyPoint)) error {
	try := func(r int) (bool, error) {
		leg, err := measure(r)
		if err != nil {
			return false, err
		}
		pt := SteadyPoint{Rate: r, P99Ms: leg.P99Ms, MaxMs: leg.MaxMs, Behind: leg.Pace.Behind, Missing: leg.Missing, Pass: searchPass(leg)}
		s.Steps = append(s.Steps, pt)
		report(pt)
		if pt.Pass {
			s.Best = r
		}
		return pt.Pass, nil
	}
	for r := steadySearchStart; r <= limit; r += steadySearchStep {
		pass, err := try(r)
		if err != nil {
			return err
		}
		if !pass {
			break
		}
	}
	if s.Best > 0 {
		return nil
	}
	for r := steadySearchStart / 2; r >= steadySearchFloor; r /= 2 {
		if r > limit {
			continue
		}
		if pass, err := try(r); err != nil || pass {
			return err
		}
	}
	return nil
}

// steadyQueues declares the steady workload's destination queues, the
// step's (label's) dest0 to dest3.
func (b *bencher) steadyQueues(label string) ([]string, error) {
	dests := make([]string, steadyDests)
	for k := range dests {
		dests[k] = b.name(label, "dest"+strconv.Itoa(k))
		if err := b.declareQueue(dests[k], nil); err != nil {
			return nil, err
		}
	}
	return dests, nil
}

// steadyBridge publishes R a second for the step's duration through bridge
// p, each due U[1 s, 5 s] after its send, to four destination queues, and
// measures the lateness at their consumer.
func (b *bencher) steadyBridge(ctx context.Context, p *bridgeProc, st *SteadyStore, pg *scaleOutPg, r int) (*SteadyLeg, error) {
	label := fmt.Sprintf("%s-%s-%d", StepSteady, st.Store, r)
	dests, err := b.steadyQueues(label)
	if err != nil {
		return nil, err
	}
	n := int(float64(r) * b.opts.SteadyDuration.Seconds())
	col, err := b.collectQueues(dests, n, nil)
	if err != nil {
		return nil, err
	}
	b.logf("   steady %s: %d/s for %v (%d messages), due 1–5 s after each send", st.Store, r, b.opts.SteadyDuration, n)
	var prof sync.WaitGroup
	start := time.Now()
	// The CPU sample at the window's start is taken meanwhile; cancelled,
	// it returns at once, and it is always waited for, as it may use pg's
	// connection.
	sctx, stopSample := context.WithCancel(ctx)
	defer stopSample()
	c0 := make(chan cpuSample, 1)
	go func() { c0 <- b.cpuAt(sctx, []*bridgeProc{p}, pg, b.steadyFrom(start)) }()
	if b.opts.SteadyProfile != "" {
		prof.Add(1)
		go func() {
			defer prof.Done()
			path, err := b.steadyProfile(ctx, p, st.Store, r, start)
			if err != nil {
				b.warnf("steady %s %d/s: CPU profile: %v", st.Store, r, err)
				return
			}
			if st.Profile == nil {
				st.Profile = map[int]string{}
			}
			st.Profile[r] = path
		}()
	}
	leg, pub, err := b.paced(ctx, start, r, n, func(i int, now time.Time) outgoing {
		due := now.Add(steadyMinDelay + time.Duration(mrand.Int64N(int64(steadyMaxDelay-steadyMinDelay))))
		dest := dests[i%steadyDests]
		return outgoing{key: p.timeoutsQueue(), msg: b.message(dest, i, due, dest)}
	})
	if err != nil {
		stopSample()
		<-c0
		col.stop(0)
		prof.Wait()
		return nil, err
	}
	leg.CPU = legCPU(<-c0, cpuNow(ctx, []*bridgeProc{p}, pg))
	col.expect(leg.Pace.Published)
	if !col.wait(ctx, pub.End.Add(steadyMaxDelay+collectGrace)) && ctx.Err() == nil {
		b.warnf("steady %s %d/s: %d of %d delivered %v after the last due time", st.Store, r, col.received(), leg.Pace.Published, collectGrace)
	}
	got, _ := col.stop(duplicateLinger)
	leg.counted(got)
	prof.Wait()
	b.logf("   steady %s %d/s: publish %.0f/s (lag p99 %.1f ms, behind %v); p50 %.1f ms, p99 %.1f ms, p99.9 %.1f ms, max %.1f ms, early %d, dups %d, missing %d",
		st.Store, r, leg.Pace.Rate, leg.Pace.LagP99Ms, leg.Pace.Behind, leg.P50Ms, leg.P99Ms, leg.P999Ms, leg.MaxMs, leg.Early, leg.Duplicates, leg.Missing)
	b.legCPUf(fmt.Sprintf("steady %s %d/s", st.Store, r), leg.CPU)
	return leg, ctx.Err()
}

// steadyHop is the broker's own single hop at r a second: published
// straight to a plain queue with the send time as bench-due, so the
// lateness at the consumer is the latency. Bridge p, idle meanwhile, and
// pg are sampled for the leg's CPU.
func (b *bencher) steadyHop(ctx context.Context, p *bridgeProc, pg *scaleOutPg, label string, r int) (*SteadyLeg, error) {
	q := b.name(label, "hop", strconv.Itoa(r))
	if err := b.declareQueue(q, nil); err != nil {
		return nil, err
	}
	n := int(float64(r) * b.opts.SteadyDuration.Seconds())
	col, err := b.collect(q, n)
	if err != nil {
		return nil, err
	}
	c0 := cpuNow(ctx, []*bridgeProc{p}, pg)
	leg, pub, err := b.paced(ctx, time.Now(), r, n, func(i int, now time.Time) outgoing {
		return outgoing{key: q, msg: b.message(q, i, now, q)}
	})
	if err != nil {
		col.stop(0)
		return nil, err
	}
	leg.CPU = legCPU(c0, cpuNow(ctx, []*bridgeProc{p}, pg))
	col.expect(leg.Pace.Published)
	if !col.wait(ctx, pub.End.Add(collectGrace)) && ctx.Err() == nil {
		b.warnf("steady hop %d/s: %d of %d delivered %v after the last publish", r, col.received(), leg.Pace.Published, collectGrace)
	}
	got, _ := col.stop(duplicateLinger)
	leg.counted(got)
	_ = b.deleteQueue(q)
	b.logf("   steady hop %d/s: publish %.0f/s (behind %v); latency p50 %.2f ms, p99 %.2f ms, p99.9 %.2f ms, max %.1f ms, missing %d",
		r, leg.Pace.Rate, leg.Pace.Behind, leg.P50Ms, leg.P99Ms, leg.P999Ms, leg.MaxMs, leg.Missing)
	b.legCPUf(fmt.Sprintf("steady hop %d/s", r), leg.CPU)
	return leg, ctx.Err()
}

// paced publishes n messages at r a second from start with the bench's
// publishers (confirm mode); build(i, now) is message i, now the clock read
// just before it is published.
func (b *bencher) paced(ctx context.Context, start time.Time, r, n int, build func(i int, now time.Time) outgoing) (*SteadyLeg, pubResult, error) {
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	tokens := pace(pctx, start, float64(r), n, steadyPaceTick)
	sent := make([]time.Time, n)
	// A publisher far behind (a loaded machine) stops at twice the schedule's
	// length: the run stays bounded, and what it did not send is not missed.
	cutoff := start.Add(2 * time.Duration(float64(n)/float64(r)*float64(time.Second)))
	pub, err := b.publishFrom(ctx, n, func() (int, bool) {
		i, ok := <-tokens
		return i, ok && time.Now().Before(cutoff)
	}, func(i int) outgoing {
		now := time.Now()
		sent[i] = now
		return build(i, now)
	})
	cancel()
	for range tokens { // let the pacer end
	}
	if err != nil {
		return nil, pub, err
	}
	return &SteadyLeg{Pace: paceStats(start, float64(r), sent)}, pub, nil
}

// counted sets the leg's lateness from the collector, expecting only the
// messages that were published.
func (l *SteadyLeg) counted(c Lateness) {
	c.Expected = l.Pace.Published
	c.Missing = max(c.Expected-c.Received, 0)
	l.Lateness = c
}

// steadyFrom is when a bridge leg started at start reaches its full rate of
// deliveries (steadyProfileStart later), or start in a run too short to
// leave a second after that.
func (b *bencher) steadyFrom(start time.Time) time.Time {
	if b.opts.SteadyDuration-steadyProfileStart < 2*time.Second {
		return start
	}
	return start.Add(steadyProfileStart)
}

// legCPUf logs a leg's CPU, and warns when the hypervisor took a share of
// the CPUs that disturbs its figures.
func (b *bencher) legCPUf(leg string, c *LegCPU) {
	if c == nil {
		return
	}
	b.logf("   %s: CPU %s", leg, c)
	if c.Steal > steadyStealWarn {
		b.warnf("%s: the hypervisor took %.1f%% of the CPUs (steal); the tail is partly the host's", leg, 100*c.Steal)
	}
}

// steadyProfile fetches a CPU profile of the bridge over the part of the
// run where intake and delivery both run at the full rate, and saves it as
// DIR/steady[-postgres]-R.pprof.
func (b *bencher) steadyProfile(ctx context.Context, p *bridgeProc, store string, r int, start time.Time) (string, error) {
	from := b.steadyFrom(start)
	secs := max(int((b.opts.SteadyDuration-from.Sub(start)-time.Second)/time.Second), 1)
	select {
	case <-ctx.Done():
		return "", ctx.Err()
	case <-time.After(time.Until(from)):
	}
	name := "steady-" + strconv.Itoa(r) + ".pprof"
	if store != "bbolt" {
		name = "steady-" + store + "-" + strconv.Itoa(r) + ".pprof"
	}
	path := filepath.Join(b.opts.SteadyProfile, name)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.httpAddr+"/debug/pprof/profile?seconds="+strconv.Itoa(secs), nil)
	if err != nil {
		return "", err
	}
	client := &http.Client{Timeout: time.Duration(secs)*time.Second + 30*time.Second}
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET /debug/pprof/profile: %s (does the bridge serve DELAYBRIDGE_PPROF?)", resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return "", err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return "", err
	}
	return path, f.Close()
}
