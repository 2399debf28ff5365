package cli

import (
	"fmt"
	"io"
)

// runHelp is `delaybridge help [COMMAND]` (and -h, -help, --help): usage, or
// COMMAND's own help.
func runHelp(args []string, out, errOut io.Writer) int {
	if len(args) > 0 && !isHelp(args[0]) {
		return Run([]string{args[0], "--help"}, out, errOut)
	}
	fmt.Fprint(out, usage)
	return exitOK
}

// isHelp reports whether a is a request for help.
func isHelp(a string) bool {
	switch a {
	case "help", "-h", "-help", "--help":
		return true
	}
	return false
}

// usage is the help of the whole command; an unknown command prints it too.
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
  delaybridge schedules [ls|show|pause|resume|cancel|fire KEY] [flags]
                                 recurring schedules: list with their next fire,
                                 show one (next 5 fire times), pause, resume,
                                 cancel, or fire one once now

Times are printed, and --at, --from and --to are given, as RFC 3339
(2026-11-21T20:00:00.25+01:00); --from and --to also take a duration from now.
Exit codes: 0 done, 1 runtime or API failure, 2 usage or configuration error.

FILTERS select pending timeouts: --destination Q | --exchange X [--routing-key K],
--from T, --to T (due range), --id-prefix P, --header NAME:VALUE. A bulk action
needs at least one; it reports how many it changed and how many it left
because they were being dispatched.

The bench is its own command, delaybridge-bench: see bench/README.md.
`
