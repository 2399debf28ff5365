package admin

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/errorqueue"
	"github.com/delaybridge/delaybridge/intake"
	"github.com/delaybridge/delaybridge/message"
	"github.com/delaybridge/delaybridge/protocol/nsbtimeout"
	"github.com/delaybridge/delaybridge/wire"
)

// The error queue as a view (docs/contract.md §4.6, §6.3). A queue can only
// be read from its head: each request takes messages with basic.get without
// acknowledging them, acts on this endpoint's copies that match, and
// requeues the rest at the end of the pass. Listing therefore costs a read of
// every message up to the page's end, and the messages read are invisible
// to other consumers until the pass ends and come back marked redelivered
// (a quorum queue also counts the delivery in x-delivery-count).

// Bounds of one pass.
const (
	// DefaultErrorScan is how many messages a request reads after its
	// cursor unless it says otherwise.
	DefaultErrorScan = 1000
	// MaxErrorDepth bounds cursor + scan: how deep into the queue any
	// request reads.
	MaxErrorDepth = 10000
)

// ErrorsOp is what a pass does with the copies it selects.
type ErrorsOp int

// The ops of a pass.
const (
	ErrorsList ErrorsOp = iota
	ErrorsDelete
	ErrorsReplay
)

// ErrorsRequest is one pass over the error queue.
type ErrorsRequest struct {
	Op     ErrorsOp
	Filter ErrorFilter
	// Skip is the position (0: the head) where the pass starts; the
	// messages before it are read and requeued untouched.
	Skip int
	// Scan is the most messages the pass reads from Skip on.
	Scan int
	// Limit, when positive, ends the pass once that many copies matched.
	Limit int
	// Detail lists copies with their properties, headers and body.
	Detail bool
	// ReportForeign reports other endpoints' copies as skipped, as
	// POST /api/v1/replay-errors always has.
	ReportForeign bool
}

// ErrorsResult is the outcome of a pass.
type ErrorsResult struct {
	ReplayResult
	Errors  []ErrorCopyJSON
	Deleted int
	// Scanned counts the messages read from Skip on; Foreign those among
	// them that are not this endpoint's failures.
	Scanned, Foreign int
	// End: the pass reached the end of the queue. Next, when positive, is
	// where a list pass that did not reach it would go on.
	End  bool
	Next int
}

// ErrorFilter selects copies. Zero fields select everything.
type ErrorFilter struct {
	ID    string // the copy's message id (message-id, else NServiceBus.MessageId)
	Stage string
	// Destination is a queue, or with Exchange set the routing key (any
	// when empty) of that exchange's destinations.
	Destination, Exchange string
	ExceptionType         string
	// FailedFrom (inclusive) and FailedTo (exclusive) bound
	// x-delaybridge-failed-at.
	FailedFrom, FailedTo time.Time
}

// IsEmpty: the filter selects every copy.
func (f ErrorFilter) IsEmpty() bool { return f == ErrorFilter{} }

func (f *ErrorFilter) match(c *ErrorCopyJSON) bool {
	switch {
	case f.ID != "" && c.ID != f.ID,
		f.Stage != "" && c.Stage != f.Stage,
		f.ExceptionType != "" && c.ExceptionType != f.ExceptionType:
		return false
	case f.Exchange != "":
		if c.Exchange != f.Exchange || c.RoutingKey == nil || (f.Destination != "" && *c.RoutingKey != f.Destination) {
			return false
		}
	case f.Destination != "" && (c.Exchange != "" || c.Destination != f.Destination):
		return false
	}
	if !f.FailedFrom.IsZero() && (c.FailedAt == nil || c.FailedAt.Before(f.FailedFrom)) {
		return false
	}
	if !f.FailedTo.IsZero() && (c.FailedAt == nil || !c.FailedAt.Before(f.FailedTo)) {
		return false
	}
	return true
}

// ErrorCopyJSON is one copy on the error queue. DestJSON is for a dispatch
// failure where the forward went, for an ingest failure what the
// destination headers name (empty when they name nothing valid).
type ErrorCopyJSON struct {
	ID string `json:"id"`
	// Position is the copy's place in the error queue when it was read
	// (0: the head).
	Position int        `json:"position"`
	Stage    string     `json:"stage"`
	Reason   string     `json:"reason"`
	FailedAt *time.Time `json:"failed_at,omitempty"`
	Attempts int        `json:"attempts"`
	DestJSON
	ExceptionType string `json:"exception_type,omitempty"`
	// Redelivered: the broker delivered the copy before (another read of
	// the queue, a consumer that died, an earlier pass).
	Redelivered bool `json:"redelivered"`

	// Show only.
	MessageJSON
}

// ErrorListJSON is the response of GET /api/v1/errors.
type ErrorListJSON struct {
	Errors []ErrorCopyJSON `json:"errors"`
	// Scanned counts the messages read after the cursor, other endpoints'
	// failures (OtherEndpoints of them) included.
	Scanned        int             `json:"scanned"`
	OtherEndpoints int             `json:"other_endpoints"`
	Unreadable     []ReplaySkipped `json:"unreadable,omitempty"`
	Next           string          `json:"next,omitempty"`
}

// ErrorDeleteJSON is the response of DELETE /api/v1/errors[/{id}].
type ErrorDeleteJSON struct {
	Deleted int `json:"deleted"`
	Scanned int `json:"scanned"`
}

// ErrorReplayJSON is the response of POST /api/v1/errors[/{id}]/replay.
type ErrorReplayJSON struct {
	ReplayResult
	Scanned int `json:"scanned"`
}

// routeErrors adds the error-queue routes.
func (h *handler) routeErrors() {
	h.mux.HandleFunc("GET /api/v1/errors", h.errorsList)
	h.mux.HandleFunc("GET /api/v1/errors/{id}", h.errorsShow)
	h.mux.HandleFunc("DELETE /api/v1/errors", h.errorsDelete)
	h.mux.HandleFunc("DELETE /api/v1/errors/{id}", h.errorsDelete)
	h.mux.HandleFunc("POST /api/v1/errors/replay", h.errorsReplay)
	h.mux.HandleFunc("POST /api/v1/errors/{id}/replay", h.errorsReplay)
}

// describe reads a copy's summary; with detail, its message too.
func describe(d *amqp.Delivery, pos int, detail bool) ErrorCopyJSON {
	f := errorqueue.Describe(d.Headers)
	c := ErrorCopyJSON{Position: pos, Redelivered: d.Redelivered, Stage: f.Stage, Reason: f.Reason,
		ExceptionType: f.ExceptionType, FailedAt: utc(f.FailedAt), Attempts: f.Attempts}
	c.ID, _ = intake.ParseID(d)
	if dest, err := nsbtimeout.ForwardedTo(d.Headers); err == nil {
		c.DestJSON = NewDestJSON(dest)
	}
	if detail {
		c.MessageJSON = messageDetail(message.FromDelivery(d))
	}
	return c
}

// messageDetail renders a message's properties, headers and body for show.
func messageDetail(p amqp.Publishing) MessageJSON {
	props := &PropertiesJSON{
		ContentType: p.ContentType, ContentEncoding: p.ContentEncoding, DeliveryMode: p.DeliveryMode,
		Priority: p.Priority, CorrelationID: p.CorrelationId, ReplyTo: p.ReplyTo, Expiration: p.Expiration,
		MessageID: p.MessageId, Timestamp: utc(p.Timestamp), Type: p.Type, UserID: p.UserId, AppID: p.AppId,
	}
	headers := map[string]any{}
	for k, v := range p.Headers {
		headers[k] = JSONValue(v)
	}
	body := base64.StdEncoding.EncodeToString(p.Body)
	n := len(p.Body)
	return MessageJSON{Properties: props, Headers: headers, BodyBase64: &body, BodyBytes: &n}
}

// errorsRequest reads the query of an error-queue request: the filters,
// scan and (list only) cursor and limit. The {id} in the path, when there
// is one, is the id filter.
func errorsRequest(r *http.Request, op ErrorsOp) (ErrorsRequest, error) {
	q := r.URL.Query()
	req := ErrorsRequest{Op: op, Scan: DefaultErrorScan}
	f := &req.Filter
	if id := r.PathValue("id"); id != "" || q.Has("id") {
		if id == "" {
			id = q.Get("id")
		}
		if err := wire.ValidateID("id", id); err != nil {
			return req, fmt.Errorf("invalid message id: %w", err)
		}
		f.ID = id
	}
	switch f.Stage = q.Get("stage"); f.Stage {
	case "", wire.StageIngest, wire.StageDispatch:
	default:
		return req, fmt.Errorf("stage %q must be %s or %s", f.Stage, wire.StageIngest, wire.StageDispatch)
	}
	// As for timeouts: exchange without routing_key is any routing key.
	var err error
	if f.Destination, f.Exchange, err = destinationFilter(q); err != nil {
		return req, err
	}
	f.ExceptionType = q.Get("exception_type")
	for name, t := range map[string]*time.Time{"failed_from": &f.FailedFrom, "failed_to": &f.FailedTo} {
		if v := q.Get(name); v != "" {
			if *t, err = parseTime(name, v); err != nil {
				return req, err
			}
		}
	}
	if !f.FailedFrom.IsZero() && !f.FailedTo.IsZero() && f.FailedTo.Before(f.FailedFrom) {
		return req, errors.New("failed_to is before failed_from")
	}
	num := func(name string, lo, hi int, into *int) error {
		v := q.Get(name)
		if v == "" {
			return nil
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < lo || n > hi {
			return fmt.Errorf("%s %q must be an integer from %d to %d", name, v, lo, hi)
		}
		*into = n
		return nil
	}
	if err := num("scan", 1, MaxErrorDepth, &req.Scan); err != nil {
		return req, err
	}
	if op == ErrorsList {
		req.Limit = DefaultLimit
		if err := num("limit", 1, MaxLimit, &req.Limit); err != nil {
			return req, err
		}
		if err := num("cursor", 0, MaxErrorDepth-1, &req.Skip); err != nil {
			return req, fmt.Errorf("invalid cursor (use the \"next\" of a previous page): %w", err)
		}
	}
	if req.Skip+req.Scan > MaxErrorDepth {
		req.Scan = MaxErrorDepth - req.Skip
	}
	return req, nil
}

// errorsPass reads the request (errorsRequest, then check when set) and
// runs its pass, answering the request itself when either fails.
func (h *handler) errorsPass(w http.ResponseWriter, r *http.Request, op ErrorsOp, check func(*ErrorsRequest) error) (ErrorsRequest, ErrorsResult, bool) {
	req, err := errorsRequest(r, op)
	if err == nil && check != nil {
		err = check(&req)
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return req, ErrorsResult{}, false
	}
	if h.opts.Errors == nil {
		writeError(w, http.StatusNotImplemented, "the error queue is not available in this bridge")
		return req, ErrorsResult{}, false
	}
	res, err := h.opts.Errors(r.Context(), req)
	if err != nil {
		h.opts.Logger.Error().Err(err).Msg("admin API: error queue pass failed")
		writeJSON(w, http.StatusBadGateway, struct {
			ErrorJSON
			ReplayResult
			Deleted int `json:"deleted,omitempty"`
		}{ErrorJSON{"error queue: " + err.Error()}, res.ReplayResult, res.Deleted})
		return req, res, false
	}
	return req, res, true
}

// notFound answers that no copy has the id of req's path.
func notFound(w http.ResponseWriter, req ErrorsRequest) {
	writeError(w, http.StatusNotFound, fmt.Sprintf("no copy of this endpoint with id %q among the first %d messages of the error queue", req.Filter.ID, req.Skip+req.Scan))
}

func (h *handler) errorsList(w http.ResponseWriter, r *http.Request) {
	_, res, ok := h.errorsPass(w, r, ErrorsList, nil)
	if !ok {
		return
	}
	out := ErrorListJSON{Errors: res.Errors, Scanned: res.Scanned, OtherEndpoints: res.Foreign, Unreadable: res.Details}
	if out.Errors == nil {
		out.Errors = []ErrorCopyJSON{}
	}
	if res.Next > 0 {
		out.Next = strconv.Itoa(res.Next)
	}
	writeJSON(w, http.StatusOK, out)
}

func (h *handler) errorsShow(w http.ResponseWriter, r *http.Request) {
	req, res, ok := h.errorsPass(w, r, ErrorsList, func(req *ErrorsRequest) error {
		req.Detail, req.Limit = true, MaxLimit
		return nil
	})
	if !ok {
		return
	}
	if len(res.Errors) == 0 {
		notFound(w, req)
		return
	}
	// The same id may have failed more than once: every copy is shown.
	writeJSON(w, http.StatusOK, ErrorListJSON{Errors: res.Errors, Scanned: res.Scanned, OtherEndpoints: res.Foreign, Unreadable: res.Details})
}

func (h *handler) errorsDelete(w http.ResponseWriter, r *http.Request) {
	req, res, ok := h.errorsPass(w, r, ErrorsDelete, func(req *ErrorsRequest) error {
		if req.Filter.IsEmpty() && r.URL.Query().Get("all") != "true" {
			return errors.New("give a filter (id, stage, destination, exchange, routing_key, exception_type, failed_from, failed_to), or all=true to delete every copy of this endpoint among the messages read")
		}
		return nil
	})
	if !ok {
		return
	}
	if req.Filter.ID != "" && r.PathValue("id") != "" && res.Deleted == 0 {
		notFound(w, req)
		return
	}
	h.opts.Logger.Info().Int("deleted", res.Deleted).Int("scanned", res.Scanned).Msg("admin API: deleted copies from the error queue")
	writeJSON(w, http.StatusOK, ErrorDeleteJSON{Deleted: res.Deleted, Scanned: res.Scanned})
}

func (h *handler) errorsReplay(w http.ResponseWriter, r *http.Request) {
	req, res, ok := h.errorsPass(w, r, ErrorsReplay, nil)
	if !ok {
		return
	}
	if req.Filter.ID != "" && r.PathValue("id") != "" && res.Replayed == 0 && res.Skipped == 0 {
		notFound(w, req)
		return
	}
	h.ops.replayed(res)
	writeJSON(w, http.StatusOK, ErrorReplayJSON{ReplayResult: res.ReplayResult, Scanned: res.Scanned})
}

// ErrorsFunc is Replayer.Errors's signature, for Options.
type ErrorsFunc = func(ctx context.Context, req ErrorsRequest) (ErrorsResult, error)
