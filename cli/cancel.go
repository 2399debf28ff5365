package cli

import (
	"flag"
	"fmt"
	"net/http"
	"net/url"

	"github.com/delaybridge/delaybridge/admin"
)

// cliCancel is `delaybridge cancel`: one timeout, a saga's or those the
// filters select.
func cliCancel(c *adminClient, fs *flag.FlagSet, args []string) int {
	saga := fs.String("saga-id", "", "cancel every pending timeout of this saga (NServiceBus.SagaId) instead of one ID")
	ff := addFilterFlags(fs, "cancel every pending timeout")
	setUsage(fs, "cancel (ID | --saga-id SAGA | "+filterSynopsis+")",
		"Cancels a pending timeout (it is deleted and never delivered; every pending send of the ID),\n"+
			"every pending timeout of a saga, or every pending timeout the filters select (at least one\n"+
			"filter); timeouts being dispatched at that moment are counted and left alone. An ID with\n"+
			"nothing pending is an error (exit 1) and is not blocked: a message sent with it later is\n"+
			"delivered. An ID that was cancelled stays cancelled for 10 minutes (the cancel window).")
	pos, q, filtered, code := ff.parse(c, fs, args)
	if code >= 0 {
		return code
	}
	switch {
	case *saga != "" && (len(pos) != 0 || filtered):
		return c.usageErr(fs, "give one of a timeout ID, --saga-id or filters")
	case *saga != "":
		return c.cancelSaga(*saga)
	case filtered && len(pos) != 0:
		return c.usageErr(fs, "give a timeout ID or filters, not both")
	case filtered:
		return c.bulk(http.MethodDelete, "/api/v1/timeouts", q, nil, "cancelled")
	}
	if len(pos) != 1 || pos[0] == "" {
		return c.usageErr(fs, "give exactly one timeout ID, --saga-id, or filters")
	}
	id := pos[0]
	if _, err := c.do(http.MethodDelete, timeoutPath(id), nil, nil, nil); err != nil {
		return c.fail(err)
	}
	if c.json {
		c.printJSON([]byte(fmt.Sprintf(`{"cancelled": %q}`, id)))
		return exitOK
	}
	fmt.Fprintf(c.out, "cancelled %s\n", id)
	return exitOK
}

func (c *adminClient) cancelSaga(saga string) int {
	var res admin.CancelSagaJSON
	if code := c.call(http.MethodDelete, "/api/v1/timeouts", url.Values{"saga_id": {saga}}, nil, &res); code >= 0 {
		return code
	}
	fmt.Fprintf(c.out, "cancelled %d timeouts of saga %s\n", res.Cancelled, saga)
	if res.Leased > 0 {
		fmt.Fprintf(c.out, "%d more were being dispatched and could not be cancelled\n", res.Leased)
	}
	return exitOK
}
