package cli

import (
	"flag"
	"strconv"
	"strings"

	"github.com/delaybridge/delaybridge/admin"
)

// cliScheduleShow is `delaybridge schedules show KEY`.
func cliScheduleShow(c *adminClient, fs *flag.FlagSet, args []string) int {
	setUsage(fs, "schedules show KEY [--json]",
		"Shows one recurring schedule: its settings, state, counts, its next 5 fire times in its\n"+
			"time zone, and the message every fire forwards.")
	var s admin.ScheduleJSON
	if code := c.getOne(fs, args, giveKey, schedulePath, &s); code >= 0 {
		return code
	}
	f := c.fields()
	f.row("key", s.Key)
	f.row("source", s.Source)
	f.row("state", s.State)
	f.row("cron", s.Cron)
	f.row("time zone", s.TimeZone)
	if s.Start != nil {
		f.row("start", fmtTime(*s.Start))
	}
	if s.End != nil {
		f.row("end", fmtTime(*s.End))
	}
	f.row("misfire policy", s.Misfire)
	if s.Description != "" {
		f.row("description", s.Description)
	}
	if s.Exchange == "" {
		f.row("destination", s.Destination)
	} else {
		f.row("exchange", strconv.Quote(s.Exchange))
		f.row("routing key", strconv.Quote(*s.RoutingKey))
	}
	if s.PrevFireAt != nil {
		f.row("previous fire", fmtTime(*s.PrevFireAt))
	}
	if len(s.NextFireTimes) == 0 {
		f.row("next fires", "none")
	} else {
		f.row("next fires", strings.Join(s.NextFireTimes, ", "))
	}
	f.row("fires", s.Fires)
	f.row("misfires", s.Misfires)
	f.row("generation", s.Generation)
	if s.LastError != "" {
		f.row("last error", s.LastError)
	}
	f.row("updated at", fmtTime(s.UpdatedAt))
	c.printMessage(f, &s.MessageJSON)
	return exitOK
}
