// Package admin serves the bridge's admin API under /api/v1/ (docs/contract.md §6.3):
// list, inspect, cancel, reschedule and dispatch
// pending timeouts, count them, replay dispatch failures from the error
// queue back into the store, and pause and resume destinations (pause.go).
//
// The API is JSON only. It exists only when a bearer token is configured
// (DELAYBRIDGE_ADMIN_TOKEN), and then every request must carry
// "Authorization: Bearer <token>".
package admin

import (
	"context"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/big"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/rs/zerolog"

	"github.com/delaybridge/delaybridge/message"
	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/wire"
)

// List limits.
const (
	DefaultLimit = 100
	MaxLimit     = 1000
)

// maxBodyBytes bounds request bodies (a PATCH is a few dozen bytes).
const maxBodyBytes = 64 << 10

// Options configure the handler.
type Options struct {
	Store storage.Store
	// Token is the bearer token every request must carry. Empty: the API is
	// disabled and every request gets 404 with a JSON error saying so.
	Token string
	// Now is the clock used for "dispatch now"; nil means time.Now.
	Now func() time.Time
	// Wake, when set, is called after a change that may make a timeout due
	// sooner (reschedule, dispatch, replay), so the poller looks at once.
	Wake func(due time.Time)
	// ScheduleWake, when set, is called after a schedule was stored or
	// resumed, so the firer reads the next fire time again (schedules.go).
	ScheduleWake func()
	// Replay, when set, serves POST /api/v1/replay-errors.
	Replay func(ctx context.Context, limit int) (ReplayResult, error)
	// Errors, when set, serves /api/v1/errors (errors.go).
	Errors ErrorsFunc
	Logger zerolog.Logger
}

// DestJSON is a destination in the answers (TimeoutJSON, ScheduleJSON,
// DestinationJSON, ErrorCopyJSON). A queue destination is Destination, as
// it always was; an exchange destination is Exchange and RoutingKey
// (present even when empty), with Destination left empty so that no client
// takes a routing key for a queue.
type DestJSON struct {
	Destination string  `json:"destination"`
	Exchange    string  `json:"exchange,omitempty"`
	RoutingKey  *string `json:"routing_key,omitempty"`
}

// NewDestJSON is d as the answers write it.
func NewDestJSON(d wire.Destination) DestJSON {
	if d.IsQueue() {
		return DestJSON{Destination: d.Key}
	}
	key := d.Key
	return DestJSON{Exchange: d.Exchange, RoutingKey: &key}
}

// Dest is the destination j names.
func (j DestJSON) Dest() wire.Destination {
	if j.Exchange == "" {
		return wire.Queue(j.Destination)
	}
	d := wire.Destination{Exchange: j.Exchange}
	if j.RoutingKey != nil {
		d.Key = *j.RoutingKey
	}
	return d
}

// TimeoutJSON is one timeout in list and show responses.
type TimeoutJSON struct {
	ID string `json:"id"`
	// Send tells apart the sends of one id pending at once
	// (docs/contract.md §2.4): 2, 3, ... for the later ones; absent (0)
	// for the send stored under the id itself.
	Send int `json:"send,omitempty"`
	DestJSON
	DueAt         time.Time  `json:"due_at"`
	ReceivedAt    time.Time  `json:"received_at"`
	Attempts      int        `json:"attempts"`
	LastError     string     `json:"last_error"`
	Leased        bool       `json:"leased"`
	LockExpiresAt *time.Time `json:"lock_expires_at,omitempty"`
	NotBefore     *time.Time `json:"not_before,omitempty"`
	SagaID        string     `json:"saga_id,omitempty"`
	// Paused: the destination is paused; the timeout is held past its due
	// time until it is resumed (absent: false).
	Paused bool `json:"paused,omitempty"`

	// Show only: how many sends of the id are pending, when more than
	// one (the item is the one due first).
	Sends int `json:"sends,omitempty"`
	MessageJSON
}

// MessageJSON is a message as show answers it; list items leave it out.
type MessageJSON struct {
	Properties *PropertiesJSON `json:"properties,omitempty"`
	Headers    map[string]any  `json:"headers,omitempty"`
	BodyBase64 *string         `json:"body_base64,omitempty"`
	BodyBytes  *int            `json:"body_bytes,omitempty"`
}

// PropertiesJSON are the AMQP basic properties of a stored message.
type PropertiesJSON struct {
	ContentType     string     `json:"content_type,omitempty"`
	ContentEncoding string     `json:"content_encoding,omitempty"`
	DeliveryMode    uint8      `json:"delivery_mode,omitempty"`
	Priority        uint8      `json:"priority,omitempty"`
	CorrelationID   string     `json:"correlation_id,omitempty"`
	ReplyTo         string     `json:"reply_to,omitempty"`
	Expiration      string     `json:"expiration,omitempty"`
	MessageID       string     `json:"message_id,omitempty"`
	Timestamp       *time.Time `json:"timestamp,omitempty"`
	Type            string     `json:"type,omitempty"`
	UserID          string     `json:"user_id,omitempty"`
	AppID           string     `json:"app_id,omitempty"`
}

// CancelSagaJSON is the response of DELETE /api/v1/timeouts?saga_id=S:
// how many of the saga's timeouts were cancelled, and how many were being
// dispatched and so were not.
type CancelSagaJSON struct {
	Cancelled int `json:"cancelled"`
	Leased    int `json:"leased"`
}

// ListJSON is the response of GET /api/v1/timeouts.
type ListJSON struct {
	Timeouts []TimeoutJSON `json:"timeouts"`
	Next     string        `json:"next,omitempty"`
}

// StatsJSON is the response of GET /api/v1/stats. Pending and Leased are
// left out when the store cannot count (it is no storage.Stater).
type StatsJSON struct {
	Pending *int       `json:"pending,omitempty"`
	Leased  *int       `json:"leased,omitempty"`
	NextDue *time.Time `json:"next_due,omitempty"`
}

// ReplayResult is the response of POST /api/v1/replay-errors.
type ReplayResult struct {
	Replayed int             `json:"replayed"`
	Skipped  int             `json:"skipped"`
	Details  []ReplaySkipped `json:"skipped_messages,omitempty"`
}

// ReplaySkipped says why one message stayed on the error queue.
type ReplaySkipped struct {
	MessageID string `json:"message_id,omitempty"`
	Reason    string `json:"reason"`
}

// ErrorJSON is every error response.
type ErrorJSON struct {
	Error string `json:"error"`
}

type handler struct {
	opts Options
	ops  *Ops
	mux  *http.ServeMux
}

// Ops are the admin API's actions on one message, for the other front ends
// of the same operations (the status page's forms): each does what its
// endpoint does, logs it the same way, and returns the store's errors
// (storage.ErrNotFound, storage.ErrLeased, …) for the caller to word.
type Ops struct{ opts Options }

// NewOps returns the operations over opts (Store, Now, Wake, Errors, Logger;
// Token is not checked here: the caller authenticates).
func NewOps(opts Options) *Ops {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Wake == nil {
		opts.Wake = func(time.Time) {}
	}
	if opts.ScheduleWake == nil {
		opts.ScheduleWake = func() {}
	}
	return &Ops{opts: opts}
}

// Cancel cancels every pending send of an id that is not being dispatched
// (DELETE /api/v1/timeouts/{id}). An id with nothing pending is not
// blocked: the cancel leaves a tombstone only when it removed something
// (storage.CancelFound; docs/contract.md §6.3).
func (o *Ops) Cancel(ctx context.Context, id string) error {
	if err := wire.ValidateID("id", id); err != nil {
		return fmt.Errorf("invalid timeout id: %w", err)
	}
	if err := o.opts.Store.Cancel(ctx, id, storage.CancelFound); err != nil {
		return err
	}
	o.opts.Logger.Info().Str("id", id).Msg("admin API: timeout cancelled")
	return nil
}

// DispatchNow makes a pending timeout due now
// (POST /api/v1/timeouts/{id}/dispatch).
func (o *Ops) DispatchNow(ctx context.Context, id string) error {
	if err := wire.ValidateID("id", id); err != nil {
		return fmt.Errorf("invalid timeout id: %w", err)
	}
	return o.setDue(ctx, "dispatch", id, o.opts.Now())
}

func (o *Ops) setDue(ctx context.Context, op, id string, due time.Time) error {
	if err := o.opts.Store.Reschedule(ctx, id, due); err != nil {
		return err
	}
	o.opts.Wake(due)
	o.opts.Logger.Info().Str("id", id).Time("due_at", due).Str("op", op).Msg("admin API: timeout rescheduled")
	return nil
}

// ErrNoErrorQueue: the bridge has no error-queue access (Options.Errors).
var ErrNoErrorQueue = errors.New("the error queue is not available in this bridge")

// ReplayError replays this endpoint's copies with the message id id from
// the first DefaultErrorScan messages of the error queue
// (POST /api/v1/errors/{id}/replay); found is false when none has it.
func (o *Ops) ReplayError(ctx context.Context, id string) (res ErrorsResult, found bool, err error) {
	if err := wire.ValidateID("id", id); err != nil {
		return res, false, fmt.Errorf("invalid message id: %w", err)
	}
	if o.opts.Errors == nil {
		return res, false, ErrNoErrorQueue
	}
	res, err = o.opts.Errors(ctx, ErrorsRequest{Op: ErrorsReplay, Filter: ErrorFilter{ID: id}, Scan: DefaultErrorScan})
	if err != nil {
		o.opts.Logger.Error().Err(err).Msg("admin API: error queue pass failed")
		return res, false, err
	}
	o.replayed(res)
	return res, res.Replayed > 0 || res.Skipped > 0, nil
}

// replayed wakes the poller after a replay and logs it.
func (o *Ops) replayed(res ErrorsResult) {
	if res.Replayed > 0 {
		o.opts.Wake(o.opts.Now())
	}
	o.opts.Logger.Info().Int("replayed", res.Replayed).Int("skipped", res.Skipped).Msg("admin API: replayed copies from the error queue")
}

// New returns the admin handler, to be mounted at /api/v1/.
func New(opts Options) http.Handler {
	ops := NewOps(opts)
	h := &handler{opts: ops.opts, ops: ops, mux: http.NewServeMux()} // opts with NewOps's defaults
	h.mux.HandleFunc("GET /api/v1/timeouts", h.list)
	h.mux.HandleFunc("GET /api/v1/timeouts/{id}", h.show)
	h.mux.HandleFunc("DELETE /api/v1/timeouts/{id}", h.cancel)
	h.mux.HandleFunc("DELETE /api/v1/timeouts", h.cancelMany)
	h.mux.HandleFunc("POST /api/v1/timeouts/dispatch", h.dispatchMany)
	h.mux.HandleFunc("POST /api/v1/timeouts/reschedule", h.rescheduleMany)
	h.mux.HandleFunc("PATCH /api/v1/timeouts/{id}", h.reschedule)
	h.mux.HandleFunc("POST /api/v1/timeouts/{id}/dispatch", h.dispatch)
	h.mux.HandleFunc("GET /api/v1/stats", h.stats)
	h.mux.HandleFunc("POST /api/v1/replay-errors", h.replay)
	h.routeErrors()
	h.routePauses()
	h.routeSchedules()
	return h
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if h.opts.Token == "" {
		writeError(w, http.StatusNotFound, "the admin API is disabled (set DELAYBRIDGE_ADMIN_TOKEN, or DELAYBRIDGE_ADMIN_TOKEN_FILE to a file the bridge can write)")
		return
	}
	if !h.authorized(r) {
		w.Header().Set("WWW-Authenticate", `Bearer realm="delaybridge"`)
		writeError(w, http.StatusUnauthorized, "missing or wrong bearer token (Authorization: Bearer <DELAYBRIDGE_ADMIN_TOKEN>)")
		return
	}
	// The ServeMux answers 405 in plain text; keep every answer JSON.
	rec := &methodCheck{ResponseWriter: w, r: r}
	h.mux.ServeHTTP(rec, r)
}

func (h *handler) authorized(r *http.Request) bool {
	auth := r.Header.Get("Authorization")
	scheme, token, ok := strings.Cut(auth, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return false
	}
	token = strings.TrimSpace(token)
	return subtle.ConstantTimeCompare([]byte(token), []byte(h.opts.Token)) == 1
}

// methodCheck turns the mux's plain-text 404 and 405 into JSON errors.
type methodCheck struct {
	http.ResponseWriter
	r       *http.Request
	swallow bool
}

func (m *methodCheck) WriteHeader(code int) {
	if (code == http.StatusMethodNotAllowed || code == http.StatusNotFound) && !m.swallow &&
		!strings.HasPrefix(m.Header().Get("Content-Type"), "application/json") {
		m.swallow = true
		msg := "no such admin endpoint: " + m.r.Method + " " + m.r.URL.Path
		if code == http.StatusMethodNotAllowed {
			msg = "method " + m.r.Method + " not allowed here (allowed: " + m.Header().Get("Allow") + ")"
		}
		m.Header().Del("X-Content-Type-Options")
		writeJSON(m.ResponseWriter, code, ErrorJSON{Error: msg})
		return
	}
	m.ResponseWriter.WriteHeader(code)
}

func (m *methodCheck) Write(b []byte) (int, error) {
	if m.swallow {
		return len(b), nil
	}
	return m.ResponseWriter.Write(b)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func writeError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, ErrorJSON{Error: msg})
}

// storeError maps store errors to responses.
func (h *handler) storeError(w http.ResponseWriter, op, id string, err error) {
	switch {
	case errors.Is(err, storage.ErrNotFound):
		writeError(w, http.StatusNotFound, fmt.Sprintf("no pending timeout with id %q", id))
	case errors.Is(err, storage.ErrLeased):
		writeError(w, http.StatusConflict, fmt.Sprintf("timeout %q is being dispatched; try again shortly", id))
	case errors.Is(err, storage.ErrDueOutOfRange):
		writeError(w, http.StatusBadRequest, err.Error())
	default:
		h.opts.Logger.Error().Err(err).Str("op", op).Str("id", id).Msg("admin API: store error")
		writeError(w, http.StatusInternalServerError, op+": "+err.Error())
	}
}

// pathID returns the request's {id}, or answers 400 when no stored timeout
// can have it (the rules of wire.ValidateID): such an id never reaches the
// store, which might refuse it with an error that reads as an outage.
func pathID(w http.ResponseWriter, r *http.Request) (string, bool) {
	id := r.PathValue("id")
	if err := wire.ValidateID("id", id); err != nil {
		writeError(w, http.StatusBadRequest, "invalid timeout id: "+err.Error())
		return "", false
	}
	return id, true
}

func parseTime(name, v string) (time.Time, error) {
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return time.Time{}, fmt.Errorf("%s %q is not an RFC 3339 time like 2026-11-21T20:00:00Z", name, v)
	}
	return t, nil
}

// queryLimit reads the query's limit: DefaultLimit when it has none,
// else an integer from 1 to MaxLimit. Otherwise it answers 400 and returns
// false.
func queryLimit(w http.ResponseWriter, q url.Values) (int, bool) {
	v := q.Get("limit")
	if v == "" {
		return DefaultLimit, true
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > MaxLimit {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("limit %q must be an integer from 1 to %d", v, MaxLimit))
		return 0, false
	}
	return n, true
}

func (h *handler) list(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f, err := parseFilter(q)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	limit, ok := queryLimit(w, q)
	if !ok {
		return
	}
	f.After, f.Limit = q.Get("cursor"), limit
	rows, next, err := h.opts.Store.List(r.Context(), f)
	if err != nil {
		if f.After != "" && strings.Contains(err.Error(), "cursor") {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("invalid cursor %q (use the \"next\" of a previous page)", f.After))
			return
		}
		h.storeError(w, "list", "", err)
		return
	}
	out := ListJSON{Timeouts: make([]TimeoutJSON, 0, len(rows)), Next: next}
	now := h.opts.Now()
	for i := range rows {
		out.Timeouts = append(out.Timeouts, summary(&rows[i], now))
	}
	writeJSON(w, http.StatusOK, out)
}

// filterParams are the query parameters of the bulk actions' selector;
// parseFilter reads them, and saga_id and id, which only the list takes
// (DELETE with saga_id cancels a saga, see cancelMany; an id's sends are
// cancelled, shown and rescheduled through /api/v1/timeouts/{id}).
var filterParams = []string{"destination", "exchange", "routing_key", "due_from", "due_to", "id_prefix", "header"}

// parseFilter reads the list's filters (filterParams and saga_id) into a
// ListFilter without paging.
func parseFilter(q url.Values) (storage.ListFilter, error) {
	var f storage.ListFilter
	var err error
	if f.Destination, f.Exchange, err = destinationFilter(q); err != nil {
		return f, err
	}
	if q.Has("saga_id") {
		f.SagaID = q.Get("saga_id")
		if err := wire.ValidateID("saga_id", f.SagaID); err != nil {
			return f, fmt.Errorf("invalid saga id filter: %w", err)
		}
	}
	if q.Has("id") {
		f.ID = q.Get("id")
		if err := wire.ValidateID("id", f.ID); err != nil {
			return f, fmt.Errorf("invalid id filter: %w", err)
		}
	}
	if v := q.Get("due_from"); v != "" {
		if f.DueFrom, err = parseTime("due_from", v); err != nil {
			return f, err
		}
	}
	if v := q.Get("due_to"); v != "" {
		if f.DueTo, err = parseTime("due_to", v); err != nil {
			return f, err
		}
	}
	if !f.DueFrom.IsZero() && !f.DueTo.IsZero() && f.DueTo.Before(f.DueFrom) {
		return f, errors.New("due_to is before due_from")
	}
	if q.Has("id_prefix") {
		f.IDPrefix = q.Get("id_prefix")
		if err := wire.ValidateID("id_prefix", f.IDPrefix); err != nil {
			return f, fmt.Errorf("invalid id_prefix filter: %w", err)
		}
	}
	if q.Has("header") {
		name, value, ok := strings.Cut(q.Get("header"), ":")
		if !ok || name == "" {
			return f, fmt.Errorf("header filter %q must be name:value, e.g. header=tenant:acme", q.Get("header"))
		}
		f.HeaderName, f.HeaderValue = name, value
	}
	return f, nil
}

// ParseListFilter reads the list's filters from a query as
// GET /api/v1/timeouts does (destination, exchange, routing_key, due_from,
// due_to, id_prefix, header, saga_id, id), without paging: the status
// page's search uses it.
func ParseListFilter(q url.Values) (storage.ListFilter, error) { return parseFilter(q) }

// bulkFilter reads the selector of a bulk action: the list's filters, at
// least one of them, and no other parameter (a cursor or a limit would
// suggest that only a page is changed).
func bulkFilter(q url.Values) (storage.ListFilter, error) {
	for k := range q {
		if !slices.Contains(filterParams, k) {
			return storage.ListFilter{}, fmt.Errorf("unknown parameter %q: a bulk action takes the list's filters (%s)", k, strings.Join(filterParams, ", "))
		}
	}
	f, err := parseFilter(q)
	if err == nil && f.Empty() {
		err = fmt.Errorf("a bulk action needs at least one filter (%s); it never applies to every pending timeout", strings.Join(filterParams, ", "))
	}
	return f, err
}

// destinationFilter reads the list's destination filters: destination=Q
// for a queue, or exchange=X with an optional routing_key=K, checked with
// the rules of wire. It returns storage.ListFilter's Destination and
// Exchange.
func destinationFilter(q url.Values) (dest, exchange string, err error) {
	dest, exchange = q.Get("destination"), q.Get("exchange")
	switch {
	case exchange == "":
		if q.Has("routing_key") {
			return "", "", errors.New("routing_key filters the rows of an exchange: give exchange too")
		}
		if dest != "" {
			if err := wire.ValidateDestination("destination", dest); err != nil {
				return "", "", fmt.Errorf("invalid destination filter: %w", err)
			}
		}
		return dest, "", nil
	case dest != "":
		return "", "", errors.New("destination (a queue) and exchange exclude each other: give one of them")
	case exchange == "amq.default":
		return "", "", errors.New("invalid exchange filter: amq.default is the default exchange, whose destinations are queues: filter them with destination")
	}
	if err := wire.ValidateExchange("exchange", exchange); err != nil {
		return "", "", fmt.Errorf("invalid exchange filter: %w", err)
	}
	key := q.Get("routing_key")
	if q.Has("routing_key") && key == "" {
		// ListFilter cannot tell "routing key empty" from "any routing key".
		return "", "", errors.New("routing_key is empty: an empty routing key cannot be filtered on; leave routing_key out to list every routing key of the exchange")
	}
	if err := wire.ValidateRoutingKey("routing_key", key); err != nil {
		return "", "", fmt.Errorf("invalid routing_key filter: %w", err)
	}
	return key, exchange, nil
}

func utc(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}

func summary(t *storage.Timeout, now time.Time) TimeoutJSON {
	id, send := wire.SplitKey(t.ID)
	if send == 1 {
		send = 0
	}
	j := TimeoutJSON{
		ID: id, Send: send, DestJSON: NewDestJSON(t.Dest()), DueAt: t.DueAt.UTC(), ReceivedAt: t.ReceivedAt.UTC(),
		Attempts: t.Attempts, LastError: t.LastError,
		Leased:    t.Lock != "" && t.LockExpiresAt.After(now),
		NotBefore: utc(t.NotBefore), SagaID: t.SagaID, Paused: t.Paused,
	}
	if t.Lock != "" {
		j.LockExpiresAt = utc(t.LockExpiresAt)
	}
	return j
}

func (h *handler) show(w http.ResponseWriter, r *http.Request) {
	id, ok := pathID(w, r)
	if !ok {
		return
	}
	t, sends, err := firstSend(r.Context(), h.opts.Store, id)
	if err != nil {
		h.storeError(w, "show", id, err)
		return
	}
	j := summary(&t, h.opts.Now())
	if sends > 1 {
		j.Sends = sends
	}
	p, err := message.Decode(t.Message)
	if err != nil {
		h.storeError(w, "decode stored message", id, err)
		return
	}
	j.MessageJSON = messageDetail(p)
	writeJSON(w, http.StatusOK, j)
}

// maxSends bounds the sends of one id that show counts: far more than are
// ever pending at once (docs/contract.md §2.4).
const maxSends = 100

// firstSend returns the send of id due first, with its message, and how
// many sends of id are pending (up to maxSends); storage.ErrNotFound when
// none is.
func firstSend(ctx context.Context, st storage.Store, id string) (storage.Timeout, int, error) {
	rows, _, err := st.List(ctx, storage.ListFilter{ID: id, Limit: maxSends})
	if err != nil {
		return storage.Timeout{}, 0, err
	}
	for _, r := range rows {
		// The row may be gone between the list and the read: take the
		// next.
		t, err := st.Get(ctx, r.ID)
		if errors.Is(err, storage.ErrNotFound) {
			continue
		}
		return t, len(rows), err
	}
	return storage.Timeout{}, 0, fmt.Errorf("admin: %q: %w", id, storage.ErrNotFound)
}

// JSONValue renders an AMQP field value for JSON: byte arrays as base64
// strings, timestamps as RFC 3339, decimals as decimal strings, tables as
// objects, arrays as arrays, non-finite floats as strings.
func JSONValue(v any) any {
	switch v := v.(type) {
	case []byte:
		return base64.StdEncoding.EncodeToString(v)
	case time.Time:
		return v.UTC().Format(time.RFC3339Nano)
	case amqp.Decimal:
		return decimalString(v)
	case amqp.Table:
		m := make(map[string]any, len(v))
		for k, x := range v {
			m[k] = JSONValue(x)
		}
		return m
	case []any:
		s := make([]any, len(v))
		for i, x := range v {
			s[i] = JSONValue(x)
		}
		return s
	case float32:
		return finite(float64(v), v)
	case float64:
		return finite(v, v)
	default:
		return v
	}
}

func finite(f float64, v any) any {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return strconv.FormatFloat(f, 'g', -1, 64)
	}
	return v
}

func decimalString(d amqp.Decimal) string {
	r := new(big.Rat).SetFrac(big.NewInt(int64(d.Value)), new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(d.Scale)), nil))
	return r.FloatString(int(d.Scale))
}

func (h *handler) cancel(w http.ResponseWriter, r *http.Request) {
	id, ok := pathID(w, r)
	if !ok {
		return
	}
	if err := h.ops.Cancel(r.Context(), id); err != nil {
		h.storeError(w, "cancel", id, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// cancelMany serves DELETE /api/v1/timeouts: by saga (saga_id) or in
// bulk (the list's filters).
func (h *handler) cancelMany(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if !q.Has("saga_id") {
		h.bulk(w, r, storage.BulkAction{Kind: storage.BulkCancel})
		return
	}
	h.cancelSaga(w, r, q)
}

// cancelSaga cancels every pending timeout of the saga in query saga_id
// that is not being dispatched (storage.SagaCanceller).
func (h *handler) cancelSaga(w http.ResponseWriter, r *http.Request, q url.Values) {
	for k := range q {
		if k != "saga_id" {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("unknown parameter %q: DELETE /api/v1/timeouts?saga_id= takes saga_id only", k))
			return
		}
	}
	if len(q["saga_id"]) != 1 {
		writeError(w, http.StatusBadRequest, "DELETE /api/v1/timeouts needs exactly one saga_id (to cancel one timeout: DELETE /api/v1/timeouts/{id})")
		return
	}
	saga := q.Get("saga_id")
	if err := wire.ValidateID("saga_id", saga); err != nil {
		writeError(w, http.StatusBadRequest, "invalid saga id: "+err.Error())
		return
	}
	n, leased, err := h.opts.Store.CancelSaga(r.Context(), saga)
	if err != nil {
		h.opts.Logger.Error().Err(err).Str("op", "cancel saga").Str("saga_id", saga).Msg("admin API: store error")
		writeError(w, http.StatusInternalServerError, "cancel saga: "+err.Error())
		return
	}
	h.opts.Logger.Info().Str("saga_id", saga).Int("cancelled", n).Int("leased", leased).Msg("admin API: saga's timeouts cancelled")
	writeJSON(w, http.StatusOK, CancelSagaJSON{Cancelled: n, Leased: leased})
}

type rescheduleBody struct {
	DueAt *string `json:"due_at"`
}

// BulkJSON is the answer of a bulk action: the count of rows it changed
// under the action's name (cancelled, dispatched or rescheduled), and how
// many selected rows were being dispatched and so left alone. OutOfRange
// (a shift only) counts rows a shift would move past the latest due time.
type BulkJSON struct {
	Cancelled   *int `json:"cancelled,omitempty"`
	Dispatched  *int `json:"dispatched,omitempty"`
	Rescheduled *int `json:"rescheduled,omitempty"`
	Leased      int  `json:"leased"`
	OutOfRange  *int `json:"out_of_range,omitempty"`
	// Error, on a failure midway: the counts are what was committed.
	Error string `json:"error,omitempty"`
}

func bulkJSON(a storage.BulkAction, res storage.BulkResult) BulkJSON {
	j := BulkJSON{Leased: res.Leased}
	n := res.Changed
	switch {
	case a.Kind == storage.BulkCancel:
		j.Cancelled = &n
	case a.Kind == storage.BulkSetDue && a.DueAt.IsZero():
		j.Dispatched = &n
	default:
		j.Rescheduled = &n
		if a.Kind == storage.BulkShift {
			oor := res.OutOfRange
			j.OutOfRange = &oor
		}
	}
	return j
}

func (h *handler) dispatchMany(w http.ResponseWriter, r *http.Request) {
	h.bulk(w, r, storage.BulkAction{Kind: storage.BulkSetDue}) // zero DueAt: now, see bulk
}

type bulkRescheduleBody struct {
	DueAt *string `json:"due_at"`
	Shift *string `json:"shift"`
}

func (h *handler) rescheduleMany(w http.ResponseWriter, r *http.Request) {
	const want = `want {"shift": "<Go duration, e.g. 10m or -1h30m>"} or {"due_at": "<RFC 3339 time>"}`
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	dec.DisallowUnknownFields()
	var body bulkRescheduleBody
	if err := dec.Decode(&body); err != nil {
		writeError(w, http.StatusBadRequest, "bad request body ("+want+"): "+err.Error())
		return
	}
	if dec.Decode(&struct{}{}) != io.EOF {
		writeError(w, http.StatusBadRequest, "bad request body: want exactly one JSON object")
		return
	}
	var a storage.BulkAction
	switch {
	case (body.DueAt == nil) == (body.Shift == nil):
		writeError(w, http.StatusBadRequest, "bad request body: give one of shift and due_at ("+want+")")
		return
	case body.Shift != nil:
		d, err := time.ParseDuration(*body.Shift)
		if err != nil || d == 0 {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("shift %q must be a non-zero Go duration like 10m, 2h or -30s", *body.Shift))
			return
		}
		a = storage.BulkAction{Kind: storage.BulkShift, Shift: d}
	default:
		due, err := parseTime("due_at", *body.DueAt)
		if err == nil {
			err = storage.CheckDueAt(due)
		}
		if err != nil {
			writeError(w, http.StatusBadRequest, err.Error())
			return
		}
		a = storage.BulkAction{Kind: storage.BulkSetDue, DueAt: due}
	}
	h.bulk(w, r, a)
}

// bulk applies a to every pending timeout the request's filters select
// (storage.Bulker). A BulkSetDue with a zero DueAt is dispatch-now: the
// due time is the handler's now.
func (h *handler) bulk(w http.ResponseWriter, r *http.Request, a storage.BulkAction) {
	f, err := bulkFilter(r.URL.Query())
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	act := a
	if act.Kind == storage.BulkSetDue && act.DueAt.IsZero() {
		act.DueAt = h.opts.Now()
	}
	res, err := h.opts.Store.Bulk(r.Context(), f, act)
	out := bulkJSON(a, res)
	log := h.opts.Logger.Info()
	if err != nil {
		log = h.opts.Logger.Error().Err(err)
		out.Error = "bulk action stopped midway (the counts are what it did): " + err.Error()
	}
	if res.Changed > 0 && act.Kind != storage.BulkCancel {
		h.opts.Wake(h.opts.Now())
	}
	log.Str("op", bulkOp(a)).Str("filter", r.URL.RawQuery).Int("changed", res.Changed).Int("leased", res.Leased).
		Int("out_of_range", res.OutOfRange).Msg("admin API: bulk action")
	code := http.StatusOK
	if err != nil {
		code = http.StatusInternalServerError
	}
	writeJSON(w, code, out)
}

func bulkOp(a storage.BulkAction) string {
	switch {
	case a.Kind == storage.BulkCancel:
		return "cancel"
	case a.Kind == storage.BulkSetDue && a.DueAt.IsZero():
		return "dispatch"
	}
	return "reschedule"
}

func (h *handler) reschedule(w http.ResponseWriter, r *http.Request) {
	id, ok := pathID(w, r)
	if !ok {
		return
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	dec.DisallowUnknownFields()
	var body rescheduleBody
	if err := dec.Decode(&body); err != nil {
		writeError(w, http.StatusBadRequest, "bad request body (want {\"due_at\": \"<RFC 3339 time>\"}): "+err.Error())
		return
	}
	if dec.Decode(&struct{}{}) != io.EOF {
		writeError(w, http.StatusBadRequest, "bad request body: want exactly one JSON object")
		return
	}
	if body.DueAt == nil {
		writeError(w, http.StatusBadRequest, "bad request body: due_at is required")
		return
	}
	due, err := parseTime("due_at", *body.DueAt)
	if err == nil {
		err = storage.CheckDueAt(due) // before the store: not a store error
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	h.setDue(w, r, "reschedule", id, due)
}

func (h *handler) dispatch(w http.ResponseWriter, r *http.Request) {
	id, ok := pathID(w, r)
	if !ok {
		return
	}
	h.setDue(w, r, "dispatch", id, h.opts.Now())
}

func (h *handler) setDue(w http.ResponseWriter, r *http.Request, op, id string, due time.Time) {
	if err := h.ops.setDue(r.Context(), op, id, due); err != nil {
		h.storeError(w, op, id, err)
		return
	}
	t, sends, err := firstSend(r.Context(), h.opts.Store, id)
	if err != nil {
		// Dispatched (or cancelled) already: report what was set.
		writeJSON(w, http.StatusOK, TimeoutJSON{ID: id, DueAt: due.UTC()})
		return
	}
	j := summary(&t, h.opts.Now())
	if sends > 1 {
		j.Sends = sends
	}
	writeJSON(w, http.StatusOK, j)
}

// stats reports the counts and the next due time.
func (h *handler) stats(w http.ResponseWriter, r *http.Request) {
	var out StatsJSON
	pending, leased, err := h.opts.Store.Stats(r.Context())
	if err != nil {
		h.storeError(w, "stats", "", err)
		return
	}
	out.Pending, out.Leased = &pending, &leased
	at, ok, err := h.opts.Store.NextDue(r.Context())
	if err != nil {
		h.storeError(w, "stats", "", err)
		return
	}
	if ok {
		out.NextDue = utc(at)
	}
	writeJSON(w, http.StatusOK, out)
}

func (h *handler) replay(w http.ResponseWriter, r *http.Request) {
	if h.opts.Replay == nil {
		writeError(w, http.StatusNotImplemented, "replay is not available in this bridge")
		return
	}
	limit, ok := queryLimit(w, r.URL.Query())
	if !ok {
		return
	}
	res, err := h.opts.Replay(r.Context(), limit)
	if err != nil {
		h.opts.Logger.Error().Err(err).Msg("admin API: replay failed")
		writeJSON(w, http.StatusBadGateway, struct {
			ErrorJSON
			ReplayResult
		}{ErrorJSON{"replay: " + err.Error()}, res})
		return
	}
	if res.Replayed > 0 {
		h.opts.Wake(h.opts.Now())
	}
	h.opts.Logger.Info().Int("replayed", res.Replayed).Int("skipped", res.Skipped).Msg("admin API: replayed dispatch failures from the error queue")
	writeJSON(w, http.StatusOK, res)
}
