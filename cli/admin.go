package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/delaybridge/delaybridge/admin"
	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/config"
)

// The client the admin commands share (ls, show, cancel, reschedule,
// dispatch, stats, replay-errors, errors, pause, resume, paused, schedules: a file each):
// they talk to a running bridge's admin API (docs/contract.md §6.3).

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
	"schedules":     cliSchedules,
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

// pages gets the list at path from cursor, and with all the pages after it
// too; add keeps what each page, a P, lists and returns its "next". With
// --json it prints the last page as it came, or with all the whole list,
// whole(), as one document. code < 0: print the table; next is the cursor
// when there is more. Otherwise return code.
func pages[P any](c *adminClient, path string, q url.Values, cursor string, all bool, add func(page *P) string, whole func() any) (next string, code int) {
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
		var page P
		if err := json.Unmarshal(raw, &page); err != nil {
			return "", c.fail(fmt.Errorf("unexpected answer from %s: %v", path, err))
		}
		if next = add(&page); !all || next == "" {
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

// flagsOnly parses args, which hold flags and no other argument. code < 0:
// go on; otherwise return code (see parseFlags).
func (c *adminClient) flagsOnly(fs *flag.FlagSet, args []string) int {
	pos, code := parseFlags(fs, args, c.out, c.errOut)
	if code >= 0 {
		return code
	}
	if len(pos) > 0 {
		return c.usageErr(fs, "unexpected argument %q", pos[0])
	}
	return -1
}

// The usage errors of oneArg.
const (
	giveID  = "give exactly one timeout ID"
	giveKey = "give exactly one schedule KEY (as delaybridge schedules lists it, e.g. amqp:<message id>)"
)

// oneArg parses args, which hold flags and one argument, not empty; give is
// the usage error otherwise (giveID, giveKey). code < 0: go on with it.
func (c *adminClient) oneArg(fs *flag.FlagSet, args []string, give string) (string, int) {
	pos, code := parseFlags(fs, args, c.out, c.errOut)
	if code >= 0 {
		return "", code
	}
	if len(pos) != 1 || pos[0] == "" {
		return "", c.usageErr(fs, "%s", give)
	}
	return pos[0], -1
}

// getOne parses args as oneArg does and gets path(the argument) into into.
// code < 0: print it. Otherwise return code.
func (c *adminClient) getOne(fs *flag.FlagSet, args []string, give string, path func(string) string, into any) int {
	arg, code := c.oneArg(fs, args, give)
	if code >= 0 {
		return code
	}
	return c.call(http.MethodGet, path(arg), nil, nil, into)
}

// get parses args, which hold flags only, and gets path into into.
// code < 0: print it. Otherwise return code.
func (c *adminClient) get(fs *flag.FlagSet, args []string, path string, into any) int {
	if code := c.flagsOnly(fs, args); code >= 0 {
		return code
	}
	return c.call(http.MethodGet, path, nil, nil, into)
}

// limitFlag adds --limit, how many items (what) one call takes.
func limitFlag(fs *flag.FlagSet, what string) *int {
	return fs.Int("limit", admin.DefaultLimit, fmt.Sprintf("most %s (1..%d)", what, admin.MaxLimit))
}

// checkLimit checks --limit. code < 0: go on; otherwise return code.
func (c *adminClient) checkLimit(fs *flag.FlagSet, limit int) int {
	if limit < 1 || limit > admin.MaxLimit {
		return c.usageErr(fs, "--limit must be from 1 to %d", admin.MaxLimit)
	}
	return -1
}

// more says, after a list, how to get its next page, if there is one.
func (c *adminClient) more(next string) {
	if next != "" {
		fmt.Fprintf(c.errOut, "more: delaybridge %s --cursor %s (or --all)\n", c.cmd, next)
	}
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

func (c *adminClient) setDue(method, path string, body any, verb string) int {
	var t admin.TimeoutJSON
	if code := c.call(method, path, nil, body, &t); code >= 0 {
		return code
	}
	fmt.Fprintf(c.out, "%s %s: due %s\n", verb, t.ID, fmtTime(t.DueAt))
	return exitOK
}

// call calls the API and decodes its answer into into. code < 0: print the
// answer from into. Otherwise return code: the call failed, or --json
// printed the answer as it came.
func (c *adminClient) call(method, path string, q url.Values, body, into any) int {
	raw, err := c.do(method, path, q, body, into)
	if err != nil {
		return c.fail(err)
	}
	if c.json {
		c.printJSON(raw)
		return exitOK
	}
	return -1
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
