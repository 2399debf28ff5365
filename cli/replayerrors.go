package cli

import (
	"flag"
	"fmt"
	"net/http"
	"net/url"
	"strconv"

	"github.com/delaybridge/delaybridge/admin"
)

// cliReplay is `delaybridge replay-errors`: dispatch failures from the error
// queue back into the store.
func cliReplay(c *adminClient, fs *flag.FlagSet, args []string) int {
	limit := limitFlag(fs, "messages taken from the error queue")
	setUsage(fs, "replay-errors [--limit N] [--json]",
		"Moves dispatch failures from the error queue back into the store, due now.\n"+
			"Ingest failures and messages that cannot be replayed stay on the error queue.")
	if code := c.flagsOnly(fs, args); code >= 0 {
		return code
	}
	if code := c.checkLimit(fs, *limit); code >= 0 {
		return code
	}
	var res admin.ReplayResult
	if code := c.act(http.MethodPost, "/api/v1/replay-errors", url.Values{"limit": {strconv.Itoa(*limit)}}, &res); code >= 0 {
		return code
	}
	fmt.Fprintf(c.out, "replayed %d, skipped %d\n", res.Replayed, res.Skipped)
	c.printSkipped(res.Details)
	return exitOK
}
