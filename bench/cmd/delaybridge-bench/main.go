// Command delaybridge-bench measures delaybridge against a real broker: it
// runs the delaybridge binary as child processes and prints what it measured.
// It is a command of its own so that the harness is not linked into the
// bridge.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/delaybridge/delaybridge/bench"
)

// Exit codes, as the bridge's: 0 every check passed, 1 a miss or a failure,
// 2 usage.
const (
	exitOK       = 0
	exitCritical = 1
	exitConfig   = 2
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	cmd, code := parseArgs(args)
	if cmd == nil {
		return code
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	res, err := bench.Run(ctx, cmd.opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "delaybridge-bench:", err)
		return exitCritical
	}
	printResults(res)
	if cmd.jsonPath != "" {
		if err := bench.WriteJSON(res, cmd.jsonPath); err != nil {
			fmt.Fprintln(os.Stderr, "delaybridge-bench: write JSON:", err)
			return exitCritical
		}
		fmt.Println("\nresults written to", cmd.jsonPath)
	}
	if ctx.Err() != nil {
		return exitCritical
	}
	for _, r := range res.Rows {
		if r.Result == bench.Miss {
			return exitCritical
		}
	}
	return exitOK
}

// usage heads the flags in the help text.
const usage = `usage: delaybridge-bench [flags]

Measures the bridge against a real broker and prints a table (and writes JSON):
  ceiling      the broker's own single hop (persistent, publisher confirms, consumer acks)
  ingest       messages the bridge stores per second, and the ratio to the ceiling
  punctuality  lateness at the destination's consumer of messages due uniformly over --window
  burst        time from a shared due instant until the last of --burst-n is delivered
  ttl          the punctuality workload through a 28-level TTL + dead-letter topology (no bridge)
  exchange     (--exchange) the punctuality workload to a queue (x-destination), to a topic exchange
               (x-destination-exchange) and through a delayed topic exchange (x-delay), in
               alternating rounds on one bridge (--exchange-rounds)
  scale        (--scale) ingest while filling --scale-n pending, punctuality and the steady workload
               (--scale-steady-rate), memory, store size and restart-to-ready with them pending
  nsb          (--nsb) the punctuality workload sent as NServiceBus endpoints send delayed
               messages into the transport's v2 chain (its real names): the chain alone,
               then a bridge with DELAYBRIDGE_NSB_NATIVE_DELAYS consuming its level queues
  rebus        (--only rebus) the punctuality workload as Rebus endpoints defer it to a bridge
               serving as their external timeout manager (DELAYBRIDGE_REBUS_QUEUE)
  masstransit  (--only masstransit) the plain punctuality workload, then as MassTransit
               ScheduleMessages to a bridge serving as their scheduler (DELAYBRIDGE_MASSTRANSIT_QUEUE)
  nsbtm        (--only nsbtm) the plain punctuality workload, then as NServiceBus 3-7 endpoints
               defer to their timeout manager (NServiceBus.Timeout.Expire on E.Timeouts)
  steady       (--only steady) messages published at a constant rate R for --steady-duration, each
               due 1–5 s after its send, to 4 destination queues, so intake and delivery overlap:
               lateness p50/p99/p99.9/max per rate, and the broker's own hop at R and 2R
  scaleout     (--scaleout) one, two, then three bridges sharing a PostgreSQL store (--postgres-url):
               ingest rate, burst delivery rate and lateness, and what each instance did
  resend       (--only resend) clients sending a message again, same id, the moment it arrives:
               NServiceBus delayed retries (v2 chain), second-level retries to the timeout manager,
               and the same message re-published with x-delay, --resend-rate new messages a second
               each for --resend-duration, 3 sends each, due 1 s after each send; through one bridge
               (bbolt), then two on PostgreSQL (--postgres-url): sends lost (must be 0), duplicates,
               early, lateness
  crash        (--only crash) the steady workload (--crash-rate, due 1–5 s after each send) through a
               bridge on bbolt killed with SIGKILL 3 times over --crash-duration and restarted at once:
               duplicates per kill (what it had forwarded and not yet removed) and how many ms of
               forwards they are; lost and early must be 0
  failover     (--only failover) three bridges on one PostgreSQL store (--postgres-url) under the
               steady workload (--failover-rate, due 1–5 s after each send); 8 s in, one is killed
               (SIGKILL), stopped (SIGTERM) or stalled (SIGSTOP for 40 s, then SIGCONT), each
               --failover-repeats times: lost, early, duplicates, and the lateness p99 and max of the
               messages due in the 10 s after the event
  recurring    (--only recurring) --recurring-n schedules firing every second (x-delaybridge-cron)
               to one queue, consumed for --recurring-duration, then cancelled: fires expected,
               missed, doubled, early, lateness from x-delaybridge-fire-time p50/p99/max, fires
               after the cancels, and the store's pending count and bbolt size over the window

Every bridge is the delaybridge binary (--bridge) run as a child process with its own
endpoint, store and HTTP port; everything the bench declares on the broker is deleted at
the end.

`

// choices are the flags that are no field of bench.Options: they choose the
// binary, the steps and the output.
type choices struct {
	bridgePath, only, jsonPath, steadyRates, steadyStore *string
	ttl, exchange, scale, scaleOut, nsb, quiet           *bool
}

// defineFlags defines the flags on fs: those of bench.Options straight into
// opts, with their defaults, and the others into the choices it returns.
func defineFlags(fs *flag.FlagSet, opts *bench.Options) choices {
	def := bench.DefaultOptions()
	var c choices
	c.bridgePath = fs.String("bridge", "", "the delaybridge binary each bridge runs (default: delaybridge next to this executable, else on $PATH)")
	fs.StringVar(&opts.AMQPURL, "amqp-url", envOr("DELAYBRIDGE_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"), "broker URL; $DELAYBRIDGE_AMQP_URL when set")
	fs.IntVar(&opts.Size, "size", def.Size, "message body size in bytes")
	fs.IntVar(&opts.CeilingN, "ceiling-n", def.CeilingN, "messages for the broker's single-hop ceiling")
	fs.IntVar(&opts.IngestN, "ingest-n", def.IngestN, "messages for the ingest rate")
	fs.IntVar(&opts.PunctualN, "punctual-n", def.PunctualN, "messages due over --window (punctuality and ttl steps)")
	fs.DurationVar(&opts.Window, "window", def.Window, "window the punctuality workload's due times spread over")
	fs.IntVar(&opts.BurstN, "burst-n", def.BurstN, "messages all due at the same instant")
	c.scale = fs.Bool("scale", false, "also run the scale step (fills --scale-n pending messages; takes minutes)")
	fs.IntVar(&opts.ScaleN, "scale-n", def.ScaleN, "messages pending far in the future in the scale step")
	fs.IntVar(&opts.ScalePunctualN, "scale-punctual-n", def.ScalePunctualN, "messages of the due stream run while --scale-n are pending")
	fs.IntVar(&opts.ScaleSteadyRate, "scale-steady-rate", def.ScaleSteadyRate, "rate (msgs/s) of the steady workload run for --steady-duration while --scale-n are pending")
	c.scaleOut = fs.Bool("scaleout", false, "also run the scaleout step: one vs two bridges sharing the PostgreSQL store at --postgres-url (about a minute)")
	fs.IntVar(&opts.ScaleOutN, "scaleout-n", def.ScaleOutN, "messages of each scaleout workload (ingest, burst, spread over --window)")
	fs.StringVar(&opts.PostgresURL, "postgres-url", os.Getenv("DELAYBRIDGE_TEST_POSTGRES_URL"), "PostgreSQL database for the scaleout step (schemas are created and dropped); $DELAYBRIDGE_TEST_POSTGRES_URL when set; empty skips the step")
	c.exchange = fs.Bool("exchange", false, "also run the exchange step: the punctuality workload to a queue, to an exchange and through a delayed exchange, alternating (about 2 minutes)")
	fs.IntVar(&opts.ExchangeRounds, "exchange-rounds", def.ExchangeRounds, "rounds of the exchange step (each runs every path once)")
	c.ttl = fs.Bool("ttl", true, "run the TTL + dead-letter topology comparison (--ttl=false to skip)")
	c.nsb = fs.Bool("nsb", false, "also run the nsb step: the punctuality workload sent as NServiceBus sends into its delay chain, alone and with a bridge consuming it (uses the transport's real queue names)")
	fs.StringVar(&opts.TTLQueueType, "ttl-queue-type", def.TTLQueueType, "queue type of the TTL levels: quorum (NServiceBus v2) or classic (v1)")
	c.steadyRates = fs.String("steady-rates", joinInts(def.SteadyRates), "publish rates (msgs/s) of the steady step, comma-separated")
	fs.DurationVar(&opts.SteadyDuration, "steady-duration", def.SteadyDuration, "how long the steady step publishes at each rate")
	c.steadyStore = fs.String("steady-store", strings.Join(def.SteadyStores, ","), "stores of the steady step's bridge, comma-separated: bbolt, postgres (postgres uses --postgres-url)")
	fs.BoolVar(&opts.SteadySearch, "steady-search", false, "steady step: also step the rate up from 1000 by 500 until the bridge's p99 exceeds 10 ms or the publisher falls behind, and report the highest as a ratio to the ceiling (measured if not run)")
	fs.StringVar(&opts.SteadyProfile, "steady-profile", "", "steady step: directory for a CPU profile of the bridge (DELAYBRIDGE_PPROF) over the steady window of every rate, saved as steady-R.pprof")
	fs.IntVar(&opts.ResendRate, "resend-rate", 50, "resend step: new messages a second of each workload")
	fs.DurationVar(&opts.ResendDuration, "resend-duration", 10*time.Second, "resend step: how long new messages are sent")
	fs.IntVar(&opts.CrashRate, "crash-rate", 1000, "crash step: steady rate of messages a second")
	fs.DurationVar(&opts.CrashDuration, "crash-duration", 20*time.Second, "crash step: how long messages are sent (3 kills spread over it)")
	fs.IntVar(&opts.FailoverRate, "failover-rate", 1000, "failover step: steady rate of messages a second")
	fs.DurationVar(&opts.FailoverDuration, "failover-duration", 20*time.Second, "failover step: how long messages are sent in each run (the event 8 s in)")
	fs.IntVar(&opts.FailoverRepeats, "failover-repeats", 5, "failover step: runs of each event (kill, term, stop)")
	fs.IntVar(&opts.RecurringN, "recurring-n", 1000, "recurring step: schedules, each firing every second")
	fs.DurationVar(&opts.RecurringDuration, "recurring-duration", 20*time.Second, "recurring step: how long the fires are consumed and counted")
	c.only = fs.String("only", "", "run only these steps, comma-separated: "+strings.Join(bench.AllSteps, ","))
	fs.DurationVar(&opts.Lead, "lead", 0, "time from publishing to the first due time (0: from the measured ingest rate, at least 3s)")
	fs.IntVar(&opts.Publishers, "publishers", def.Publishers, "publishing goroutines, each with its own confirm-mode channel")
	fs.IntVar(&opts.ConfirmWindow, "confirm-window", def.ConfirmWindow, "unconfirmed publishes each publisher keeps in flight")
	c.jsonPath = fs.String("json", "bench-results.json", "write the results as JSON to this file (empty: don't)")
	fs.StringVar(&opts.Dir, "dir", "", "parent directory of the temporary stores and bridge logs (default: the system's temp dir)")
	fs.BoolVar(&opts.Keep, "keep", false, "keep the temporary stores and bridge logs")
	c.quiet = fs.Bool("quiet", false, "no progress lines on stderr")
	fs.BoolVar(&opts.SentinelOnly, "sentinel", false, "tell when a workload is stored by a sentinel message, not /debug/vars pending")
	fs.Var((*envFlags)(&opts.BridgeEnv), "env", "extra KEY=VALUE setting for every bridge started, e.g. DELAYBRIDGE_BATCH_SIZE=2000 (repeatable)")
	return c
}

// command is what the command line asks for: a run with opts, its results
// written as JSON to jsonPath unless that is empty.
type command struct {
	opts     bench.Options
	jsonPath string
}

// parseArgs reads the command line. With nothing to run (help, or a usage
// error, told on stderr) it returns nil and the exit code.
func parseArgs(args []string) (*command, int) {
	var opts bench.Options
	fs := flag.NewFlagSet("delaybridge-bench", flag.ContinueOnError)
	c := defineFlags(fs, &opts)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return nil, exitOK
		}
		return nil, exitConfig
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "delaybridge-bench: unexpected arguments %q\n", fs.Args())
		return nil, exitConfig
	}
	exe, err := findBridge(*c.bridgePath)
	if err != nil {
		fmt.Fprintln(os.Stderr, "delaybridge-bench:", err)
		return nil, exitConfig
	}
	opts.BridgeCmd = []string{exe, "run"}
	opts.Log = os.Stderr
	if opts.SteadyRates, err = parseInts(*c.steadyRates); err != nil {
		fmt.Fprintln(os.Stderr, "delaybridge-bench: --steady-rates:", err)
		return nil, exitConfig
	}
	opts.SteadyStores = commaList(*c.steadyStore)
	if *c.quiet {
		opts.Log = nil
	} else {
		fmt.Fprintln(os.Stderr, "delaybridge-bench: bridge binary", exe)
	}
	opts.Steps = c.steps()
	return &command{opts: opts, jsonPath: *c.jsonPath}, exitOK
}

// steps are the steps to run: --only's, or the default ones and those
// their own flags add.
func (c choices) steps() []string {
	if *c.only != "" {
		return commaList(*c.only)
	}
	steps := []string{bench.StepCeiling, bench.StepIngest, bench.StepPunctuality, bench.StepBurst}
	for _, add := range []struct {
		on   bool
		step string
	}{{*c.ttl, bench.StepTTL}, {*c.exchange, bench.StepExchange}, {*c.scale, bench.StepScale}, {*c.scaleOut, bench.StepScaleOut}, {*c.nsb, bench.StepNSB}} {
		if add.on {
			steps = append(steps, add.step)
		}
	}
	return steps
}

// commaList is the non-empty entries of a comma-separated list, trimmed.
func commaList(s string) []string {
	var out []string
	for _, e := range strings.Split(s, ",") {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return out
}

// printResults prints the machine, the table, the reports of the steps run,
// and the errors, warnings and bridge logs.
func printResults(res *bench.Results) {
	m := res.Machine
	fmt.Printf("\ndelaybridge bench: %d-byte messages; %d CPUs (%s); %s %s; %s; broker %s; bridge %s; store on %s\n\n",
		res.Params.Size, m.CPUs, m.CPUModel, m.GOOS, orDash(m.Kernel), m.GoVersion, m.Broker, orDash(m.BridgeRevision), orDash(m.StoreFS))
	fmt.Print(bench.FormatTable(res.Rows))
	for _, report := range []string{bench.FormatComparison(res), bench.FormatExchange(res), bench.FormatScaleOut(res), bench.FormatSteady(res)} {
		if report != "" {
			fmt.Print("\n", report)
		}
	}
	for _, e := range res.Errors {
		fmt.Printf("error (%s): %s\n", e.Step, e.Error)
	}
	for _, w := range res.Warnings {
		fmt.Println("warning:", w)
	}
	for _, l := range res.BridgeLogs {
		fmt.Printf("bridge log (%s): %d warnings, %d errors; last: %s\n", l.Step, l.Warnings, l.Errors, l.Last)
	}
}

// findBridge returns the delaybridge binary to run: flagPath when set (a
// file path, not looked up on $PATH), else one next to this executable (so
// both built into one directory just work), else one on $PATH.
func findBridge(flagPath string) (string, error) {
	if flagPath != "" {
		abs, err := filepath.Abs(flagPath)
		if err != nil {
			return "", fmt.Errorf("--bridge: %w", err)
		}
		if _, err := exec.LookPath(abs); err != nil {
			return "", fmt.Errorf("--bridge: %w", err)
		}
		return abs, nil
	}
	if self, err := os.Executable(); err == nil {
		if p, err := exec.LookPath(filepath.Join(filepath.Dir(self), "delaybridge")); err == nil {
			return p, nil
		}
	}
	p, err := exec.LookPath("delaybridge")
	if err != nil {
		return "", errors.New("no delaybridge binary next to this one or on $PATH: build it (go build -o delaybridge .) or pass --bridge PATH")
	}
	return filepath.Abs(p)
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// parseInts parses comma-separated positive integers.
func parseInts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("%q is not a positive integer", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ",")
}

type envFlags []string

func (e *envFlags) String() string { return strings.Join(*e, ",") }

func (e *envFlags) Set(v string) error {
	if k, _, ok := strings.Cut(v, "="); !ok || k == "" {
		return fmt.Errorf("want KEY=VALUE, got %q", v)
	}
	*e = append(*e, v)
	return nil
}
