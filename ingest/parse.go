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
	// NServiceBus writes DateTimeExtensions.ToWireFormattedString: yyyy-MM-dd HH:mm:ss:ffffff Z.
	nsbExpire = regexp.MustCompile(`^(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}):(\d{1,9}) Z$`)
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
	if p.Destination, err = destination(d.Headers); err != nil {
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

// headerString accepts AMQP long strings and byte arrays (some clients send
// text as 'x'). ok is false when the header is absent.
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
// both. Replay reads error-queue copies with it, so both apply the same rules.
func ParseDestination(h amqp.Table) (wire.Destination, error) { return destination(h) }

// ParseID reads the id as Parse does (docs/contract.md §2.4): the message-id
// property, else the NServiceBus.MessageId header. "" with a nil error means
// the delivery names no id.
func ParseID(d *amqp.Delivery) (string, error) { return messageID(d) }

func destination(h amqp.Table) (wire.Destination, error) {
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
	return wire.Destination{}, fmt.Errorf("no destination: set header %s (or %s) to the queue to deliver to, or %s (and %s) to the exchange",
		wire.HeaderDestination, wire.HeaderNSBDestination, wire.HeaderDestinationExchange, wire.HeaderDestinationRoutingKey)
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
		return time.Time{}, fmt.Errorf("header %s %q is not an RFC 3339 timestamp like 2026-11-21T20:00:00.250Z", wire.HeaderDueAt, clip(s))
	}
	return inRange(wire.HeaderDueAt, t.UTC())
}

func parseNSBExpire(v any) (time.Time, error) {
	var s string
	switch v := v.(type) {
	case string:
		s = v
	case []byte:
		s = string(v)
	default:
		return time.Time{}, fmt.Errorf("header %s must be a string, got %s", wire.HeaderNSBExpire, typeName(v))
	}
	if len(s) > maxTimeText {
		return time.Time{}, fmt.Errorf("header %s is %d bytes, too long for the NServiceBus wire format", wire.HeaderNSBExpire, len(s))
	}
	m := nsbExpire.FindStringSubmatch(s)
	if m == nil {
		return time.Time{}, fmt.Errorf("header %s %q is not in the NServiceBus wire format yyyy-MM-dd HH:mm:ss:ffffff Z", wire.HeaderNSBExpire, clip(s))
	}
	t, err := time.Parse("2006-01-02 15:04:05", m[1])
	if err != nil {
		return time.Time{}, fmt.Errorf("header %s %q: %v", wire.HeaderNSBExpire, clip(s), err)
	}
	frac := m[2] + strings.Repeat("0", 9-len(m[2]))
	ns, _ := strconv.Atoi(frac) // nine digits at most: always fits
	return inRange(wire.HeaderNSBExpire, t.Add(time.Duration(ns)).UTC())
}

// parseDelay reads x-delay as the delayed-message-exchange plugin does:
// every AMQP integer type, a decimal string, or a floating-point number
// truncated toward zero. Zero or negative means now.
func parseDelay(v any) (int64, error) {
	var ms int64
	switch v := v.(type) {
	case float32:
		return floatDelay(float64(v))
	case float64:
		return floatDelay(v)
	case int8:
		ms = int64(v)
	case uint8:
		ms = int64(v)
	case int16:
		ms = int64(v)
	case uint16:
		ms = int64(v)
	case int32:
		ms = int64(v)
	case uint32:
		ms = int64(v)
	case int64:
		ms = v
	case int:
		ms = int64(v)
	case string, []byte:
		var s string
		if b, ok := v.([]byte); ok {
			s = string(b)
		} else {
			s = v.(string)
		}
		n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("header %s %q is not a whole number of milliseconds", wire.HeaderDelay, clip(s))
		}
		ms = n
	default:
		return 0, fmt.Errorf("header %s must be a number of milliseconds (an integer, a decimal string or a floating-point number), got %s", wire.HeaderDelay, typeName(v))
	}
	return delayInRange(ms)
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

// clip keeps error text short when a header value is huge.
func clip(s string) string {
	const n = 64
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
