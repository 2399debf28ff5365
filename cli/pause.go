package cli

import (
	"flag"
	"fmt"
	"net/http"
	"net/url"
	"os"

	"github.com/delaybridge/delaybridge/admin"
)

// cliPause is `delaybridge pause`: a destination's deliveries held (the
// admin API's paused destinations; paused.go lists them).
func cliPause(c *adminClient, fs *flag.FlagSet, args []string) int {
	by := fs.String("by", "", "who pauses, recorded with the pause (default: $USER)")
	return c.setPaused(fs, args, "pause", by,
		"Pauses deliveries to a destination: its pending timeouts, and those scheduled while it is\n"+
			"paused, are held past their due time (listed as paused) until it is resumed. A timeout\n"+
			"being dispatched as the pause lands may still be delivered. The pause survives restarts\n"+
			"and holds on every instance sharing the store.")
}

// cliResume is `delaybridge resume`: a paused destination's deliveries let go.
func cliResume(c *adminClient, fs *flag.FlagSet, args []string) int {
	return c.setPaused(fs, args, "resume", nil,
		"Resumes deliveries to a paused destination: its timeouts are delivered as they fall due,\n"+
			"those held past their due time at once.")
}

// setPaused is pause and resume: QUEUE, or --exchange X ROUTING_KEY.
func (c *adminClient) setPaused(fs *flag.FlagSet, args []string, op string, by *string, text string) int {
	exchange := fs.String("exchange", "", "the destination is this exchange's routing key (the argument), not a queue")
	setUsage(fs, op+" (QUEUE | --exchange X ROUTING_KEY) [--json]", text)
	pos, code := parseFlags(fs, args, c.out, c.errOut)
	if code >= 0 {
		return code
	}
	if len(pos) != 1 || pos[0] == "" {
		return c.usageErr(fs, "give exactly one destination: a queue, or with --exchange a routing key (not empty)")
	}
	q := url.Values{}
	if *exchange != "" {
		q.Set("exchange", *exchange)
	}
	var body any
	if by != nil {
		if *by == "" {
			*by = os.Getenv("USER")
		}
		if *by != "" {
			body = map[string]string{"by": *by}
		}
	}
	var d admin.DestinationJSON
	if code := c.call(http.MethodPost, "/api/v1/destinations/"+pathSegment(pos[0])+"/"+op, q, body, &d); code >= 0 {
		return code
	}
	dest := d.Dest()
	switch {
	case op == "pause" && *d.Changed:
		fmt.Fprintf(c.out, "paused %s\n", dest)
	case op == "pause":
		fmt.Fprintf(c.out, "%s was paused already (since %s)\n", dest, fmtTime(*d.Since))
	case *d.Changed:
		fmt.Fprintf(c.out, "resumed %s\n", dest)
	default:
		fmt.Fprintf(c.out, "%s was not paused\n", dest)
	}
	return exitOK
}
