package cli

import (
	"flag"
	"fmt"
	"net/http"
	"strconv"
	"text/tabwriter"

	"github.com/delaybridge/delaybridge/admin"
)

// cliShow is `delaybridge show`: one pending timeout.
func cliShow(c *adminClient, fs *flag.FlagSet, args []string) int {
	setUsage(fs, "show ID [--json]", "Shows one pending timeout: state, properties, headers and body.")
	id, code := oneID(c, fs, args)
	if code >= 0 {
		return code
	}
	var t admin.TimeoutJSON
	if code := c.call(http.MethodGet, timeoutPath(id), nil, nil, &t); code >= 0 {
		return code
	}
	tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	row := func(k string, v any) { fmt.Fprintf(tw, "%s:\t%v\n", k, v) }
	row("id", sendName(&t))
	if t.Sends > 1 {
		row("sends pending", fmt.Sprintf("%d of this id; this one is due first (delaybridge ls --id to list them; cancel, reschedule and dispatch act on all)", t.Sends))
	}
	if t.Exchange == "" {
		row("destination", t.Destination)
	} else {
		d := t.Dest()
		row("exchange", strconv.Quote(d.Exchange))
		row("routing key", strconv.Quote(d.Key))
	}
	if t.SagaID != "" {
		row("saga id", t.SagaID)
	}
	row("due at", fmtTime(t.DueAt))
	row("received at", fmtTime(t.ReceivedAt))
	row("attempts", t.Attempts)
	if t.LastError != "" {
		row("last error", t.LastError)
	}
	row("dispatching", t.Leased)
	if t.Paused {
		row("paused", "yes: its destination is paused (delaybridge resume)")
	}
	if t.LockExpiresAt != nil {
		row("lease expires", fmtTime(*t.LockExpiresAt))
	}
	if t.NotBefore != nil {
		row("retry not before", fmtTime(*t.NotBefore))
	}
	c.printMessage(tw, row, t.Properties, t.Headers, t.BodyBase64)
	return exitOK
}
