package cli

import (
	"flag"
	"fmt"
	"net/http"

	"github.com/delaybridge/delaybridge/admin"
)

// cliPaused is `delaybridge paused`: the paused destinations.
func cliPaused(c *adminClient, fs *flag.FlagSet, args []string) int {
	setUsage(fs, "paused [--json]", "Lists the paused destinations.")
	if code := c.flagsOnly(fs, args); code >= 0 {
		return code
	}
	var ds admin.DestinationsJSON
	if code := c.call(http.MethodGet, "/api/v1/destinations", nil, nil, &ds); code >= 0 {
		return code
	}
	if len(ds.Destinations) == 0 {
		fmt.Fprintln(c.out, "no destination is paused")
		return exitOK
	}
	tw := c.table()
	fmt.Fprintln(tw, "DESTINATION\tPAUSED SINCE\tBY")
	for _, d := range ds.Destinations {
		since := ""
		if d.Since != nil {
			since = fmtTime(*d.Since)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", d.Dest(), since, d.By)
	}
	tw.Flush()
	return exitOK
}
