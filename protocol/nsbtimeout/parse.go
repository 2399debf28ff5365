package ingest

import (
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/wire"
)

// maxDelay is the longest x-delay whose due time a time.Duration can hold.
const maxDelay = math.MaxInt64 / int64(time.Millisecond)

// maxTimeText is far above the longest valid due-time text (~35 bytes);
// longer values are refused before any parsing work. The limits on ids and
// destinations are wire's, shared with every other way into the store.
const maxTimeText = 64

var (
	// NServiceBus.Timeout.Expire: every released NServiceBus with a timeout
	// manager, 3.0.0 to 7.x, wrote it with the invariant culture in the
	// format wire.ParseNSBTime reads (src/utils/DateTimeExtensions.cs in
	// 3.x, src/NServiceBus.Core/DateTimeExtensions.cs in 4.x to 7.x;
	// writers: UnicastBus.Defer and TimeoutMessageConverter in 3.x,
	// TimeoutManagerDeferrer in 4.x/5.x, TimeoutManagerRoutingStrategy and
	// DelayedRetryExecutor in 6.x/7.x), always six fractional digits.
	// The 3.0 betas (tags 3.0.0-Beta1, -Beta2) wrote DateTime.ToString(),
	// the sender's culture's general format ("1/5/2012 1:14:15 PM",
	// "05.01.2012 13:14:15", ...), sometimes in local time; 3.0.0 read it
	// back with the receiver's culture. Neither the day/month order nor the
	// zone can be known from the text, so it is refused with its own reason
	// rather than guessed.
	nsbCultureTime = regexp.MustCompile(`^\d{1,4}[./-]\d{1,2}[./-]\d{1,4}\.? \d{1,2}[:.]\d{2}([:.]\d{2})?( ?[AaPp]\.? ?[Mm]\.?)?$`)
	// The earliest and latest due times the bridge accepts: the earliest
	// RFC 3339 can write, the latest a store can keep in order.
	minDue = time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC)
	maxDue = storage.MaxDueAt
)

// Parsed is what ingest needs to store a message.
type Parsed struct {
	ID          string
	Destination wire.Destination
	DueAt       time.Time
}

// Parse reads destination, due time and id from a delivery. receivedAt is
// the base of x-delay. The error says in words what is wrong; it is what lands
// in x-delaybridge-error.
func Parse(d *amqp.Delivery, receivedAt time.Time) (Parsed, error) {
	var p Parsed
	var err error
	if p.Destination, err = destination(d.Headers, d.ReplyTo); err != nil {
		return p, err
	}
	if p.DueAt, err = dueAt(d.Headers, receivedAt); err != nil {
		return p, err
	}
	if p.ID, err = messageID(d); err != nil {
		return p, err
	}
	return p, nil
}

// HeaderString reads a text header as every parser does: an AMQP long
// string or a byte array (some clients send text as 'x'). ok is false when
// the header is absent or void; any other type is an error naming the header.
func HeaderString(h amqp.Table, name string) (s string, ok bool, err error) {
	return headerString(h, name)
}

func headerString(h amqp.Table, name string) (s string, ok bool, err error) {
	v, present := h[name]
	if !present || v == nil {
		return "", false, nil
	}
	switch v := v.(type) {
	case string:
		return v, true, nil
	case []byte:
		return string(v), true, nil
	default:
		return "", true, fmt.Errorf("header %s must be a string, got %s", name, typeName(v))
	}
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

// ParseID reads the id as Parse does (docs/contract.md §2.4): the message-id
// property, else the NServiceBus.MessageId header. "" with a nil error means
// the delivery names no id.
func ParseID(d *amqp.Delivery) (string, error) { return messageID(d) }

// destination reads where a delivery goes; replyTo is its reply-to property.
func destination(h amqp.Table, replyTo string) (wire.Destination, error) {
	x, isExchange, err := headerString(h, wire.HeaderDestinationExchange)
	if err != nil {
		return wire.Destination{}, err
	}
	key, hasKey, err := headerString(h, wire.HeaderDestinationRoutingKey)
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
		s, ok, err := headerString(h, name)
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
	s, ok, err := headerString(h, wire.HeaderNSBReplyTo)
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
		ms, err := parseDelay(v)
		if err != nil {
			return time.Time{}, err
		}
		if ms <= 0 {
			return receivedAt, nil
		}
		// A long delay can pass maxDue (a Duration reaches ~292 years).
		return inRange(wire.HeaderDelay, receivedAt.Add(time.Duration(ms)*time.Millisecond))
	}
	return time.Time{}, fmt.Errorf("no due time: set header %s (RFC 3339), %s or %s (milliseconds)", wire.HeaderDueAt, wire.HeaderNSBExpire, wire.HeaderDelay)
}

func parseDueAt(v any) (time.Time, error) {
	var s string
	switch v := v.(type) {
	case string:
		s = v
	case []byte:
		s = string(v)
	case time.Time: // an AMQP timestamp is unambiguous, if only to the second
		return inRange(wire.HeaderDueAt, v.UTC())
	default:
		return time.Time{}, fmt.Errorf("header %s must be an RFC 3339 string, got %s", wire.HeaderDueAt, typeName(v))
	}
	// RFC 3339 allows lower-case t and z; Go's parser wants them upper-case.
	if len(s) > maxTimeText {
		return time.Time{}, fmt.Errorf("header %s is %d bytes, too long for an RFC 3339 timestamp", wire.HeaderDueAt, len(s))
	}
	t, err := time.Parse(time.RFC3339Nano, strings.ToUpper(strings.TrimSpace(s)))
	if err != nil {
		return time.Time{}, fmt.Errorf("header %s %q is not an RFC 3339 timestamp like 2026-11-21T20:00:00.250Z", wire.HeaderDueAt, wire.Clip(s))
	}
	return inRange(wire.HeaderDueAt, t.UTC())
}

func parseNSBExpire(v any) (time.Time, error) { return parseNSBTime(wire.HeaderNSBExpire, v) }

// parseNSBTime reads header name's value v in the NServiceBus wire format
// (wire.ParseNSBTime), as a string or a byte array.
func parseNSBTime(name string, v any) (time.Time, error) {
	var s string
	switch v := v.(type) {
	case string:
		s = v
	case []byte:
		s = string(v)
	default:
		return time.Time{}, fmt.Errorf("header %s must be a string, got %s", name, typeName(v))
	}
	if len(s) > maxTimeText {
		return time.Time{}, fmt.Errorf("header %s is %d bytes, too long for the NServiceBus wire format", name, len(s))
	}
	if nsbCultureTime.MatchString(s) {
		return time.Time{}, fmt.Errorf("header %s %q is culture-dependent date text, as NServiceBus 3.0 betas wrote it: its day/month order and time zone are unknown; senders from NServiceBus 3.0.0 on write %s", name, wire.Clip(s), wire.NSBTimeLayout)
	}
	t, err := wire.ParseNSBTime(s)
	if err != nil {
		return time.Time{}, fmt.Errorf("header %s %q is %v", name, wire.Clip(s), err)
	}
	return inRange(name, t)
}

// parseDelay reads x-delay as the delayed-message-exchange plugin does:
// every AMQP integer type, a decimal string, or a floating-point number
// truncated toward zero. Zero or negative means now.
func parseDelay(v any) (int64, error) {
	if ms, ok := amqpInteger(v); ok {
		return delayInRange(ms)
	}
	switch v := v.(type) {
	case float32:
		return floatDelay(float64(v))
	case float64:
		return floatDelay(v)
	case string, []byte:
		var s string
		if b, ok := v.([]byte); ok {
			s = string(b)
		} else {
			s = v.(string)
		}
		n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("header %s %q is not a whole number of milliseconds", wire.HeaderDelay, wire.Clip(s))
		}
		return delayInRange(n)
	}
	return 0, fmt.Errorf("header %s must be a number of milliseconds (an integer, a decimal string or a floating-point number), got %s", wire.HeaderDelay, typeName(v))
}

// amqpInteger is v as an int64 when it is of one of the integer types an
// AMQP table value decodes to.
func amqpInteger(v any) (int64, bool) {
	switch v := v.(type) {
	case int8:
		return int64(v), true
	case uint8:
		return int64(v), true
	case int16:
		return int64(v), true
	case uint16:
		return int64(v), true
	case int32:
		return int64(v), true
	case uint32:
		return int64(v), true
	case int64:
		return v, true
	case int:
		return int64(v), true
	}
	return 0, false
}

func floatDelay(f float64) (int64, error) {
	switch {
	case math.IsNaN(f):
		return 0, fmt.Errorf("header %s is NaN, not a number of milliseconds", wire.HeaderDelay)
	case f <= 0: // -Inf too
		return 0, nil
	case f > float64(maxDelay): // +Inf too; checked before the conversion, which would overflow
		return 0, fmt.Errorf("header %s %g ms is longer than the %d ms the bridge can represent", wire.HeaderDelay, f, maxDelay)
	}
	return delayInRange(int64(f)) // truncates toward zero
}

func delayInRange(ms int64) (int64, error) {
	if ms > maxDelay {
		return 0, fmt.Errorf("header %s %d ms is longer than the %d ms the bridge can represent", wire.HeaderDelay, ms, maxDelay)
	}
	return ms, nil
}

func inRange(header string, t time.Time) (time.Time, error) {
	if t.Before(minDue) || t.After(maxDue) {
		return time.Time{}, fmt.Errorf("header %s %s is outside years 0000 to 2262 (the latest due time is %s)",
			header, t.Format(time.RFC3339Nano), maxDue.Format(time.RFC3339Nano))
	}
	return t, nil
}

func messageID(d *amqp.Delivery) (string, error) {
	id, source := d.MessageId, "message-id property"
	if strings.TrimSpace(id) == "" {
		s, ok, err := headerString(d.Headers, wire.HeaderNSBMessageID)
		if err != nil {
			return "", err
		}
		id, source = s, "header "+wire.HeaderNSBMessageID
		if !ok || strings.TrimSpace(id) == "" {
			return "", nil // the caller assigns one
		}
	}
	if err := wire.ValidateID(source, id); err != nil {
		return "", err
	}
	return id, nil
}

func typeName(v any) string {
	switch v.(type) {
	case float32, float64:
		return fmt.Sprintf("a floating-point number (%v)", v)
	case bool:
		return "a boolean"
	case amqp.Table:
		return "a table"
	case []any:
		return "an array"
	case amqp.Decimal:
		return "a decimal"
	case time.Time:
		return "a timestamp"
	}
	return fmt.Sprintf("%T", v)
}

// The readers below serve the parsers of the protocols under protocol/,
// which read their headers by the same rules.

// InRange returns t, or an error naming header when t is outside the due
// times a store keeps.
func InRange(header string, t time.Time) (time.Time, error) { return inRange(header, t) }

// HeaderInteger reads a header value of any AMQP integer type.
func HeaderInteger(v any) (int64, bool) { return amqpInteger(v) }

// ParseNSBTimeHeader reads the value v of header name in the NServiceBus
// wire format (wire.ParseNSBTime).
func ParseNSBTimeHeader(name string, v any) (time.Time, error) { return parseNSBTime(name, v) }

// ParseDelay reads an x-delay value: milliseconds.
func ParseDelay(v any) (int64, error) { return parseDelay(v) }

// TypeName names a header value's type in error text.
func TypeName(v any) string { return typeName(v) }
