package cli

import (
	"flag"
	"fmt"

	"github.com/delaybridge/delaybridge/admin"
)

// cliStats is `delaybridge stats`: pending and leased counts, the next due
// time.
func cliStats(c *adminClient, fs *flag.FlagSet, args []string) int {
	setUsage(fs, "stats [--json]", "Counts pending and leased timeouts and shows the next due time.")
	var s admin.StatsJSON
	if code := c.get(fs, args, "/api/v1/stats", &s); code >= 0 {
		return code
	}
	tw := c.table()
	if s.Pending != nil {
		fmt.Fprintf(tw, "pending:\t%d\n", *s.Pending)
	}
	if s.Leased != nil {
		fmt.Fprintf(tw, "being dispatched:\t%d\n", *s.Leased)
	}
	fmt.Fprintf(tw, "next due:\t%s\n", fmtTimeOr(s.NextDue, "-"))
	tw.Flush()
	return exitOK
}
