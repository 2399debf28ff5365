package cli

import (
	"errors"
	"flag"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/delaybridge/delaybridge/admin"
)

// delaybridge errors ls|show|rm|replay: the admin API's /api/v1/errors.

const errorsUsage = `usage: delaybridge errors COMMAND [flags]

This endpoint's copies on the error queue (NServiceBus.FailedQ = E.Timeouts).
Each command reads the head of the error queue with basic.get and requeues what
it does not remove: see docs/operations.md, "The error queue", for the cost.

commands:
  ls [filters] [--limit N] [--cursor C] [--all]   list copies
  show ID                                         one id's copies: headers, body
  rm (ID | filters | --all)                       delete copies
  replay (ID | filters)                           store dispatch failures again, due now

Every command takes --url (default $DELAYBRIDGE_ADMIN_URL or http://127.0.0.1:8080),
--token (default $DELAYBRIDGE_ADMIN_TOKEN) and --json, after the command.
Run delaybridge errors COMMAND --help for its flags.
`

func cliErrors(c *adminClient, fs *flag.FlagSet, args []string) int {
	if len(args) == 0 || isHelp(args[0]) {
		if len(args) == 0 {
			fmt.Fprint(c.errOut, errorsUsage)
			return exitConfig
		}
		fmt.Fprint(c.out, errorsUsage)
		return exitOK
	}
	verb := args[0]
	impl, ok := map[string]func(*adminClient, *flag.FlagSet, *errorFilterFlags, []string) int{
		"ls": cliErrorsList, "show": cliErrorsShow, "rm": cliErrorsRemove, "replay": cliErrorsReplay,
	}[verb]
	if !ok {
		fmt.Fprintf(c.errOut, "delaybridge errors: unknown command %q\n\n%s", verb, errorsUsage)
		return exitConfig
	}
	c.cmd = "errors " + verb
	ff := &errorFilterFlags{scan: admin.DefaultErrorScan}
	fs.IntVar(&ff.scan, "scan", admin.DefaultErrorScan, fmt.Sprintf("most messages read from the error queue (1..%d)", admin.MaxErrorDepth))
	if verb != "show" {
		fs.StringVar(&ff.stage, "stage", "", "only copies of this stage: ingest or dispatch")
		fs.StringVar(&ff.dest, "destination", "", "only copies for this queue")
		fs.StringVar(&ff.exchange, "exchange", "", "only copies for this exchange")
		fs.StringVar(&ff.key, "routing-key", "", "with --exchange: only copies with this routing key")
		fs.StringVar(&ff.exType, "exception-type", "", "only copies with this NServiceBus.ExceptionInfo.ExceptionType")
		fs.StringVar(&ff.from, "from", "", "only copies that failed at or after this time (RFC 3339 or a duration from now, e.g. -1h)")
		fs.StringVar(&ff.to, "to", "", "only copies that failed before this time (RFC 3339 or a duration from now)")
	}
	return impl(c, fs, ff, args[1:])
}

// errorFilterFlags are the filter flags of errors ls, rm and replay.
type errorFilterFlags struct {
	scan                                         int
	stage, dest, exchange, key, exType, from, to string
}

// query turns the flags into the API's query; set is false when no filter
// was given.
func (ff *errorFilterFlags) query(fs *flag.FlagSet) (q url.Values, set bool, err error) {
	q = url.Values{}
	if ff.scan < 1 || ff.scan > admin.MaxErrorDepth {
		return nil, false, fmt.Errorf("--scan must be from 1 to %d", admin.MaxErrorDepth)
	}
	q.Set("scan", strconv.Itoa(ff.scan))
	keySet := false
	fs.Visit(func(f *flag.Flag) { keySet = keySet || f.Name == "routing-key" })
	switch {
	case ff.dest != "" && ff.exchange != "":
		return nil, false, errors.New("give --destination (a queue) or --exchange, not both")
	case keySet && ff.exchange == "":
		return nil, false, errors.New("--routing-key needs --exchange")
	}
	for k, v := range map[string]string{"stage": ff.stage, "destination": ff.dest, "exchange": ff.exchange, "exception_type": ff.exType} {
		if v != "" {
			q.Set(k, v)
			set = true
		}
	}
	if keySet {
		q.Set("routing_key", ff.key)
	}
	now := time.Now()
	for name, v := range map[string]string{"from": ff.from, "to": ff.to} {
		if v == "" {
			continue
		}
		t, err := parseWhen(v, now)
		if err != nil {
			return nil, false, fmt.Errorf("--%s: %v", name, err)
		}
		q.Set("failed_"+name, t.UTC().Format(time.RFC3339Nano))
		set = true
	}
	return q, set, nil
}

// errorPath is the API path of one id's copies (escaped as timeoutPath).
func errorPath(id, suffix string) string {
	return "/api/v1/errors/" + strings.TrimPrefix(timeoutPath(id), "/api/v1/timeouts/") + suffix
}

func cliErrorsList(c *adminClient, fs *flag.FlagSet, ff *errorFilterFlags, args []string) int {
	limit := limitFlag(fs, "copies per page")
	cursor := fs.String("cursor", "", "start at this cursor (the \"next\" of a previous page)")
	all := fs.Bool("all", false, "follow the cursor to the end of the queue (each page reads the queue from its head)")
	setUsage(fs, "errors ls [--stage S] [--destination Q | --exchange X [--routing-key K]] [--exception-type T] [--from T] [--to T] [--limit N] [--scan N] [--cursor C] [--all] [--json]",
		"Lists this endpoint's copies on the error queue, head first.")
	if code := c.flagsOnly(fs, args); code >= 0 {
		return code
	}
	q, _, err := ff.query(fs)
	if err != nil {
		return c.usageErr(fs, "%v", err)
	}
	if code := c.checkLimit(fs, *limit); code >= 0 {
		return code
	}
	q.Set("limit", strconv.Itoa(*limit))
	var out admin.ErrorListJSON
	next, code := pages(c, "/api/v1/errors", q, *cursor, *all, func(page *admin.ErrorListJSON) string {
		out.Errors = append(out.Errors, page.Errors...)
		out.Scanned += page.Scanned
		out.OtherEndpoints += page.OtherEndpoints
		out.Unreadable = append(out.Unreadable, page.Unreadable...)
		return page.Next
	}, func() any { return out })
	if code >= 0 {
		return code
	}
	tw := c.table()
	fmt.Fprintln(tw, "POS\tID\tFAILED AT\tSTAGE\tDESTINATION\tEXCEPTION TYPE\tREASON")
	for _, e := range out.Errors {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", e.Position, e.ID, fmtTimeOr(e.FailedAt, "-"), e.Stage, errorDest(&e), e.ExceptionType, oneLine(e.Reason, 60))
	}
	tw.Flush()
	fmt.Fprintf(c.errOut, "read %d messages, %d of them other endpoints' failures\n", out.Scanned, out.OtherEndpoints)
	for _, u := range out.Unreadable {
		fmt.Fprintf(c.errOut, "unreadable copy %q: %s\n", u.MessageID, u.Reason)
	}
	c.more(next)
	return exitOK
}

// errorDest is where a copy was going, as ls words a timeout's.
func errorDest(e *admin.ErrorCopyJSON) string {
	if e.Exchange == "" && e.Destination == "" {
		return "-"
	}
	return e.Dest().String()
}

func cliErrorsShow(c *adminClient, fs *flag.FlagSet, ff *errorFilterFlags, args []string) int {
	setUsage(fs, "errors show ID [--scan N] [--json]", "Shows this endpoint's copies with this message id: headers and body.")
	id, code := c.oneArg(fs, args, giveID)
	if code >= 0 {
		return code
	}
	q, _, err := ff.query(fs)
	if err != nil {
		return c.usageErr(fs, "%v", err)
	}
	var out admin.ErrorListJSON
	if code := c.call(http.MethodGet, errorPath(id, ""), q, nil, &out); code >= 0 {
		return code
	}
	for i, e := range out.Errors {
		if i > 0 {
			fmt.Fprintln(c.out)
		}
		f := c.fields()
		f.row("id", e.ID)
		f.row("position", e.Position)
		f.row("stage", e.Stage)
		f.row("destination", errorDest(&e))
		if e.FailedAt != nil {
			f.row("failed at", fmtTime(*e.FailedAt))
		}
		f.row("attempts", e.Attempts)
		f.row("exception type", e.ExceptionType)
		f.row("reason", e.Reason)
		c.printMessage(f, &e.MessageJSON)
	}
	return exitOK
}

func cliErrorsRemove(c *adminClient, fs *flag.FlagSet, ff *errorFilterFlags, args []string) int {
	all := fs.Bool("all", false, "delete every copy of this endpoint among the messages read")
	setUsage(fs, "errors rm (ID | [--stage S] [--destination Q | --exchange X [--routing-key K]] [--exception-type T] [--from T] [--to T] | --all) [--scan N] [--json]",
		"Deletes this endpoint's copies from the error queue: one id's, those matching the filters, or all.")
	return c.errorsAct(fs, ff, args, http.MethodDelete, "", all)
}

func cliErrorsReplay(c *adminClient, fs *flag.FlagSet, ff *errorFilterFlags, args []string) int {
	setUsage(fs, "errors replay (ID | [--stage S] [--destination Q | --exchange X [--routing-key K]] [--exception-type T] [--from T] [--to T]) [--scan N] [--json]",
		"Stores this endpoint's dispatch failures again as messages due now, as replay-errors does:\n"+
			"one id's, or those matching the filters; each is checked as an incoming message is\n"+
			"(DELAYBRIDGE_ALLOWED_DESTINATIONS included).")
	return c.errorsAct(fs, ff, args, http.MethodPost, "/replay", nil)
}

// errorsAct runs rm or replay: one ID, or the filters (--all for rm).
func (c *adminClient) errorsAct(fs *flag.FlagSet, ff *errorFilterFlags, args []string, method, suffix string, all *bool) int {
	pos, code := parseFlags(fs, args, c.out, c.errOut)
	if code >= 0 {
		return code
	}
	q, filtered, err := ff.query(fs)
	if err != nil {
		return c.usageErr(fs, "%v", err)
	}
	everything := all != nil && *all
	var path string
	switch {
	case len(pos) > 1:
		return c.usageErr(fs, "give at most one ID")
	case len(pos) == 1 && (filtered || everything):
		return c.usageErr(fs, "give an ID or filters, not both")
	case len(pos) == 1:
		path = errorPath(pos[0], suffix)
	case filtered || everything:
		path = "/api/v1/errors" + suffix
		if everything {
			q.Set("all", "true")
		}
	case all != nil:
		return c.usageErr(fs, "give an ID, filters, or --all")
	default:
		return c.usageErr(fs, "give an ID or filters")
	}
	var res struct {
		admin.ReplayResult
		Deleted int `json:"deleted"`
		Scanned int `json:"scanned"`
	}
	if code := c.act(method, path, q, &res); code >= 0 {
		return code
	}
	if method == http.MethodDelete {
		fmt.Fprintf(c.out, "deleted %d (read %d messages)\n", res.Deleted, res.Scanned)
		return exitOK
	}
	fmt.Fprintf(c.out, "replayed %d, skipped %d (read %d messages)\n", res.Replayed, res.Skipped, res.Scanned)
	c.printSkipped(res.Details)
	return exitOK
}
