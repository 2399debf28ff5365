package cli

import (
	"flag"
	"fmt"
	"strconv"

	"github.com/delaybridge/delaybridge/admin"
)

// cliShow is `delaybridge show`: one pending timeout.
func cliShow(c *adminClient, fs *flag.FlagSet, args []string) int {
	setUsage(fs, "show ID [--json]", "Shows one pending timeout: state, properties, headers and body.")
	var t admin.TimeoutJSON
	if code := c.getOne(fs, args, giveID, timeoutPath, &t); code >= 0 {
		return code
	}
	f := c.fields()
	f.row("id", sendName(&t))
	if t.Sends > 1 {
		f.row("sends pending", fmt.Sprintf("%d of this id; this one is due first (delaybridge ls --id to list them; cancel, reschedule and dispatch act on all)", t.Sends))
	}
	if t.Exchange == "" {
		f.row("destination", t.Destination)
	} else {
		d := t.Dest()
		f.row("exchange", strconv.Quote(d.Exchange))
		f.row("routing key", strconv.Quote(d.Key))
	}
	if t.SagaID != "" {
		f.row("saga id", t.SagaID)
	}
	f.row("due at", fmtTime(t.DueAt))
	f.row("received at", fmtTime(t.ReceivedAt))
	f.row("attempts", t.Attempts)
	if t.LastError != "" {
		f.row("last error", t.LastError)
	}
	f.row("dispatching", t.Leased)
	if t.Paused {
		f.row("paused", "yes: its destination is paused (delaybridge resume)")
	}
	if t.LockExpiresAt != nil {
		f.row("lease expires", fmtTime(*t.LockExpiresAt))
	}
	if t.NotBefore != nil {
		f.row("retry not before", fmtTime(*t.NotBefore))
	}
	c.printMessage(f, &t.MessageJSON)
	return exitOK
}
