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

// runBridge reads the configuration, makes the logger and runs the bridge
// until SIGINT or SIGTERM; it returns the exit code of docs/contract.md §5.3.
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
