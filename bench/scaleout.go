package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// ScaleOut compares one bridge with two and three bridges of the same endpoint sharing
// one PostgreSQL store (DELAYBRIDGE_STORE=postgres): each ingests from
// E.Timeouts and dispatches from E.TimeoutsDispatcher, leasing rows with FOR
// UPDATE SKIP LOCKED. Every run has a fresh endpoint and a fresh schema,
// dropped afterwards.
type ScaleOut struct {
	N        int            `json:"n"`
	WindowMs float64        `json:"window_ms"`
	Skipped  string         `json:"skipped,omitempty"` // why the step did not run
	Runs     []*ScaleOutRun `json:"runs,omitempty"`    // 1 instance, then 2, then 3
	// Two instances against one: ingest rate and burst delivery rate.
	IngestRatio float64 `json:"ingest_ratio_2_vs_1,omitempty"`
	BurstRatio  float64 `json:"burst_rate_ratio_2_vs_1,omitempty"`
}

// ScaleOutRun is one configuration: Instances bridges on one schema.
type ScaleOutRun struct {
	Instances int            `json:"instances"`
	Schema    string         `json:"schema"`
	ReadyMs   []float64      `json:"start_to_ready_ms"`
	Ingest    *ScaleOutPhase `json:"ingest,omitempty"`
	Burst     *ScaleOutPhase `json:"burst,omitempty"`
	Punctual  *ScaleOutPhase `json:"punctuality,omitempty"`
	RowsLeft  int64          `json:"rows_left"` // rows in the store after the run; -1: unknown
}

// ScaleOutPhase is one workload of a run.
type ScaleOutPhase struct {
	N int `json:"n"`
	// Ingest: first publish to all stored. Burst: due instant to the last
	// delivery (-1 when some never arrived). Punctuality: the window.
	Seconds        float64 `json:"seconds"`
	Rate           float64 `json:"msgs_per_s,omitempty"` // ingest: stored/s; burst: delivered/s after the due instant
	PublishRate    float64 `json:"publish_msgs_per_s"`
	Method         string  `json:"method,omitempty"` // how "all stored" was detected
	LeadMs         float64 `json:"lead_ms,omitempty"`
	StoredMarginMs float64 `json:"stored_margin_ms,omitempty"` // first due minus all stored
	Stored         bool    `json:"stored_before_due,omitempty"`
	// PerInstance is what each instance did, from its /metrics: messages
	// ingested (ingest) or dispatched (burst, punctuality); -1: unknown.
	PerInstance []int64 `json:"per_instance"`
	// CPU while the phase ran (ingest: publish start to all stored; the
	// others: first due time to last delivery): each bridge's CPU seconds,
	// and the share of the machine's CPU time spent busy and stolen.
	BridgeCPUSeconds []float64 `json:"bridge_cpu_seconds,omitempty"`
	MachineBusy      float64   `json:"machine_cpu_busy"`
	MachineSteal     float64   `json:"machine_cpu_steal"`
	// The busy CPU time in seconds: the whole machine's (everything that
	// ran meanwhile included), PostgreSQL's for the bench, the broker's
	// (beam.smp) and the bench's own. PostgreSQL's is that of the backends
	// of the bench's and its bridges' connections and the server's
	// background processes, plus the postmaster's own time and that of
	// the server's processes that ended during the phase
	// (PostgresExitedCPUSeconds: parallel query workers, mostly, and the
	// postmaster forking them; other clients' backends that ended count
	// too).
	MachineCPUSeconds        float64 `json:"machine_cpu_seconds"`
	PostgresCPUSeconds       float64 `json:"postgres_cpu_seconds"`
	PostgresExitedCPUSeconds float64 `json:"postgres_exited_cpu_seconds"`
	// PostgresBenchCPUSeconds is the CPU of the bench's own backend (the
	// row counts waitRows polls), not in PostgresCPUSeconds: that one is
	// the bridges' database work and the server's background processes.
	PostgresBenchCPUSeconds float64   `json:"postgres_bench_cpu_seconds"`
	BrokerCPUSeconds        float64   `json:"broker_cpu_seconds"`
	BenchCPUSeconds         float64   `json:"bench_cpu_seconds"`
	Lateness                *Lateness `json:"lateness,omitempty"`
}

const (
	metricIngested   = "delaybridge_messages_ingested_total"
	metricDispatched = "delaybridge_messages_dispatched_total"
	pgTable          = "timeouts" // storage/postgres's table
)

// scaleOutPg is the PostgreSQL side of one run.
type scaleOutPg struct {
	conn    *pgx.Conn
	schema  string
	table   string // quoted schema.table
	appName string // application_name of the bench's and its bridges' connections
}

// withAppName sets application_name in a PostgreSQL URL or key=value
// connection string, so the bench can tell its own backends from others'.
func withAppName(conn, name string) string {
	if !strings.Contains(conn, "://") {
		return strings.TrimSpace(conn) + " application_name=" + name
	}
	u, err := url.Parse(conn)
	if err != nil {
		return conn
	}
	q := u.Query()
	q.Set("application_name", name)
	u.RawQuery = q.Encode()
	return u.String()
}

// pids are the PostgreSQL server processes working for this bench: the
// backends of its bridges' connections and the server's
// background processes (autovacuum, WAL writer, checkpointer, ...), not
// other clients' backends.
func (pg *scaleOutPg) pids(ctx context.Context) []int {
	if pg == nil { // no PostgreSQL in the step
		return nil
	}
	// The bench's own backend is measured apart (cpuNow).
	rows, err := pg.conn.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE (application_name = $1 OR backend_type <> 'client backend') AND pid <> pg_backend_pid()`, pg.appName)
	if err != nil {
		return nil
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return nil
	}
	out := make([]int, len(pids))
	for i, p := range pids {
		out[i] = int(p)
	}
	return out
}

func (b *bencher) stepScaleOut(ctx context.Context) error {
	res := &ScaleOut{N: b.opts.ScaleOutN, WindowMs: ms(b.opts.Window)}
	b.res.ScaleOut = res
	conn, appName, err := b.pgOrSkip(ctx, "scaleout:", &res.Skipped)
	if conn == nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for _, k := range []int{1, 2, 3} {
		run := &ScaleOutRun{Instances: k, RowsLeft: -1}
		res.Runs = append(res.Runs, run)
		if err := b.scaleOutRun(ctx, conn, appName, run); err != nil {
			return fmt.Errorf("%s: %w", instances(k), err)
		}
	}
	res.IngestRatio, res.BurstRatio = res.ratios()
	return nil
}

// noPostgres is why a step that needs PostgreSQL was skipped.
const noPostgres = "no PostgreSQL URL (--postgres-url or $DELAYBRIDGE_TEST_POSTGRES_URL)"

// pgOrSkip is pgConnect when there is a --postgres-url. Without one it
// records in *skipped that what was skipped, logs it and returns a nil
// connection and a nil error.
func (b *bencher) pgOrSkip(ctx context.Context, what string, skipped *string) (*pgx.Conn, string, error) {
	if b.opts.PostgresURL == "" {
		*skipped = noPostgres
		b.logf("   %s SKIPPED: %s", what, *skipped)
		return nil, "", nil
	}
	return b.pgConnect(ctx)
}

// pgSchema is schema on conn, and the environment that makes a bridge keep
// its store there under the run's application_name.
func (b *bencher) pgSchema(conn *pgx.Conn, appName, schema string) (*scaleOutPg, map[string]string) {
	pg := &scaleOutPg{conn: conn, schema: schema, table: pgx.Identifier{schema, pgTable}.Sanitize(), appName: appName}
	return pg, map[string]string{
		"DELAYBRIDGE_STORE":           "postgres",
		"DELAYBRIDGE_POSTGRES_URL":    withAppName(b.opts.PostgresURL, appName),
		"DELAYBRIDGE_POSTGRES_SCHEMA": schema,
	}
}

// pgConnect connects to --postgres-url under the run's application_name,
// which its bridges use too, so the bench can tell its backends from others'.
func (b *bencher) pgConnect(ctx context.Context) (*pgx.Conn, string, error) {
	appName := "delaybridge-bench-" + b.runID
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(cctx, withAppName(b.opts.PostgresURL, appName))
	if err != nil {
		return nil, "", fmt.Errorf("connect to PostgreSQL: %s", redactErr(err, b.opts.PostgresURL))
	}
	return conn, appName, nil
}

// ratios are two instances' ingest rate and burst delivery rate divided by
// one instance's (0 when either is missing).
func (s *ScaleOut) ratios() (ingest, burst float64) {
	one, two := s.run(1), s.run(2)
	if one == nil || two == nil {
		return 0, 0
	}
	ratio := func(a, b *ScaleOutPhase) float64 {
		if a == nil || b == nil || a.Rate <= 0 || b.Rate <= 0 {
			return 0
		}
		return b.Rate / a.Rate
	}
	return ratio(one.Ingest, two.Ingest), ratio(one.Burst, two.Burst)
}

func (s *ScaleOut) run(k int) *ScaleOutRun {
	for _, r := range s.Runs {
		if r.Instances == k {
			return r
		}
	}
	return nil
}

func instances(k int) string {
	if k == 1 {
		return "1 instance"
	}
	return strconv.Itoa(k) + " instances"
}

func (b *bencher) scaleOutRun(ctx context.Context, conn *pgx.Conn, appName string, run *ScaleOutRun) error {
	k, n := run.Instances, b.opts.ScaleOutN
	label := StepScaleOut + strconv.Itoa(k)
	run.Schema = "bench_" + b.runID + "_" + strconv.Itoa(k)
	pg, env := b.pgSchema(conn, appName, run.Schema)
	endpoint := b.name(label)
	b.logf("   scaleout: %s on endpoint %s, schema %s", instances(k), endpoint, run.Schema)

	defer b.dropSchema(ctx, pg)
	var procs []*bridgeProc
	defer func() { b.stopInstances(label, procs) }()
	for i := range k {
		store := filepath.Join(b.dir, label, "instance"+strconv.Itoa(i+1), "unused.db")
		p, ready, err := b.startBridgeEnv(ctx, endpoint, store, env)
		if err != nil {
			return fmt.Errorf("start instance %d: %w", i+1, err)
		}
		procs = append(procs, p)
		run.ReadyMs = append(run.ReadyMs, ms(ready))
		b.logf("   bridge %s #%d ready in %.0f ms (pid %d, http %s)", endpoint, i+1, ms(ready), p.cmd.Process.Pid, p.httpAddr)
	}

	var err error
	if run.Ingest, err = b.scaleOutIngest(ctx, pg, procs, label, n); err != nil {
		return fmt.Errorf("ingest: %w", err)
	}
	lead := b.opts.Lead
	if lead <= 0 {
		lead = leadFor(n, run.Ingest.Rate)
	}
	if run.Burst, err = b.scaleOutBurst(ctx, pg, procs, label, n, lead); err != nil {
		return fmt.Errorf("burst: %w", err)
	}
	if run.Punctual, err = b.scaleOutPunctual(ctx, pg, procs, label, n, b.opts.Window, lead); err != nil {
		return fmt.Errorf("punctuality: %w", err)
	}
	if left, err := pg.count(ctx); err == nil {
		run.RowsLeft = left
	}
	return nil
}

// leadFor is how far ahead the first due time of an n-message workload lies
// when the store takes r messages a second: the time to store them with a
// 1.5× margin plus 1 s, at least 3 s.
func leadFor(n int, r float64) time.Duration {
	if r <= 0 {
		r = 2000 // a conservative guess
	}
	est := time.Duration(float64(n)/r*1.5*float64(time.Second)) + time.Second
	return max(defaultLeadMin, est).Round(100 * time.Millisecond)
}

// scaleOutIngest publishes n messages due in an hour and measures the time
// from the first publish until all n rows are in the store; then it deletes
// them, so the next phase starts on an empty table.
func (b *bencher) scaleOutIngest(ctx context.Context, pg *scaleOutPg, procs []*bridgeProc, label string, n int) (*ScaleOutPhase, error) {
	dest := b.name(label, "ingest-dest")
	if err := b.declareQueue(dest, nil); err != nil {
		return nil, err
	}
	base := countersOf(procs, metricIngested)
	due := time.Now().Add(ingestDueOffset)
	c0 := cpuNow(ctx, procs, pg)
	pub, err := b.publishAll(ctx, n, func(i int) outgoing {
		return outgoing{key: procs[0].timeoutsQueue(), msg: b.message(dest, i, due, dest)}
	})
	if err != nil {
		return nil, err
	}
	at, method, err := b.waitRows(ctx, pg, procs, int64(n), time.Now().Add(5*time.Minute))
	if err != nil {
		return nil, fmt.Errorf("waiting for %d rows (%s): %w", n, method, err)
	}
	c1 := cpuNow(ctx, procs, pg)
	d := at.Sub(pub.Start)
	ph := &ScaleOutPhase{N: n, Seconds: d.Seconds(), Rate: rate(n, d), PublishRate: pub.rate(), Method: method,
		PerInstance: b.counterDeltas(ctx, procs, metricIngested, base, int64(n))}
	ph.cpu(c0, c1)
	b.checkQuiet(label+" ingest", ph)
	b.logf("   %s ingest: %d stored in %.2f s = %.0f msg/s (publish %.0f msg/s); by instance %v; CPU busy %.0f%%",
		label, n, d.Seconds(), ph.Rate, ph.PublishRate, ph.PerInstance, 100*ph.MachineBusy)
	if _, err := pg.conn.Exec(ctx, "DELETE FROM "+pg.table); err != nil {
		return ph, fmt.Errorf("delete the ingested rows: %w", err)
	}
	return ph, nil
}

// scaleOutBurst publishes n messages all due at one instant, lead ahead, and
// measures the time from that instant until the last is delivered.
func (b *bencher) scaleOutBurst(ctx context.Context, pg *scaleOutPg, procs []*bridgeProc, label string, n int, lead time.Duration) (*ScaleOutPhase, error) {
	dest := b.name(label, "burst-dest")
	col, err := b.declareAndCollect(dest, n)
	if err != nil {
		return nil, err
	}
	base := countersOf(procs, metricDispatched)
	due := time.Now().Add(lead)
	b.logf("   %s burst: %d messages all due in %v", label, n, lead)
	pub, err := b.publishAll(ctx, n, func(i int) outgoing {
		return outgoing{key: procs[0].timeoutsQueue(), msg: b.message(dest, i, due, dest)}
	})
	if err != nil {
		col.stop(0)
		return nil, err
	}
	ph := &ScaleOutPhase{N: n, LeadMs: ms(lead), PublishRate: pub.rate()}
	l, last, err := b.scaleOutDelivered(ctx, pg, procs, label, "burst", ph, col, base, due, due)
	if err != nil {
		return nil, err
	}
	if l.Missing == 0 {
		ph.Seconds = last.Sub(due).Seconds()
		ph.Rate = rate(n, last.Sub(due))
	} else {
		ph.Seconds = -1
	}
	b.logf("   %s burst: last delivered %.0f ms after the due time (%.0f msg/s); p50 %.1f ms, p99 %.1f ms, max %.1f ms; dups %d, missing %d; by instance %v; CPU busy %.0f%%",
		label, 1000*ph.Seconds, ph.Rate, l.P50Ms, l.P99Ms, l.MaxMs, l.Duplicates, l.Missing, ph.PerInstance, 100*ph.MachineBusy)
	return ph, nil
}

// scaleOutPunctual publishes n messages due evenly over window, in random
// order, the first lead ahead, and measures their lateness.
func (b *bencher) scaleOutPunctual(ctx context.Context, pg *scaleOutPg, procs []*bridgeProc, label string, n int, window, lead time.Duration) (*ScaleOutPhase, error) {
	dest := b.name(label, "punctual-dest")
	col, err := b.declareAndCollect(dest, n)
	if err != nil {
		return nil, err
	}
	base := countersOf(procs, metricDispatched)
	dues, pub, err := b.publishSpread(ctx, label+" punctuality", n, window, lead, func(_, seq int, due time.Time) outgoing {
		return outgoing{key: procs[0].timeoutsQueue(), msg: b.message(dest, seq, due, dest)}
	})
	if err != nil {
		col.stop(0)
		return nil, err
	}
	ph := &ScaleOutPhase{N: n, Seconds: window.Seconds(), LeadMs: ms(lead), PublishRate: pub.rate()}
	l, _, err := b.scaleOutDelivered(ctx, pg, procs, label, "punctuality", ph, col, base, dues[0], dues[n-1])
	if err != nil {
		return nil, err
	}
	b.logf("   %s punctuality: p50 %.1f ms, p99 %.1f ms, max %.1f ms; early %d, dups %d, missing %d; by instance %v; CPU busy %.0f%%",
		label, l.P50Ms, l.P99Ms, l.MaxMs, l.Early, l.Duplicates, l.Missing, ph.PerInstance, 100*ph.MachineBusy)
	return ph, nil
}

// scaleOutDelivered waits until the n messages of a timed phase whose
// first falls due at first are stored, and until they are delivered, at
// most collectGrace after the last falls due; it records in ph their
// lateness, the CPU from first on and what each instance dispatched since
// base. It returns the lateness and the time the last arrived.
func (b *bencher) scaleOutDelivered(ctx context.Context, pg *scaleOutPg, procs []*bridgeProc, label, phase string, ph *ScaleOutPhase, col *collector, base []int64, first, last time.Time) (Lateness, time.Time, error) {
	if err := b.scaleOutStored(ctx, pg, procs, label, ph, ph.N, first); err != nil {
		col.stop(0)
		return Lateness{}, time.Time{}, err
	}
	c0 := b.cpuAt(ctx, procs, pg, first)
	ok := col.wait(ctx, last.Add(collectGrace))
	c1 := cpuNow(ctx, procs, pg)
	if !ok && ctx.Err() == nil {
		b.warnf("%s %s: %d of %d delivered %v after the last due time", label, phase, col.received(), ph.N, collectGrace)
	}
	l, lastAt := col.stop(duplicateLinger)
	if ctx.Err() != nil {
		return l, lastAt, ctx.Err()
	}
	ph.Lateness = &l
	ph.cpu(c0, c1)
	b.checkQuiet(label+" "+phase, ph)
	ph.PerInstance = b.counterDeltas(ctx, procs, metricDispatched, base, int64(l.Received))
	return l, lastAt, nil
}

// scaleOutStored waits until the n rows of a timed workload are stored, at
// most until its first due time, and records by how much it was ahead.
func (b *bencher) scaleOutStored(ctx context.Context, pg *scaleOutPg, procs []*bridgeProc, label string, ph *ScaleOutPhase, n int, first time.Time) error {
	at, method, err := b.waitRows(ctx, pg, procs, int64(n), first)
	ph.Method = method
	switch {
	case err == nil:
		ph.StoredMarginMs, ph.Stored = b.storedAhead(label, "the bridges", at, first)
	case errors.Is(err, errNotStored):
		b.warnf("%s: the bridges had not stored all %d by the first due time (%s); raise --lead", label, n, method)
	default:
		return err
	}
	return nil
}

// count is the number of rows in the store's table.
func (pg *scaleOutPg) count(ctx context.Context) (int64, error) {
	var n int64
	err := pg.conn.QueryRow(ctx, "SELECT count(*) FROM "+pg.table).Scan(&n)
	return n, err
}

// waitRows waits until the store's table holds want rows (committed, so
// stored and acknowledged by a bridge), or until deadline (errNotStored).
// A count of 20,000 rows takes a few ms of PostgreSQL's time: it polls every
// 20 ms at most and never sooner than 8× the time the previous count took,
// so the polling stays a small part of the load. When the table cannot be
// counted it falls back to the first bridge's /debug/vars pending.
func (b *bencher) waitRows(ctx context.Context, pg *scaleOutPg, procs []*bridgeProc, want int64, deadline time.Time) (time.Time, string, error) {
	const method = "rows"
	for {
		t0 := time.Now()
		n, err := pg.count(ctx)
		took := time.Since(t0)
		if err != nil {
			if ctx.Err() != nil {
				return time.Time{}, method, ctx.Err()
			}
			b.warnf("scaleout: cannot count %s (%v); telling from /debug/vars instead", pg.table, err)
			return b.waitStored(ctx, procs[0], want, deadline)
		}
		if n >= want {
			return time.Now(), method, nil
		}
		if time.Now().After(deadline) {
			return time.Time{}, method, errNotStored
		}
		select {
		case <-ctx.Done():
			return time.Time{}, method, ctx.Err()
		case <-time.After(max(20*time.Millisecond, 8*took)):
		}
	}
}

func (b *bencher) dropSchema(ctx context.Context, pg *scaleOutPg) {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if _, err := pg.conn.Exec(dctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{pg.schema}.Sanitize()+" CASCADE"); err != nil {
		b.warnf("PostgreSQL: could not drop schema %s: %v", pg.schema, err)
		return
	}
	b.logf("   PostgreSQL: dropped schema %s", pg.schema)
}

// ---------------------------------------------------------------------------
// per-instance counters and CPU

// countersOf reads counter name from each bridge's /metrics (-1: unknown).
func countersOf(procs []*bridgeProc, name string) []int64 {
	out := make([]int64, len(procs))
	for i, p := range procs {
		out[i] = -1
		if v, err := p.counter(name); err == nil {
			out[i] = v
		}
	}
	return out
}

// counterDeltas returns how much each bridge's counter grew since base. A
// bridge counts a message after its commit, a moment after the effect the
// bench saw, so it waits (up to 3 s) for the deltas to add up to want.
func (b *bencher) counterDeltas(ctx context.Context, procs []*bridgeProc, name string, base []int64, want int64) []int64 {
	deadline := time.Now().Add(3 * time.Second)
	for {
		now := countersOf(procs, name)
		deltas, sum := counterDeltas(base, now)
		if sum >= want || time.Now().After(deadline) || ctx.Err() != nil {
			return deltas
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// counterDeltas is now - base per instance (-1 where either is unknown) and
// the sum of the known deltas.
func counterDeltas(base, now []int64) ([]int64, int64) {
	out := make([]int64, len(now))
	var sum int64
	for i := range now {
		if i >= len(base) || base[i] < 0 || now[i] < 0 {
			out[i] = -1
			continue
		}
		out[i] = now[i] - base[i]
		sum += out[i]
	}
	return out, sum
}

func (p *bridgeProc) counter(name string) (int64, error) {
	resp, err := httpClient.Get("http://" + p.httpAddr + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
		return 0, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	return parseCounter(resp.Body, name)
}

// parseCounter reads an unlabelled counter from Prometheus text exposition.
func parseCounter(r io.Reader, name string) (int64, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, name)
		if !ok || !strings.HasPrefix(rest, " ") {
			continue
		}
		fields := strings.Fields(rest)
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			return 0, fmt.Errorf("metric %s: %w", name, err)
		}
		return int64(v), nil
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("metric %s not found", name)
}

// cpuSample is the CPU time used so far (clock ticks) by each bridge (-1:
// unknown), by the PostgreSQL processes working for the bench (by pid), by
// the broker and by the bench itself, and by the whole machine.
type cpuSample struct {
	procs         []int64
	postgres      map[int]int64
	pgExited      int64 // the postmaster's own time and its children's, once they ended (-1: unknown)
	pgBench       int64 // the bench's own backend (-1: unknown)
	broker, bench int64
	machine       machineCPU
}

// machineCPU is the first line of /proc/stat, in clock ticks.
type machineCPU struct {
	busy, steal, total int64
}

// clockTicks is USER_HZ, 100 on every Linux architecture Go supports.
const clockTicks = 100

func readProcStat(pid string) (procStat, error) {
	data, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return procStat{}, err
	}
	return parseProcStat(string(data))
}

func cpuNow(ctx context.Context, procs []*bridgeProc, pg *scaleOutPg) cpuSample {
	s := cpuSample{procs: make([]int64, len(procs)), postgres: map[int]int64{}, pgExited: -1, pgBench: -1}
	if pg != nil && pg.conn != nil {
		if st, err := readProcStat(strconv.Itoa(int(pg.conn.PgConn().PID()))); err == nil {
			s.pgBench = st.ticks
		}
	}
	postmaster := 0
	for _, pid := range pg.pids(ctx) {
		if st, err := readProcStat(strconv.Itoa(pid)); err == nil {
			s.postgres[pid] = st.ticks
			postmaster = st.ppid
		}
	}
	// The postmaster reaps its children, so its children's time grows by
	// what every backend and worker that ended used (a parallel query's
	// workers live for one query, and a sample never sees them). Its own
	// time is mostly forking them.
	if postmaster > 1 {
		if st, err := readProcStat(strconv.Itoa(postmaster)); err == nil && st.comm == "postgres" {
			s.pgExited = st.ticks + st.childTicks
		}
	}
	for i, p := range procs {
		s.procs[i] = -1
		if st, err := readProcStat(strconv.Itoa(p.cmd.Process.Pid)); err == nil {
			s.procs[i] = st.ticks
		}
	}
	if st, err := readProcStat("self"); err == nil {
		s.bench = st.ticks
	}
	// The broker, by process name: it may serve other clients too.
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		if st, err := readProcStat(e.Name()); err == nil && st.comm == "beam.smp" {
			s.broker += st.ticks
		}
	}
	if data, err := os.ReadFile("/proc/stat"); err == nil {
		s.machine, _ = parseMachineCPU(string(data))
	}
	return s
}

// cpuAt waits until t and samples the CPU then.
func (b *bencher) cpuAt(ctx context.Context, procs []*bridgeProc, pg *scaleOutPg, t time.Time) cpuSample {
	select {
	case <-ctx.Done():
	case <-time.After(time.Until(t)):
	}
	return cpuNow(ctx, procs, pg)
}

// cpu records the CPU used between two samples. A PostgreSQL process only
// in the second sample started in between: all its time counts. (One that
// ended in between takes its time with it.)
func (ph *ScaleOutPhase) cpu(a, b cpuSample) {
	ph.BridgeCPUSeconds = make([]float64, len(b.procs))
	for i := range b.procs {
		if i >= len(a.procs) || a.procs[i] < 0 || b.procs[i] < 0 {
			ph.BridgeCPUSeconds[i] = -1
			continue
		}
		ph.BridgeCPUSeconds[i] = float64(b.procs[i]-a.procs[i]) / clockTicks
	}
	if dt := b.machine.total - a.machine.total; dt > 0 {
		ph.MachineBusy = float64(b.machine.busy-a.machine.busy) / float64(dt)
		ph.MachineSteal = float64(b.machine.steal-a.machine.steal) / float64(dt)
	}
	var pgTicks, exited int64
	for pid, t := range b.postgres {
		pgTicks += max(t-a.postgres[pid], 0)
	}
	if a.pgExited >= 0 && b.pgExited >= 0 {
		exited = max(b.pgExited-a.pgExited, 0)
	}
	ph.MachineCPUSeconds = float64(b.machine.busy-a.machine.busy) / clockTicks
	ph.PostgresCPUSeconds = float64(pgTicks+exited) / clockTicks
	ph.PostgresExitedCPUSeconds = float64(exited) / clockTicks
	if a.pgBench >= 0 && b.pgBench >= 0 {
		ph.PostgresBenchCPUSeconds = float64(max(b.pgBench-a.pgBench, 0)) / clockTicks
	}
	ph.BrokerCPUSeconds = float64(max(b.broker-a.broker, 0)) / clockTicks
	ph.BenchCPUSeconds = float64(max(b.bench-a.bench, 0)) / clockTicks
}

// otherCPUSeconds is the busy CPU time of the phase that none of the
// processes measured used: interrupts, and whatever else ran meanwhile.
func (ph *ScaleOutPhase) otherCPUSeconds() float64 {
	used := ph.PostgresCPUSeconds + ph.PostgresBenchCPUSeconds + ph.BrokerCPUSeconds + ph.BenchCPUSeconds
	for _, s := range ph.BridgeCPUSeconds {
		used += max(s, 0)
	}
	return max(ph.MachineCPUSeconds-used, 0)
}

// checkQuiet warns when other work took a noticeable part of the machine
// during a phase (more than 0.25 CPU seconds per second of the phase).
func (b *bencher) checkQuiet(phase string, ph *ScaleOutPhase) {
	if ph.MachineBusy <= 0 || ph.MachineCPUSeconds <= 0 {
		return
	}
	wall := ph.MachineCPUSeconds / ph.MachineBusy / float64(max(runtime.NumCPU(), 1))
	if other := ph.otherCPUSeconds(); wall > 0 && other/wall > 0.25 {
		b.warnf("%s: other work on the machine took %.1f CPU s in %.1f s (%.0f%% of a core); its figures are disturbed",
			phase, other, wall, 100*other/wall)
	}
}

// procStat is what the bench reads from /proc/<pid>/stat.
type procStat struct {
	comm       string
	ppid       int
	ticks      int64 // utime + stime
	childTicks int64 // cutime + cstime: children that ended and were waited for
}

// parseProcStat parses /proc/<pid>/stat: "pid (comm) state ppid ...", with
// utime, stime, cutime and cstime as fields 14 to 17.
func parseProcStat(stat string) (procStat, error) {
	i, j := strings.IndexByte(stat, '('), strings.LastIndexByte(stat, ')')
	if i < 0 || j < i {
		return procStat{}, errors.New("/proc/<pid>/stat: no (comm)")
	}
	f := strings.Fields(stat[j+1:]) // f[0] is field 3
	if len(f) < 15 {
		return procStat{}, errors.New("/proc/<pid>/stat: too few fields")
	}
	var v [5]int64
	for k, idx := range []int{1, 11, 12, 13, 14} {
		n, err := strconv.ParseInt(f[idx], 10, 64)
		if err != nil {
			return procStat{}, fmt.Errorf("/proc/<pid>/stat: %w", err)
		}
		v[k] = n
	}
	return procStat{comm: stat[i+1 : j], ppid: int(v[0]), ticks: v[1] + v[2], childTicks: v[3] + v[4]}, nil
}

// parseMachineCPU reads the "cpu" line of /proc/stat: user nice system idle
// iowait irq softirq steal. Busy is user + nice + system + irq + softirq.
func parseMachineCPU(stat string) (machineCPU, error) {
	line, _, _ := strings.Cut(stat, "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return machineCPU{}, errors.New("/proc/stat: no cpu line")
	}
	var v [8]int64
	for i := range v {
		n, err := strconv.ParseInt(f[i+1], 10, 64)
		if err != nil {
			return machineCPU{}, fmt.Errorf("/proc/stat: %w", err)
		}
		v[i] = n
	}
	var m machineCPU
	for _, n := range v {
		m.total += n
	}
	m.busy = v[0] + v[1] + v[2] + v[5] + v[6]
	m.steal = v[7]
	return m, nil
}
