package broker

import (
	"errors"
	"fmt"
	"math"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/internal/codec"
)

// ErrUnreadable means a message's properties are valid AMQP, and the broker
// took them, but amqp091-go refuses to read them: it then drops the whole
// connection, and the message comes back first, forever. The sweep
// (sweep.go) moves such messages to the error queue.
var ErrUnreadable = errors.New("message headers exceed what the AMQP client can read")

// amqp091-go v1.16.0's limits when it reads a field table or array
// (maxFieldDepth and maxContainerElements in its read.go). The headers table
// is depth 0; each nested table or array adds one.
const (
	clientMaxDepth   = 32
	clientMaxEntries = 8192
)

// Property flags of basic's content header, in wire order (amqp091-go's
// flag* constants).
const (
	propContentType     = 0x8000
	propContentEncoding = 0x4000
	propHeaders         = 0x2000
	propDeliveryMode    = 0x1000
	propPriority        = 0x0800
	propCorrelationID   = 0x0400
	propReplyTo         = 0x0200
	propExpiration      = 0x0100
	propMessageID       = 0x0080
	propTimestamp       = 0x0040
	propType            = 0x0020
	propUserID          = 0x0010
	propAppID           = 0x0008
	propReserved        = 0x0004
)

// decodeProperties reads a content header's property flags and list (its
// payload after class, weight and body size) the way amqp091-go does. It
// returns every property but the headers, and an error wrapping
// ErrUnreadable when amqp091-go could not read them. Properties after an
// unreadable headers table are still returned: the table's length prefix
// says where it ends. An encoding the protocol does not allow (which the
// broker refuses anyway) counts as unreadable too.
func decodeProperties(b []byte) (amqp.Publishing, error) {
	var p amqp.Publishing
	d := codec.NewDecoder(b, errMalformed)
	flags := d.U16()
	str := func(flag uint16, dst *string) {
		if flags&flag != 0 {
			*dst = d.ShortString()
		}
	}
	octet := func(flag uint16, dst *uint8) {
		if flags&flag != 0 {
			*dst = d.Byte()
		}
	}
	var unreadable error
	str(propContentType, &p.ContentType)
	str(propContentEncoding, &p.ContentEncoding)
	if flags&propHeaders != 0 {
		n := d.U32()
		if n > math.MaxInt32 {
			d.Fail(fmt.Sprintf("headers table of %d bytes", n))
		}
		if table := d.Next(uint64(n)); d.Err() == nil {
			unreadable = checkTable(table, 0)
		}
	}
	octet(propDeliveryMode, &p.DeliveryMode)
	octet(propPriority, &p.Priority)
	str(propCorrelationID, &p.CorrelationId)
	str(propReplyTo, &p.ReplyTo)
	str(propExpiration, &p.Expiration)
	str(propMessageID, &p.MessageId)
	if flags&propTimestamp != 0 {
		p.Timestamp = time.Unix(int64(d.U64()), 0)
	}
	str(propType, &p.Type)
	str(propUserID, &p.UserId)
	str(propAppID, &p.AppId)
	var reserved string
	str(propReserved, &reserved)
	switch {
	case unreadable != nil:
		return p, unreadable
	case d.Err() != nil:
		return p, fmt.Errorf("%w: %w", ErrUnreadable, d.Err())
	}
	return p, nil
}

// checkTable walks the entries of an encoded field table (without its
// length prefix) at depth, building no values, and applies amqp091-go's
// limits exactly: it refuses an entry when the table already holds
// clientMaxEntries distinct keys (a repeated key replaces, so it does not
// count), and a table or array deeper than clientMaxDepth.
func checkTable(b []byte, depth int) error {
	if depth > clientMaxDepth {
		return depthError()
	}
	d := codec.NewDecoder(b, errMalformed)
	keys := make(map[string]struct{})
	entries, over := 0, false
	for d.Len() > 0 {
		key := d.ShortString()
		if err := checkField(d, depth); err != nil {
			return err
		}
		if d.Err() != nil {
			return fmt.Errorf("%w: %w", ErrUnreadable, d.Err())
		}
		entries++
		if len(keys) >= clientMaxEntries {
			over = true // keep counting, for the reason
			continue
		}
		keys[key] = struct{}{}
	}
	if over {
		return fmt.Errorf("%w: %d entries in one table (limit %d)", ErrUnreadable, entries, clientMaxEntries)
	}
	return nil
}

// checkArray walks an encoded field array (length prefix included).
func checkArray(d *codec.Decoder, depth int) error {
	if depth > clientMaxDepth {
		return depthError()
	}
	n := d.U32()
	if n > math.MaxInt32 {
		return fmt.Errorf("%w: %w: array of %d bytes", ErrUnreadable, errMalformed, n)
	}
	inner := codec.NewDecoder(d.Next(uint64(n)), errMalformed)
	elements := 0
	for d.Err() == nil && inner.Len() > 0 {
		if err := checkField(inner, depth); err != nil {
			return err
		}
		if inner.Err() != nil {
			return fmt.Errorf("%w: %w", ErrUnreadable, inner.Err())
		}
		elements++
	}
	if elements > clientMaxEntries {
		return fmt.Errorf("%w: %d elements in one array (limit %d)", ErrUnreadable, elements, clientMaxEntries)
	}
	return nil
}

func depthError() error {
	return fmt.Errorf("%w: tables or arrays nested more than %d levels deep (limit %d)", ErrUnreadable, clientMaxDepth, clientMaxDepth)
}

// checkField skips one field value (its type octet first), descending into
// tables and arrays. Short reads are left in d.Err() for the caller.
func checkField(d *codec.Decoder, depth int) error {
	switch typ := d.Byte(); typ {
	case 't', 'b', 'B':
		d.Next(1)
	case 's', 'u':
		d.Next(2)
	case 'I', 'i', 'f':
		d.Next(4)
	case 'l', 'd', 'T':
		d.Next(8)
	case 'D':
		d.Next(5)
	case 'V':
	case 'S':
		if n := d.U32(); n > math.MaxInt32 {
			return fmt.Errorf("%w: %w: long string of %d bytes", ErrUnreadable, errMalformed, n)
		} else {
			d.Next(uint64(n))
		}
	case 'x':
		if n := int32(d.U32()); n < 0 {
			return fmt.Errorf("%w: %w: byte array of negative length", ErrUnreadable, errMalformed)
		} else {
			d.Next(uint64(n))
		}
	case 'A':
		return checkArray(d, depth+1)
	case 'F':
		if depth+1 > clientMaxDepth {
			return depthError()
		}
		n := d.U32()
		if n > math.MaxInt32 {
			return fmt.Errorf("%w: %w: table of %d bytes", ErrUnreadable, errMalformed, n)
		}
		if inner := d.Next(uint64(n)); d.Err() == nil {
			return checkTable(inner, depth+1)
		}
	default:
		if d.Err() == nil {
			return fmt.Errorf("%w: %w: unknown field type 0x%02x", ErrUnreadable, errMalformed, typ)
		}
	}
	return nil
}
