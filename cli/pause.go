package cli

import (
	"flag"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"text/tabwriter"

	"github.com/delaybridge/delaybridge/admin"
)

// pause, resume and paused: the admin API's paused destinations.

func cliPause(c *adminClient, fs *flag.FlagSet, args []string) int {
	by := fs.String("by", "", "who pauses, recorded with the pause (default: $USER)")
	return c.setPaused(fs, args, "pause", by,
		"Pauses deliveries to a destination: its pending timeouts, and those scheduled while it is\n"+
			"paused, are held past their due time (listed as paused) until it is resumed. A timeout\n"+
			"being dispatched as the pause lands may still be delivered. The pause survives restarts\n"+
			"and holds on every instance sharing the store.")
}

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
	raw, err := c.do(http.MethodPost, "/api/v1/destinations/"+pathSegment(pos[0])+"/"+op, q, body, &d)
	if err != nil {
		return c.fail(err)
	}
	if c.json {
		c.printJSON(raw)
		return exitOK
	}
	dest := destOfJSON(&d)
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

func cliPaused(c *adminClient, fs *flag.FlagSet, args []string) int {
	setUsage(fs, "paused [--json]", "Lists the paused destinations.")
	pos, code := parseFlags(fs, args, c.out, c.errOut)
	if code >= 0 {
		return code
	}
	if len(pos) > 0 {
		return c.usageErr(fs, "unexpected argument %q", pos[0])
	}
	var ds admin.DestinationsJSON
	raw, err := c.do(http.MethodGet, "/api/v1/destinations", nil, nil, &ds)
	if err != nil {
		return c.fail(err)
	}
	if c.json {
		c.printJSON(raw)
		return exitOK
	}
	if len(ds.Destinations) == 0 {
		fmt.Fprintln(c.out, "no destination is paused")
		return exitOK
	}
	tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "DESTINATION\tPAUSED SINCE\tBY")
	for _, d := range ds.Destinations {
		since := ""
		if d.Since != nil {
			since = fmtTime(*d.Since)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", destOfJSON(&d), since, d.By)
	}
	tw.Flush()
	return exitOK
}

// destOfJSON is a DestinationJSON's destination, worded as destOf's.
func destOfJSON(d *admin.DestinationJSON) fmt.Stringer {
	return destOf(&admin.TimeoutJSON{Destination: d.Destination, Exchange: d.Exchange, RoutingKey: d.RoutingKey})
}
