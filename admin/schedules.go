package admin

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/cron"
	"github.com/delaybridge/delaybridge/message"
	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/wire"
)

// Recurring schedules (storage.Scheduler, docs/contract.md §2.11, §6.3):
// GET /api/v1/schedules, POST /api/v1/schedules (create or replace),
// GET and DELETE /api/v1/schedules/{key}, and POST …/{key}/pause, …/resume
// and …/fire. {key} is the schedule's key as listed ("amqp:<message id>"
// for a schedule made on E.Timeouts, "admin:<id>" for one made here),
// path-escaped.

// ScheduleSourceAdmin is the source of the schedules the admin API makes.
const ScheduleSourceAdmin = "admin"

// NextFireTimes is how many coming fire times show lists.
const NextFireTimes = 5

// ScheduleJSON is one schedule in the answers of the schedule endpoints.
type ScheduleJSON struct {
	Key         string     `json:"key"`
	ID          string     `json:"id"`
	Source      string     `json:"source"`
	Cron        string     `json:"cron"`
	TimeZone    string     `json:"timezone"`
	Start       *time.Time `json:"start,omitempty"`
	End         *time.Time `json:"end,omitempty"`
	Misfire     string     `json:"misfire"`
	Description string     `json:"description,omitempty"`
	DestJSON
	// State is active, paused or ended (no fire time left, or it could
	// not be planned: LastError).
	State      string     `json:"state"`
	NextFireAt *time.Time `json:"next_fire_at,omitempty"`
	PrevFireAt *time.Time `json:"prev_fire_at,omitempty"`
	Generation int64      `json:"generation"`
	Fires      int64      `json:"fires"`
	Misfires   int64      `json:"misfires"`
	LastError  string     `json:"last_error,omitempty"`
	UpdatedAt  time.Time  `json:"updated_at"`
	// Show only: the coming fire times (up to NextFireTimes, in the
	// schedule's zone, the first being NextFireAt) and the message every
	// fire forwards.
	NextFireTimes []string `json:"next_fire_times,omitempty"`
	// Changed, in the answers of pause and resume: false when the
	// schedule was paused (active) already.
	Changed *bool `json:"changed,omitempty"`
	MessageJSON
}

// SchedulesJSON is the answer of GET /api/v1/schedules.
type SchedulesJSON struct {
	Schedules []ScheduleJSON `json:"schedules"`
	Next      string         `json:"next,omitempty"`
}

// FireJSON is the answer of POST /api/v1/schedules/{key}/fire.
type FireJSON struct {
	Key string `json:"key"`
	// ID is the fire's row key and message id.
	ID     string    `json:"id"`
	DueAt  time.Time `json:"due_at"`
	Stored bool      `json:"stored"`
}

// ScheduleRequest is the body of POST /api/v1/schedules.
type ScheduleRequest struct {
	ID          string         `json:"id"`
	Cron        string         `json:"cron"`
	TimeZone    string         `json:"timezone"`
	Start       string         `json:"start"`
	End         string         `json:"end"`
	Misfire     string         `json:"misfire"`
	Description string         `json:"description"`
	Destination string         `json:"destination"`
	Exchange    string         `json:"exchange"`
	RoutingKey  string         `json:"routing_key"`
	Body        *string        `json:"body"`
	BodyBase64  *string        `json:"body_base64"`
	ContentType string         `json:"content_type"`
	Headers     map[string]any `json:"headers"`
}

// ScheduleState is the state of s as listed: active, paused or ended.
func ScheduleState(s *storage.Schedule) string {
	switch {
	case s.Paused:
		return "paused"
	case s.NextFireAt.IsZero():
		return "ended"
	}
	return "active"
}

// ErrNoSchedules: the store keeps no recurring schedules.
var ErrNoSchedules = errors.New("this store keeps no recurring schedules")

func (h *handler) routeSchedules() {
	h.mux.HandleFunc("GET /api/v1/schedules", h.schedules)
	h.mux.HandleFunc("POST /api/v1/schedules", h.putSchedule)
	h.mux.HandleFunc("GET /api/v1/schedules/{key}", h.showSchedule)
	h.mux.HandleFunc("DELETE /api/v1/schedules/{key}", h.cancelSchedule)
	h.mux.HandleFunc("POST /api/v1/schedules/{key}/pause", func(w http.ResponseWriter, r *http.Request) { h.pauseSchedule(w, r, true) })
	h.mux.HandleFunc("POST /api/v1/schedules/{key}/resume", func(w http.ResponseWriter, r *http.Request) { h.pauseSchedule(w, r, false) })
	h.mux.HandleFunc("POST /api/v1/schedules/{key}/fire", h.fireSchedule)
}

// Scheduler returns the store as a storage.Scheduler, or ErrNoSchedules.
func (o *Ops) Scheduler() (storage.Scheduler, error) {
	sc, ok := o.opts.Store.(storage.Scheduler)
	if !ok {
		return nil, ErrNoSchedules
	}
	return sc, nil
}

// PauseSchedule pauses (pause) or resumes a schedule and logs it.
func (o *Ops) PauseSchedule(ctx context.Context, key string, pause bool) (changed bool, err error) {
	sc, err := o.Scheduler()
	if err != nil {
		return false, err
	}
	op := "resume"
	if pause {
		op = "pause"
		changed, err = sc.PauseSchedule(ctx, key)
	} else {
		changed, err = sc.ResumeSchedule(ctx, key)
	}
	if err != nil {
		return false, err
	}
	if !pause {
		o.opts.ScheduleWake()
	}
	o.opts.Logger.Info().Str("schedule", key).Str("op", op).Bool("changed", changed).Msg("admin API: schedule " + op + "d")
	return changed, nil
}

// CancelSchedule ends a schedule and logs it; ErrScheduleNotFound when
// there was none.
func (o *Ops) CancelSchedule(ctx context.Context, key string) error {
	sc, err := o.Scheduler()
	if err != nil {
		return err
	}
	found, err := sc.CancelSchedule(ctx, key)
	if err != nil {
		return err
	}
	if !found {
		return storage.ErrScheduleNotFound
	}
	o.opts.Logger.Info().Str("schedule", key).Msg("admin API: schedule cancelled")
	return nil
}

// FireSchedule stores one extra fire of a schedule, due now, and wakes the
// poller for it.
func (o *Ops) FireSchedule(ctx context.Context, key string) (FireJSON, error) {
	sc, err := o.Scheduler()
	if err != nil {
		return FireJSON{}, err
	}
	now := o.opts.Now()
	f, err := sc.FireNow(ctx, key, now, FireNowMessage)
	if err != nil {
		return FireJSON{}, err
	}
	if f.Stored {
		o.opts.Wake(f.DueAt)
	}
	o.opts.Logger.Info().Str("schedule", key).Str("fire", f.ID).Bool("stored", f.Stored).Msg("admin API: schedule fired now")
	return FireJSON{Key: key, ID: f.ID, DueAt: f.DueAt.UTC(), Stored: f.Stored}, nil
}

// FireNowMessage is the message of an extra fire: the template with the
// fire headers (wire.HeaderFireTime, wire.HeaderScheduleID) as a cron
// fire's, and the fire's row key as message id.
func FireNowMessage(s *storage.Schedule, id string, at time.Time) ([]byte, error) {
	msg, err := message.Decode(s.Message)
	if err != nil {
		return nil, fmt.Errorf("stored message of schedule %q is corrupt: %w", s.Key, err)
	}
	h := make(amqp.Table, len(msg.Headers)+2)
	for k, v := range msg.Headers {
		h[k] = v
	}
	h[wire.HeaderFireTime] = at.UTC().Format(time.RFC3339Nano)
	h[wire.HeaderScheduleID] = storage.ScheduleName(s.Key)
	msg.Headers, msg.MessageId = h, id
	return message.Encode(nil, &msg)
}

// scheduleError maps the errors of the schedule calls to responses.
func (h *handler) scheduleError(w http.ResponseWriter, op, key string, err error) {
	switch {
	case errors.Is(err, ErrNoSchedules):
		writeError(w, http.StatusNotImplemented, err.Error())
	case errors.Is(err, storage.ErrScheduleNotFound):
		writeError(w, http.StatusNotFound, fmt.Sprintf("no schedule with key %q (keys as GET /api/v1/schedules lists them, e.g. amqp:<message id>)", key))
	case errors.Is(err, storage.ErrScheduleCancelled):
		writeError(w, http.StatusConflict, fmt.Sprintf("schedule %q: its id was cancelled within the cancel window; try again later or use another id", key))
	default:
		h.storeError(w, op, key, err)
	}
}

// pathKey returns the request's {key}, or answers 400 for one no schedule
// can have.
func pathKey(w http.ResponseWriter, r *http.Request) (string, bool) {
	key := r.PathValue("key")
	if err := storage.CheckSchedule(&storage.Schedule{Key: key, Destination: "-"}); err != nil {
		writeError(w, http.StatusBadRequest, "invalid schedule key: "+err.Error())
		return "", false
	}
	return key, true
}

func scheduleJSON(s *storage.Schedule) ScheduleJSON {
	j := ScheduleJSON{Key: s.Key, ID: storage.ScheduleName(s.Key), Source: s.Source, Cron: s.Expr, TimeZone: s.Zone,
		Start: utc(s.Start), End: utc(s.End), Misfire: cron.MisfirePolicy(s.Misfire).String(), Description: s.Description,
		DestJSON: NewDestJSON(s.Dest()), State: ScheduleState(s), NextFireAt: utc(s.NextFireAt), PrevFireAt: utc(s.PrevFireAt),
		Generation: s.Generation, Fires: s.Fires, Misfires: s.Misfires, LastError: s.LastError, UpdatedAt: s.UpdatedAt.UTC()}
	return j
}

// NextFires returns up to n coming fire times of s, from its NextFireAt,
// in its zone; nil when it has none or cannot be planned.
func NextFires(s *storage.Schedule, n int) []time.Time {
	if s.NextFireAt.IsZero() || n <= 0 {
		return nil
	}
	spec, err := cron.Parse(s.Expr)
	if err != nil {
		return nil
	}
	loc, err := cron.LoadLocation(s.Zone)
	if err != nil {
		return nil
	}
	out := []time.Time{s.NextFireAt.In(loc)}
	for len(out) < n {
		t := spec.NextIn(out[len(out)-1], loc, cron.Window{Start: s.Start, End: s.End})
		if t.IsZero() {
			break
		}
		out = append(out, t.In(loc))
	}
	return out
}

func (h *handler) schedules(w http.ResponseWriter, r *http.Request) {
	sc, err := h.ops.Scheduler()
	if err != nil {
		h.scheduleError(w, "list schedules", "", err)
		return
	}
	q := r.URL.Query()
	for k := range q {
		if k != "cursor" && k != "limit" {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("unknown parameter %q: GET /api/v1/schedules takes cursor and limit", k))
			return
		}
	}
	limit, ok := queryLimit(w, q)
	if !ok {
		return
	}
	rows, next, err := sc.ListSchedules(r.Context(), q.Get("cursor"), limit)
	if err != nil {
		h.storeError(w, "list schedules", "", err)
		return
	}
	out := SchedulesJSON{Schedules: make([]ScheduleJSON, 0, len(rows)), Next: next}
	for i := range rows {
		out.Schedules = append(out.Schedules, scheduleJSON(&rows[i]))
	}
	writeJSON(w, http.StatusOK, out)
}

func (h *handler) showSchedule(w http.ResponseWriter, r *http.Request) {
	key, ok := pathKey(w, r)
	if !ok {
		return
	}
	sc, err := h.ops.Scheduler()
	if err == nil {
		var s storage.Schedule
		if s, err = sc.GetSchedule(r.Context(), key); err == nil {
			writeJSON(w, http.StatusOK, scheduleDetail(&s))
			return
		}
	}
	h.scheduleError(w, "show schedule", key, err)
}

// scheduleDetail is show's answer: the schedule, its coming fire times and
// its message.
func scheduleDetail(s *storage.Schedule) ScheduleJSON {
	j := scheduleJSON(s)
	for _, t := range NextFires(s, NextFireTimes) {
		j.NextFireTimes = append(j.NextFireTimes, t.Format(time.RFC3339))
	}
	if p, err := message.Decode(s.Message); err == nil {
		j.MessageJSON = messageDetail(p)
	} else {
		j.LastError = strings.TrimSpace(j.LastError + " stored message unreadable: " + err.Error())
	}
	return j
}

func (h *handler) cancelSchedule(w http.ResponseWriter, r *http.Request) {
	key, ok := pathKey(w, r)
	if !ok {
		return
	}
	if err := h.ops.CancelSchedule(r.Context(), key); err != nil {
		h.scheduleError(w, "cancel schedule", key, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (h *handler) pauseSchedule(w http.ResponseWriter, r *http.Request, pause bool) {
	key, ok := pathKey(w, r)
	if !ok {
		return
	}
	op := map[bool]string{true: "pause schedule", false: "resume schedule"}[pause]
	changed, err := h.ops.PauseSchedule(r.Context(), key, pause)
	if err != nil {
		h.scheduleError(w, op, key, err)
		return
	}
	sc, _ := h.ops.Scheduler()
	s, err := sc.GetSchedule(r.Context(), key)
	if err != nil {
		h.scheduleError(w, op, key, err) // cancelled meanwhile
		return
	}
	j := scheduleJSON(&s)
	j.Changed = &changed
	writeJSON(w, http.StatusOK, j)
}

func (h *handler) fireSchedule(w http.ResponseWriter, r *http.Request) {
	key, ok := pathKey(w, r)
	if !ok {
		return
	}
	f, err := h.ops.FireSchedule(r.Context(), key)
	if err != nil {
		h.scheduleError(w, "fire schedule", key, err)
		return
	}
	writeJSON(w, http.StatusOK, f)
}

func (h *handler) putSchedule(w http.ResponseWriter, r *http.Request) {
	sc, err := h.ops.Scheduler()
	if err != nil {
		h.scheduleError(w, "put schedule", "", err)
		return
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxScheduleBytes))
	dec.DisallowUnknownFields()
	dec.UseNumber()
	var req ScheduleRequest
	if err := dec.Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, `bad request body (want {"id", "cron", "destination", ...}, see docs/contract.md §6.3): `+err.Error())
		return
	}
	if dec.Decode(&struct{}{}) != io.EOF {
		writeError(w, http.StatusBadRequest, "bad request body: want exactly one JSON object")
		return
	}
	s, err := BuildSchedule(&req, h.opts.Now())
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	got, err := sc.PutSchedule(r.Context(), s)
	if err != nil {
		h.scheduleError(w, "put schedule", s.Key, err)
		return
	}
	h.opts.ScheduleWake()
	h.opts.Logger.Info().Str("schedule", got.Key).Int64("generation", got.Generation).Str("cron", got.Expr).Str("zone", got.Zone).
		Time("first_fire", got.NextFireAt).Msg("admin API: schedule stored")
	code := http.StatusCreated
	if got.Generation > 1 {
		code = http.StatusOK
	}
	writeJSON(w, code, scheduleDetail(&got))
}

// maxScheduleBytes bounds a schedule request: the message body is in it.
const maxScheduleBytes = 4 << 20

// BuildSchedule checks a create request and builds its schedule, named
// admin:<id>, its first fire time the first at or after now (as a schedule
// made on E.Timeouts, docs/contract.md §2.11).
func BuildSchedule(req *ScheduleRequest, now time.Time) (storage.Schedule, error) {
	if req.ID == "" {
		return storage.Schedule{}, errors.New("id is required: it names the schedule (its key is admin:<id>)")
	}
	if err := wire.ValidateID("id", req.ID); err != nil {
		return storage.Schedule{}, err
	}
	if req.Cron == "" {
		return storage.Schedule{}, errors.New(`cron is required: 5 fields (Unix) or 6-7 fields (Quartz, seconds first), e.g. "*/5 * * * *"`)
	}
	spec, err := cron.Parse(req.Cron)
	if err != nil {
		return storage.Schedule{}, fmt.Errorf("cron %q: %w", req.Cron, err)
	}
	zone := strings.TrimSpace(req.TimeZone)
	if zone == "" {
		zone = "UTC"
	}
	loc, err := cron.LoadLocation(zone)
	if err != nil {
		return storage.Schedule{}, fmt.Errorf("timezone: %w", err)
	}
	var start, end time.Time
	if req.Start != "" {
		if start, err = parseTime("start", req.Start); err != nil {
			return storage.Schedule{}, err
		}
	}
	if req.End != "" {
		if end, err = parseTime("end", req.End); err != nil {
			return storage.Schedule{}, err
		}
	}
	misfire, err := cron.ParseMisfirePolicy(req.Misfire)
	if err != nil {
		return storage.Schedule{}, fmt.Errorf("misfire: %w", err)
	}
	dest := wire.Destination{Exchange: req.Exchange, Key: req.Destination}
	switch {
	case req.Exchange == "" && req.RoutingKey != "":
		return storage.Schedule{}, errors.New("routing_key goes with exchange: give exchange too, or destination (a queue) alone")
	case req.Exchange != "" && req.Destination != "":
		return storage.Schedule{}, errors.New("destination (a queue) and exchange exclude each other: give one of them")
	case req.Exchange != "":
		dest.Key = req.RoutingKey
	case req.Destination == "":
		return storage.Schedule{}, errors.New("destination (a queue) or exchange (with routing_key) is required")
	}
	if err := dest.Validate("destination"); err != nil {
		return storage.Schedule{}, err
	}
	body, err := requestBody(req)
	if err != nil {
		return storage.Schedule{}, err
	}
	headers, err := requestHeaders(req.Headers)
	if err != nil {
		return storage.Schedule{}, err
	}
	msg := amqp.Publishing{Headers: headers, ContentType: req.ContentType, DeliveryMode: amqp.Persistent, MessageId: req.ID, Body: body}
	enc, err := message.Encode(nil, &msg)
	if err != nil {
		return storage.Schedule{}, fmt.Errorf("headers: %w", err)
	}
	// A fire time at this very second still fires, as over AMQP.
	first := spec.NextIn(now.Add(-time.Second), loc, cron.Window{Start: start, End: end})
	if first.IsZero() {
		return storage.Schedule{}, fmt.Errorf("cron %q in %s has no fire time left (after end, or a date that never comes)", req.Cron, zone)
	}
	s := storage.Schedule{Key: storage.ScheduleKey(ScheduleSourceAdmin, req.ID), Source: ScheduleSourceAdmin,
		Expr: req.Cron, Zone: zone, Start: start, End: end, Misfire: int(misfire), Description: req.Description,
		Destination: dest.Key, Exchange: dest.Exchange, Message: enc, NextFireAt: first.UTC()}
	if err := storage.CheckSchedule(&s); err != nil {
		return storage.Schedule{}, err
	}
	return s, nil
}

func requestBody(req *ScheduleRequest) ([]byte, error) {
	switch {
	case req.Body != nil && req.BodyBase64 != nil:
		return nil, errors.New("body and body_base64 exclude each other: give one of them")
	case req.BodyBase64 != nil:
		b, err := base64.StdEncoding.DecodeString(*req.BodyBase64)
		if err != nil {
			return nil, fmt.Errorf("body_base64 is not standard base64: %w", err)
		}
		return b, nil
	case req.Body != nil:
		return []byte(*req.Body), nil
	}
	return []byte{}, nil
}

// requestHeaders turns JSON header values into AMQP ones: strings, booleans,
// integers (int64), other numbers (float64); objects and arrays are
// refused (there is no one way to type their members).
func requestHeaders(in map[string]any) (amqp.Table, error) {
	if len(in) == 0 {
		return nil, nil
	}
	t := make(amqp.Table, len(in))
	for k, v := range in {
		if strings.HasPrefix(k, "x-delaybridge-") {
			return nil, fmt.Errorf("headers: %q is the bridge's own header: give the schedule's settings as fields of the request", k)
		}
		switch v := v.(type) {
		case string, bool:
			t[k] = v
		case json.Number:
			if n, err := v.Int64(); err == nil {
				t[k] = n
			} else if f, err := v.Float64(); err == nil && !math.IsInf(f, 0) {
				t[k] = f
			} else {
				return nil, fmt.Errorf("headers: %q: number %s out of range", k, v)
			}
		default:
			return nil, fmt.Errorf("headers: %q must be a string, number or boolean", k)
		}
	}
	return t, nil
}
