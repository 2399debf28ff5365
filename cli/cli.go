// Package cli is the delaybridge command: running the bridge and the client
// subcommands of docs/contract.md §5.5, with the exit codes of §5.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/delaybridge/delaybridge/admin"
	"github.com/delaybridge/delaybridge/bridge"
	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/config"
)

// Exit codes of docs/contract.md §5.
const (
	exitOK       = 0
	exitCritical = 1
	exitConfig   = 2
)

// Run runs the command args (the process's arguments, without its name)
// names and returns the process's exit code. Help asked for (help, -h, --help, and
// after any command) goes to stdout and exits 0; usage errors go to stderr
// and exit 2.
func Run(args []string, out, errOut io.Writer) int {
	cmd := "run"
	if len(args) > 0 {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "run":
		return runCommand(args, out, errOut)
	case "schedule":
		return runSchedule(args, out, errOut)
	case "declare-queue":
		return runDeclareQueue(args, out, errOut)
	case "migrate-bindings":
		return runMigrateBindings(args, out, errOut)
	case "version", "--version", "-version":
		return runVersion(args, out, errOut)
	case "bench":
		if len(args) > 0 && isHelp(args[0]) {
			return benchMoved(out, exitOK)
		}
		return benchMoved(errOut, exitConfig)
	case "ls", "show", "cancel", "reschedule", "dispatch", "stats", "replay-errors", "errors", "pause", "resume", "paused":
		return runAdmin(cmd, args, out, errOut)
	case "help", "-h", "-help", "--help":
		if len(args) > 0 && !isHelp(args[0]) {
			// help CMD: that command's own help.
			return Run([]string{args[0], "--help"}, out, errOut)
		}
		fmt.Fprint(out, usage)
		return exitOK
	default:
		fmt.Fprintf(errOut, "delaybridge: unknown command %q\n\n%s", cmd, usage)
		return exitConfig
	}
}

// isHelp reports whether a is a request for help.
func isHelp(a string) bool {
	switch a {
	case "help", "-h", "-help", "--help":
		return true
	}
	return false
}

// runCommand is `delaybridge [run]`: it takes no arguments, only help.
func runCommand(args []string, out, errOut io.Writer) int {
	switch {
	case len(args) == 0:
		return runBridge()
	case isHelp(args[0]):
		fmt.Fprint(out, usage)
		return exitOK
	default:
		fmt.Fprintf(errOut, "delaybridge run: unexpected argument %q (the bridge is configured by DELAYBRIDGE_* variables)\n\n%s", args[0], usage)
		return exitConfig
	}
}

const usage = `usage:
  delaybridge [run]              run the bridge (configured by DELAYBRIDGE_* variables)
  delaybridge schedule --to Q (--in DURATION | --at TIME) [flags] (BODY | --empty)
                                 publish BODY to E.Timeouts for delivery later;
                                 prints the message id
  delaybridge declare-queue [--quorum] NAME...
                                 declare durable queues (e.g. a destination)
                                 on DELAYBRIDGE_AMQP_URL
  delaybridge migrate-bindings --exchange NAME [--apply]
                                 move the bindings of a delayed exchange other
                                 than the bridge's own to NAME.route (through
                                 the RabbitMQ management API; dry run without
                                 --apply)
  delaybridge version            version, VCS revision and Go version (also --version)
  delaybridge help [COMMAND]     this text, or COMMAND's flags (as COMMAND --help)

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
  delaybridge pause (QUEUE | --exchange X KEY) [--by NAME]
                                 hold a destination's timeouts past their due
                                 time (listed as paused) until resumed
  delaybridge resume (QUEUE | --exchange X KEY)
                                 deliver them again, the overdue ones at once
  delaybridge paused [--json]    the paused destinations, since when, by whom
  delaybridge replay-errors [--limit N]
                                 move dispatch failures from the error queue
                                 back into the store, due now
  delaybridge errors ls|show|rm|replay [flags]
                                 this endpoint's copies on the error queue:
                                 list, show, delete, replay one or a filtered set

Times are printed, and --at, --from and --to are given, as RFC 3339
(2026-11-21T20:00:00.25+01:00); --from and --to also take a duration from now.
Exit codes: 0 done, 1 runtime or API failure, 2 usage or configuration error.

FILTERS select pending timeouts: --destination Q | --exchange X [--routing-key K],
--from T, --to T (due range), --id-prefix P, --header NAME:VALUE. A bulk action
needs at least one; it reports how many it changed and how many it left
because they were being dispatched.

The bench is its own command, delaybridge-bench: see bench/README.md.
`

// benchMoved answers the bench subcommand, which is its own command so that
// the harness is not linked into the bridge.
func benchMoved(w io.Writer, code int) int {
	fmt.Fprintln(w, "delaybridge: the bench is its own command: go build -o delaybridge . && go build -C bench -o ../delaybridge-bench ./cmd/delaybridge-bench && ./delaybridge-bench (see bench/README.md)")
	return code
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
	log := newLogger(cfg, os.Stderr)
	for _, u := range config.Unknown(os.Environ()) {
		// The value is never logged: a misspelt password variable is still a password.
		ev := log.Warn().Str("variable", u.Name)
		if u.Like != "" {
			ev = ev.Str("did_you_mean", u.Like)
		}
		ev.Msg("unknown DELAYBRIDGE_ variable, ignored")
	}
	if code := adminToken(&cfg, log); code != exitOK {
		return code
	}
	if limit, ok := memoryLimit(cfg, os.Getenv("GOMEMLIMIT")); ok {
		debug.SetMemoryLimit(limit)
		log.Debug().Int64("bytes", limit).Msg("Go soft memory limit set from DELAYBRIDGE_MAX_INFLIGHT_BYTES")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		stop() // a second signal now kills at once, as an impatient operator expects
	}()
	if err := bridge.New(cfg, bridge.Deps{Logger: log, TLS: tlsCfg}).Run(ctx); err != nil {
		if hint := brokerHint(err); hint != "" {
			log.Error().Err(err).Msg(hint)
		} else if errors.Is(err, bridge.ErrCritical) {
			log.Error().Err(err).Msg("critical error: stopped so a supervisor can restart the bridge")
		} else {
			log.Error().Err(err).Msg("stopped on error")
		}
		return exitCritical
	}
	log.Info().Msg("stopped")
	return exitOK
}

// newLogger writes to out (stderr) as DELAYBRIDGE_LOG_FORMAT says.
func newLogger(cfg config.Config, out *os.File) zerolog.Logger {
	level, _ := zerolog.ParseLevel(cfg.LogLevel) // validated by config
	// Millisecond timing matters in a scheduler's logs.
	zerolog.TimeFieldFormat = time.RFC3339Nano
	w := zerolog.New(out)
	if cfg.LogFormat == "console" {
		// Colour codes only for a person at a terminal, not in a file or a
		// log collector.
		w = zerolog.New(zerolog.ConsoleWriter{Out: out, TimeFormat: time.RFC3339Nano, NoColor: !isTerminal(out)})
	}
	return w.Level(level).With().Timestamp().Logger()
}

// isTerminal reports whether f is a terminal (a character device; /dev/null
// is one too, where colour does no harm).
func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// adminToken sets cfg.AdminToken from DELAYBRIDGE_ADMIN_TOKEN_FILE when
// DELAYBRIDGE_ADMIN_TOKEN is empty (docs/contract.md §6.3), making the file
// when there is none. A file at the default path that cannot be made (a
// read-only directory) leaves the API off with a warning, as before the
// file existed; one the operator named must work, or the bridge exits 2.
func adminToken(cfg *config.Config, log zerolog.Logger) int {
	if cfg.AdminToken != "" || cfg.AdminTokenFile == "" {
		return exitOK
	}
	tok, created, err := admin.TokenFile(cfg.AdminTokenFile)
	_, named := os.LookupEnv("DELAYBRIDGE_ADMIN_TOKEN_FILE")
	switch {
	case err == nil:
		cfg.AdminToken = tok
		msg := "admin API on; its token is in this file, readable by this user only"
		if created {
			msg = "admin API on; made a token for it in this file, readable by this user only"
		}
		log.Info().Str("token_file", cfg.AdminTokenFile).Msg(msg)
	case named || errors.Is(err, admin.ErrTokenFileExposed):
		fmt.Fprintf(os.Stderr, "delaybridge: configuration: DELAYBRIDGE_ADMIN_TOKEN_FILE: %v\n", err)
		return exitConfig
	default:
		log.Warn().Err(err).Str("token_file", cfg.AdminTokenFile).
			Msg("admin API off: no token file here; set DELAYBRIDGE_ADMIN_TOKEN, or DELAYBRIDGE_ADMIN_TOKEN_FILE to a writable path (empty: off, without this warning)")
	}
	return exitOK
}

// brokerHint is what to do about a bridge that found no broker at start
// (the TCP connection failed): empty for any other error.
func brokerHint(err error) string {
	if !errors.Is(err, broker.ErrNeverConnected) || !errors.Is(err, broker.ErrUnreachable) {
		return ""
	}
	return "no RabbitMQ answered at DELAYBRIDGE_AMQP_URL: point it at your broker, or start one here " +
		"(sudo ./scripts/ensure-rabbitmq.sh installs and starts Debian's rabbitmq-server; or docker compose up -d rabbitmq)"
}

// memoryLimit is the Go soft memory limit the bridge sets when the operator
// set none (GOMEMLIMIT): room for the messages the byte budget admits, each
// about three times over (the delivery, the stored record, the store's or
// the decoder's copy), and 128 MiB for the rest. With the default GOGC the
// heap may otherwise grow to twice what is live before a collection, so
// large messages passing through would double the bridge's footprint. It is
// soft: a bridge that needs more gets more, at the cost of more frequent
// collections. No budget (0), no limit.
func memoryLimit(cfg config.Config, gomemlimit string) (int64, bool) {
	if gomemlimit != "" || cfg.MaxInflightBytes <= 0 {
		return 0, false
	}
	return 128<<20 + 3*cfg.MaxInflightBytes, true
}
