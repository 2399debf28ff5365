package cli

import (
	"flag"
	"net/http"
	"time"
)

// cliReschedule is `delaybridge reschedule`: a new due time for one timeout
// or those the filters select.
func cliReschedule(c *adminClient, fs *flag.FlagSet, args []string) int {
	at := fs.String("at", "", "new due time (RFC 3339)")
	in := fs.String("in", "", "new due time as a duration from now (e.g. 10m)")
	shift := fs.String("shift", "", "with filters: move each due time by this duration (e.g. 10m, -1h)")
	ff := addFilterFlags(fs, "reschedule every pending timeout")
	setUsage(fs, "reschedule (ID (--at TIME | --in DURATION) | "+filterSynopsis+" (--at TIME | --in DURATION | --shift DURATION))",
		"Sets a new due time on a pending timeout, or on every pending timeout the filters select\n"+
			"(at least one filter; --shift moves each by a duration); timeouts being dispatched at that\n"+
			"moment are counted and left alone.")
	pos, q, filtered, code := ff.parse(c, fs, args)
	if code >= 0 {
		return code
	}
	switch {
	case filtered && len(pos) != 0:
		return c.usageErr(fs, "give a timeout ID or filters, not both")
	case !filtered && (len(pos) != 1 || pos[0] == ""):
		return c.usageErr(fs, "give exactly one timeout ID, or filters")
	case !filtered && *shift != "":
		return c.usageErr(fs, "--shift moves the timeouts filters select; for one timeout use --at or --in")
	}
	given := 0
	for _, v := range []string{*at, *in, *shift} {
		if v != "" {
			given++
		}
	}
	if given != 1 {
		if filtered {
			return c.usageErr(fs, "give exactly one of --at, --in or --shift")
		}
		return c.usageErr(fs, "give exactly one of --at or --in")
	}
	var due time.Time
	switch {
	case *shift != "":
		d, err := time.ParseDuration(*shift)
		if err != nil || d == 0 {
			return c.usageErr(fs, "--shift %q is not a non-zero duration like 10m or -1h", *shift)
		}
		return c.bulk(http.MethodPost, "/api/v1/timeouts/reschedule", q, map[string]string{"shift": d.String()}, "rescheduled")
	case *at != "":
		t, err := time.Parse(time.RFC3339Nano, *at)
		if err != nil {
			return c.usageErr(fs, "--at %q is not an RFC 3339 time like 2026-11-21T20:00:00Z", *at)
		}
		due = t
	default:
		d, err := time.ParseDuration(*in)
		if err != nil {
			return c.usageErr(fs, "--in %q is not a duration like 10m", *in)
		}
		due = time.Now().Add(d)
	}
	body := map[string]string{"due_at": due.Format(time.RFC3339Nano)}
	if filtered {
		return c.bulk(http.MethodPost, "/api/v1/timeouts/reschedule", q, body, "rescheduled")
	}
	return c.setDue(http.MethodPatch, timeoutPath(pos[0]), body, "rescheduled")
}
