package nsbtimeout

import (
	"fmt"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/cron"
	"github.com/delaybridge/delaybridge/intake"
	"github.com/delaybridge/delaybridge/message"
	"github.com/delaybridge/delaybridge/wire"
)

// Recurring schedules over AMQP (docs/contract.md §2.11): a message on
// E.Timeouts with x-delaybridge-cron creates or replaces the schedule named
// by its message id; x-delaybridge-cancel with that id ends it (ingest's
// cancel ends the schedule of the id it cancels).

// parseRecurring reads a delivery with wire.HeaderCron: where each fire
// goes, the schedule's headers and the message every fire forwards (the
// delivery without the due-time and schedule headers).
func parseRecurring(d *amqp.Delivery, receivedAt time.Time) intake.Intake {
	dest, err := destination(d.Headers, d.ReplyTo)
	if err != nil {
		return intake.Reject(err)
	}
	id, err := intake.ParseID(d)
	if err != nil {
		return intake.Reject(err)
	}
	if id == "" {
		return intake.Reject(fmt.Errorf("header %s needs a message id (the message-id property): it names the schedule, and %s with it ends the schedule",
			wire.HeaderCron, wire.HeaderCancel))
	}
	r, err := parseRecurrence(d.Headers, receivedAt)
	if err != nil {
		return intake.Reject(err)
	}
	msg := broker.Forwardable(message.FromDelivery(d), append(append([]string{}, wire.DueTimeHeaders...), wire.ScheduleHeaders...))
	return intake.Intake{Op: intake.OpRecur, ID: id, Destination: dest.Key, Exchange: dest.Exchange, DueAt: r.First, Msg: msg, Recur: r}
}

// parseRecurrence reads the schedule headers; the time zone defaults to UTC.
func parseRecurrence(h amqp.Table, receivedAt time.Time) (*intake.Recurrence, error) {
	r := &intake.Recurrence{Zone: "UTC"}
	expr, _, err := intake.HeaderString(h, wire.HeaderCron)
	if err != nil {
		return nil, err
	}
	spec, err := cron.Parse(expr)
	if err != nil {
		return nil, fmt.Errorf("header %s %q: %w", wire.HeaderCron, wire.Clip(expr), err)
	}
	r.Expr = expr
	if z, ok, err := intake.HeaderString(h, wire.HeaderTimeZone); err != nil {
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
	if m, _, err := intake.HeaderString(h, wire.HeaderMisfire); err != nil {
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
	return parseTime(name, v)
}
