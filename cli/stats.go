package cli

import (
	"flag"
	"fmt"
	"net/http"

	"github.com/delaybridge/delaybridge/admin"
)

// cliStats is `delaybridge stats`: pending and leased counts, the next due
// time.
func cliStats(c *adminClient, fs *flag.FlagSet, args []string) int {
	setUsage(fs, "stats [--json]", "Counts pending and leased timeouts and shows the next due time.")
	if code := c.flagsOnly(fs, args); code >= 0 {
		return code
	}
	var s admin.StatsJSON
	if code := c.call(http.MethodGet, "/api/v1/stats", nil, nil, &s); code >= 0 {
		return code
	}
	tw := c.table()
	if s.Pending != nil {
		fmt.Fprintf(tw, "pending:\t%d\n", *s.Pending)
	}
	if s.Leased != nil {
		fmt.Fprintf(tw, "being dispatched:\t%d\n", *s.Leased)
	}
	next := "-"
	if s.NextDue != nil {
		next = fmtTime(*s.NextDue)
	}
	fmt.Fprintf(tw, "next due:\t%s\n", next)
	tw.Flush()
	return exitOK
}
