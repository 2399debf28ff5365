package cli

import (
	"flag"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/delaybridge/delaybridge/admin"
)

// oneKey parses args, which hold one schedule KEY and flags.
func oneKey(c *adminClient, fs *flag.FlagSet, args []string) (string, int) {
	pos, code := parseFlags(fs, args, c.out, c.errOut)
	if code >= 0 {
		return "", code
	}
	if len(pos) != 1 || pos[0] == "" {
		return "", c.usageErr(fs, "give exactly one schedule KEY (as delaybridge schedules lists it, e.g. amqp:<message id>)")
	}
	return pos[0], -1
}

// cliScheduleShow is `delaybridge schedules show KEY`.
func cliScheduleShow(c *adminClient, fs *flag.FlagSet, args []string) int {
	setUsage(fs, "schedules show KEY [--json]",
		"Shows one recurring schedule: its settings, state, counts, its next 5 fire times in its\n"+
			"time zone, and the message every fire forwards.")
	key, code := oneKey(c, fs, args)
	if code >= 0 {
		return code
	}
	var s admin.ScheduleJSON
	if code := c.call(http.MethodGet, schedulePath(key), nil, nil, &s); code >= 0 {
		return code
	}
	tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	row := func(k string, v any) { fmt.Fprintf(tw, "%s:\t%v\n", k, v) }
	row("key", s.Key)
	row("source", s.Source)
	row("state", s.State)
	row("cron", s.Cron)
	row("time zone", s.TimeZone)
	if s.Start != nil {
		row("start", fmtTime(*s.Start))
	}
	if s.End != nil {
		row("end", fmtTime(*s.End))
	}
	row("misfire policy", s.Misfire)
	if s.Description != "" {
		row("description", s.Description)
	}
	if s.Exchange == "" {
		row("destination", s.Destination)
	} else {
		row("exchange", strconv.Quote(s.Exchange))
		row("routing key", strconv.Quote(*s.RoutingKey))
	}
	if s.PrevFireAt != nil {
		row("previous fire", fmtTime(*s.PrevFireAt))
	}
	if len(s.NextFireTimes) == 0 {
		row("next fires", "none")
	} else {
		row("next fires", strings.Join(s.NextFireTimes, ", "))
	}
	row("fires", s.Fires)
	row("misfires", s.Misfires)
	row("generation", s.Generation)
	if s.LastError != "" {
		row("last error", s.LastError)
	}
	row("updated at", fmtTime(s.UpdatedAt))
	c.printMessage(tw, row, s.Properties, s.Headers, s.BodyBase64)
	return exitOK
}
