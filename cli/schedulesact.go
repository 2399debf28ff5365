package cli

import (
	"flag"
	"fmt"
	"net/http"

	"github.com/delaybridge/delaybridge/admin"
)

// cliSchedulePause is `delaybridge schedules pause KEY` (pause) and
// `… resume KEY`.
func cliSchedulePause(c *adminClient, fs *flag.FlagSet, args []string, pause bool) int {
	op, text := "resume", "Resumes a paused schedule. Fire times that passed while it was paused are missed: its\n"+
		"misfire policy decides (one catch-up fire, or none)."
	if pause {
		op, text = "pause", "Pauses a schedule: it fires nothing, and its pending fires are cancelled, until resumed.\n"+
			"A fire being dispatched as the pause lands may still be delivered."
	}
	setUsage(fs, "schedules "+op+" KEY [--json]", text)
	var s admin.ScheduleJSON
	key, code := c.scheduleAct(fs, args, http.MethodPost, "/"+op, &s)
	if code >= 0 {
		return code
	}
	switch {
	case *s.Changed:
		fmt.Fprintf(c.out, "%sd %s\n", op, key)
	case pause:
		fmt.Fprintf(c.out, "%s was paused already\n", key)
	default:
		fmt.Fprintf(c.out, "%s was not paused\n", key)
	}
	return exitOK
}

// cliScheduleCancel is `delaybridge schedules cancel KEY`.
func cliScheduleCancel(c *adminClient, fs *flag.FlagSet, args []string) int {
	setUsage(fs, "schedules cancel KEY [--json]",
		"Ends a recurring schedule: it is deleted with its pending fires (a fire being dispatched at\n"+
			"that moment may still be delivered). An unknown KEY is an error (exit 1).")
	key, code := c.scheduleAct(fs, args, http.MethodDelete, "", nil)
	if code >= 0 {
		return code
	}
	fmt.Fprintf(c.out, "cancelled %s\n", key)
	return exitOK
}

// cliScheduleFire is `delaybridge schedules fire KEY`.
func cliScheduleFire(c *adminClient, fs *flag.FlagSet, args []string) int {
	setUsage(fs, "schedules fire KEY [--json]",
		"Fires a schedule once now, paused or not: one extra fire, due now, forwarded as its fires\n"+
			"are. The schedule's next fire time does not move.")
	var f admin.FireJSON
	key, code := c.scheduleAct(fs, args, http.MethodPost, "/fire", &f)
	if code >= 0 {
		return code
	}
	if !f.Stored {
		fmt.Fprintf(c.out, "%s: a fire at this instant is stored already (%s)\n", key, f.ID)
		return exitOK
	}
	fmt.Fprintf(c.out, "fired %s: %s due %s\n", key, f.ID, fmtTime(f.DueAt))
	return exitOK
}

// scheduleAct parses args, which hold one schedule KEY and flags, and calls
// method on the schedule's path and suffix, as act does. code < 0: print
// the result from into.
func (c *adminClient) scheduleAct(fs *flag.FlagSet, args []string, method, suffix string, into any) (key string, code int) {
	key, code = c.oneArg(fs, args, giveKey)
	if code >= 0 {
		return "", code
	}
	return key, c.act(method, schedulePath(key)+suffix, nil, into)
}
