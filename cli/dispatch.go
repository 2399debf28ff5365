package cli

import (
	"flag"
	"net/http"
)

// cliDispatch is `delaybridge dispatch`: pending timeouts due now.
func cliDispatch(c *adminClient, fs *flag.FlagSet, args []string) int {
	ff := addFilterFlags(fs, "dispatch every pending timeout")
	setUsage(fs, "dispatch (ID | "+filterSynopsis+")",
		"Makes a pending timeout due now, so it is delivered at once, or every pending timeout the\n"+
			"filters select (at least one filter).")
	pos, q, filtered, code := ff.parse(c, fs, args)
	switch {
	case code >= 0:
		return code
	case filtered && len(pos) != 0:
		return c.usageErr(fs, "give a timeout ID or filters, not both")
	case filtered:
		return c.bulk(http.MethodPost, "/api/v1/timeouts/dispatch", q, nil, "dispatching")
	case len(pos) != 1 || pos[0] == "":
		return c.usageErr(fs, "give exactly one timeout ID, or filters")
	}
	return c.setDue(http.MethodPost, timeoutPath(pos[0])+"/dispatch", nil, "dispatching")
}
