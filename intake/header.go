package intake

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

// The readers of header values that every protocol's parser shares, so
// that all read a value by the same rules and refuse it in the same words.

// maxDelay is the longest x-delay whose due time a time.Duration can hold.
const maxDelay = math.MaxInt64 / int64(time.Millisecond)

// MaxTimeText is far above the longest valid due-time text (~35 bytes);
// longer values are refused before any parsing work. The limits on ids and
// destinations are wire's, shared with every other way into the store.
const MaxTimeText = 64

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

// Parsed is where and when a message goes, and its id: what ingest's rules
// check (ingest.Rules).
type Parsed struct {
	ID          string
	Destination wire.Destination
	DueAt       time.Time
}

// HeaderString reads a text header as every parser does: an AMQP long
// string or a byte array (some clients send text as 'x'). ok is false when
// the header is absent or void; any other type is an error naming the header.
func HeaderString(h amqp.Table, name string) (s string, ok bool, err error) {
	v, present := h[name]
	if !present || v == nil {
		return "", false, nil
	}
	if s, ok := Text(v); ok {
		return s, true, nil
	}
	return "", true, fmt.Errorf("header %s must be a string, got %s", name, TypeName(v))
}

// Text is v as text when it is of a type a client sends text as: an AMQP
// long string, or a byte array (some clients send text as 'x').
func Text(v any) (string, bool) {
	switch v := v.(type) {
	case string:
		return v, true
	case []byte:
		return string(v), true
	}
	return "", false
}

// ParseNSBTimeHeader reads header name's value v in the NServiceBus wire
// format (wire.ParseNSBTime), as a string or a byte array.
func ParseNSBTimeHeader(name string, v any) (time.Time, error) {
	s, ok := Text(v)
	if !ok {
		return time.Time{}, fmt.Errorf("header %s must be a string, got %s", name, TypeName(v))
	}
	if len(s) > MaxTimeText {
		return time.Time{}, fmt.Errorf("header %s is %d bytes, too long for the NServiceBus wire format", name, len(s))
	}
	if nsbCultureTime.MatchString(s) {
		return time.Time{}, fmt.Errorf("header %s %q is culture-dependent date text, as NServiceBus 3.0 betas wrote it: its day/month order and time zone are unknown; senders from NServiceBus 3.0.0 on write %s", name, wire.Clip(s), wire.NSBTimeLayout)
	}
	t, err := wire.ParseNSBTime(s)
	if err != nil {
		return time.Time{}, fmt.Errorf("header %s %q is %v", name, wire.Clip(s), err)
	}
	return InRange(name, t)
}

// ParseDelay reads x-delay as the delayed-message-exchange plugin does:
// every AMQP integer type, a decimal string, or a floating-point number
// truncated toward zero. Zero or negative means now.
func ParseDelay(v any) (int64, error) {
	if ms, ok := HeaderInteger(v); ok {
		return delayInRange(ms)
	}
	switch v := v.(type) {
	case float32:
		return floatDelay(float64(v))
	case float64:
		return floatDelay(v)
	case string, []byte:
		s, _ := Text(v)
		n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("header %s %q is not a whole number of milliseconds", wire.HeaderDelay, wire.Clip(s))
		}
		return delayInRange(n)
	}
	return 0, fmt.Errorf("header %s must be a number of milliseconds (an integer, a decimal string or a floating-point number), got %s", wire.HeaderDelay, TypeName(v))
}

// HeaderInteger is v as an int64 when it is of one of the integer types an
// AMQP table value decodes to.
func HeaderInteger(v any) (int64, bool) {
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

// InRange returns t, or an error naming header when t is outside the due
// times a store keeps.
func InRange(header string, t time.Time) (time.Time, error) {
	if t.Before(minDue) || t.After(maxDue) {
		return time.Time{}, fmt.Errorf("header %s %s is outside years 0000 to 2262 (the latest due time is %s)",
			header, t.Format(time.RFC3339Nano), maxDue.Format(time.RFC3339Nano))
	}
	return t, nil
}

// ParseID reads the id as every parser does (docs/contract.md §2.4): the
// message-id property, else the NServiceBus.MessageId header. "" with a nil
// error means the delivery names no id.
func ParseID(d *amqp.Delivery) (string, error) {
	id, source := d.MessageId, "message-id property"
	if strings.TrimSpace(id) == "" {
		s, ok, err := HeaderString(d.Headers, wire.HeaderNSBMessageID)
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

// TypeName names a header value's type in error text.
func TypeName(v any) string {
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
