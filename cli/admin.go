package cli

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/delaybridge/delaybridge/admin"
	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/config"
	"github.com/delaybridge/delaybridge/wire"
)

// The admin CLI: subcommands that talk to a running bridge's admin API.

const defaultAdminURL = "http://127.0.0.1:8080"

// adminCommands maps each admin subcommand to its implementation.
var adminCommands = map[string]func(c *adminClient, fs *flag.FlagSet, args []string) int{
	"ls":            cliList,
	"show":          cliShow,
	"cancel":        cliCancel,
	"reschedule":    cliReschedule,
	"dispatch":      cliDispatch,
	"stats":         cliStats,
	"replay-errors": cliReplay,
	"errors":        cliErrors,
	"pause":         cliPause,
	"resume":        cliResume,
	"paused":        cliPaused,
}

// adminClient calls the admin API.
type adminClient struct {
	cmd    string
	base   string
	token  string
	json   bool
	out    io.Writer
	errOut io.Writer
	http   *http.Client

	// tokenSet: --token was given; otherwise the env var is read when needed.
	tokenSet bool
	// tokenFileErr: why the token file could not be read (bearer).
	tokenFileErr error
	// timeout bounds one call; zero: 60 seconds.
	timeout time.Duration
}

// runAdmin runs one admin subcommand; out and errOut are stdout and stderr.
func runAdmin(cmd string, args []string, out, errOut io.Writer) int {
	impl := adminCommands[cmd]
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	fs.SetOutput(errOut)
	c := &adminClient{cmd: cmd, out: out, errOut: errOut, http: &http.Client{}}
	def := os.Getenv("DELAYBRIDGE_ADMIN_URL")
	if def == "" {
		def = defaultAdminURL
	}
	fs.StringVar(&c.base, "url", def, "admin API base URL (env DELAYBRIDGE_ADMIN_URL)")
	// Not the env var as the flag's default: usage text prints defaults.
	fs.Var(tokenFlag{c}, "token", "admin bearer `token` (default: $DELAYBRIDGE_ADMIN_TOKEN, else for a bridge on this machine the file $DELAYBRIDGE_ADMIN_TOKEN_FILE, default ./data/admin-token)")
	fs.BoolVar(&c.json, "json", false, "print the API's JSON instead of a table")
	return impl(c, fs, args)
}

// tokenFlag is --token. Its String is always empty, so usage text never
// shows a token.
type tokenFlag struct{ c *adminClient }

func (f tokenFlag) String() string { return "" }

func (f tokenFlag) Set(v string) error {
	f.c.token, f.c.tokenSet = v, true
	return nil
}

// parse parses flags, allowing them before and after positional arguments.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if rest[0] == "--" {
			return append(pos, rest[1:]...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// parseFlags parses args with parseInterspersed. code < 0: go on with the
// positional arguments. Otherwise return code: exitOK after help asked for
// (-h, --help), printed to out; exitConfig after a flag error, printed with
// the usage to errOut.
func parseFlags(fs *flag.FlagSet, args []string, out, errOut io.Writer) (pos []string, code int) {
	var buf bytes.Buffer
	fs.SetOutput(&buf)
	pos, err := parseInterspersed(fs, args)
	fs.SetOutput(errOut)
	switch {
	case errors.Is(err, flag.ErrHelp):
		out.Write(buf.Bytes())
		return nil, exitOK
	case err != nil:
		errOut.Write(buf.Bytes())
		return nil, exitConfig
	}
	return pos, -1
}

// usageErr reports a usage error of command cmd, with its usage, and
// returns exitConfig.
func usageErr(fs *flag.FlagSet, errOut io.Writer, cmd, format string, a ...any) int {
	fmt.Fprintf(errOut, "delaybridge %s: %s\n", cmd, fmt.Sprintf(format, a...))
	fs.SetOutput(errOut)
	fs.Usage()
	return exitConfig
}

func (c *adminClient) usageErr(fs *flag.FlagSet, format string, a ...any) int {
	return usageErr(fs, c.errOut, c.cmd, format, a...)
}

func (c *adminClient) fail(err error) int {
	fmt.Fprintf(c.errOut, "delaybridge %s: %v\n", c.cmd, err)
	return exitCritical
}

// apiError is an error answer of the admin API.
type apiError struct {
	Status int
	Msg    string
	// tokenFile is why the token file could not be read, if it was tried.
	tokenFile error
}

func (e *apiError) Error() string {
	if e.Status == http.StatusUnauthorized {
		hint := "pass --token or set DELAYBRIDGE_ADMIN_TOKEN"
		if e.tokenFile != nil {
			hint += "; the token file: " + e.tokenFile.Error()
		}
		return fmt.Sprintf("%s (HTTP 401: %s)", e.Msg, hint)
	}
	return fmt.Sprintf("%s (HTTP %d)", e.Msg, e.Status)
}

// bearer is the token to send: --token, else $DELAYBRIDGE_ADMIN_TOKEN, else,
// for a bridge on this machine, the token file a bridge keeps when it has
// no token set (DELAYBRIDGE_ADMIN_TOKEN_FILE, docs/contract.md §6.3). A
// remote bridge never gets the local file's token.
func (c *adminClient) bearer() string {
	if c.tokenSet {
		return c.token
	}
	if tok := os.Getenv("DELAYBRIDGE_ADMIN_TOKEN"); tok != "" {
		return tok
	}
	if !isLoopback(c.base) {
		return ""
	}
	path, ok := os.LookupEnv("DELAYBRIDGE_ADMIN_TOKEN_FILE")
	if !ok {
		path = config.DefaultAdminTokenFile
	}
	if path == "" {
		return ""
	}
	tok, err := admin.ReadTokenFile(path)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			c.tokenFileErr = err
		}
		return ""
	}
	return tok
}

// isLoopback reports whether the URL's host is this machine.
func isLoopback(rawURL string) bool {
	u, err := url.Parse(rawURL)
	if err != nil {
		return false
	}
	h := u.Hostname()
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// do calls the API and decodes a JSON answer into out (when not nil). It
// returns the raw body too, for --json.
func (c *adminClient) do(method, path string, query url.Values, body any, out any) ([]byte, error) {
	u := strings.TrimRight(c.base, "/") + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	timeout := c.timeout
	if timeout <= 0 {
		timeout = 60 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return nil, fmt.Errorf("bad --url %q: %s", broker.Redact(c.base), broker.RedactText(err.Error(), c.base))
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	if token := c.bearer(); token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("cannot reach the admin API at %s: %s", broker.Redact(c.base), broker.RedactText(err.Error(), c.base))
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("read the answer of %s %s: %v", method, u, err)
	}
	if resp.StatusCode >= 300 {
		var e admin.ErrorJSON
		if json.Unmarshal(raw, &e) != nil || e.Error == "" {
			e.Error = strings.TrimSpace(string(raw))
			if e.Error == "" {
				e.Error = http.StatusText(resp.StatusCode)
			}
			if resp.StatusCode == http.StatusNotFound && strings.HasPrefix(e.Error, "404 page not found") {
				e.Error = "no admin API at " + c.base + " (is it a delaybridge with DELAYBRIDGE_HTTP_ADDR there?)"
			}
		}
		return raw, &apiError{Status: resp.StatusCode, Msg: e.Error, tokenFile: c.tokenFileErr}
	}
	if out != nil && len(raw) > 0 {
		if err := json.Unmarshal(raw, out); err != nil {
			return raw, fmt.Errorf("unexpected answer from %s: %v", u, err)
		}
	}
	return raw, nil
}

// timeoutPath is the API path of one timeout. PathEscape leaves "." and
// ".." as they are, and the server's router removes such dot-segments
// (net/http.ServeMux cleans paths and redirects), so they are escaped too:
// the handler then gets the id itself.
func timeoutPath(id string) string { return "/api/v1/timeouts/" + pathSegment(id) }

// pathSegment escapes s as one segment of an API path; see timeoutPath.
func pathSegment(s string) string {
	seg := url.PathEscape(s)
	if s == "." || s == ".." {
		seg = strings.ReplaceAll(seg, ".", "%2E")
	}
	return seg
}

func (c *adminClient) printJSON(raw []byte) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		raw = []byte("{}")
	}
	c.out.Write(raw)
	fmt.Fprintln(c.out)
}

// parseWhen accepts an RFC 3339 time or a duration from now ("10m", "-1h").
func parseWhen(v string, now time.Time) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(v); err == nil {
		return now.Add(d), nil
	}
	return time.Time{}, fmt.Errorf("%q is neither an RFC 3339 time (2026-11-21T20:00:00Z) nor a duration from now (10m)", v)
}

// fmtTime prints a time as --at, --from and --to accept it (RFC 3339, every
// digit kept), so that a printed time can be pasted back and means the same
// instant.
func fmtTime(t time.Time) string { return t.Local().Format(time.RFC3339Nano) }

func setUsage(fs *flag.FlagSet, synopsis, text string) {
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: delaybridge %s\n\n%s\n\nflags:\n", synopsis, text)
		fs.PrintDefaults()
	}
}

// filterFlags are the selector flags of ls and of the bulk actions: the
// admin API's list filters.
type filterFlags struct {
	dest, exchange, key, from, to, idPrefix, header *string
}

func addFilterFlags(fs *flag.FlagSet, what string) *filterFlags {
	return &filterFlags{
		dest:     fs.String("destination", "", what+" for this queue"),
		exchange: fs.String("exchange", "", what+" for this exchange"),
		key:      fs.String("routing-key", "", "with --exchange: "+what+" with this routing key"),
		from:     fs.String("from", "", what+" due at or after this time (RFC 3339 or a duration from now)"),
		to:       fs.String("to", "", what+" due before this time (RFC 3339 or a duration from now)"),
		idPrefix: fs.String("id-prefix", "", what+" whose id starts with this"),
		header:   fs.String("header", "", what+" whose message has this header with this text value, as `name:value` (e.g. tenant:acme)"),
	}
}

// filterSynopsis is the usage text of filterFlags.
const filterSynopsis = "[--destination Q | --exchange X [--routing-key K]] [--from T] [--to T] [--id-prefix P] [--header NAME:VALUE]"

// query checks the filter flags and returns them as the API's query; code
// is -1 unless the flags are wrong (then it is the exit code). set reports
// whether any filter was given.
func (ff *filterFlags) query(c *adminClient, fs *flag.FlagSet) (q url.Values, set bool, code int) {
	keySet := false
	fs.Visit(func(f *flag.Flag) { keySet = keySet || f.Name == "routing-key" })
	switch {
	case *ff.dest != "" && *ff.exchange != "":
		return nil, false, c.usageErr(fs, "give --destination (a queue) or --exchange, not both")
	case keySet && *ff.exchange == "":
		return nil, false, c.usageErr(fs, "--routing-key needs --exchange")
	}
	q = url.Values{}
	for name, v := range map[string]string{"destination": *ff.dest, "exchange": *ff.exchange, "id_prefix": *ff.idPrefix, "header": *ff.header} {
		if v != "" {
			q.Set(name, v)
		}
	}
	if keySet {
		q.Set("routing_key", *ff.key)
	}
	now := time.Now()
	for name, v := range map[string]string{"due_from": *ff.from, "due_to": *ff.to} {
		if v == "" {
			continue
		}
		t, err := parseWhen(v, now)
		if err != nil {
			return nil, false, c.usageErr(fs, "--%s: %v", map[string]string{"due_from": "from", "due_to": "to"}[name], err)
		}
		q.Set(name, t.UTC().Format(time.RFC3339Nano))
	}
	return q, len(q) > 0, -1
}

// parse parses args (flags anywhere) and then the filter flags; see query.
func (ff *filterFlags) parse(c *adminClient, fs *flag.FlagSet, args []string) (pos []string, q url.Values, set bool, code int) {
	pos, code = parseFlags(fs, args, c.out, c.errOut)
	if code >= 0 {
		return nil, nil, false, code
	}
	q, set, code = ff.query(c, fs)
	return pos, q, set, code
}

func cliList(c *adminClient, fs *flag.FlagSet, args []string) int {
	ff := addFilterFlags(fs, "only timeouts")
	limit := fs.Int("limit", admin.DefaultLimit, fmt.Sprintf("most rows per page (1..%d)", admin.MaxLimit))
	all := fs.Bool("all", false, "follow the cursor and list every matching timeout")
	cursor := fs.String("cursor", "", "start after this cursor (the \"next\" of a previous page)")
	saga := fs.String("saga-id", "", "only timeouts of this saga (NServiceBus saga id, MassTransit schedule token)")
	id := fs.String("id", "", "only the sends of this message id (more than one may be pending: a retry that reuses the id)")
	setUsage(fs, "ls "+filterSynopsis+" [--saga-id S] [--id ID] [--limit N] [--all] [--json]",
		"Lists pending timeouts in due order. A later send of an id that is pending twice shows its\n"+
			"number after the id: \"ID (send 2)\".")
	pos, code := parseFlags(fs, args, c.out, c.errOut)
	if code >= 0 {
		return code
	}
	if len(pos) > 0 {
		return c.usageErr(fs, "unexpected argument %q", pos[0])
	}
	q, _, code := ff.query(c, fs)
	if code >= 0 {
		return code
	}
	if *limit < 1 || *limit > admin.MaxLimit {
		return c.usageErr(fs, "--limit must be from 1 to %d", admin.MaxLimit)
	}
	q.Set("limit", strconv.Itoa(*limit))
	if *saga != "" {
		q.Set("saga_id", *saga)
	}
	if *id != "" {
		q.Set("id", *id)
	}
	var rows []admin.TimeoutJSON
	next, code := c.pages("/api/v1/timeouts", q, *cursor, *all, func(raw []byte) (string, error) {
		var page admin.ListJSON
		if err := json.Unmarshal(raw, &page); err != nil {
			return "", err
		}
		rows = append(rows, page.Timeouts...)
		return page.Next, nil
	}, func() any { return admin.ListJSON{Timeouts: rows} })
	if code >= 0 {
		return code
	}
	tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tDESTINATION\tDUE\tATTEMPTS\tSTATE\tLAST ERROR")
	for _, r := range rows {
		state := "pending"
		if r.Leased {
			state = "dispatching"
		} else if r.Paused {
			state = "paused"
		} else if r.NotBefore != nil {
			state = "retry after " + fmtTime(*r.NotBefore)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\n", sendName(&r), destOf(&r), fmtTime(r.DueAt), r.Attempts, state, oneLine(r.LastError, 60))
	}
	tw.Flush()
	if next != "" {
		fmt.Fprintf(c.errOut, "more: delaybridge ls --cursor %s (or --all)\n", next)
	}
	return exitOK
}

// pages gets the list at path from cursor, and with all the pages after it
// too; add reads each page and returns its "next". With --json it prints
// the last page as it came, or with all the whole list, whole(), as one
// document. code < 0: print the table; next is the cursor when there is
// more. Otherwise return code.
func (c *adminClient) pages(path string, q url.Values, cursor string, all bool, add func(raw []byte) (string, error), whole func() any) (next string, code int) {
	next = cursor
	var raw []byte
	for {
		if next != "" {
			q.Set("cursor", next)
		}
		var err error
		if raw, err = c.do(http.MethodGet, path, q, nil, nil); err != nil {
			return "", c.fail(err)
		}
		if next, err = add(raw); err != nil {
			return "", c.fail(fmt.Errorf("unexpected answer from %s: %v", path, err))
		}
		if !all || next == "" {
			break
		}
	}
	if !c.json {
		return next, -1
	}
	if all {
		raw, _ = json.MarshalIndent(whole(), "", "  ")
	}
	c.printJSON(raw)
	return "", exitOK
}

// sendName is t's id, with its send number when it is a later send of an
// id pending more than once (docs/contract.md §2.4).
func sendName(t *admin.TimeoutJSON) string {
	if t.Send > 1 {
		return t.ID + " (send " + strconv.Itoa(t.Send) + ")"
	}
	return t.ID
}

// destOf is where t goes, as the status page and the logs word it.
func destOf(t *admin.TimeoutJSON) wire.Destination {
	if t.Exchange == "" {
		return wire.Queue(t.Destination)
	}
	d := wire.Destination{Exchange: t.Exchange}
	if t.RoutingKey != nil {
		d.Key = *t.RoutingKey
	}
	return d
}

func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > n {
		s = s[:n-1] + "…"
	}
	return s
}

func oneID(c *adminClient, fs *flag.FlagSet, args []string) (string, int) {
	pos, code := parseFlags(fs, args, c.out, c.errOut)
	if code >= 0 {
		return "", code
	}
	if len(pos) != 1 || pos[0] == "" {
		return "", c.usageErr(fs, "give exactly one timeout ID")
	}
	return pos[0], -1
}

func cliShow(c *adminClient, fs *flag.FlagSet, args []string) int {
	setUsage(fs, "show ID [--json]", "Shows one pending timeout: state, properties, headers and body.")
	id, code := oneID(c, fs, args)
	if code >= 0 {
		return code
	}
	var t admin.TimeoutJSON
	raw, err := c.do(http.MethodGet, timeoutPath(id), nil, nil, &t)
	if err != nil {
		return c.fail(err)
	}
	if c.json {
		c.printJSON(raw)
		return exitOK
	}
	tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	row := func(k string, v any) { fmt.Fprintf(tw, "%s:\t%v\n", k, v) }
	row("id", sendName(&t))
	if t.Sends > 1 {
		row("sends pending", fmt.Sprintf("%d of this id; this one is due first (delaybridge ls --id to list them; cancel, reschedule and dispatch act on all)", t.Sends))
	}
	if t.Exchange == "" {
		row("destination", t.Destination)
	} else {
		d := destOf(&t)
		row("exchange", strconv.Quote(d.Exchange))
		row("routing key", strconv.Quote(d.Key))
	}
	if t.SagaID != "" {
		row("saga id", t.SagaID)
	}
	row("due at", fmtTime(t.DueAt))
	row("received at", fmtTime(t.ReceivedAt))
	row("attempts", t.Attempts)
	if t.LastError != "" {
		row("last error", t.LastError)
	}
	row("dispatching", t.Leased)
	if t.Paused {
		row("paused", "yes: its destination is paused (delaybridge resume)")
	}
	if t.LockExpiresAt != nil {
		row("lease expires", fmtTime(*t.LockExpiresAt))
	}
	if t.NotBefore != nil {
		row("retry not before", fmtTime(*t.NotBefore))
	}
	c.printMessage(tw, row, t.Properties, t.Headers, t.BodyBase64)
	return exitOK
}

// printMessage prints a message's properties and headers as rows of tw,
// flushes it, then prints the body.
func (c *adminClient) printMessage(tw *tabwriter.Writer, row func(string, any), p *admin.PropertiesJSON, h map[string]any, bodyBase64 *string) {
	if p != nil {
		b, _ := json.Marshal(p)
		var m map[string]any
		_ = json.Unmarshal(b, &m)
		for _, k := range sortedKeys(m) {
			row("property "+k, m[k])
		}
	}
	for _, k := range sortedKeys(h) {
		v := h[k]
		if _, ok := v.(string); !ok {
			b, _ := json.Marshal(v)
			v = string(b)
		}
		row("header "+k, v)
	}
	tw.Flush()
	if bodyBase64 != nil {
		body, _ := base64.StdEncoding.DecodeString(*bodyBase64)
		fmt.Fprintf(c.out, "body (%d bytes):\n", len(body))
		if isPrintable(body) {
			fmt.Fprintln(c.out, string(body))
		} else {
			fmt.Fprintf(c.out, "(binary, base64) %s\n", *bodyBase64)
		}
	}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func isPrintable(b []byte) bool {
	if !utf8.Valid(b) {
		return false
	}
	for _, r := range string(b) {
		if (r < 0x20 && r != '\n' && r != '\r' && r != '\t') || r == 0x7f {
			return false
		}
	}
	return true
}

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

// bulkTimeout bounds a bulk action's call: it works through its matches
// in chunks (storage.BulkChunk rows a commit), which for millions of rows
// takes minutes, not the 60 seconds of other calls.
const bulkTimeout = time.Hour

// bulk calls a bulk action of the admin API and prints its counts.
func (c *adminClient) bulk(method, path string, q url.Values, body any, verb string) int {
	c.timeout = bulkTimeout
	var res admin.BulkJSON
	raw, err := c.do(method, path, q, body, &res)
	if err != nil {
		var ae *apiError
		if errors.As(err, &ae) && json.Unmarshal(raw, &res) == nil && (res.Cancelled != nil || res.Dispatched != nil || res.Rescheduled != nil) {
			c.printBulk(raw, &res, verb) // stopped midway: say what it did
		}
		return c.fail(err)
	}
	c.printBulk(raw, &res, verb)
	return exitOK
}

func (c *adminClient) printBulk(raw []byte, res *admin.BulkJSON, verb string) {
	if c.json {
		c.printJSON(raw)
		return
	}
	n := 0
	for _, p := range []*int{res.Cancelled, res.Dispatched, res.Rescheduled} {
		if p != nil {
			n = *p
		}
	}
	fmt.Fprintf(c.out, "%s %d timeouts\n", verb, n)
	if res.Leased > 0 {
		fmt.Fprintf(c.out, "%d more were being dispatched and were left alone\n", res.Leased)
	}
	if res.OutOfRange != nil && *res.OutOfRange > 0 {
		fmt.Fprintf(c.out, "%d more were left alone: the shift would move them past the latest due time the bridge keeps\n", *res.OutOfRange)
	}
}

func (c *adminClient) cancelSaga(saga string) int {
	var res admin.CancelSagaJSON
	raw, err := c.do(http.MethodDelete, "/api/v1/timeouts", url.Values{"saga_id": {saga}}, nil, &res)
	if err != nil {
		return c.fail(err)
	}
	if c.json {
		c.printJSON(raw)
		return exitOK
	}
	fmt.Fprintf(c.out, "cancelled %d timeouts of saga %s\n", res.Cancelled, saga)
	if res.Leased > 0 {
		fmt.Fprintf(c.out, "%d more were being dispatched and could not be cancelled\n", res.Leased)
	}
	return exitOK
}

func cliReschedule(c *adminClient, fs *flag.FlagSet, args []string) int {
	at := fs.String("at", "", "new due time (RFC 3339)")
	in := fs.String("in", "", "new due time as a duration from now (e.g. 10m)")
	shift := fs.String("shift", "", "with filters: move each due time by this duration (e.g. 10m, -1h)")
	ff := addFilterFlags(fs, "reschedule every pending timeout")
	setUsage(fs, "reschedule (ID (--at TIME | --in DURATION) | "+filterSynopsis+" (--at TIME | --in DURATION | --shift DURATION))",
		"Sets a new due time on a pending timeout, or on every pending timeout the filters select\n"+
			"(at least one filter; --shift moves each by a duration); timeouts being dispatched at that\n"+
			"moment are counted and left alone.")
	pos, q, filtered, code := ff.parse(c, fs, args)
	if code >= 0 {
		return code
	}
	switch {
	case filtered && len(pos) != 0:
		return c.usageErr(fs, "give a timeout ID or filters, not both")
	case !filtered && (len(pos) != 1 || pos[0] == ""):
		return c.usageErr(fs, "give exactly one timeout ID, or filters")
	case !filtered && *shift != "":
		return c.usageErr(fs, "--shift moves the timeouts filters select; for one timeout use --at or --in")
	}
	given := 0
	for _, v := range []string{*at, *in, *shift} {
		if v != "" {
			given++
		}
	}
	if given != 1 {
		if filtered {
			return c.usageErr(fs, "give exactly one of --at, --in or --shift")
		}
		return c.usageErr(fs, "give exactly one of --at or --in")
	}
	var due time.Time
	switch {
	case *shift != "":
		d, err := time.ParseDuration(*shift)
		if err != nil || d == 0 {
			return c.usageErr(fs, "--shift %q is not a non-zero duration like 10m or -1h", *shift)
		}
		return c.bulk(http.MethodPost, "/api/v1/timeouts/reschedule", q, map[string]string{"shift": d.String()}, "rescheduled")
	case *at != "":
		t, err := time.Parse(time.RFC3339Nano, *at)
		if err != nil {
			return c.usageErr(fs, "--at %q is not an RFC 3339 time like 2026-11-21T20:00:00Z", *at)
		}
		due = t
	default:
		d, err := time.ParseDuration(*in)
		if err != nil {
			return c.usageErr(fs, "--in %q is not a duration like 10m", *in)
		}
		due = time.Now().Add(d)
	}
	body := map[string]string{"due_at": due.Format(time.RFC3339Nano)}
	if filtered {
		return c.bulk(http.MethodPost, "/api/v1/timeouts/reschedule", q, body, "rescheduled")
	}
	return c.setDue(http.MethodPatch, timeoutPath(pos[0]), body, "rescheduled")
}

func (c *adminClient) setDue(method, path string, body any, verb string) int {
	var t admin.TimeoutJSON
	raw, err := c.do(method, path, nil, body, &t)
	if err != nil {
		return c.fail(err)
	}
	if c.json {
		c.printJSON(raw)
		return exitOK
	}
	fmt.Fprintf(c.out, "%s %s: due %s\n", verb, t.ID, fmtTime(t.DueAt))
	return exitOK
}

func cliDispatch(c *adminClient, fs *flag.FlagSet, args []string) int {
	ff := addFilterFlags(fs, "dispatch every pending timeout")
	setUsage(fs, "dispatch (ID | "+filterSynopsis+")",
		"Makes a pending timeout due now, so it is delivered at once, or every pending timeout the\n"+
			"filters select (at least one filter).")
	pos, q, filtered, code := ff.parse(c, fs, args)
	switch {
	case code >= 0:
		return code
	case filtered && len(pos) != 0:
		return c.usageErr(fs, "give a timeout ID or filters, not both")
	case filtered:
		return c.bulk(http.MethodPost, "/api/v1/timeouts/dispatch", q, nil, "dispatching")
	case len(pos) != 1 || pos[0] == "":
		return c.usageErr(fs, "give exactly one timeout ID, or filters")
	}
	return c.setDue(http.MethodPost, timeoutPath(pos[0])+"/dispatch", nil, "dispatching")
}

func cliStats(c *adminClient, fs *flag.FlagSet, args []string) int {
	setUsage(fs, "stats [--json]", "Counts pending and leased timeouts and shows the next due time.")
	pos, code := parseFlags(fs, args, c.out, c.errOut)
	if code >= 0 {
		return code
	}
	if len(pos) > 0 {
		return c.usageErr(fs, "unexpected argument %q", pos[0])
	}
	var s admin.StatsJSON
	raw, err := c.do(http.MethodGet, "/api/v1/stats", nil, nil, &s)
	if err != nil {
		return c.fail(err)
	}
	if c.json {
		c.printJSON(raw)
		return exitOK
	}
	tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
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

func cliReplay(c *adminClient, fs *flag.FlagSet, args []string) int {
	limit := fs.Int("limit", admin.DefaultLimit, fmt.Sprintf("most messages taken from the error queue (1..%d)", admin.MaxLimit))
	setUsage(fs, "replay-errors [--limit N] [--json]",
		"Moves dispatch failures from the error queue back into the store, due now.\n"+
			"Ingest failures and messages that cannot be replayed stay on the error queue.")
	pos, code := parseFlags(fs, args, c.out, c.errOut)
	if code >= 0 {
		return code
	}
	if len(pos) > 0 {
		return c.usageErr(fs, "unexpected argument %q", pos[0])
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

// act calls the API for a command that changes something. code < 0: print
// the result from into. Otherwise return code: the call failed (with
// --json, an error answer is printed as it came too), or --json printed it.
func (c *adminClient) act(method, path string, q url.Values, into any) int {
	raw, err := c.do(method, path, q, nil, into)
	if err != nil {
		var ae *apiError
		if c.json && errors.As(err, &ae) && len(raw) > 0 {
			c.printJSON(raw)
		}
		return c.fail(err)
	}
	if c.json {
		c.printJSON(raw)
		return exitOK
	}
	return -1
}

// printSkipped prints a replay's skipped messages.
func (c *adminClient) printSkipped(skipped []admin.ReplaySkipped) {
	if len(skipped) == 0 {
		return
	}
	tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SKIPPED MESSAGE-ID\tREASON")
	for _, d := range skipped {
		fmt.Fprintf(tw, "%s\t%s\n", d.MessageID, d.Reason)
	}
	tw.Flush()
}
