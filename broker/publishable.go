package broker

import (
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// ErrUnpublishable means a message cannot go on the wire as it is: the
// client library would fail to encode it, which closes the whole connection
// (amqp091-go shuts the connection down on a frame it cannot write), or the
// broker would close the connection over it (a content header larger than
// frame_max). It is about the message, not the connection: other publishes
// are unaffected, and retrying the same message cannot help.
var ErrUnpublishable = errors.New("cannot be published")

// frameOverhead is a frame's type, channel, size and end octet.
const frameOverhead = 8

// Publishable checks what amqp091-go checks while writing a publish, and
// the content header's size against the connection's frame_max (frameMax ≤ 0:
// no limit), so that an unencodable message fails alone instead of taking
// the connection and every publish in flight on it down. The error wraps
// ErrUnpublishable and says which field is at fault.
func Publishable(exchange, routingKey string, msg *amqp.Publishing, frameMax int) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrUnpublishable, fmt.Sprintf(format, args...))
	}
	for _, f := range []struct{ name, v string }{{"exchange", exchange}, {"routing key", routingKey}} {
		if len(f.v) > 255 {
			return bad("%s is %d bytes, over AMQP's 255", f.name, len(f.v))
		}
	}
	// Payload of the content header: class, weight, body size, flags.
	size := 2 + 2 + 8 + 2
	for _, p := range []struct{ name, v string }{
		{"content-type", msg.ContentType}, {"content-encoding", msg.ContentEncoding},
		{"correlation-id", msg.CorrelationId}, {"reply-to", msg.ReplyTo}, {"expiration", msg.Expiration},
		{"message-id", msg.MessageId}, {"type", msg.Type}, {"user-id", msg.UserId}, {"app-id", msg.AppId},
	} {
		if len(p.v) > 255 {
			return bad("property %s is %d bytes, over AMQP's 255", p.name, len(p.v))
		}
		if p.v != "" {
			size += 1 + len(p.v)
		}
	}
	if msg.DeliveryMode > 0 {
		size++
	}
	if msg.Priority > 0 {
		size++
	}
	if !msg.Timestamp.IsZero() {
		size += 8
	}
	if len(msg.Headers) > 0 {
		n, err := tableSize(msg.Headers)
		if err != nil {
			return bad("headers: %v", err)
		}
		size += n
	}
	if frameMax > 0 && size > frameMax-frameOverhead {
		return bad("its properties and headers take %d bytes, over the connection's frame size of %d", size, frameMax)
	}
	return nil
}

// tableSize is the encoded size of a field table (with its length prefix),
// mirroring amqp091-go's writeTable: keys are short strings.
func tableSize(t amqp.Table) (int, error) {
	n := 4
	for k, v := range t {
		if len(k) > 255 {
			return 0, fmt.Errorf("key %.40q… is %d bytes, over AMQP's 255", k, len(k))
		}
		fn, err := fieldSize(v)
		if err != nil {
			return 0, fmt.Errorf("%q: %w", k, err)
		}
		n += 1 + len(k) + fn
	}
	return n, nil
}

// fieldSize is the encoded size of one field value with its type octet; the
// types are exactly those amqp091-go's writeField accepts.
func fieldSize(v any) (int, error) {
	switch v := v.(type) {
	case nil:
		return 1, nil
	case bool, byte, int8:
		return 2, nil
	case int16, uint16:
		return 3, nil
	case int, int32, uint32, float32:
		return 5, nil
	case amqp.Decimal:
		return 6, nil
	case int64, float64, time.Time:
		return 9, nil
	case string:
		return 5 + len(v), nil
	case []byte:
		return 5 + len(v), nil
	case []any:
		n := 5
		for i, e := range v {
			fn, err := fieldSize(e)
			if err != nil {
				return 0, fmt.Errorf("array element %d: %w", i, err)
			}
			n += fn
		}
		return n, nil
	case amqp.Table:
		n, err := tableSize(v)
		return 1 + n, err
	}
	return 0, fmt.Errorf("value of type %T has no AMQP encoding", v)
}
