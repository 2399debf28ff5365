// Package cli is the delaybridge command: the bridge's start-up (run.go) and
// the client subcommands of docs/contract.md §5.5, a file each, with the
// exit codes of §5.3. It is the one reader of the configuration.
package cli

import (
	"fmt"
	"io"
)

// Exit codes of docs/contract.md §5.3.
const (
	exitOK       = 0
	exitCritical = 1
	exitConfig   = 2
)

// Run runs the command args (the process's arguments, without its name)
// names and returns the process's exit code. Help asked for (help, -h,
// --help, and after any command) goes to stdout and exits 0; usage errors go
// to stderr and exit 2.
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
		return runBench(args, out, errOut)
	case "ls", "show", "cancel", "reschedule", "dispatch", "stats", "replay-errors", "errors", "pause", "resume", "paused", "schedules":
		return runAdmin(cmd, args, out, errOut)
	case "help", "-h", "-help", "--help":
		return runHelp(args, out, errOut)
	default:
		fmt.Fprintf(errOut, "delaybridge: unknown command %q\n\n%s", cmd, usage)
		return exitConfig
	}
}
