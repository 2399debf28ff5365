package cli

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"
)

// Flag parsing and usage text shared by every command.

// parseInterspersed parses flags, allowing them before and after positional arguments.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if rest[0] == "--" {
			return append(pos, rest[1:]...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// parseFlags parses args with parseInterspersed. code < 0: go on with the
// positional arguments. Otherwise return code: exitOK after help asked for
// (-h, --help), printed to out; exitConfig after a flag error, printed with
// the usage to errOut.
func parseFlags(fs *flag.FlagSet, args []string, out, errOut io.Writer) (pos []string, code int) {
	var buf bytes.Buffer
	fs.SetOutput(&buf)
	pos, err := parseInterspersed(fs, args)
	fs.SetOutput(errOut)
	switch {
	case errors.Is(err, flag.ErrHelp):
		out.Write(buf.Bytes())
		return nil, exitOK
	case err != nil:
		errOut.Write(buf.Bytes())
		return nil, exitConfig
	}
	return pos, -1
}

// usageErr reports a usage error of command cmd, with its usage, and
// returns exitConfig.
func usageErr(fs *flag.FlagSet, errOut io.Writer, cmd, format string, a ...any) int {
	fmt.Fprintf(errOut, "delaybridge %s: %s\n", cmd, fmt.Sprintf(format, a...))
	fs.SetOutput(errOut)
	fs.Usage()
	return exitConfig
}

// parseWhen accepts an RFC 3339 time or a duration from now ("10m", "-1h").
func parseWhen(v string, now time.Time) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(v); err == nil {
		return now.Add(d), nil
	}
	return time.Time{}, fmt.Errorf("%q is neither an RFC 3339 time (2026-11-21T20:00:00Z) nor a duration from now (10m)", v)
}

// fmtTime prints a time as --at, --from and --to accept it (RFC 3339, every
// digit kept), so that a printed time can be pasted back and means the same
// instant.
func fmtTime(t time.Time) string { return t.Local().Format(time.RFC3339Nano) }

// fmtTimeOr is fmtTime of *t, or none when there is no t.
func fmtTimeOr(t *time.Time, none string) string {
	if t == nil {
		return none
	}
	return fmtTime(*t)
}

func setUsage(fs *flag.FlagSet, synopsis, text string) {
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: delaybridge %s\n\n%s\n\nflags:\n", synopsis, text)
		fs.PrintDefaults()
	}
}
