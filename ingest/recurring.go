package ingest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/cron"
	"github.com/delaybridge/delaybridge/message"
	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/wire"
)

// Recurring schedules over AMQP (docs/contract.md §2.11): a message on
// E.Timeouts with x-delaybridge-cron creates or replaces the schedule named
// by its message id; x-delaybridge-cancel with that id ends it (cancel in
// ingest.go calls cancelSchedule too).

// Recurrence is what a recurring schedule's headers (or a protocol's
// schedule message) say.
type Recurrence struct {
	// Source names the way it came in (storage.Schedule.Source): the
	// schedule's key is storage.ScheduleKey(Source, Intake.ID).
	// wire.ScheduleSourceAMQP when empty.
	Source     string
	Expr, Zone string
	Start, End time.Time
	Misfire    cron.MisfirePolicy
	// Description and Token as storage.Schedule's.
	Description, Token string
	// First is the first fire time, from the time the message was taken in.
	First time.Time
}

// NewRecurrence checks a schedule given by expr (cron.Parse) in zone
// (cron.LoadLocation; UTC when empty) between start and end (zero:
// unbounded) and finds its first fire time from receivedAt on.
func NewRecurrence(expr, zone string, start, end time.Time, misfire cron.MisfirePolicy, receivedAt time.Time) (*Recurrence, error) {
	spec, err := cron.Parse(expr)
	if err != nil {
		return nil, fmt.Errorf("cron expression %q: %w", wire.Clip(expr), err)
	}
	return newRecurrence(spec, expr, zone, start, end, misfire, receivedAt)
}

func newRecurrence(spec cron.Schedule, expr, zone string, start, end time.Time, misfire cron.MisfirePolicy, receivedAt time.Time) (*Recurrence, error) {
	r := &Recurrence{Expr: expr, Zone: strings.TrimSpace(zone), Start: start, End: end, Misfire: misfire}
	if r.Zone == "" {
		r.Zone = "UTC"
	}
	loc, err := cron.LoadLocation(r.Zone)
	if err != nil {
		return nil, fmt.Errorf("time zone: %w", err)
	}
	// A fire time at the moment of intake still fires (as Quartz, which
	// starts a new trigger's search a second back).
	r.First = spec.NextIn(receivedAt.Add(-time.Second), loc, cron.Window{Start: r.Start, End: r.End})
	if r.First.IsZero() {
		return nil, fmt.Errorf("cron expression %q in %s has no fire time left (after the end time, or a date that never comes)",
			wire.Clip(expr), r.Zone)
	}
	r.First = r.First.UTC()
	return r, nil
}

// parseRecurring reads a delivery with wire.HeaderCron: where each fire
// goes, the schedule's headers and the message every fire forwards (the
// delivery without the due-time and schedule headers).
func parseRecurring(d *amqp.Delivery, receivedAt time.Time) Intake {
	dest, err := destination(d.Headers, d.ReplyTo)
	if err != nil {
		return Reject(err)
	}
	id, err := messageID(d)
	if err != nil {
		return Reject(err)
	}
	if id == "" {
		return Reject(fmt.Errorf("header %s needs a message id (the message-id property): it names the schedule, and %s with it ends the schedule",
			wire.HeaderCron, wire.HeaderCancel))
	}
	r, err := parseRecurrence(d.Headers, receivedAt)
	if err != nil {
		return Reject(err)
	}
	msg := broker.Forwardable(message.FromDelivery(d), append(append([]string{}, wire.DueTimeHeaders...), wire.ScheduleHeaders...))
	return Intake{Op: OpRecur, ID: id, Destination: dest.Key, Exchange: dest.Exchange, DueAt: r.First, Msg: msg, Recur: r}
}

// parseRecurrence reads the schedule headers; the time zone defaults to UTC.
func parseRecurrence(h amqp.Table, receivedAt time.Time) (*Recurrence, error) {
	r := &Recurrence{Zone: "UTC"}
	expr, _, err := headerString(h, wire.HeaderCron)
	if err != nil {
		return nil, err
	}
	spec, err := cron.Parse(expr)
	if err != nil {
		return nil, fmt.Errorf("header %s %q: %w", wire.HeaderCron, wire.Clip(expr), err)
	}
	r.Expr = expr
	if z, ok, err := headerString(h, wire.HeaderTimeZone); err != nil {
		return nil, err
	} else if ok {
		r.Zone = strings.TrimSpace(z)
	}
	loc, err := cron.LoadLocation(r.Zone)
	if err != nil {
		return nil, fmt.Errorf("header %s: %w", wire.HeaderTimeZone, err)
	}
	if r.Start, err = optionalTime(h, wire.HeaderStart); err != nil {
		return nil, err
	}
	if r.End, err = optionalTime(h, wire.HeaderEnd); err != nil {
		return nil, err
	}
	if m, _, err := headerString(h, wire.HeaderMisfire); err != nil {
		return nil, err
	} else if r.Misfire, err = cron.ParseMisfirePolicy(m); err != nil {
		return nil, fmt.Errorf("header %s: %w", wire.HeaderMisfire, err)
	}
	// A fire time at the moment of intake still fires (as Quartz, which
	// starts a new trigger's search a second back).
	r.First = spec.NextIn(receivedAt.Add(-time.Second), loc, cron.Window{Start: r.Start, End: r.End})
	if r.First.IsZero() {
		return nil, fmt.Errorf("header %s %q in %s has no fire time left (after %s, or a date that never comes)",
			wire.HeaderCron, wire.Clip(expr), r.Zone, wire.HeaderEnd)
	}
	r.First = r.First.UTC()
	return r, nil
}

// optionalTime reads an RFC 3339 header (or an AMQP timestamp); absent is zero.
func optionalTime(h amqp.Table, name string) (time.Time, error) {
	v, ok := h[name]
	if !ok || v == nil {
		return time.Time{}, nil
	}
	if t, ok := v.(time.Time); ok {
		return t.UTC(), nil
	}
	s, _, err := headerString(h, name)
	if err != nil {
		return time.Time{}, err
	}
	if len(s) > maxTimeText {
		return time.Time{}, fmt.Errorf("header %s is %d bytes, too long for an RFC 3339 timestamp", name, len(s))
	}
	t, err := time.Parse(time.RFC3339Nano, strings.ToUpper(strings.TrimSpace(s)))
	if err != nil {
		return time.Time{}, fmt.Errorf("header %s %q is not an RFC 3339 timestamp like 2026-11-21T20:00:00Z", name, wire.Clip(s))
	}
	return t.UTC(), nil
}

// acceptRecurring checks a schedule against the rules (its first fire time
// as the due time) and builds it.
func (in *Ingester) acceptRecurring(it *Intake, d *amqp.Delivery, now time.Time) (storage.Schedule, error) {
	if _, ok := in.store.(storage.Scheduler); !ok {
		return storage.Schedule{}, errors.New("this store cannot keep recurring schedules")
	}
	if err := in.opts.Rules.Check(Parsed{ID: it.ID, Destination: it.Dest(), DueAt: it.DueAt}, len(d.Body), now); err != nil {
		return storage.Schedule{}, err
	}
	enc, err := message.Encode(nil, &it.Msg)
	if err != nil {
		return storage.Schedule{}, fmt.Errorf("headers cannot be stored: %w", err)
	}
	r := it.Recur
	src := r.Source
	if src == "" {
		src = wire.ScheduleSourceAMQP
	}
	sched := storage.Schedule{Key: storage.ScheduleKey(src, it.ID), Source: src,
		Expr: r.Expr, Zone: r.Zone, Start: r.Start, End: r.End, Misfire: int(r.Misfire), Description: r.Description, Token: r.Token,
		Destination: it.Destination, Exchange: it.Exchange, Message: enc, NextFireAt: r.First}
	return sched, storage.CheckSchedule(&sched)
}

// putSchedule stores e's schedule and acks e, or returns the pause to take
// when the store failed (e stays requeued).
func (in *Ingester) putSchedule(ctx context.Context, e *entry) time.Duration {
	sc := in.store.(storage.Scheduler) // acceptRecurring refused the message otherwise
	got, err := sc.PutSchedule(context.WithoutCancel(ctx), e.sched)
	if err != nil {
		pause := in.opts.StoreBreaker.Failure(err)
		in.log.Error().Err(err).Str("schedule", e.sched.Key).Dur("retry_in", pause).Msg("storing a recurring schedule failed; requeued")
		return pause
	}
	in.opts.StoreBreaker.Success()
	e.outcome = ack
	in.log.Info().Str("schedule", got.Key).Int64("generation", got.Generation).Str("cron", got.Expr).Str("zone", got.Zone).
		Time("first_fire", got.NextFireAt).Msg("recurring schedule stored")
	if in.opts.ScheduleWake != nil {
		in.opts.ScheduleWake()
	}
	return 0
}

// cancelSchedule ends the AMQP schedule named id, if the store keeps
// schedules: found says whether there was one.
func (in *Ingester) cancelSchedule(ctx context.Context, id string) (found bool, err error) {
	sc, ok := in.store.(storage.Scheduler)
	if !ok {
		return false, nil
	}
	return sc.CancelSchedule(context.WithoutCancel(ctx), storage.ScheduleKey(wire.ScheduleSourceAMQP, id))
}

// ScheduleControl is what an OpScheduleControl does to a schedule.
type ScheduleControl int

// The controls of a schedule (storage.Scheduler).
const (
	ScheduleCancel ScheduleControl = iota + 1
	SchedulePause
	ScheduleResume
)

func (c ScheduleControl) String() string {
	switch c {
	case ScheduleCancel:
		return "cancel"
	case SchedulePause:
		return "pause"
	case ScheduleResume:
		return "resume"
	}
	return fmt.Sprintf("control %d", int(c))
}

// controlSchedule applies e's control to its schedule and acks e, or
// returns the pause to take when the store failed (e stays requeued). A
// schedule that does not exist is no error: the control is acked and
// logged (as Quartz's unschedule or pause of a missing trigger).
func (in *Ingester) controlSchedule(ctx context.Context, e *entry) time.Duration {
	key, c := e.intake.ScheduleKey, e.intake.Control
	sc, ok := in.store.(storage.Scheduler)
	if !ok {
		// classify refused it already: a store without schedules never
		// gets here. Should one, the control stays requeued, said so.
		in.log.Error().Str("schedule", key).Stringer("control", c).Msg("schedule control on a store without schedules; requeued")
		return time.Second
	}
	var changed bool
	var err error
	ctx = context.WithoutCancel(ctx)
	switch c {
	case ScheduleCancel:
		changed, err = sc.CancelSchedule(ctx, key)
	case SchedulePause:
		changed, err = sc.PauseSchedule(ctx, key)
	case ScheduleResume:
		changed, err = sc.ResumeSchedule(ctx, key)
	}
	if errors.Is(err, storage.ErrScheduleNotFound) {
		err = nil
	}
	if err != nil {
		pause := in.opts.StoreBreaker.Failure(err)
		in.log.Error().Err(err).Str("schedule", key).Stringer("control", c).Dur("retry_in", pause).Msg("schedule control failed; requeued")
		return pause
	}
	in.opts.StoreBreaker.Success()
	e.outcome = ack
	in.log.Info().Str("schedule", key).Stringer("control", c).Bool("changed", changed).Msg("recurring schedule control applied")
	if changed && c == ScheduleResume && in.opts.ScheduleWake != nil {
		in.opts.ScheduleWake()
	}
	return 0
}
