// Command delaybridge gives an AMQP endpoint durable delayed delivery: it
// consumes E.Timeouts, stores each message until its due time and then
// forwards it to its destination queue.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/delaybridge/delaybridge/bridge"
	"github.com/delaybridge/delaybridge/config"
)

// Exit codes of docs/contract.md §5.
const (
	exitOK       = 0
	exitCritical = 1
	exitConfig   = 2
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	cmd := "run"
	if len(args) > 0 {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "run":
		return runBridge()
	case "schedule":
		return runSchedule(args)
	case "bench":
		return benchMoved(os.Stderr)
	case "ls", "show", "cancel", "reschedule", "dispatch", "stats", "replay-errors":
		return runAdmin(cmd, args, os.Stdout, os.Stderr)
	case "help", "-h", "--help":
		fmt.Print(usage)
		return exitOK
	default:
		fmt.Fprintf(os.Stderr, "delaybridge: unknown command %q\n\n%s", cmd, usage)
		return exitConfig
	}
}

const usage = `usage:
  delaybridge [run]              run the bridge (configured by DELAYBRIDGE_* variables)
  delaybridge schedule [flags] BODY
                                 publish BODY to E.Timeouts for delivery later
                                 (delaybridge schedule --help for flags)

admin commands (talk to a running bridge's admin API; flags --url, default
$DELAYBRIDGE_ADMIN_URL or http://127.0.0.1:8080, and --token, default
$DELAYBRIDGE_ADMIN_TOKEN; --json prints the API's JSON instead of a table):
  delaybridge ls [FILTERS] [--limit N] [--all] [--json]
                                 list pending timeouts in due order
  delaybridge show ID [--json]   one timeout: state, properties, headers, body
  delaybridge cancel (ID | --saga-id S | FILTERS)
                                 delete a pending timeout, a saga's, or every
                                 one the filters select
  delaybridge reschedule ID (--at TIME | --in DURATION)
  delaybridge reschedule FILTERS (--at TIME | --in DURATION | --shift DURATION)
                                 set a new due time, or move each by a duration
  delaybridge dispatch (ID | FILTERS)
                                 make pending timeouts due now
  delaybridge stats [--json]     pending and leased counts, next due time
  delaybridge replay-errors [--limit N]
                                 move dispatch failures from the error queue
                                 back into the store, due now

FILTERS select pending timeouts: --destination Q | --exchange X [--routing-key K],
--from T, --to T (due range), --id-prefix P, --header NAME:VALUE. A bulk action
needs at least one; it reports how many it changed and how many it left
because they were being dispatched.

The bench is its own command, delaybridge-bench: see bench/README.md.
`

// benchMoved answers the bench subcommand, which is its own command so that
// the harness is not linked into the bridge.
func benchMoved(stderr io.Writer) int {
	fmt.Fprintln(stderr, "delaybridge: the bench is its own command: go build -o delaybridge . && go build -o delaybridge-bench ./cmd/delaybridge-bench && ./delaybridge-bench (see bench/README.md)")
	return exitConfig
}

func runBridge() int {
	cfg, err := config.Load()
	if err != nil {
		fmt.Fprintln(os.Stderr, "delaybridge: configuration:", err)
		return exitConfig
	}
	tlsCfg, err := cfg.TLSFiles().Config()
	if err != nil {
		fmt.Fprintln(os.Stderr, "delaybridge: configuration:", err)
		return exitConfig
	}
	log := newLogger(cfg)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		stop() // a second signal now kills at once, as an impatient operator expects
	}()
	if err := bridge.New(cfg, bridge.Deps{Logger: log, TLS: tlsCfg}).Run(ctx); err != nil {
		if errors.Is(err, bridge.ErrCritical) {
			log.Error().Err(err).Msg("critical error: stopped so a supervisor can restart the bridge")
		} else {
			log.Error().Err(err).Msg("stopped on error")
		}
		return exitCritical
	}
	log.Info().Msg("stopped")
	return exitOK
}

func newLogger(cfg config.Config) zerolog.Logger {
	level, _ := zerolog.ParseLevel(cfg.LogLevel) // validated by config
	// Millisecond timing matters in a scheduler's logs.
	zerolog.TimeFieldFormat = time.RFC3339Nano
	w := zerolog.New(os.Stderr)
	if cfg.LogFormat == "console" {
		w = zerolog.New(zerolog.ConsoleWriter{Out: os.Stderr, TimeFormat: time.RFC3339Nano})
	}
	return w.Level(level).With().Timestamp().Logger()
}
