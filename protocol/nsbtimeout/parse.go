package nsbtimeout

import (
	"fmt"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/intake"
	"github.com/delaybridge/delaybridge/message"
	"github.com/delaybridge/delaybridge/wire"
)

// Parse reads destination, due time and id from a delivery. receivedAt is
// the base of x-delay. The error says in words what is wrong; it is what lands
// in x-delaybridge-error.
func Parse(d *amqp.Delivery, receivedAt time.Time) (intake.Parsed, error) {
	var p intake.Parsed
	var err error
	if p.Destination, err = destination(d.Headers, d.ReplyTo); err != nil {
		return p, err
	}
	if p.DueAt, err = dueAt(d.Headers, receivedAt); err != nil {
		return p, err
	}
	if p.ID, err = intake.ParseID(d); err != nil {
		return p, err
	}
	return p, nil
}

// ParseDestination reads the destination headers as Parse does
// (docs/contract.md §2.2): a queue (x-destination, which wins when present
// even if invalid, else NServiceBus.Timeout.RouteExpiredTimeoutTo) or an
// exchange (x-destination-exchange with x-destination-routing-key), never
// both; an NServiceBus timeout with none of them goes to its reply-to
// address. Replay reads error-queue copies with it, so both apply the same
// rules; it has headers only, so it never falls back to the reply-to
// property.
func ParseDestination(h amqp.Table) (wire.Destination, error) { return destination(h, "") }

// destination reads where a delivery goes; replyTo is its reply-to property.
func destination(h amqp.Table, replyTo string) (wire.Destination, error) {
	x, isExchange, err := intake.HeaderString(h, wire.HeaderDestinationExchange)
	if err != nil {
		return wire.Destination{}, err
	}
	key, hasKey, err := intake.HeaderString(h, wire.HeaderDestinationRoutingKey)
	if err != nil {
		return wire.Destination{}, err
	}
	if isExchange {
		for _, name := range []string{wire.HeaderDestination, wire.HeaderNSBDestination} {
			if v, ok := h[name]; ok && v != nil {
				return wire.Destination{}, fmt.Errorf("headers %s and %s both name a destination: set one of them", name, wire.HeaderDestinationExchange)
			}
		}
		d := wire.Destination{Exchange: x, Key: key}
		if err := wire.ValidateExchange("header "+wire.HeaderDestinationExchange, x); err != nil {
			return wire.Destination{}, err
		}
		if err := wire.ValidateRoutingKey("header "+wire.HeaderDestinationRoutingKey, key); err != nil {
			return wire.Destination{}, err
		}
		return d, nil
	}
	if hasKey {
		return wire.Destination{}, fmt.Errorf("header %s needs %s: a queue destination has no routing key of its own", wire.HeaderDestinationRoutingKey, wire.HeaderDestinationExchange)
	}
	for _, name := range []string{wire.HeaderDestination, wire.HeaderNSBDestination} {
		s, ok, err := intake.HeaderString(h, name)
		if err != nil {
			return wire.Destination{}, err
		}
		if !ok {
			continue
		}
		if err := wire.ValidateDestination("header "+name, s); err != nil {
			return wire.Destination{}, err
		}
		return wire.Queue(s), nil
	}
	if v, ok := h[wire.HeaderNSBExpire]; ok && v != nil {
		return nsbReplyTo(h, replyTo)
	}
	return wire.Destination{}, fmt.Errorf("no destination: set header %s (or %s) to the queue to deliver to, or %s (and %s) to the exchange",
		wire.HeaderDestination, wire.HeaderNSBDestination, wire.HeaderDestinationExchange, wire.HeaderDestinationRoutingKey)
}

// nsbReplyTo is where NServiceBus's timeout manager sends a timeout that
// has no NServiceBus.Timeout.RouteExpiredTimeoutTo: its reply-to address.
// 6.x and 7.x read the NServiceBus.ReplyToAddress header
// (DelayedDelivery/TimeoutManager/StoreTimeoutBehavior.cs,
// GetReplyToAddress); 3.x to 5.x read TransportMessage.ReplyToAddress
// (Timeout/Hosting/Windows/TimeoutMessageProcessor.cs), which the RabbitMQ
// transport of NServiceBus 4 (its first) carried in the reply-to property. The header
// wins: a sender that sets both means the same queue. Only NServiceBus
// timeouts fall back; for any other message a missing destination is an
// error, not a guess.
func nsbReplyTo(h amqp.Table, replyTo string) (wire.Destination, error) {
	s, ok, err := intake.HeaderString(h, wire.HeaderNSBReplyTo)
	if err != nil {
		return wire.Destination{}, err
	}
	what := "header " + wire.HeaderNSBReplyTo
	if !ok {
		s, what = replyTo, "reply-to property"
	}
	if s == "" {
		return wire.Destination{}, fmt.Errorf("no destination: an NServiceBus timeout needs header %s, or a reply-to address (header %s or the reply-to property) to fall back to",
			wire.HeaderNSBDestination, wire.HeaderNSBReplyTo)
	}
	if err := wire.ValidateDestination(what+" (the fallback for a missing "+wire.HeaderNSBDestination+")", s); err != nil {
		return wire.Destination{}, err
	}
	return wire.Queue(s), nil
}

func dueAt(h amqp.Table, receivedAt time.Time) (time.Time, error) {
	if v, ok := h[wire.HeaderDueAt]; ok && v != nil {
		return parseDueAt(v)
	}
	if v, ok := h[wire.HeaderNSBExpire]; ok && v != nil {
		return parseNSBExpire(v)
	}
	if v, ok := h[wire.HeaderDelay]; ok && v != nil {
		ms, err := intake.ParseDelay(v)
		if err != nil {
			return time.Time{}, err
		}
		if ms <= 0 {
			return receivedAt, nil
		}
		// A long delay can pass maxDue (a Duration reaches ~292 years).
		return intake.InRange(wire.HeaderDelay, receivedAt.Add(time.Duration(ms)*time.Millisecond))
	}
	return time.Time{}, fmt.Errorf("no due time: set header %s (RFC 3339), %s or %s (milliseconds)", wire.HeaderDueAt, wire.HeaderNSBExpire, wire.HeaderDelay)
}

func parseDueAt(v any) (time.Time, error) {
	t, err := parseTime(wire.HeaderDueAt, v)
	if err != nil {
		return time.Time{}, err
	}
	return intake.InRange(wire.HeaderDueAt, t)
}

// parseTime reads header name's value v as an RFC 3339 timestamp, or an
// AMQP timestamp (unambiguous, if only to the second), in UTC.
func parseTime(name string, v any) (time.Time, error) {
	if t, ok := v.(time.Time); ok {
		return t.UTC(), nil
	}
	s, ok := intake.Text(v)
	if !ok {
		return time.Time{}, fmt.Errorf("header %s must be an RFC 3339 string, got %s", name, intake.TypeName(v))
	}
	if len(s) > intake.MaxTimeText {
		return time.Time{}, fmt.Errorf("header %s is %d bytes, too long for an RFC 3339 timestamp", name, len(s))
	}
	// RFC 3339 allows lower-case t and z; Go's parser wants them upper-case.
	t, err := time.Parse(time.RFC3339Nano, strings.ToUpper(strings.TrimSpace(s)))
	if err != nil {
		return time.Time{}, fmt.Errorf("header %s %q is not an RFC 3339 timestamp like 2026-11-21T20:00:00.250Z", name, wire.Clip(s))
	}
	return t.UTC(), nil
}

func parseNSBExpire(v any) (time.Time, error) {
	return intake.ParseNSBTimeHeader(wire.HeaderNSBExpire, v)
}

// TimeoutsSource is E.Timeouts (docs/contract.md §2): messages with the
// bridge's own headers. The delayed exchanges bound to it read theirs
// with sources of their own (intake.Source.Exchanges).
func TimeoutsSource(queue string) intake.Source {
	return intake.Source{Name: "ingest", Queue: queue, Parser: intake.ParserFunc(ParseHeaders)}
}

// ParseHeaders reads a delivery to E.Timeouts: a cancel (x-delaybridge-cancel),
// NServiceBus's request to clear a saga's timeouts (NServiceBus.ClearTimeouts)
// or a message to schedule (destination, due time and id headers, and the
// saga it belongs to).
func ParseHeaders(d *amqp.Delivery, receivedAt time.Time) intake.Intake {
	if _, ok := d.Headers[wire.HeaderCancel]; ok {
		id, err := cancelID(d)
		if err != nil {
			return intake.Reject(err)
		}
		return intake.Intake{Op: intake.OpCancel, CancelID: id}
	}
	if v, ok := d.Headers[wire.HeaderCron]; ok && v != nil {
		return parseRecurring(d, receivedAt)
	}
	if v, ok := d.Headers[wire.HeaderNSBClearTimeouts]; ok && v != nil {
		saga, err := clearTimeoutsSaga(d.Headers)
		if err != nil {
			return intake.Reject(err)
		}
		return intake.Intake{Op: intake.OpCancelSaga, SagaID: saga}
	}
	var it intake.Intake
	if IsRetry(d.Headers) {
		// A dispatch failure retried from ServicePulse: due now, to where
		// it was going (docs/contract.md §4.6).
		it = ParseRetry(d, receivedAt)
	} else {
		p, err := Parse(d, receivedAt)
		if err != nil {
			return intake.Reject(err)
		}
		it = intake.Intake{Op: intake.OpSchedule, ID: p.ID, Destination: p.Destination.Key, Exchange: p.Destination.Exchange, DueAt: p.DueAt,
			Msg: broker.Forwardable(message.FromDelivery(d), wire.DueTimeHeaders)}
		if isNSBTimeout(d.Headers) {
			it.Msg = markNSBTimeout(it.Msg)
		}
	}
	if it.Op == intake.OpReject {
		return it
	}
	saga, _, err := intake.HeaderString(d.Headers, wire.HeaderNSBSagaID)
	if err != nil {
		return intake.Reject(err)
	}
	it.SagaID = strings.TrimSpace(saga)
	return it
}

// noSaga is Guid.Empty as .NET writes it: no saga instance.
const noSaga = "00000000-0000-0000-0000-000000000000"

// clearTimeoutsSaga reads the saga whose timeouts a ClearTimeouts message
// cancels. NServiceBus's timeout manager (3.x to 7.x: TimeoutMessageProcessor,
// later StoreTimeoutBehavior) acts on the header's presence, whatever its
// value and body, and refuses a missing or empty saga id: "clear timeouts is
// only supported for saga instances". Saga ids are compared as the text the
// sender wrote (Guid.ToString(), lower-case "D" form, in every version).
func clearTimeoutsSaga(h amqp.Table) (string, error) {
	saga, _, err := intake.HeaderString(h, wire.HeaderNSBSagaID)
	if err != nil {
		return "", err
	}
	saga = strings.TrimSpace(saga)
	if saga == "" || saga == noSaga {
		return "", fmt.Errorf("header %s needs header %s naming the saga whose timeouts to cancel (clearing is for saga instances only)",
			wire.HeaderNSBClearTimeouts, wire.HeaderNSBSagaID)
	}
	if err := wire.ValidateID("header "+wire.HeaderNSBSagaID, saga); err != nil {
		return "", err
	}
	return saga, nil
}

// cancelID validates a cancel message and returns the id it names.
func cancelID(d *amqp.Delivery) (string, error) {
	id, _, err := intake.HeaderString(d.Headers, wire.HeaderCancel)
	switch {
	case err != nil:
		return "", err
	case strings.TrimSpace(id) == "":
		return "", fmt.Errorf("header %s is empty: it must name the message-id to cancel", wire.HeaderCancel)
	case len(d.Body) > 0:
		return "", fmt.Errorf("a message with header %s cancels and must have no body (this one has %d bytes)", wire.HeaderCancel, len(d.Body))
	}
	// The same rules as every stored id: an id no message can have (NUL,
	// invalid UTF-8) is this message's error, never a store call that
	// PostgreSQL refuses and the store breaker counts as an outage.
	if err := wire.ValidateID("header "+wire.HeaderCancel, id); err != nil {
		return "", err
	}
	return id, nil
}

// isNSBTimeout reports whether a message parsed from its headers is an
// NServiceBus timeout: its due time is NServiceBus.Timeout.Expire (no
// x-due-at, which would win).
func isNSBTimeout(h amqp.Table) bool {
	if v, ok := h[wire.HeaderDueAt]; ok && v != nil {
		return false
	}
	v, ok := h[wire.HeaderNSBExpire]
	return ok && v != nil
}

// markNSBTimeout marks msg, a stored NServiceBus timeout, for Stamper
// (nsbtimeout.go). msg's headers are a copy of the delivery's.
func markNSBTimeout(msg amqp.Publishing) amqp.Publishing {
	if msg.Headers == nil {
		msg.Headers = amqp.Table{}
	}
	msg.Headers[wire.HeaderNSBTimeoutStamp] = "timeout-manager"
	return msg
}
