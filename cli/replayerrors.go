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
	limit := fs.Int("limit", admin.DefaultLimit, fmt.Sprintf("most messages taken from the error queue (1..%d)", admin.MaxLimit))
	setUsage(fs, "replay-errors [--limit N] [--json]",
		"Moves dispatch failures from the error queue back into the store, due now.\n"+
			"Ingest failures and messages that cannot be replayed stay on the error queue.")
	if code := c.flagsOnly(fs, args); code >= 0 {
		return code
	}
	if *limit < 1 || *limit > admin.MaxLimit {
		return c.usageErr(fs, "--limit must be from 1 to %d", admin.MaxLimit)
	}
	var res admin.ReplayResult
	if code := c.act(http.MethodPost, "/api/v1/replay-errors", url.Values{"limit": {strconv.Itoa(*limit)}}, &res); code >= 0 {
		return code
	}
	fmt.Fprintf(c.out, "replayed %d, skipped %d\n", res.Replayed, res.Skipped)
	c.printSkipped(res.Details)
	return exitOK
}
