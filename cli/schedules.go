package cli

import (
	"flag"
	"fmt"
	"strconv"

	"github.com/delaybridge/delaybridge/admin"
)

// delaybridge schedules [ls|show|pause|resume|cancel|fire]: the admin API's
// recurring schedules, /api/v1/schedules (docs/contract.md §6.3). The
// actions are in schedulesshow.go and schedulesact.go.

const schedulesUsage = `usage: delaybridge schedules [COMMAND] [flags]

Recurring schedules (docs/contract.md §2.11). KEY is a schedule's key as listed:
amqp:<message id> for one made on E.Timeouts, admin:<id> for one made through the
admin API.

commands:
  ls [--limit N] [--cursor C] [--all]   list schedules and their next fire (the default)
  show KEY                              one schedule, its next 5 fire times and its message
  pause KEY                             hold it: no fires until resumed
  resume KEY                            fire again; missed fire times follow its misfire policy
  cancel KEY                            end it and its pending fires
  fire KEY                              one extra fire, due now; the schedule does not move

Every command takes --url (default $DELAYBRIDGE_ADMIN_URL or http://127.0.0.1:8080),
--token (default $DELAYBRIDGE_ADMIN_TOKEN) and --json, after the command.
Run delaybridge schedules COMMAND --help for its flags.
`

func cliSchedules(c *adminClient, fs *flag.FlagSet, args []string) int {
	if len(args) > 0 && isHelp(args[0]) {
		fmt.Fprint(c.out, schedulesUsage)
		return exitOK
	}
	verbs := map[string]func(*adminClient, *flag.FlagSet, []string) int{
		"ls": cliSchedulesList, "show": cliScheduleShow, "cancel": cliScheduleCancel, "fire": cliScheduleFire,
		"pause":  func(c *adminClient, fs *flag.FlagSet, args []string) int { return cliSchedulePause(c, fs, args, true) },
		"resume": func(c *adminClient, fs *flag.FlagSet, args []string) int { return cliSchedulePause(c, fs, args, false) },
	}
	// The command is the first argument that names one: flags may come
	// before it (schedules --url U ls); with none, the list.
	verb := "ls"
	for i, a := range args {
		if _, ok := verbs[a]; ok {
			verb, args = a, append(append([]string{}, args[:i]...), args[i+1:]...)
			break
		}
		if i == 0 && (a == "" || a[0] != '-') {
			fmt.Fprintf(c.errOut, "delaybridge schedules: unknown command %q\n\n%s", a, schedulesUsage)
			return exitConfig
		}
	}
	impl := verbs[verb]
	c.cmd = "schedules " + verb
	return impl(c, fs, args)
}

// schedulePath is the API path of one schedule.
func schedulePath(key string) string { return "/api/v1/schedules/" + pathSegment(key) }

// cliSchedulesList is `delaybridge schedules [ls]`.
func cliSchedulesList(c *adminClient, fs *flag.FlagSet, args []string) int {
	limit := limitFlag(fs, "schedules per page")
	all := fs.Bool("all", false, "follow the cursor and list every schedule")
	cursor := fs.String("cursor", "", "start after this cursor (the \"next\" of a previous page)")
	setUsage(fs, "schedules [ls] [--limit N] [--cursor C] [--all] [--json]",
		"Lists the recurring schedules in key order: state (active, paused, ended), next fire time,\n"+
			"cron expression and zone, destination, fires and misfires so far.")
	if code := c.flagsOnly(fs, args); code >= 0 {
		return code
	}
	if code := c.checkLimit(fs, *limit); code >= 0 {
		return code
	}
	var rows []admin.ScheduleJSON
	next, code := pages(c, "/api/v1/schedules", map[string][]string{"limit": {strconv.Itoa(*limit)}}, *cursor, *all, func(page *admin.SchedulesJSON) string {
		rows = append(rows, page.Schedules...)
		return page.Next
	}, func() any { return admin.SchedulesJSON{Schedules: rows} })
	if code >= 0 {
		return code
	}
	tw := c.table()
	fmt.Fprintln(tw, "KEY\tSTATE\tNEXT FIRE\tCRON\tZONE\tDESTINATION\tFIRES\tMISFIRES")
	for i := range rows {
		s := &rows[i]
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\n", s.Key, s.State, fmtTimeOr(s.NextFireAt, "-"), s.Cron, s.TimeZone, s.Dest(), s.Fires, s.Misfires)
	}
	tw.Flush()
	c.more(next)
	return exitOK
}
