package integration

import (
	"context"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/internal/testenv"
)

// chromiumPath finds Debian's chromium (scripts/test.sh installs it): a
// missing one ends the test, and fails it under CI=true.
func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	testenv.Unavailable(t, "chromium not found: the status page's browser test needs it (apt-get install -y chromium; scripts/test.sh installs it)")
	return ""
}

// newBrowser starts headless Chromium, driven over the DevTools protocol
// (chromedp), for the test's lifetime.
func newBrowser(t *testing.T) context.Context {
	t.Helper()
	path := chromiumPath(t)
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox,
		chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1280, 1000), chromedp.Flag("disable-quic", true))
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelCtx := chromedp.NewContext(alloc)
	t.Cleanup(func() { cancelCtx(); cancelAlloc() })
	// Start the browser now, so a failure to start is reported as such.
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return ctx
}

// do runs browser actions with a generous deadline.
func do(t *testing.T, ctx context.Context, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		t.Fatalf("browser: %s: %v", what, err)
	}
}

// text is the visible text of the first element selector matches, "" when
// none does.
func text(t *testing.T, ctx context.Context, selector string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	s, err := chromedp.Run(ctx, chromedp.Evaluate[string](
		`(function(){var e=document.querySelector(`+jsString(selector)+`);return e?e.innerText:"";})()`))
	if err != nil {
		t.Fatalf("browser: text of %s: %v", selector, err)
	}
	return s
}

// waitText waits until the text of selector on the current page (which
// may still be loading) contains want, and returns it.
func waitText(t *testing.T, ctx context.Context, selector, want string) string {
	t.Helper()
	deadline := time.Now().Add(45 * time.Second)
	var last string
	for time.Now().Before(deadline) {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		s, err := chromedp.Run(cctx, chromedp.Evaluate[string](
			`(function(){var e=document.querySelector(`+jsString(selector)+`);return e?e.innerText:"";})()`))
		cancel()
		if err == nil && strings.Contains(s, want) {
			return s
		}
		last = s
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("%s says %q, want %q", selector, last, want)
	return ""
}

// waitPage loads target until the text of selector satisfies ok.
func waitPage(t *testing.T, ctx context.Context, target, selector, what string, ok func(string) bool) string {
	t.Helper()
	deadline := time.Now().Add(45 * time.Second)
	for {
		do(t, ctx, "load "+target, chromedp.Navigate(target), chromedp.WaitReady(chromedp.CSS("body")))
		if s := text(t, ctx, selector); ok(s) {
			return s
		} else if time.Now().After(deadline) {
			t.Fatalf("%s: %s on %s is %q", what, selector, target, s)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func jsString(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s) + "'"
}

// TestStatusPageInBrowser drives the status page in headless Chromium
// against a real bridge: a destination whose every forward fails turns the
// badge to "attention" with the destination failing and its messages
// retrying (not "healthy" with the messages "waiting"); an
// operator logs in with the admin token, searches by id prefix, cancels a
// message and sees it gone, and dispatches another now.
func TestStatusPageInBrowser(t *testing.T) {
	t.Parallel()
	b := startBridge(t, map[string]string{"DELAYBRIDGE_ADMIN_TOKEN": adminToken,
		"DELAYBRIDGE_NUMBER_OF_RETRIES": "1000", "DELAYBRIDGE_POLL_INTERVAL": "200ms"})
	ctx := newBrowser(t)
	conn := dial(t)
	pub := newPublisher(t, conn)
	dest, missing := b.Endpoint+".orders", b.Endpoint+".missing"
	got := declareAndConsume(t, conn, dest)
	later := time.Now().Add(time.Hour).UTC().Format(time.RFC3339Nano)
	now := time.Now().UTC().Format(time.RFC3339Nano)
	pub.PublishAll(b.TimeoutsQueue(), []amqp.Publishing{
		{MessageId: "keep-1", Body: []byte("k"), Headers: amqp.Table{"x-destination": dest, "x-due-at": later}},
		{MessageId: "cancel-me-1", Body: []byte("c"), Headers: amqp.Table{"x-destination": dest, "x-due-at": later}},
		{MessageId: "dispatch-me-1", Body: []byte("d"), Headers: amqp.Table{"x-destination": dest, "x-due-at": later}},
		// No such queue: returned, retried with backoff, failing.
		{MessageId: "fail-1", Body: []byte("f"), Headers: amqp.Table{"x-destination": missing, "x-due-at": now}},
		{MessageId: "fail-2", Body: []byte("f"), Headers: amqp.Table{"x-destination": missing, "x-due-at": now}},
	})
	home := "http://" + b.HTTPAddr + "/"

	waitPage(t, ctx, home, "#health", "badge", func(s string) bool { return s == "attention" })
	problems := waitPage(t, ctx, home, "#problems", "problems", func(s string) bool { return strings.Contains(s, "dispatch failing") })
	if !strings.Contains(problems, "to "+missing) {
		t.Errorf("problems %q do not name the failing destination %s", problems, missing)
	}
	failingRow := waitPage(t, ctx, home, "#destinations tr.failing", "failing destination", func(s string) bool { return s != "" })
	if !strings.Contains(failingRow, missing) || !strings.Contains(failingRow, "failing") {
		t.Errorf("failing destination row %q, want %s failing", failingRow, missing)
	}
	rows := waitPage(t, ctx, home+"?id_prefix=fail-", "#rows", "failing rows", func(s string) bool { return strings.Contains(s, "fail-2") })
	if strings.Contains(rows, "waiting") || !(strings.Contains(rows, "retrying") || strings.Contains(rows, "failing")) {
		t.Errorf("rows of messages that fail: %q; want retrying or failing, never waiting", rows)
	}

	// Log in on a search page (no reload there) and come back to it.
	search := home + "?id_prefix=cancel-me"
	do(t, ctx, "log in", chromedp.Navigate(search), chromedp.WaitVisible(chromedp.CSS(`#login`)),
		chromedp.SendKeys(chromedp.CSS(`#login input[name="token"]`), adminToken), chromedp.Submit(chromedp.CSS(`#login`)),
	)
	waitText(t, ctx, "#flash", "Logged in")
	// The list is read again rather than taken from the page the flash is
	// on: the browser may show the flash, at the top, before it has parsed
	// the list, and on a busy machine a page's store read can time out
	// (the page then says so in place of the list).
	if list := waitPage(t, ctx, search, "#rows", "search for cancel-me", func(s string) bool { return strings.Contains(s, "cancel-me-1") }); strings.Contains(list, "keep-1") {
		t.Fatalf("search for cancel-me shows %q", list)
	}
	do(t, ctx, "cancel", chromedp.Click(chromedp.CSS(`#rows button.cancel`)))
	waitText(t, ctx, "#flash", `Cancelled "cancel-me-1"`)
	if after := waitPage(t, ctx, search, "#pending-list", "the list after cancel", func(s string) bool { return strings.Contains(s, "No pending message matches") }); strings.Contains(after, "cancel-me-1") {
		t.Fatalf("after cancel the list says %q", after)
	}
	if code, _ := adminDo(t, b, http.MethodGet, "/api/v1/timeouts/cancel-me-1"); code != http.StatusNotFound {
		t.Errorf("GET cancel-me-1 after the page cancelled it: %d, want 404", code)
	}
	if code, _ := adminDo(t, b, http.MethodGet, "/api/v1/timeouts/keep-1"); code != http.StatusOK {
		t.Errorf("GET keep-1: %d, want 200 (only the searched message is cancelled)", code)
	}

	do(t, ctx, "dispatch now", chromedp.Navigate(home+"?id_prefix=dispatch-me"), chromedp.WaitVisible(chromedp.CSS(`#rows button.dispatch`)),
		chromedp.Click(chromedp.CSS(`#rows button.dispatch`)))
	waitText(t, ctx, "#flash", `"dispatch-me-1" is due now`)
	arr := got.WaitFor(1, livenessBound)
	if arr[0].MessageId != "dispatch-me-1" {
		t.Errorf("delivered %q, want dispatch-me-1", arr[0].MessageId)
	}
}

// pageClient posts the status page's forms as a browser does: a cookie jar
// and the page's own Origin.
type pageClient struct {
	t    *testing.T
	base string
	c    *http.Client
}

func newPageClient(t *testing.T, b *bridgeProc) *pageClient {
	jar, _ := cookiejar.New(nil)
	return &pageClient{t: t, base: "http://" + b.HTTPAddr, c: &http.Client{Jar: jar, Timeout: 30 * time.Second}}
}

func (p *pageClient) get(path string) string {
	p.t.Helper()
	resp, err := p.c.Get(p.base + path)
	if err != nil {
		p.t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return string(body)
}

// post posts form to path and follows the 303 back; it returns the status
// of the POST and the page it led to.
func (p *pageClient) post(path string, form url.Values) (int, string) {
	p.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, p.base+path, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", p.base)
	c := *p.c
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, err := c.Do(req)
	if err != nil {
		p.t.Fatalf("POST %s: %v", path, err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther {
		return resp.StatusCode, ""
	}
	return resp.StatusCode, p.get(resp.Header.Get("Location"))
}

var csrfRe = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// TestStatusPageErrorQueueAndReplay: a dispatch failure moved to the error
// queue shows on the page (depth, id, destination, reason) and as the
// problem "error queue growing"; retrying it from the page (logged in,
// with the CSRF token) stores it again and, its queue now declared,
// delivers it.
func TestStatusPageErrorQueueAndReplay(t *testing.T) {
	t.Parallel()
	b := startBridge(t, map[string]string{"DELAYBRIDGE_ADMIN_TOKEN": adminToken,
		"DELAYBRIDGE_NUMBER_OF_RETRIES": "0", "DELAYBRIDGE_POLL_INTERVAL": "200ms"})
	conn := dial(t)
	pub := newPublisher(t, conn)
	dest := b.Endpoint + ".later"
	pub.Publish(b.TimeoutsQueue(), amqp.Publishing{MessageId: "to-replay-1", Body: []byte("r"),
		Headers: amqp.Table{"x-destination": dest, "x-due-at": time.Now().UTC().Format(time.RFC3339Nano)}})
	deadline := time.Now().Add(livenessBound + 5*time.Second)
	for queueDepth(t, conn, b.ErrorQ) < 1 {
		if time.Now().After(deadline) {
			t.Fatalf("the failure did not reach the error queue")
		}
		time.Sleep(100 * time.Millisecond)
	}
	pc := newPageClient(t, b)
	// The page reads the error queue on its own and waits a little for it.
	page := pc.get("/")
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(page, `id="error-depth"`) && time.Now().Before(deadline); {
		time.Sleep(200 * time.Millisecond)
		page = pc.get("/")
	}
	for _, want := range []string{`id="error-depth">1<`, "to-replay-1", dest, "NO_ROUTE", "error queue growing", ">attention<"} {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks %q", want)
		}
	}
	// Not logged in: no retry form; a post without a session does nothing.
	if strings.Contains(page, `/replay"`) {
		t.Error("the page offers retry before login")
	}
	if code, _ := pc.post("/ui/errors/to-replay-1/replay", url.Values{"csrf": {"x"}}); code != http.StatusSeeOther {
		t.Errorf("replay without a session: %d", code)
	}
	if n := queueDepth(t, conn, b.ErrorQ); n != 1 {
		t.Fatalf("error queue has %d after a post without a session, want 1", n)
	}
	if code, _ := pc.post("/ui/login", url.Values{"token": {adminToken}}); code != http.StatusSeeOther {
		t.Fatalf("login: %d", code)
	}
	page = pc.get("/")
	m := csrfRe.FindStringSubmatch(page)
	if m == nil || !strings.Contains(page, `action="/ui/errors/to-replay-1/replay"`) {
		t.Fatalf("logged in, the page has no retry form for to-replay-1")
	}
	got := declareAndConsume(t, conn, dest)
	code, after := pc.post("/ui/errors/to-replay-1/replay", url.Values{"csrf": {m[1]}, "back": {"/"}})
	if code != http.StatusSeeOther || !strings.Contains(after, "Replayed &#34;to-replay-1&#34;") {
		t.Fatalf("replay: %d, page %s", code, tail(after, 3000))
	}
	if arr := got.WaitFor(1, livenessBound); arr[0].MessageId != "to-replay-1" {
		t.Errorf("delivered %q, want to-replay-1", arr[0].MessageId)
	}
	if n := queueDepth(t, conn, b.ErrorQ); n != 0 {
		t.Errorf("error queue has %d after the replay, want 0", n)
	}
}
