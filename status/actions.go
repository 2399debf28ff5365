package status

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/delaybridge/delaybridge/admin"
	"github.com/delaybridge/delaybridge/storage"
)

// The page's actions (docs/contract.md §6.4). They exist only when the admin
// token is configured, as the admin API does: without it every action
// answers 404 and the page offers none.
//
// An operator logs in once with the admin token (POST /ui/login). The
// session cookie holds an expiry and an HMAC of it keyed by the token, never
// the token: HttpOnly, SameSite=Strict, Secure over TLS. Each form carries a
// CSRF token, an HMAC of the session cookie, and a POST must also come from
// the page's own origin (Origin, else Referer). Every POST answers 303 back to
// the page, with the outcome in a short-lived flash cookie.

// Actions are the admin API's operations (admin.Ops) the forms call.
type Actions interface {
	Cancel(ctx context.Context, id string) error
	DispatchNow(ctx context.Context, id string) error
	ReplayError(ctx context.Context, id string) (admin.ErrorsResult, bool, error)
}

// Cookie names and lifetimes.
const (
	SessionCookie = "delaybridge_session"
	flashCookie   = "delaybridge_flash"
	// SessionTTL is how long a login lasts.
	SessionTTL = 12 * time.Hour
)

// session is the request's login, as the page needs it.
type session struct {
	Enabled  bool   // actions configured (a token is set)
	LoggedIn bool   // a valid session cookie
	CSRF     string // the forms' CSRF token
	Flash    string // the outcome of the last action
	FlashBad bool
	Back     string // where a form's POST returns to
}

func (h *Handler) routeActions() {
	h.mux.HandleFunc("POST /ui/login", h.login)
	h.mux.HandleFunc("POST /ui/logout", h.logout)
	h.mux.HandleFunc("POST /ui/timeouts/{id}/cancel", h.action("cancel"))
	h.mux.HandleFunc("POST /ui/timeouts/{id}/dispatch", h.action("dispatch"))
	h.mux.HandleFunc("POST /ui/errors/{id}/replay", h.action("replay"))
}

func (h *Handler) enabled() bool { return h.opts.Token != "" && h.opts.Actions != nil }

// mac is HMAC-SHA256 keyed by the admin token over the parts.
func (h *Handler) mac(parts ...string) string {
	m := hmac.New(sha256.New, []byte(h.opts.Token))
	m.Write([]byte(strings.Join(parts, "\x00")))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// newSession returns a session cookie's value: expiry, then its HMAC.
func (h *Handler) newSession(now time.Time) string {
	exp := strconv.FormatInt(now.Add(SessionTTL).Unix(), 10)
	return exp + "." + h.mac("session", exp)
}

// validSession reports whether the request's session cookie is one of ours
// and not expired, and returns its value.
func (h *Handler) validSession(r *http.Request) (string, bool) {
	if !h.enabled() {
		return "", false
	}
	c, err := r.Cookie(SessionCookie)
	if err != nil {
		return "", false
	}
	exp, sig, ok := strings.Cut(c.Value, ".")
	if !ok || !hmac.Equal([]byte(sig), []byte(h.mac("session", exp))) {
		return "", false
	}
	unix, err := strconv.ParseInt(exp, 10, 64)
	if err != nil || !h.opts.Now().Before(time.Unix(unix, 0)) {
		return "", false
	}
	return c.Value, true
}

func (h *Handler) csrf(sess string) string { return h.mac("csrf", sess) }

// sessionOf reads the request's session and flash (clearing the flash).
func (h *Handler) sessionOf(w http.ResponseWriter, r *http.Request) session {
	s := session{Enabled: h.enabled(), Back: r.URL.RequestURI()}
	if sess, ok := h.validSession(r); ok {
		s.LoggedIn, s.CSRF = true, h.csrf(sess)
	}
	if c, err := r.Cookie(flashCookie); err == nil {
		if v, err := url.QueryUnescape(c.Value); err == nil {
			s.FlashBad = strings.HasPrefix(v, "!")
			s.Flash = truncate(strings.TrimPrefix(v, "!"), 300)
		}
		http.SetCookie(w, &http.Cookie{Name: flashCookie, Value: "", Path: "/", MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode})
	}
	return s
}

// sameOrigin: the POST comes from a page of this host. Browsers send Origin
// on every form POST; Referer is the fallback for those that do not. The
// scheme is not compared: behind a proxy that ends TLS the request arrives
// over http from a page served over https (the proxy must pass Host on).
func sameOrigin(r *http.Request) bool {
	from := r.Header.Get("Origin")
	if from == "" || from == "null" {
		from = r.Header.Get("Referer")
	}
	if from == "" {
		return false
	}
	u, err := url.Parse(from)
	return err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != "" && strings.EqualFold(u.Host, r.Host)
}

// secure: the browser reached the page over TLS, here or at a proxy, so the
// cookies get Secure (a spoofed header only makes them stricter).
func secure(r *http.Request) bool {
	return r.TLS != nil || strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https")
}

// back is where a POST returns to: the form's back field when it is a path
// of the page, else the page.
func back(r *http.Request) string {
	b := r.PostFormValue("back")
	if !strings.HasPrefix(b, "/") || strings.HasPrefix(b, "//") || strings.HasPrefix(b, "/\\") {
		return "/"
	}
	return b
}

// done answers a POST: 303 back, with msg as the flash ("!" first: a failure).
func (h *Handler) done(w http.ResponseWriter, r *http.Request, msg string, bad bool) {
	if bad {
		msg = "!" + msg
	}
	http.SetCookie(w, &http.Cookie{Name: flashCookie, Value: url.QueryEscape(msg), Path: "/", MaxAge: 60,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: secure(r)})
	http.Redirect(w, r, back(r), http.StatusSeeOther)
}

// guard runs the checks every POST passes: actions enabled (404 otherwise,
// as the admin API without a token), same origin (403).
func (h *Handler) guard(w http.ResponseWriter, r *http.Request) bool {
	if !h.enabled() {
		http.Error(w, "the page's actions are disabled (set DELAYBRIDGE_ADMIN_TOKEN to enable them and the admin API)", http.StatusNotFound)
		return false
	}
	if !sameOrigin(r) {
		http.Error(w, "cross-origin request refused", http.StatusForbidden)
		return false
	}
	r.Body = http.MaxBytesReader(w, r.Body, 16<<10)
	if err := r.ParseForm(); err != nil {
		http.Error(w, "bad form", http.StatusBadRequest)
		return false
	}
	return true
}

func (h *Handler) login(w http.ResponseWriter, r *http.Request) {
	if !h.guard(w, r) {
		return
	}
	token := r.PostFormValue("token")
	if subtle.ConstantTimeCompare([]byte(token), []byte(h.opts.Token)) != 1 {
		h.refusedLogin()
		h.done(w, r, "Wrong admin token.", true)
		return
	}
	http.SetCookie(w, &http.Cookie{Name: SessionCookie, Value: h.newSession(h.opts.Now()), Path: "/",
		MaxAge: int(SessionTTL / time.Second), HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: secure(r)})
	h.log("login", "", "ok")
	h.done(w, r, "Logged in: the page's actions are enabled for "+fmtDur(SessionTTL)+".", false)
}

func (h *Handler) logout(w http.ResponseWriter, r *http.Request) {
	if !h.guard(w, r) {
		return
	}
	http.SetCookie(w, &http.Cookie{Name: SessionCookie, Value: "", Path: "/", MaxAge: -1, HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: secure(r)})
	h.done(w, r, "Logged out.", false)
}

// action returns the handler of one message action: a valid session and its
// CSRF token required.
func (h *Handler) action(name string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !h.guard(w, r) {
			return
		}
		sess, ok := h.validSession(r)
		if !ok {
			h.done(w, r, "Log in with the admin token first.", true)
			return
		}
		if !hmac.Equal([]byte(r.PostFormValue("csrf")), []byte(h.csrf(sess))) {
			http.Error(w, "missing or wrong CSRF token (reload the page)", http.StatusForbidden)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
		defer cancel()
		id := r.PathValue("id")
		msg, bad := h.run(ctx, name, id)
		h.log(name, id, msg)
		h.done(w, r, msg, bad)
	}
}

// run does the action and words its outcome.
func (h *Handler) run(ctx context.Context, name, id string) (string, bool) {
	a := h.opts.Actions
	var err error
	switch name {
	case "cancel":
		if err = a.Cancel(ctx, id); err == nil {
			return "Cancelled " + strconv.Quote(id) + ".", false
		}
	case "dispatch":
		if err = a.DispatchNow(ctx, id); err == nil {
			return strconv.Quote(id) + " is due now: the bridge forwards it at once.", false
		}
	case "replay":
		res, found, rerr := a.ReplayError(ctx, id)
		switch {
		case rerr != nil:
			err = rerr
		case !found:
			return "No copy of this endpoint with id " + strconv.Quote(id) + " among the first " +
				strconv.Itoa(admin.DefaultErrorScan) + " messages of the error queue.", true
		case res.Replayed == 0:
			reason := "skipped"
			if len(res.Details) > 0 {
				reason = res.Details[0].Reason
			}
			return "Not replayed " + strconv.Quote(id) + ": " + reason, true
		default:
			return "Replayed " + strconv.Quote(id) + ": stored again, due now.", false
		}
	}
	switch {
	case errors.Is(err, storage.ErrNotFound):
		return "No pending message with id " + strconv.Quote(id) + " (dispatched or cancelled already?).", true
	case errors.Is(err, storage.ErrLeased):
		return strconv.Quote(id) + " is being dispatched; try again shortly.", true
	}
	return name + " " + strconv.Quote(id) + " failed: " + err.Error(), true
}

// refusedLoginInterval is how often refused logins are logged: the first at
// once, then a count at most this often, so that someone guessing tokens
// cannot flood the log.
const refusedLoginInterval = time.Minute

// refusedLogin logs a refused login, or counts it until the next log is due.
func (h *Handler) refusedLogin() {
	h.refusedMu.Lock()
	h.refused++
	now := h.opts.Now()
	if !h.refusedLogged.IsZero() && now.Sub(h.refusedLogged) < refusedLoginInterval && !now.Before(h.refusedLogged) {
		h.refusedMu.Unlock()
		return
	}
	n := h.refused
	h.refused, h.refusedLogged = 0, now
	h.refusedMu.Unlock()
	if n == 1 {
		h.log("login", "", "refused: wrong token")
		return
	}
	h.log("login", "", "refused: wrong token ("+strconv.Itoa(n)+" times since the last such line)")
}

func (h *Handler) log(action, id, outcome string) {
	if h.opts.Log != nil {
		h.opts.Log(action, id, outcome)
	}
}
