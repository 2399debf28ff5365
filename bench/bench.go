// Package bench measures delaybridge against a real broker: the broker's own
// single-hop ceiling, the bridge's ingest rate, the punctuality of spread and
// simultaneous due times, behaviour with a large pending set, and, for
// comparison, the same punctuality workload through a TTL + dead-letter delay
// topology. Each bridge under test is a child process (the delaybridge binary
// run with "run") with its own endpoint, store and HTTP port, so memory
// figures are its own and a restart is a real process start.
//
// Run is the entry point; cmd/delaybridge-bench parses flags, calls it and
// prints the results. The harness is its own command so that none of it is
// linked into the bridge.
package bench

import (
	"context"
	"crypto/rand"
	"debug/buildinfo"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/internal/nsbendpoint"
	"github.com/delaybridge/delaybridge/wire"
	"github.com/delaybridge/delaybridge/wire/nsbdelay"
)

// Step names, in the order they run.
const (
	StepCeiling     = "ceiling"
	StepIngest      = "ingest"
	StepPunctuality = "punctuality"
	StepBurst       = "burst"
	StepTTL         = "ttl"
	StepExchange    = "exchange"
	StepScale       = "scale"
	StepScaleOut    = "scaleout"
	StepRebus       = "rebus"
	StepNSB         = "nsb"
	StepMassTransit = "masstransit"
	StepNSBTimeouts = "nsbtm"
	StepSteady      = "steady"
	StepBigMsg      = "bigmsg"
	StepResend      = "resend"
	StepCrash       = "crash"
	StepFailover    = "failover"
	StepRecurring   = "recurring"
)

// AllSteps lists every step in run order.
var AllSteps = []string{StepCeiling, StepIngest, StepPunctuality, StepBurst, StepTTL, StepExchange, StepScale, StepScaleOut, StepRebus, StepNSB, StepMassTransit, StepNSBTimeouts, StepSteady, StepBigMsg, StepResend, StepCrash, StepFailover, StepRecurring}

// Options configure a run. Zero values take the defaults of DefaultOptions.
type Options struct {
	AMQPURL string
	// BridgeCmd starts a bridge: the executable and its arguments, e.g.
	// [/path/to/delaybridge run]. The bridge is configured by environment.
	BridgeCmd []string
	// BridgeEnv are extra KEY=VALUE settings for every bridge started (they
	// override the bench's own, e.g. DELAYBRIDGE_BATCH_SIZE=2000).
	BridgeEnv []string
	// Dir is where the temporary stores and bridge logs go (a new directory
	// inside it); empty means the system's temporary directory.
	Dir  string
	Keep bool // keep the temporary directory

	Size           int // message body bytes
	CeilingN       int
	IngestN        int
	PunctualN      int
	Window         time.Duration // punctuality: due times spread over this
	BurstN         int
	ScaleN         int // messages pending far in the future in the scale step
	ScalePunctualN int // the due stream run while ScaleN are pending
	// ScaleSteadyRate is the rate (msgs/s) of the steady workload (see the
	// steady step) run for SteadyDuration while ScaleN are pending.
	ScaleSteadyRate int
	// ScaleOutN is the size of each workload of the scaleout step (ingest,
	// burst and spread over Window), run with one and then two bridges
	// sharing the PostgreSQL store at PostgresURL; empty PostgresURL skips
	// the step.
	ScaleOutN   int
	PostgresURL string
	// ExchangeRounds is how many times the exchange step runs the
	// punctuality workload through each kind of destination.
	ExchangeRounds int
	// Lead is how far ahead the first due time lies when a timed workload
	// starts publishing; 0 picks it from the measured ingest rate (at least
	// 3 s), so every message is stored before the first is due.
	Lead time.Duration

	Steps        []string // subset of AllSteps to run
	TTLQueueType string   // quorum (NServiceBus v2) or classic (v1)
	// Publishers is the number of publishing goroutines, each with its own
	// confirm-mode channel; ConfirmWindow the unconfirmed publishes each
	// keeps in flight.
	Publishers    int
	ConfirmWindow int

	// SteadyRates are the rates (msgs/s) of the steady step, each run for
	// SteadyDuration through a bridge on each of SteadyStores (bbolt,
	// postgres). SteadySearch also steps the rate up from 1,000 by 500 until
	// the bridge's p99 exceeds 10 ms. SteadyProfile, when set, is a directory
	// for a CPU profile of the bridge at every rate.
	SteadyRates    []int
	SteadyDuration time.Duration
	SteadyStores   []string
	SteadySearch   bool
	SteadyProfile  string

	// ResendRate is the new messages a second of each workload of the
	// resend step, sent for ResendDuration (0: the step's defaults).
	ResendRate     int
	ResendDuration time.Duration
	// CrashRate is the steady rate of the crash step, run for
	// CrashDuration (0: the step's defaults).
	CrashRate     int
	CrashDuration time.Duration
	// FailoverRate is the steady rate of the failover step, run for
	// FailoverDuration, each event FailoverRepeats times (0: the step's
	// defaults).
	FailoverRate     int
	FailoverDuration time.Duration
	FailoverRepeats  int
	// RecurringN is the schedules of the recurring step, each firing every
	// second, consumed for RecurringDuration (0: the step's defaults).
	RecurringN        int
	RecurringDuration time.Duration

	// SentinelOnly makes the bench tell when a workload is stored by a
	// sentinel message even when the bridge serves delaybridge.pending.
	SentinelOnly bool

	Log io.Writer // progress lines; nil discards
}

// DefaultOptions are the workloads: 256-byte messages, 20,000 per
// step, a 10 s punctuality window and 1,000,000 pending for the scale step.
func DefaultOptions() Options {
	return Options{
		AMQPURL:         "amqp://guest:guest@localhost:5672/",
		Size:            256,
		CeilingN:        20000,
		IngestN:         20000,
		PunctualN:       20000,
		Window:          10 * time.Second,
		BurstN:          20000,
		ScaleN:          1000000,
		ScalePunctualN:  20000,
		ScaleSteadyRate: 1000,
		ScaleOutN:       20000,
		ExchangeRounds:  2,
		Steps:           []string{StepCeiling, StepIngest, StepPunctuality, StepBurst, StepTTL},
		TTLQueueType:    "quorum",
		Publishers:      4,
		ConfirmWindow:   500,
		SteadyRates:     []int{1000, 2000, 3000},
		SteadyDuration:  20 * time.Second,
		SteadyStores:    []string{"bbolt"},
	}
}

// Targets of the issue, for 256-byte messages on a 2-core machine.
var (
	TargetIngestRatio  = 0.8
	TargetP99          = 20 * time.Millisecond
	TargetMax          = 100 * time.Millisecond
	TargetBurst        = 3 * time.Second
	TargetHeap         = uint64(64 << 20)
	TargetRestartReady = time.Second
	// The scale step's targets: the fill against an empty store's ingest, and the
	// steady p99 with N pending against an empty store's at the same rate.
	TargetScaleFillRatio   = 0.7
	TargetScaleSteadyRatio = 1.5
	defaultLeadMin         = 3 * time.Second
	scaleDueOffset         = 30 * 24 * time.Hour
	ingestDueOffset        = time.Hour
	collectGrace           = 30 * time.Second
	duplicateLinger        = 300 * time.Millisecond
	storedWaitUnbounded    = 30 * time.Minute
)

// Results of a run; every step that did not run (or failed) is nil.
type Results struct {
	Machine    Machine   `json:"machine"`
	Params     Params    `json:"params"`
	StartedAt  time.Time `json:"started_at"`
	FinishedAt time.Time `json:"finished_at"`

	Ceiling     *Ceiling   `json:"ceiling,omitempty"`
	Ingest      *Ingest    `json:"ingest,omitempty"`
	Punctuality *Punctual  `json:"punctuality,omitempty"`
	Burst       *Burst     `json:"burst,omitempty"`
	TTL         *TTL       `json:"ttl,omitempty"`
	Exchange    *Exchange  `json:"exchange,omitempty"`
	Scale       *Scale     `json:"scale,omitempty"`
	ScaleOut    *ScaleOut  `json:"scaleout,omitempty"`
	Rebus       *Punctual  `json:"rebus,omitempty"` // the punctuality workload as Rebus endpoints defer
	NSB         *NSB       `json:"nsb,omitempty"`
	MassTransit *Protocol  `json:"masstransit,omitempty"` // as MassTransit endpoints schedule, and plain
	NSBTimeouts *Protocol  `json:"nsbtm,omitempty"`       // as NServiceBus endpoints defer to the timeout manager, and plain
	Steady      *Steady    `json:"steady,omitempty"`
	BigMsg      *BigMsg    `json:"bigmsg,omitempty"`
	Resend      *Resend    `json:"resend,omitempty"`
	Crash       *Crash     `json:"crash,omitempty"`
	Failover    *Failover  `json:"failover,omitempty"`
	Recurring   *Recurring `json:"recurring,omitempty"`

	BridgeLogs []BridgeLog `json:"bridge_logs,omitempty"`
	Warnings   []string    `json:"warnings,omitempty"`
	Errors     []StepError `json:"errors,omitempty"`
	Rows       []Row       `json:"rows"`
}

// Machine describes where the run happened.
type Machine struct {
	CPUs           int    `json:"cpus"`
	CPUModel       string `json:"cpu_model,omitempty"`
	Kernel         string `json:"kernel,omitempty"` // the OS release (Linux: uname -r): the scheduler differs between them
	GOOS           string `json:"goos"`
	GOARCH         string `json:"goarch"`
	GoVersion      string `json:"go_version"` // the bridge binary's when readable, else the bench's
	Broker         string `json:"broker"`
	BridgeRevision string `json:"bridge_revision,omitempty"`
	StoreFS        string `json:"store_fs,omitempty"`
}

// Params are the workloads of the run.
type Params struct {
	Size            int      `json:"message_bytes"`
	CeilingN        int      `json:"ceiling_n"`
	IngestN         int      `json:"ingest_n"`
	PunctualN       int      `json:"punctual_n"`
	WindowMs        float64  `json:"window_ms"`
	BurstN          int      `json:"burst_n"`
	ScaleN          int      `json:"scale_n"`
	ScalePunctualN  int      `json:"scale_punctual_n"`
	ScaleSteadyRate int      `json:"scale_steady_rate,omitempty"`
	ScaleOutN       int      `json:"scaleout_n,omitempty"`
	ExchangeRounds  int      `json:"exchange_rounds,omitempty"`
	Steps           []string `json:"steps"`
	TTLQueueType    string   `json:"ttl_queue_type"`
	Publishers      int      `json:"publishers"`
	ConfirmWindow   int      `json:"confirm_window"`
	BridgeEnv       []string `json:"bridge_env,omitempty"`
	SteadyRates     []int    `json:"steady_rates,omitempty"`
	SteadyDurS      float64  `json:"steady_duration_s,omitempty"`
	SteadyStores    []string `json:"steady_stores,omitempty"`
	SteadySearch    bool     `json:"steady_search,omitempty"`
}

// StepError is a step that failed; the other steps still run.
type StepError struct {
	Step  string `json:"step"`
	Error string `json:"error"`
}

// Ceiling is the broker's single hop: publish (persistent, confirmed) to a
// queue and consume it with acks.
type Ceiling struct {
	N           int       `json:"n"`
	Seconds     float64   `json:"seconds"` // first publish to last consumed, best round
	Rate        float64   `json:"msgs_per_s"`
	PublishRate float64   `json:"publish_msgs_per_s"`
	Rounds      []float64 `json:"rounds_msgs_per_s"`
}

// Ingest is the bridge storing messages due far in the future.
type Ingest struct {
	N           int       `json:"n"`
	Seconds     float64   `json:"seconds"` // first publish to all stored
	Rate        float64   `json:"msgs_per_s"`
	PublishRate float64   `json:"publish_msgs_per_s"`
	Ratio       float64   `json:"ratio_to_ceiling,omitempty"`
	Method      string    `json:"method"` // how "all stored" was detected
	ReadyMs     float64   `json:"start_to_ready_ms"`
	Rounds      []float64 `json:"rounds_msgs_per_s"`
	// DrainRate is the bridge alone: N messages already queued on
	// E.Timeouts when it starts, stored per second from ready to all stored.
	DrainRate float64 `json:"drain_msgs_per_s,omitempty"`
	RSS       int64   `json:"rss_bytes"`
	HeapAlloc uint64  `json:"heap_alloc_bytes,omitempty"`
}

// Punctual is a stream of messages due uniformly over a window.
type Punctual struct {
	N              int     `json:"n"`
	WindowMs       float64 `json:"window_ms"`
	LeadMs         float64 `json:"lead_ms"`          // publish start to first due
	PublishSeconds float64 `json:"publish_seconds"`  // all publishes confirmed
	StoredMarginMs float64 `json:"stored_margin_ms"` // first due minus all stored (negative: stored late)
	Stored         bool    `json:"stored_before_first_due"`
	Method         string  `json:"method"`
	CPU            *LegCPU `json:"cpu,omitempty"` // first due time to last delivery
	Lateness
}

// Burst is a batch of messages all due at the same instant.
type Burst struct {
	N              int     `json:"n"`
	LeadMs         float64 `json:"lead_ms"`
	PublishSeconds float64 `json:"publish_seconds"`
	StoredMarginMs float64 `json:"stored_margin_ms"`
	Stored         bool    `json:"stored_before_due"`
	LastAfterDueMs float64 `json:"last_after_due_ms"` // due instant to the last delivery
	Lateness
}

// TTL is the punctuality workload through the TTL + dead-letter topology.
type TTL struct {
	N              int     `json:"n"`
	WindowMs       float64 `json:"window_ms"`
	LeadMs         float64 `json:"lead_ms"`
	PublishSeconds float64 `json:"publish_seconds"`
	QueueType      string  `json:"queue_type"`
	Levels         int     `json:"levels"`
	Lateness
}

// Scale is the bridge with a large pending set.
type Scale struct {
	N               int       `json:"n"`
	FillSeconds     float64   `json:"fill_seconds"`
	FillRate        float64   `json:"fill_msgs_per_s"`
	FillPublishRate float64   `json:"fill_publish_msgs_per_s"`
	FillRateFirst   float64   `json:"fill_rate_first_10pct,omitempty"`
	FillRateLast    float64   `json:"fill_rate_last_10pct,omitempty"`
	Method          string    `json:"method"`
	Punctual        *Punctual `json:"punctuality,omitempty"`
	// Steady is the steady workload at SteadyRate while N are pending
	// (target: its p99 within 1.5× of the same rate on an empty store,
	// which the steady step measures when it runs too).
	SteadyRate     int        `json:"steady_rate,omitempty"`
	Steady         *SteadyLeg `json:"steady,omitempty"`
	RSS            int64      `json:"rss_bytes"`
	RSSAnon        int64      `json:"rss_anon_bytes"`
	RSSFile        int64      `json:"rss_file_bytes"` // mostly the store's mmap
	HWM            int64      `json:"rss_peak_bytes"`
	HeapAvailable  bool       `json:"heap_available"`
	HeapAlloc      uint64     `json:"heap_alloc_bytes,omitempty"`      // at the end of the due stream
	HeapPeak       uint64     `json:"heap_alloc_peak_bytes,omitempty"` // sampled during the due stream
	HeapFillPeak   uint64     `json:"heap_alloc_fill_peak_bytes,omitempty"`
	HeapInuse      uint64     `json:"heap_inuse_bytes,omitempty"`
	Sys            uint64     `json:"go_sys_bytes,omitempty"`
	StoreBytes     int64      `json:"store_bytes"`
	StoreOnDisk    int64      `json:"store_on_disk_bytes"`
	VarsMs         float64    `json:"debug_vars_max_ms,omitempty"` // slowest GET /debug/vars sampled
	StopMs         float64    `json:"stop_ms"`
	RestartReadyMs float64    `json:"restart_ready_ms"`
	PendingRestart int64      `json:"pending_after_restart"` // -1: unknown
}

// bencher is one run's state.
type bencher struct {
	opts  Options
	res   *Results
	log   io.Writer
	runID string
	dir   string

	adminConn *amqp.Connection
	consConn  *amqp.Connection
	pubConns  []*amqp.Connection
	adminMu   sync.Mutex
	admin     *amqp.Channel
	reg       registry
	body      []byte
	published atomic.Int64 // messages published by publishAll, all calls
}

// Run runs the selected steps against the broker and returns what it
// measured. A step that fails is recorded in Results.Errors and the others
// still run; Run returns an error only when it cannot run at all (no broker,
// no bridge command). Everything it declared on the broker is deleted before
// it returns.
func Run(ctx context.Context, opts Options) (*Results, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	logw := opts.Log
	if logw == nil {
		logw = io.Discard
	}

	b := &bencher{opts: opts, log: logw, runID: randHex(3)}
	b.body = make([]byte, opts.Size)
	_, _ = rand.Read(b.body)
	b.res = &Results{StartedAt: time.Now(), Params: paramsOf(opts)}
	if err := b.connect(); err != nil {
		return nil, err
	}
	defer b.closeConns()
	dir, err := os.MkdirTemp(opts.Dir, "delaybridge-bench-")
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	b.dir = dir
	b.res.Machine = machine(b.adminConn, dir, bridgeExe(b.opts.BridgeCmd[0]))
	if opts.Keep {
		b.logf("keeping stores and bridge logs in %s", dir)
	} else {
		defer os.RemoveAll(dir)
	}

	b.runSteps(ctx)
	b.teardown()
	b.res.FinishedAt = time.Now()
	b.res.Rows = BuildRows(b.res)
	return b.res, nil
}

// withDefaults checks opts and fills in DefaultOptions for what is unset.
func (opts Options) withDefaults() (Options, error) {
	def := DefaultOptions()
	if opts.AMQPURL == "" {
		opts.AMQPURL = def.AMQPURL
	}
	if len(opts.BridgeCmd) == 0 {
		return opts, errors.New("bench: no bridge command")
	}
	for _, p := range []*int{&opts.Size, &opts.CeilingN, &opts.IngestN, &opts.PunctualN, &opts.BurstN, &opts.ScaleN, &opts.ScalePunctualN, &opts.ScaleSteadyRate, &opts.ScaleOutN, &opts.ExchangeRounds, &opts.Publishers, &opts.ConfirmWindow} {
		if *p < 0 {
			return opts, errors.New("bench: negative count")
		}
	}
	fill := func(p *int, d int) {
		if *p == 0 {
			*p = d
		}
	}
	fill(&opts.Size, def.Size)
	fill(&opts.CeilingN, def.CeilingN)
	fill(&opts.IngestN, def.IngestN)
	fill(&opts.PunctualN, def.PunctualN)
	fill(&opts.BurstN, def.BurstN)
	fill(&opts.ScaleN, def.ScaleN)
	fill(&opts.ScalePunctualN, def.ScalePunctualN)
	fill(&opts.ScaleSteadyRate, def.ScaleSteadyRate)
	fill(&opts.ScaleOutN, def.ScaleOutN)
	fill(&opts.ExchangeRounds, def.ExchangeRounds)
	fill(&opts.Publishers, def.Publishers)
	fill(&opts.ConfirmWindow, def.ConfirmWindow)
	if opts.Window <= 0 {
		opts.Window = def.Window
	}
	if len(opts.Steps) == 0 {
		opts.Steps = def.Steps
	}
	for _, s := range opts.Steps {
		if !slices.Contains(AllSteps, s) {
			return opts, fmt.Errorf("bench: unknown step %q (steps: %s)", s, strings.Join(AllSteps, ", "))
		}
	}
	if len(opts.SteadyRates) == 0 {
		opts.SteadyRates = def.SteadyRates
	}
	for _, r := range opts.SteadyRates {
		if r <= 0 {
			return opts, fmt.Errorf("bench: steady rate %d: want > 0", r)
		}
	}
	if opts.SteadyDuration <= 0 {
		opts.SteadyDuration = def.SteadyDuration
	}
	if len(opts.SteadyStores) == 0 {
		opts.SteadyStores = def.SteadyStores
	}
	for _, s := range opts.SteadyStores {
		if s != "bbolt" && s != "postgres" {
			return opts, fmt.Errorf("bench: steady store %q: want bbolt or postgres", s)
		}
	}
	if opts.TTLQueueType == "" {
		opts.TTLQueueType = def.TTLQueueType
	}
	if opts.TTLQueueType != "quorum" && opts.TTLQueueType != "classic" {
		return opts, fmt.Errorf("bench: TTL queue type %q: want quorum or classic", opts.TTLQueueType)
	}
	return opts, nil
}

// paramsOf are the Params a run with opts records.
func paramsOf(opts Options) Params {
	ps := Params{
		Size: opts.Size, CeilingN: opts.CeilingN, IngestN: opts.IngestN, PunctualN: opts.PunctualN,
		WindowMs: ms(opts.Window), BurstN: opts.BurstN, ScaleN: opts.ScaleN, ScalePunctualN: opts.ScalePunctualN, ScaleSteadyRate: opts.ScaleSteadyRate,
		TTLQueueType: opts.TTLQueueType, Publishers: opts.Publishers, ConfirmWindow: opts.ConfirmWindow,
		BridgeEnv: opts.BridgeEnv,
	}
	if slices.Contains(opts.Steps, StepScaleOut) {
		ps.ScaleOutN = opts.ScaleOutN
	}
	if slices.Contains(opts.Steps, StepExchange) {
		ps.ExchangeRounds = opts.ExchangeRounds
	}
	if slices.Contains(opts.Steps, StepSteady) {
		ps.SteadyRates, ps.SteadyDurS = opts.SteadyRates, opts.SteadyDuration.Seconds()
		ps.SteadyStores, ps.SteadySearch = opts.SteadyStores, opts.SteadySearch
	}
	for _, s := range AllSteps { // run order, whatever order they were given in
		if slices.Contains(opts.Steps, s) {
			ps.Steps = append(ps.Steps, s)
		}
	}
	return ps
}

// runSteps runs the selected steps in run order; a step that fails is
// recorded in Results.Errors and the others still run.
func (b *bencher) runSteps(ctx context.Context) {
	doCeiling, doIngest := slices.Contains(b.opts.Steps, StepCeiling), slices.Contains(b.opts.Steps, StepIngest)
	steps := map[string]func(context.Context) error{
		// Ceiling and ingest run together, their rounds interleaved.
		StepCeiling: func(ctx context.Context) error { return b.stepThroughput(ctx, true, doIngest) },
		StepIngest: func(ctx context.Context) error {
			if doCeiling {
				return nil // measured with the ceiling
			}
			return b.stepThroughput(ctx, false, true)
		},
		StepPunctuality: b.stepPunctuality, StepBurst: b.stepBurst, StepTTL: b.stepTTL, StepExchange: b.stepExchange,
		StepScale: b.stepScale, StepScaleOut: b.stepScaleOut, StepRebus: b.stepRebus, StepNSB: b.stepNSB,
		StepMassTransit: b.stepMassTransit, StepNSBTimeouts: b.stepNSBTimeouts,
		StepSteady: b.stepSteady, StepBigMsg: b.stepBigMsg, StepResend: b.stepResend, StepCrash: b.stepCrash,
		StepFailover: b.stepFailover, StepRecurring: b.stepRecurring,
	}
	for _, s := range b.res.Params.Steps {
		if ctx.Err() != nil {
			break
		}
		if s == StepIngest && doCeiling {
			continue // measured with the ceiling
		}
		if s == StepCeiling && doIngest {
			b.logf("== ceiling and ingest (rounds interleaved)")
		} else {
			b.logf("== %s", s)
		}
		start := time.Now()
		if err := steps[s](ctx); err != nil {
			b.logf("%s failed: %v", s, err)
			b.res.Errors = append(b.res.Errors, StepError{Step: s, Error: err.Error()})
		}
		b.logf("   %s took %.1f s", s, time.Since(start).Seconds())
	}
}

func (b *bencher) logf(format string, a ...any) {
	fmt.Fprintf(b.log, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05.000")}, a...)...)
}

func (b *bencher) warnf(format string, a ...any) {
	msg := fmt.Sprintf(format, a...)
	b.res.Warnings = append(b.res.Warnings, msg)
	b.logf("WARNING: %s", msg)
}

// dial opens a connection to the broker named for its role.
func (b *bencher) dial(role string) (*amqp.Connection, error) {
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName("delaybridge bench " + role)
	conn, err := amqp.DialConfig(b.opts.AMQPURL, amqp.Config{
		Properties: props, Heartbeat: 10 * time.Second, Locale: "en_US", Dial: amqp.DefaultDial(10 * time.Second),
	})
	if err != nil {
		return nil, fmt.Errorf("bench: connect to the broker: %s", redactErr(err, b.opts.AMQPURL))
	}
	return conn, nil
}

func (b *bencher) connect() error {
	var err error
	if b.adminConn, err = b.dial("admin"); err != nil {
		return err
	}
	if b.consConn, err = b.dial("consume"); err != nil {
		b.closeConns()
		return err
	}
	// Two publish connections: publishes and consumes of one step never
	// share a connection, and the broker's per-connection reader is not the
	// single funnel for all publishers.
	for i := 0; i < 2; i++ {
		c, err := b.dial(fmt.Sprintf("publish-%d", i))
		if err != nil {
			b.closeConns()
			return err
		}
		b.pubConns = append(b.pubConns, c)
	}
	return nil
}

func (b *bencher) closeConns() {
	for _, c := range append([]*amqp.Connection{b.adminConn, b.consConn}, b.pubConns...) {
		if c != nil {
			_ = c.Close()
		}
	}
}

// teardown deletes every queue and exchange of the run. When the admin
// connection was lost (a step may fail that way), it opens another, so
// that the run leaves nothing on a shared broker.
func (b *bencher) teardown() {
	b.adminMu.Lock()
	defer b.adminMu.Unlock()
	if b.adminConn == nil || b.adminConn.IsClosed() {
		conn, err := b.dial("teardown")
		if err != nil {
			b.warnf("teardown: %v", err)
		} else {
			if b.adminConn != nil {
				_ = b.adminConn.Close()
			}
			b.adminConn, b.admin = conn, nil
		}
	}
	var failed []string
	del := func(kind, name string, f func(*amqp.Channel) error) {
		ch, err := b.adminChannel()
		if err == nil {
			err = f(ch)
		}
		if err != nil {
			b.admin = nil
			var aerr *amqp.Error
			if errors.As(err, &aerr) && aerr.Code == amqp.NotFound {
				return
			}
			failed = append(failed, kind+" "+name+": "+err.Error())
		}
	}
	b.reg.mu.Lock()
	queues, exchanges := slices.Clone(b.reg.queues), slices.Clone(b.reg.exchanges)
	b.reg.mu.Unlock()
	for _, q := range queues {
		del("queue", q, func(ch *amqp.Channel) error { _, err := ch.QueueDelete(q, false, false, false); return err })
	}
	for _, e := range exchanges {
		del("exchange", e, func(ch *amqp.Channel) error { return ch.ExchangeDelete(e, false, false) })
	}
	if len(failed) > 0 {
		b.warnf("teardown: could not delete %s", strings.Join(failed, "; "))
	} else {
		b.logf("deleted %d queues and %d exchanges", len(queues), len(exchanges))
	}
}

// name is a broker name unique to this run.
func (b *bencher) name(parts ...string) string {
	return "bench-" + b.runID + "-" + strings.Join(parts, "-")
}

// message builds a workload message: persistent, the configured body size,
// the bridge's destination and due-time headers and the bench's own.
func (b *bencher) message(tag string, seq int, due time.Time, dest string) amqp.Publishing {
	return amqp.Publishing{
		MessageId:    tag + "-" + strconv.Itoa(seq),
		DeliveryMode: amqp.Persistent,
		Headers: amqp.Table{
			wire.HeaderDestination: dest,
			wire.HeaderDueAt:       due.UTC().Format(time.RFC3339Nano),
			hdrDue:                 due.UnixNano(),
			hdrSeq:                 int64(seq),
		},
		Body: b.body,
	}
}

// ---------------------------------------------------------------------------
// 1. ceiling

// throughputRounds: the ceiling and the ingest rate are each the best of
// this many rounds, run alternately (ceiling, ingest, ceiling, ...) so that
// a moment of noise on a shared machine, or a drift in its load, affects
// both sides of their ratio alike.
const throughputRounds = 3

// stepThroughput measures the ceiling, the ingest rate, or both,
// interleaving their rounds; with ingest it then measures the drain rate.
func (b *bencher) stepThroughput(ctx context.Context, ceiling, ingest bool) error {
	var c *Ceiling
	var best *Ingest
	var ingestRounds []float64
	for round := 0; round < throughputRounds; round++ {
		if ceiling {
			n := b.opts.CeilingN
			d, pubRate, err := b.ceilingRound(ctx, round, n)
			if err != nil {
				return fmt.Errorf("ceiling round %d: %w", round+1, err)
			}
			r := rate(n, d)
			b.logf("   ceiling: %d msgs in %.2f s = %.0f msg/s (publish %.0f msg/s)", n, d.Seconds(), r, pubRate)
			if c == nil {
				c = &Ceiling{N: n}
			}
			c.Rounds = append(c.Rounds, r)
			if r > c.Rate {
				c.Rate, c.Seconds, c.PublishRate = r, d.Seconds(), pubRate
			}
			b.res.Ceiling = c
		}
		if ingest {
			in, err := b.ingestRound(ctx, round, b.opts.IngestN)
			if err != nil {
				return fmt.Errorf("ingest round %d: %w", round+1, err)
			}
			ingestRounds = append(ingestRounds, in.Rate)
			if best == nil || in.Rate > best.Rate {
				best = in
			}
			best.Rounds = ingestRounds
			b.res.Ingest = best
		}
	}
	if !ingest {
		return nil
	}
	if c != nil && c.Rate > 0 {
		best.Ratio = best.Rate / c.Rate
	} else if b.res.Ceiling != nil && b.res.Ceiling.Rate > 0 {
		best.Ratio = best.Rate / b.res.Ceiling.Rate
	}
	var err error
	best.DrainRate, err = b.drain(ctx, b.opts.IngestN)
	return err
}

// ceilingRound publishes n messages to a fresh queue while a consumer acks
// them and returns the time from the first publish to the last consumed.
func (b *bencher) ceilingRound(ctx context.Context, round, n int) (time.Duration, float64, error) {
	q := b.name("ceiling", strconv.Itoa(round))
	if err := b.declareQueue(q, nil); err != nil {
		return 0, 0, err
	}
	// Same messages as the bridge gets (headers included), to a plain queue.
	due := time.Now().Add(ingestDueOffset)
	done, stop, err := b.ackingConsumer(q, n)
	if err != nil {
		return 0, 0, err
	}
	defer stop()
	pub, err := b.publishAll(ctx, n, func(i int) outgoing {
		return outgoing{key: q, msg: b.message(q, i, due, q)}
	})
	if err != nil {
		return 0, 0, err
	}
	select {
	case last := <-done:
		return last.Sub(pub.Start), pub.rate(), nil
	case <-time.After(time.Minute):
		return 0, 0, fmt.Errorf("ceiling: not all %d messages consumed within a minute", n)
	case <-ctx.Done():
		return 0, 0, ctx.Err()
	}
}

// ---------------------------------------------------------------------------
// bridges and "all stored"

// newBridge starts a bridge with a fresh store for step.
func (b *bencher) newBridge(ctx context.Context, step string) (*bridgeProc, time.Duration, error) {
	store := filepath.Join(b.dir, step, "delaybridge.db")
	p, ready, err := b.startBridge(ctx, b.name(step), store)
	if err != nil {
		return nil, 0, err
	}
	b.logf("   bridge %s ready in %.0f ms (pid %d, http %s)", p.endpoint, ms(ready), p.cmd.Process.Pid, p.httpAddr)
	return p, ready, nil
}

// newBridgeCollecting is newBridge, and a collector of n messages on the
// step's destination queue, which it declares.
func (b *bencher) newBridgeCollecting(ctx context.Context, step string, n int) (*bridgeProc, string, *collector, error) {
	p, _, err := b.newBridge(ctx, step)
	if err != nil {
		return nil, "", nil, err
	}
	dest := b.name(step, "dest")
	col, err := b.declareAndCollect(dest, n)
	if err != nil {
		b.stopBridge(p, step)
		return nil, "", nil, err
	}
	return p, dest, col, nil
}

// stopBridge stops p and records its log summary.
func (b *bencher) stopBridge(p *bridgeProc, step string) (time.Duration, error) {
	if p.stopped {
		return 0, nil
	}
	took, err := p.stop(60 * time.Second)
	s := p.logSummary(step)
	if s.Warnings+s.Errors > 0 {
		b.res.BridgeLogs = append(b.res.BridgeLogs, s)
		b.logf("   bridge %s logged %d warnings and %d errors; last: %s", p.endpoint, s.Warnings, s.Errors, s.Last)
	}
	return took, err
}

// stopInstances stops the instances of label, each resumed first in case
// it was left stopped (SIGSTOP), and warns of any that did not stop cleanly.
func (b *bencher) stopInstances(label string, procs []*bridgeProc) {
	for i, p := range procs {
		_ = p.cmd.Process.Signal(syscall.SIGCONT)
		if _, err := b.stopBridge(p, fmt.Sprintf("%s/%d", label, i+1)); err != nil {
			b.warnf("%s: instance %d: %v", label, i+1, err)
		}
	}
}

// pendingOf returns the bridge's pending count when it publishes one.
func pendingOf(p *bridgeProc) (int64, bool) {
	v, err := p.vars()
	if err != nil || !v.HasPending {
		return 0, false
	}
	return v.Pending, true
}

var errNotStored = errors.New("not all stored in time")

// waitStored waits until the bridge has stored the workload just published.
// When the bridge publishes delaybridge.pending in /debug/vars it waits for
// pending >= want. Otherwise it publishes a sentinel due at once to a queue
// of its own, after the workload, and waits for the sentinel to come out:
// E.Timeouts is FIFO and the bridge acks a message only after storing it, so
// the sentinel is taken, and so stored, after the workload. (The sentinel's
// own hop through the poller and dispatcher makes that figure a little
// pessimistic.) It gives up at deadline with errNotStored.
func (b *bencher) waitStored(ctx context.Context, p *bridgeProc, want int64, deadline time.Time) (time.Time, string, error) {
	if _, ok := pendingOf(p); ok && !b.opts.SentinelOnly {
		for {
			t0 := time.Now()
			n, ok := pendingOf(p)
			took := time.Since(t0)
			if ok && n >= want {
				return time.Now(), "pending", nil
			}
			if time.Now().After(deadline) {
				return time.Time{}, "pending", errNotStored
			}
			// The bridge counts its store for every /debug/vars: poll every
			// 10 ms, but leave it at least 4× the time a poll costs.
			select {
			case <-ctx.Done():
				return time.Time{}, "pending", ctx.Err()
			case <-time.After(max(10*time.Millisecond, 4*took)):
			}
		}
	}
	const method = "sentinel"
	sq := p.endpoint + "-sentinel"
	if err := b.declareQueue(sq, nil); err != nil {
		return time.Time{}, method, err
	}
	ch, err := b.consConn.Channel()
	if err != nil {
		return time.Time{}, method, err
	}
	defer ch.Close()
	deliveries, err := ch.Consume(sq, "", true, false, false, false, nil)
	if err != nil {
		return time.Time{}, method, err
	}
	id := "sentinel-" + randHex(6)
	if _, err := b.publishAll(ctx, 1, func(int) outgoing {
		return outgoing{key: p.timeoutsQueue(), msg: amqp.Publishing{
			MessageId: id, DeliveryMode: amqp.Persistent, Body: b.body,
			Headers: amqp.Table{wire.HeaderDestination: sq, wire.HeaderDelay: int64(0)},
		}}
	}); err != nil {
		return time.Time{}, method, fmt.Errorf("publish sentinel: %w", err)
	}
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	for {
		select {
		case d, ok := <-deliveries:
			if !ok {
				return time.Time{}, method, errors.New("sentinel consumer closed")
			}
			if d.MessageId == id {
				return time.Now(), method, nil
			}
		case <-t.C:
			return time.Time{}, method, errNotStored
		case <-ctx.Done():
			return time.Time{}, method, ctx.Err()
		}
	}
}

// lead is how far ahead of publishing the first due time of an n-message
// timed workload lies: long enough to publish and store all n at the slowest
// ingest rate measured so far (with a 1.5× margin plus 1 s), at least 3 s.
func (b *bencher) lead(n int) time.Duration {
	if b.opts.Lead > 0 {
		return b.opts.Lead
	}
	r := 0.0
	if b.res.Ingest != nil {
		r = b.res.Ingest.Rate
	}
	if b.res.Scale != nil && b.res.Scale.FillRate > 0 && (r == 0 || b.res.Scale.FillRate < r) {
		r = b.res.Scale.FillRate
	}
	if r <= 0 {
		r = 4000 // a conservative guess when ingest was not measured
	}
	est := time.Duration(float64(n)/r*1.5*float64(time.Second)) + time.Second
	return max(defaultLeadMin, est).Round(100 * time.Millisecond)
}

// ---------------------------------------------------------------------------
// 2. ingest

// ingestRound publishes n messages due in an hour to a fresh bridge and
// measures the time from the first publish until the bridge stored them all.
func (b *bencher) ingestRound(ctx context.Context, round, n int) (*Ingest, error) {
	step := StepIngest + strconv.Itoa(round)
	p, ready, err := b.newBridge(ctx, step)
	if err != nil {
		return nil, err
	}
	defer b.stopBridge(p, step)
	dest := b.name(step, "dest")
	if err := b.declareQueue(dest, nil); err != nil {
		return nil, err
	}
	due := time.Now().Add(ingestDueOffset)
	pub, err := b.publishAll(ctx, n, func(i int) outgoing {
		return outgoing{key: p.timeoutsQueue(), msg: b.message(dest, i, due, dest)}
	})
	if err != nil {
		return nil, err
	}
	at, method, err := b.waitStored(ctx, p, int64(n), time.Now().Add(5*time.Minute))
	if err != nil {
		return nil, fmt.Errorf("waiting for the bridge to store %d messages (%s): %w", n, method, err)
	}
	d := at.Sub(pub.Start)
	in := &Ingest{N: n, Seconds: d.Seconds(), Rate: rate(n, d), PublishRate: pub.rate(), Method: method, ReadyMs: ms(ready)}
	if m, err := p.mem(); err == nil {
		in.RSS = m.RSS
	}
	if v, err := p.vars(); err == nil {
		in.HeapAlloc = v.HeapAlloc
	}
	b.logf("   ingest: %d stored in %.2f s = %.0f msg/s (publish %.0f msg/s, detected by %s)", n, d.Seconds(), in.Rate, pub.rate(), method)
	return in, nil
}

// drain queues n messages on E.Timeouts of an endpoint whose bridge is not
// running yet, then starts the bridge and measures how fast it stores them:
// the bridge's own ingest capacity, without publishers competing for the
// broker and the CPUs.
func (b *bencher) drain(ctx context.Context, n int) (float64, error) {
	endpoint := b.name(StepIngest + "drain")
	queue := wire.TimeoutsQueue(endpoint)
	// Declared as the bridge declares it (the arguments must match).
	if err := b.declareQueue(queue, nil); err != nil {
		return 0, err
	}
	dest := b.name(StepIngest+"drain", "dest")
	if err := b.declareQueue(dest, nil); err != nil {
		return 0, err
	}
	due := time.Now().Add(ingestDueOffset)
	if _, err := b.publishAll(ctx, n, func(i int) outgoing {
		return outgoing{key: queue, msg: b.message(dest, i, due, dest)}
	}); err != nil {
		return 0, err
	}
	p, _, err := b.startBridge(ctx, endpoint, filepath.Join(b.dir, StepIngest+"drain", "delaybridge.db"))
	if err != nil {
		return 0, err
	}
	defer b.stopBridge(p, StepIngest+"drain")
	start := time.Now()
	at, method, err := b.waitStored(ctx, p, int64(n), time.Now().Add(5*time.Minute))
	if err != nil {
		return 0, fmt.Errorf("drain: waiting for %d stored (%s): %w", n, method, err)
	}
	r := rate(n, at.Sub(start))
	b.logf("   ingest drain: %d queued before the bridge started, stored in %.2f s = %.0f msg/s", n, at.Sub(start).Seconds(), r)
	return r, nil
}

// ---------------------------------------------------------------------------
// 3. punctuality

func (b *bencher) stepPunctuality(ctx context.Context) error {
	p, _, err := b.newBridge(ctx, StepPunctuality)
	if err != nil {
		return err
	}
	defer b.stopBridge(p, StepPunctuality)
	res, err := b.punctual(ctx, p, StepPunctuality, b.opts.PunctualN, b.opts.Window)
	if res != nil {
		b.res.Punctuality = res
	}
	return err
}

// spread returns n due times evenly spaced over [first, first+window).
func spread(first time.Time, window time.Duration, n int) []time.Time {
	dues := make([]time.Time, n)
	for i := range dues {
		dues[i] = first.Add(time.Duration(float64(window) * float64(i) / float64(n)))
	}
	return dues
}

// publishSpread publishes n messages due evenly over window from lead
// ahead, in random order, and logs the workload as what's. build returns
// the i-th published, message seq, due at due.
func (b *bencher) publishSpread(ctx context.Context, what string, n int, window, lead time.Duration, build func(i, seq int, due time.Time) outgoing) ([]time.Time, pubResult, error) {
	dues := spread(time.Now().Add(lead), window, n)
	perm := mrand.Perm(n)
	b.logf("   %s: %d messages due over %v from %v ahead", what, n, window, lead)
	pub, err := b.publishAll(ctx, n, func(i int) outgoing {
		seq := perm[i]
		return build(i, seq, dues[seq])
	})
	return dues, pub, err
}

// storedAhead is by how much storing, finished at at, was ahead of first
// (negative: behind) and whether it finished in time; who stored is named
// in the warning when it did not.
func (b *bencher) storedAhead(label, who string, at, first time.Time) (marginMs float64, stored bool) {
	marginMs, stored = ms(first.Sub(at)), !at.After(first)
	if !stored {
		b.warnf("%s: %s finished storing %.0f ms after the first due time", label, who, -marginMs)
	}
	return marginMs, stored
}

// punctual publishes n messages due evenly over window, in random order,
// starting lead from now, through bridge p, and measures their lateness at
// the destination's consumer.
func (b *bencher) punctual(ctx context.Context, p *bridgeProc, label string, n int, window time.Duration) (*Punctual, error) {
	dest := b.name(label, "dest")
	if err := b.declareQueue(dest, nil); err != nil {
		return nil, err
	}
	run, err := b.timed(ctx, p, timedWorkload{label: label, n: n, window: window, dest: dest, cpu: true,
		build: func(seq int, due, _ time.Time) outgoing {
			return outgoing{key: p.timeoutsQueue(), msg: b.message(dest, seq, due, dest)}
		}})
	if run == nil {
		return nil, err
	}
	run.Punctual.CPU = legCPU(run.cpu0, run.cpu1)
	b.legCPUf(label, run.Punctual.CPU)
	return run.Punctual, err
}

// punctualVia is punctual with the messages of another intake: build(seq,
// due) is message seq, which the bridge delivers to the existing queue dest.
func (b *bencher) punctualVia(ctx context.Context, p *bridgeProc, label, dest string, n int, window time.Duration, build func(seq int, due time.Time) outgoing) (*Punctual, error) {
	run, err := b.timed(ctx, p, timedWorkload{label: label, n: n, window: window, dest: dest,
		build: func(seq int, due, _ time.Time) outgoing { return build(seq, due) }})
	if run == nil {
		return nil, err
	}
	return run.Punctual, err
}

// timedWorkload is n messages due evenly over window, published in random
// order so that all are stored before the first is due, and consumed from
// dest.
type timedWorkload struct {
	label  string
	n      int
	window time.Duration
	lead   time.Duration // publish start to the first due time; 0: b.lead(n)
	dest   string        // the queue consumed, declared (and bound) by the caller
	// build returns message seq, due at due; now is the clock read just
	// before it is published.
	build func(seq int, due, now time.Time) outgoing
	// check, when set, tells whether a message came as it should; the
	// others count as mismatched.
	check func(seq int, d *amqp.Delivery) bool
	// stored, when set, runs once the bridge has stored the workload before
	// its first due time, which it is given.
	stored func(ctx context.Context, first time.Time)
	// cpu samples the CPU used at the first due time and after the last
	// delivery.
	cpu bool
}

// timedRun is what a timed workload measured, with its samples.
type timedRun struct {
	*Punctual
	pubAt   []time.Time     // by seq: the clock read just before publishing it
	arrived []int64         // by seq: when it arrived (unix ns), 0 if never
	late    []time.Duration // lateness of every distinct message received
	// cpu0 and cpu1 are the CPU samples of w.cpu.
	cpu0, cpu1 cpuSample
}

// timed runs w through bridge p and measures the lateness of its messages at
// the consumer of w.dest.
func (b *bencher) timed(ctx context.Context, p *bridgeProc, w timedWorkload) (*timedRun, error) {
	n, label := w.n, w.label
	col, err := b.collectChecked(w.dest, n, w.check)
	if err != nil {
		return nil, err
	}
	base, _ := pendingOf(p)
	lead := w.lead
	if lead <= 0 {
		lead = b.lead(n)
	}
	pubAt := make([]time.Time, n)
	dues, pub, err := b.publishSpread(ctx, label, n, w.window, lead, func(_, seq int, due time.Time) outgoing {
		pubAt[seq] = time.Now()
		return w.build(seq, due, pubAt[seq])
	})
	if err != nil {
		col.stop(0)
		return nil, err
	}
	first := dues[0]
	res := &Punctual{N: n, WindowMs: ms(w.window), LeadMs: ms(lead), PublishSeconds: pub.End.Sub(pub.Start).Seconds()}
	if pub.End.After(first) {
		b.warnf("%s: publishing ended %.0f ms after the first due time; raise --lead", label, ms(pub.End.Sub(first)))
	}
	at, method, err := b.waitStored(ctx, p, base+int64(n), first.Add(w.window))
	res.Method = method
	switch {
	case err == nil:
		res.StoredMarginMs, res.Stored = b.storedAhead(label, "the bridge", at, first)
		if res.Stored && w.stored != nil {
			w.stored(ctx, first)
		}
	case errors.Is(err, errNotStored):
		b.warnf("%s: could not confirm (%s) that the bridge stored all %d before the first due time", label, method, n)
	default:
		col.stop(0)
		return nil, err
	}
	run := &timedRun{Punctual: res, pubAt: pubAt}
	if w.cpu {
		run.cpu0 = b.cpuAt(ctx, []*bridgeProc{p}, nil, first)
	}
	last := dues[n-1]
	if !col.wait(ctx, last.Add(collectGrace)) && ctx.Err() == nil {
		b.warnf("%s: %d of %d delivered %v after the last due time", label, col.received(), n, collectGrace)
	}
	if w.cpu {
		run.cpu1 = cpuNow(ctx, []*bridgeProc{p}, nil)
	}
	l, _ := col.stop(duplicateLinger)
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	res.Lateness = l
	b.logf("   %s: p50 %.1f ms, p99 %.1f ms, max %.1f ms, early %d, dups %d, missing %d",
		label, l.P50Ms, l.P99Ms, l.MaxMs, l.Early, l.Duplicates, l.Missing)
	run.late, run.arrived = col.samples()
	return run, ctx.Err()
}

// ---------------------------------------------------------------------------
// 4. burst

func (b *bencher) stepBurst(ctx context.Context) error {
	n := b.opts.BurstN
	p, dest, col, err := b.newBridgeCollecting(ctx, StepBurst, n)
	if err != nil {
		return err
	}
	defer b.stopBridge(p, StepBurst)
	lead := b.lead(n)
	due := time.Now().Add(lead)
	b.logf("   burst: %d messages all due in %v", n, lead)
	pub, err := b.publishAll(ctx, n, func(i int) outgoing {
		return outgoing{key: p.timeoutsQueue(), msg: b.message(dest, i, due, dest)}
	})
	if err != nil {
		col.stop(0)
		return err
	}
	res := &Burst{N: n, LeadMs: ms(lead), PublishSeconds: pub.End.Sub(pub.Start).Seconds()}
	at, method, err := b.waitStored(ctx, p, int64(n), due)
	switch {
	case err == nil:
		res.StoredMarginMs = ms(due.Sub(at))
		res.Stored = !at.After(due)
	case errors.Is(err, errNotStored):
		b.warnf("burst: could not confirm (%s) that the bridge stored all %d before the due time", method, n)
	default:
		col.stop(0)
		return err
	}
	if !col.wait(ctx, due.Add(collectGrace)) && ctx.Err() == nil {
		b.warnf("burst: %d of %d delivered %v after the due time", col.received(), n, collectGrace)
	}
	l, last := col.stop(duplicateLinger)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	res.Lateness = l
	if l.Missing == 0 {
		res.LastAfterDueMs = ms(last.Sub(due))
	} else {
		res.LastAfterDueMs = math.Inf(1)
	}
	b.res.Burst = res
	b.logf("   burst: last delivered %.0f ms after the due time; p50 %.1f ms, p99 %.1f ms, missing %d",
		res.LastAfterDueMs, l.P50Ms, l.P99Ms, l.Missing)
	return ctx.Err()
}

// ---------------------------------------------------------------------------
// 6. TTL + dead-letter topology

func (b *bencher) stepTTL(ctx context.Context) error {
	n, window := b.opts.PunctualN, b.opts.Window
	topo := newTTLTopology(b.name("ttl"), b.opts.TTLQueueType)
	if err := b.declareTTL(&topo); err != nil {
		return err
	}
	dest := b.name("ttl", "dest")
	if err := b.declareQueue(dest, nil); err != nil {
		return err
	}
	if err := b.bindQueue(dest, nsbdelay.DeliveryBinding(dest), topo.chain.Delivery); err != nil {
		return err
	}
	col, err := b.collect(dest, n)
	if err != nil {
		return err
	}
	lead := b.lead(n)
	dues, pub, err := b.publishSpread(ctx, "ttl ("+topo.queueType+" queues)", n, window, lead, func(_, seq int, due time.Time) outgoing {
		// What a transport does at send time: whole seconds, rounded up.
		key, level := nsbdelay.RoutingKey(nsbendpoint.DelaySeconds(due, time.Now()), dest)
		return outgoing{exchange: topo.chain.Level(level), key: key, msg: b.message(dest, seq, due, dest)}
	})
	if err != nil {
		col.stop(0)
		return err
	}
	first := dues[0]
	if pub.End.After(first) {
		b.warnf("ttl: publishing ended %.0f ms after the first due time", ms(pub.End.Sub(first)))
	}
	if !col.wait(ctx, dues[n-1].Add(collectGrace)) && ctx.Err() == nil {
		b.warnf("ttl: %d of %d delivered %v after the last due time", col.received(), n, collectGrace)
	}
	l, _ := col.stop(duplicateLinger)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	b.res.TTL = &TTL{N: n, WindowMs: ms(window), LeadMs: ms(lead), PublishSeconds: pub.End.Sub(pub.Start).Seconds(),
		QueueType: topo.queueType, Levels: nsbdelay.Levels, Lateness: l}
	b.logf("   ttl: p50 %.1f ms, p99 %.1f ms, max %.1f ms, early %d, dups %d, missing %d",
		l.P50Ms, l.P99Ms, l.MaxMs, l.Early, l.Duplicates, l.Missing)
	return ctx.Err()
}

// declareTTL declares the topology; when the broker refuses the quorum
// variant (it needs RabbitMQ 3.10+ with the stream_queue feature flag) it
// falls back to classic queues, NServiceBus's v1 layout.
func (b *bencher) declareTTL(topo *ttlTopology) error {
	b.adminMu.Lock()
	defer b.adminMu.Unlock()
	ch, err := b.adminChannel()
	if err != nil {
		return err
	}
	err = topo.declare(ch, &b.reg)
	if err != nil && topo.queueType == "quorum" {
		b.admin = nil
		b.warnf("ttl: quorum delay queues refused (%v); using classic queues", err)
		*topo = newTTLTopology(b.name("ttl", "classic"), "classic")
		if ch, err = b.adminChannel(); err != nil {
			return err
		}
		err = topo.declare(ch, &b.reg)
	}
	if err != nil {
		b.admin = nil
		return fmt.Errorf("ttl topology: %w", err)
	}
	return nil
}

// ---------------------------------------------------------------------------
// 5. scale

// sampler polls the bridge's memory while a phase runs.
type sampler struct {
	stopc, done chan struct{}
	mu          sync.Mutex
	maxRSS      int64
	maxAnon     int64 // RssAnon: the RSS that is not file-backed (the store's mmap)
	maxHeap     uint64
	haveHeap    bool
	maxVars     time.Duration // slowest GET /debug/vars
	nextVars    time.Time
}

func startSampler(p *bridgeProc, every time.Duration) *sampler {
	s := &sampler{stopc: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			s.sample(p)
			select {
			case <-s.stopc:
				s.sample(p)
				return
			case <-t.C:
			}
		}
	}()
	return s
}

// sample reads /proc every time but /debug/vars (for which the bridge counts
// its store) only while that costs the bridge under 5% of its time.
func (s *sampler) sample(p *bridgeProc) {
	m, merr := p.mem()
	s.mu.Lock()
	defer s.mu.Unlock()
	if merr == nil {
		s.maxRSS = max(s.maxRSS, m.RSS)
		s.maxAnon = max(s.maxAnon, m.Anon)
	}
	if time.Now().Before(s.nextVars) {
		return
	}
	t0 := time.Now()
	v, verr := p.vars()
	took := time.Since(t0)
	s.nextVars = time.Now().Add(20 * took)
	s.maxVars = max(s.maxVars, took)
	if verr == nil {
		s.haveHeap = true
		s.maxHeap = max(s.maxHeap, v.HeapAlloc)
	}
}

func (s *sampler) finish() (maxRSS int64, maxHeap uint64, haveHeap bool, maxVars time.Duration) {
	close(s.stopc)
	<-s.done
	return s.maxRSS, s.maxHeap, s.haveHeap, s.maxVars
}

func (b *bencher) stepScale(ctx context.Context) error {
	n := b.opts.ScaleN
	store := filepath.Join(b.dir, StepScale, "delaybridge.db")
	endpoint := b.name(StepScale)
	p, _, err := b.startBridge(ctx, endpoint, store)
	if err != nil {
		return err
	}
	running := p
	defer func() {
		if running != nil && running.alive() {
			_, _ = b.stopBridge(running, StepScale)
		}
	}()
	res := &Scale{N: n, PendingRestart: -1}
	b.res.Scale = res
	dest := b.name(StepScale, "dest")
	if err := b.declareQueue(dest, nil); err != nil {
		return err
	}

	// Fill: n messages due over a day, 30 days out, in random order.
	b.logf("   scale: filling %d messages due in 30 days", n)
	now := time.Now()
	base := now.Add(scaleDueOffset)
	fillSampler := startSampler(p, 500*time.Millisecond)
	progress := b.fillProgress(ctx, p)
	// The publisher keeps at most fillBacklog messages queued ahead of the
	// bridge, as the ingest step's 20k are: a backlog of millions on the
	// broker costs the broker CPU the bridge then lacks, and production
	// fills a store over days, never from a queue of millions.
	var next atomic.Int64
	take := func() (int, bool) {
		for progress.depth.Load() > fillBacklog && ctx.Err() == nil {
			time.Sleep(5 * time.Millisecond)
		}
		i := int(next.Add(1) - 1)
		return i, i < n
	}
	pub, err := b.publishFrom(ctx, n, take, func(i int) outgoing {
		due := base.Add(time.Duration(mrand.Int64N(int64(24 * time.Hour))))
		return outgoing{key: p.timeoutsQueue(), msg: b.message(dest+"-fill", i, due, dest)}
	})
	if err != nil {
		progress.stop(n, time.Time{})
		_, _, _, _ = fillSampler.finish()
		return err
	}
	b.logf("   scale: published %d in %.1f s (%.0f msg/s); waiting for the bridge to store them", n, pub.End.Sub(pub.Start).Seconds(), pub.rate())
	at, method, err := b.waitStored(ctx, p, int64(n), time.Now().Add(storedWaitUnbounded))
	first, last := progress.stop(n, at)
	_, res.HeapFillPeak, _, _ = fillSampler.finish()
	if err != nil {
		return fmt.Errorf("fill: %s: %w", method, err)
	}
	d := at.Sub(pub.Start)
	res.FillSeconds, res.FillRate, res.FillPublishRate, res.Method = d.Seconds(), rate(n, d), pub.rate(), method
	res.FillRateFirst, res.FillRateLast = first, last
	b.logf("   scale: %d stored in %.1f s = %.0f msg/s (first 10%%: %.0f/s, last 10%%: %.0f/s)", n, d.Seconds(), res.FillRate, first, last)

	// A due stream while n are pending.
	// Sampled once a second only: every /debug/vars makes the bridge count
	// its store, which must not disturb the due stream being measured.
	s := startSampler(p, time.Second)
	pres, err := b.punctual(ctx, p, "scale-punctual", b.opts.ScalePunctualN, b.opts.Window)
	res.Punctual = pres
	if err == nil {
		// Intake and delivery at once, with n pending.
		res.SteadyRate = b.opts.ScaleSteadyRate
		res.Steady, err = b.steadyBridge(ctx, p, &SteadyStore{Store: "bbolt-scale"}, nil, res.SteadyRate)
	}
	var varsTook time.Duration
	_, res.HeapPeak, res.HeapAvailable, varsTook = s.finish()
	res.VarsMs = ms(varsTook)
	if err != nil {
		return err
	}
	if m, err := p.mem(); err == nil {
		res.RSS, res.HWM, res.RSSAnon, res.RSSFile = m.RSS, m.HWM, m.Anon, m.File
	}
	if v, err := p.vars(); err == nil {
		res.HeapAlloc, res.HeapInuse, res.Sys = v.HeapAlloc, v.HeapInuse, v.Sys
	}
	res.StoreBytes, res.StoreOnDisk = storeSize(store)

	// Restart on the same store.
	stopTook, err := b.stopBridge(p, StepScale)
	running = nil
	res.StopMs = ms(stopTook)
	if err != nil {
		return fmt.Errorf("stop: %w", err)
	}
	p2, ready, err := b.startBridge(ctx, endpoint, store)
	if err != nil {
		return fmt.Errorf("restart: %w", err)
	}
	running = p2
	res.RestartReadyMs = ms(ready)
	if n, ok := pendingOf(p2); ok {
		res.PendingRestart = n
	}
	b.logf("   scale: stop took %.0f ms; restart ready in %.0f ms", res.StopMs, res.RestartReadyMs)
	return nil
}

// fillProgress logs the fill every 5 s and records how many messages the
// bridge has taken off E.Timeouts (published minus ready: within the
// bridge's prefetch of the stored count), for the storing rate over the
// first and last 10% of the fill. It reads the queue depth over AMQP rather
// than the bridge's /debug/vars, which would make the bridge count its store
// every time.
type progressTracker struct {
	depth       atomic.Int64 // E.Timeouts' ready messages at the last tick
	stopc       chan struct{}
	done        chan struct{}
	mu          sync.Mutex
	pts         []progressPoint
	first, last float64
}

type progressPoint struct {
	at     time.Time
	stored int64
}

// fillBacklog bounds the messages the scale step's fill keeps queued on
// E.Timeouts ahead of the bridge.
const fillBacklog = 100_000

func (b *bencher) fillProgress(ctx context.Context, p *bridgeProc) *progressTracker {
	start := time.Now()
	t := &progressTracker{stopc: make(chan struct{}), done: make(chan struct{}), pts: []progressPoint{{start, 0}}}
	pubBase := b.published.Load()
	go func() {
		defer close(t.done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		lastLog := start
		for {
			select {
			case <-t.stopc:
				return
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			published := b.published.Load() - pubBase
			depth, err := b.queueDepth(p.timeoutsQueue())
			if err != nil {
				continue
			}
			t.depth.Store(int64(depth))
			taken := max(published-int64(depth), 0)
			t.mu.Lock()
			t.pts = append(t.pts, progressPoint{time.Now(), taken})
			t.mu.Unlock()
			if time.Since(lastLog) >= 5*time.Second {
				lastLog = time.Now()
				m, _ := p.mem()
				b.logf("   scale: ~%d stored after %.0f s (RSS %.0f MiB, of which anon %.0f MiB)",
					taken, time.Since(start).Seconds(), mib(m.RSS), mib(m.Anon))
			}
		}
	}()
	return t
}

// stop ends the tracking; all n were stored at doneAt (zero: unknown). It
// returns the storing rates over the first and the last 10% of n.
func (t *progressTracker) stop(n int, doneAt time.Time) (first, last float64) {
	close(t.stopc)
	<-t.done
	pts := t.pts
	if !doneAt.IsZero() {
		pts = append(pts, progressPoint{doneAt, int64(n)})
	}
	return windowRates(n, func(yield func(time.Time, int64)) {
		for _, q := range pts {
			yield(q.at, q.stored)
		}
	})
}

// windowRates returns the storing rate over the first and the last 10% of n
// from a series of (time, stored) points.
func windowRates(n int, series func(yield func(time.Time, int64))) (first, last float64) {
	tenth := int64(n / 10)
	var t0, t10, t90, t100 time.Time
	var s0 int64
	var started bool
	series(func(at time.Time, stored int64) {
		if !started {
			t0, s0, started = at, stored, true
		}
		if t10.IsZero() && stored-s0 >= tenth {
			t10 = at
		}
		if t90.IsZero() && stored >= int64(n)-tenth {
			t90 = at
		}
		if t100.IsZero() && stored >= int64(n) {
			t100 = at
		}
	})
	if !t10.IsZero() {
		first = rate(int(tenth), t10.Sub(t0))
	}
	if !t90.IsZero() && !t100.IsZero() {
		last = rate(int(tenth), t100.Sub(t90))
	}
	return first, last
}

// ---------------------------------------------------------------------------
// helpers

func machine(conn *amqp.Connection, dir, bridgePath string) Machine {
	m := Machine{CPUs: runtime.NumCPU(), GOOS: runtime.GOOS, GOARCH: runtime.GOARCH, GoVersion: runtime.Version()}
	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	if data, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(data))
	}
	product, _ := conn.Properties["product"].(string)
	version, _ := conn.Properties["version"].(string)
	m.Broker = strings.TrimSpace(product + " " + version)
	// The bridge is a binary of its own, so its revision and Go version come
	// from that file, not from the bench's build.
	if bi, err := buildinfo.ReadFile(bridgePath); err == nil {
		m.GoVersion = bi.GoVersion
		var rev, modified string
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				modified = s.Value
			}
		}
		if len(rev) > 12 {
			rev = rev[:12]
		}
		if rev != "" && modified == "true" {
			rev += "+modified"
		}
		m.BridgeRevision = rev
	}
	m.StoreFS = fsType(dir)
	return m
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

// redactErr removes the URL's password from an error message, the way the
// bridge does.
func redactErr(err error, rawURL string) string {
	return broker.RedactText(err.Error(), rawURL)
}
