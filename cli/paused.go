package cli

import (
	"flag"
	"fmt"

	"github.com/delaybridge/delaybridge/admin"
)

// cliPaused is `delaybridge paused`: the paused destinations.
func cliPaused(c *adminClient, fs *flag.FlagSet, args []string) int {
	setUsage(fs, "paused [--json]", "Lists the paused destinations.")
	var ds admin.DestinationsJSON
	if code := c.get(fs, args, "/api/v1/destinations", &ds); code >= 0 {
		return code
	}
	if len(ds.Destinations) == 0 {
		fmt.Fprintln(c.out, "no destination is paused")
		return exitOK
	}
	tw := c.table()
	fmt.Fprintln(tw, "DESTINATION\tPAUSED SINCE\tBY")
	for _, d := range ds.Destinations {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", d.Dest(), fmtTimeOr(d.Since, ""), d.By)
	}
	tw.Flush()
	return exitOK
}
