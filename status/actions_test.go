package status

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/admin"
	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/storage/storetest"
)

// fakeActions records the calls the forms make.
type fakeActions struct {
	mu    sync.Mutex
	calls []string
	err   error
}

func (f *fakeActions) record(call string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, call)
	return f.err
}

func (f *fakeActions) Cancel(_ context.Context, id string) error { return f.record("cancel " + id) }
func (f *fakeActions) DispatchNow(_ context.Context, id string) error {
	return f.record("dispatch " + id)
}
func (f *fakeActions) ReplayError(_ context.Context, id string) (admin.ErrorsResult, bool, error) {
	err := f.record("replay " + id)
	return admin.ErrorsResult{ReplayResult: admin.ReplayResult{Replayed: 1}}, true, err
}

const testToken = "s3cret-admin-token"

// browser is a client of the handler with a cookie jar, sending Origin as
// a browser does on a form POST.
type browser struct {
	t       *testing.T
	h       http.Handler
	cookies map[string]*http.Cookie
	origin  string
}

func newBrowser(t *testing.T, h http.Handler) *browser {
	return &browser{t: t, h: h, cookies: map[string]*http.Cookie{}, origin: "http://example.com"}
}

func (b *browser) do(req *http.Request) *httptest.ResponseRecorder {
	for _, c := range b.cookies {
		req.AddCookie(c)
	}
	rec := httptest.NewRecorder()
	b.h.ServeHTTP(rec, req)
	for _, c := range rec.Result().Cookies() {
		if c.MaxAge < 0 {
			delete(b.cookies, c.Name)
		} else {
			b.cookies[c.Name] = c
		}
	}
	return rec
}

func (b *browser) get(target string) string {
	b.t.Helper()
	rec := b.do(httptest.NewRequest(http.MethodGet, target, nil))
	if rec.Code != http.StatusOK {
		b.t.Fatalf("GET %s: %d", target, rec.Code)
	}
	return rec.Body.String()
}

func (b *browser) post(target string, form url.Values) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, target, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if b.origin != "" {
		req.Header.Set("Origin", b.origin)
	}
	return b.do(req)
}

var csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

func actionsHandler(acts *fakeActions, token string) *Handler {
	now := t0
	return New(Options{Token: token, Actions: acts, Now: func() time.Time { return now }, Refresh: 5 * time.Second,
		List: rows(storage.Timeout{ID: "order-1/a b", Destination: "orders", DueAt: now.Add(time.Hour)}),
		ErrorQueue: func(context.Context) (ErrorQueue, error) {
			return ErrorQueue{Depth: 1, Newest: []ErrorEntry{{ID: "failed-1", Destination: "billing", Reason: "NO_ROUTE", FailedAt: now}}}, nil
		}})
}

func TestActionsLoginCSRFAndFlash(t *testing.T) {
	acts := &fakeActions{}
	b := newBrowser(t, actionsHandler(acts, testToken))
	page := b.get("/")
	mustContain(t, page, `action="/ui/login"`, `http-equiv="refresh"`)
	if strings.Contains(page, `class="danger cancel"`) {
		t.Error("cancel offered before login")
	}
	// Wrong token: no session.
	rec := b.post("/ui/login", url.Values{"token": {"wrong"}, "back": {"/"}})
	if rec.Code != http.StatusSeeOther || b.cookies[SessionCookie] != nil {
		t.Fatalf("wrong token: %d, session %v", rec.Code, b.cookies[SessionCookie])
	}
	mustContain(t, b.get("/"), "Wrong admin token.")

	rec = b.post("/ui/login", url.Values{"token": {testToken}, "back": {"/?destination=orders"}})
	if rec.Code != http.StatusSeeOther || rec.Header().Get("Location") != "/?destination=orders" {
		t.Fatalf("login: %d to %q", rec.Code, rec.Header().Get("Location"))
	}
	c := b.cookies[SessionCookie]
	if c == nil || !c.HttpOnly || c.SameSite != http.SameSiteStrictMode || strings.Contains(c.Value, testToken) {
		t.Fatalf("session cookie %+v: want HttpOnly, SameSite=Strict, without the token", c)
	}
	page = b.get("/")
	mustContain(t, page, "Logged in", `class="danger cancel"`, `action="/ui/timeouts/order-1%2Fa%20b/cancel"`,
		`action="/ui/errors/failed-1/replay"`)
	if strings.Contains(page, testToken) {
		t.Error("the page shows the admin token")
	}
	if strings.Contains(page, `http-equiv="refresh"`) {
		t.Error("the page reloads itself while logged in (a form being filled in would be lost)")
	}
	m := csrfField.FindStringSubmatch(page)
	if m == nil {
		t.Fatal("no CSRF token in the forms")
	}
	csrf := m[1]
	if strings.Contains(csrf, testToken) {
		t.Error("the CSRF token contains the admin token")
	}

	// Without the CSRF token, with a wrong one, or from another origin:
	// refused, nothing done.
	for name, try := range map[string]func() *httptest.ResponseRecorder{
		"no csrf": func() *httptest.ResponseRecorder { return b.post("/ui/timeouts/x/cancel", url.Values{}) },
		"wrong csrf": func() *httptest.ResponseRecorder {
			return b.post("/ui/timeouts/x/cancel", url.Values{"csrf": {"AAAA"}})
		},
		"cross-origin": func() *httptest.ResponseRecorder {
			b.origin = "http://evil.example"
			defer func() { b.origin = "http://example.com" }()
			return b.post("/ui/timeouts/x/cancel", url.Values{"csrf": {csrf}})
		},
		"no origin": func() *httptest.ResponseRecorder {
			b.origin = ""
			defer func() { b.origin = "http://example.com" }()
			return b.post("/ui/timeouts/x/cancel", url.Values{"csrf": {csrf}})
		},
	} {
		if rec := try(); rec.Code != http.StatusForbidden {
			t.Errorf("%s: %d, want 403", name, rec.Code)
		}
	}
	if len(acts.calls) != 0 {
		t.Fatalf("refused requests acted: %v", acts.calls)
	}

	for _, c := range []struct{ path, call, flash string }{
		{"/ui/timeouts/order-1%2Fa%20b/cancel", "cancel order-1/a b", "Cancelled &#34;order-1/a b&#34;."},
		{"/ui/timeouts/m-2/dispatch", "dispatch m-2", "&#34;m-2&#34; is due now"},
		{"/ui/errors/failed-1/replay", "replay failed-1", "Replayed &#34;failed-1&#34;"},
	} {
		rec := b.post(c.path, url.Values{"csrf": {csrf}, "back": {"/?id_prefix=order"}})
		if rec.Code != http.StatusSeeOther || rec.Header().Get("Location") != "/?id_prefix=order" {
			t.Errorf("POST %s: %d to %q", c.path, rec.Code, rec.Header().Get("Location"))
		}
		mustContain(t, b.get("/"), c.flash)
		if got := acts.calls[len(acts.calls)-1]; got != c.call {
			t.Errorf("POST %s called %q, want %q", c.path, got, c.call)
		}
	}
	// The flash is shown once.
	if strings.Contains(b.get("/"), `id="flash"`) {
		t.Error("the flash shows again")
	}
	// Store errors are worded.
	acts.err = storage.ErrLeased
	b.post("/ui/timeouts/m-3/cancel", url.Values{"csrf": {csrf}})
	mustContain(t, b.get("/"), "is being dispatched; try again shortly")
	// A redirect never leaves the page.
	rec = b.post("/ui/timeouts/m-3/cancel", url.Values{"csrf": {csrf}, "back": {"//evil.example/"}})
	if rec.Header().Get("Location") != "/" {
		t.Errorf("back=//evil.example/ redirected to %q", rec.Header().Get("Location"))
	}

	// Logged out: the session is gone, actions refused.
	b.post("/ui/logout", url.Values{})
	n := len(acts.calls)
	b.post("/ui/timeouts/m-4/cancel", url.Values{"csrf": {csrf}})
	if len(acts.calls) != n {
		t.Error("an action went through after logout")
	}
}

// A session cookie forged or made with another token is not a session.
func TestForgedOrExpiredSessionsAreRefused(t *testing.T) {
	acts := &fakeActions{}
	h := actionsHandler(acts, testToken)
	other := actionsHandler(acts, "another-token")
	now := h.opts.Now()
	for name, value := range map[string]string{
		"other token": other.newSession(now),
		"expired":     h.newSession(now.Add(-SessionTTL - time.Minute)),
		"forged":      "99999999999.AAAA",
		"the token":   testToken,
	} {
		b := newBrowser(t, h)
		b.cookies[SessionCookie] = &http.Cookie{Name: SessionCookie, Value: value}
		if strings.Contains(b.get("/"), `class="danger cancel"`) {
			t.Errorf("%s: the page offers actions", name)
		}
		b.post("/ui/timeouts/m/cancel", url.Values{"csrf": {h.csrf(value)}})
		if len(acts.calls) != 0 {
			t.Errorf("%s: acted: %v", name, acts.calls)
		}
	}
}

// Without an admin token there is no admin API, and no actions either.
func TestNoTokenNoActions(t *testing.T) {
	acts := &fakeActions{}
	b := newBrowser(t, actionsHandler(acts, ""))
	page := b.get("/")
	mustContain(t, page, "Actions are off: set DELAYBRIDGE_ADMIN_TOKEN")
	if strings.Contains(page, `action="/ui/login"`) || strings.Contains(page, `name="csrf"`) {
		t.Error("the page offers a login or actions without a token")
	}
	for _, path := range []string{"/ui/login", "/ui/timeouts/m/cancel", "/ui/timeouts/m/dispatch", "/ui/errors/m/replay"} {
		if rec := b.post(path, url.Values{"token": {""}}); rec.Code != http.StatusNotFound {
			t.Errorf("POST %s without a token: %d, want 404", path, rec.Code)
		}
	}
	if len(acts.calls) != 0 {
		t.Errorf("acted without a token: %v", acts.calls)
	}
}

// Behind a proxy that ends TLS: the page is https, the request http with
// the Host passed on. The POST is same-origin, and the cookie Secure.
func TestActionsBehindATLSProxy(t *testing.T) {
	acts := &fakeActions{}
	h := actionsHandler(acts, testToken)
	req := httptest.NewRequest(http.MethodPost, "/ui/login", strings.NewReader(url.Values{"token": {testToken}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", "https://example.com")
	req.Header.Set("X-Forwarded-Proto", "https")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	var sess *http.Cookie
	for _, c := range rec.Result().Cookies() {
		if c.Name == SessionCookie {
			sess = c
		}
	}
	if rec.Code != http.StatusSeeOther || sess == nil || !sess.Secure {
		t.Fatalf("login behind a TLS proxy: %d, session %+v; want 303 and a Secure cookie", rec.Code, sess)
	}
	for _, origin := range []string{"https://example.com.evil.net", "https://evil.net", "null", "file://example.com"} {
		req := httptest.NewRequest(http.MethodPost, "/ui/login", strings.NewReader(url.Values{"token": {testToken}}.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Origin", origin)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusForbidden {
			t.Errorf("Origin %q: %d, want 403", origin, rec.Code)
		}
	}
}

// Someone guessing tokens gets one log line a minute, with a count, not one
// per attempt.
func TestRefusedLoginsDoNotFloodTheLog(t *testing.T) {
	c := storetest.NewClock(t0)
	var mu sync.Mutex
	var lines []string
	h := New(Options{Token: testToken, Actions: &fakeActions{}, Now: c.Now, Log: func(action, id, outcome string) {
		mu.Lock()
		defer mu.Unlock()
		lines = append(lines, action+": "+outcome)
	}})
	b := newBrowser(t, h)
	for range 1000 {
		b.post("/ui/login", url.Values{"token": {"guess"}})
	}
	c.Advance(refusedLoginInterval)
	b.post("/ui/login", url.Values{"token": {"guess"}})
	want := []string{"login: refused: wrong token", "login: refused: wrong token (1000 times since the last such line)"}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(lines, want) {
		t.Fatalf("log lines %q, want %q", lines, want)
	}
}
