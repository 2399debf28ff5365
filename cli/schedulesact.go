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
	key, code := oneKey(c, fs, args)
	if code >= 0 {
		return code
	}
	var s admin.ScheduleJSON
	if code := c.act(http.MethodPost, schedulePath(key)+"/"+op, nil, &s); code >= 0 {
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
	key, code := oneKey(c, fs, args)
	if code >= 0 {
		return code
	}
	if code := c.act(http.MethodDelete, schedulePath(key), nil, nil); code >= 0 {
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
	key, code := oneKey(c, fs, args)
	if code >= 0 {
		return code
	}
	var f admin.FireJSON
	if code := c.act(http.MethodPost, schedulePath(key)+"/fire", nil, &f); code >= 0 {
		return code
	}
	if !f.Stored {
		fmt.Fprintf(c.out, "%s: a fire at this instant is stored already (%s)\n", key, f.ID)
		return exitOK
	}
	fmt.Fprintf(c.out, "fired %s: %s due %s\n", key, f.ID, fmtTime(f.DueAt))
	return exitOK
}
