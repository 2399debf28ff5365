// Package message encodes what the bridge keeps of an AMQP message (body,
// properties and typed headers) into bytes for the store, and back.
//
// The encoding keeps every AMQP field-table type distinct, so a header that
// arrived as an int16 leaves as an int16: forwarding is faithful on the wire,
// which JSON or gob round trips would not guarantee.
package message

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/internal/codec"
)

const version = 1

// maxDepth bounds nested tables and arrays when decoding, so corrupt input
// cannot exhaust the stack.
const maxDepth = 64

// ErrCorrupt is returned for bytes that are not a valid encoding.
var ErrCorrupt = errors.New("message: corrupt encoding")

// FromDelivery copies the publishable parts of a delivery.
func FromDelivery(d *amqp.Delivery) amqp.Publishing {
	return amqp.Publishing{
		Headers:         d.Headers,
		ContentType:     d.ContentType,
		ContentEncoding: d.ContentEncoding,
		DeliveryMode:    d.DeliveryMode,
		Priority:        d.Priority,
		CorrelationId:   d.CorrelationId,
		ReplyTo:         d.ReplyTo,
		Expiration:      d.Expiration,
		MessageId:       d.MessageId,
		Timestamp:       d.Timestamp,
		Type:            d.Type,
		UserId:          d.UserId,
		AppId:           d.AppId,
		Body:            d.Body,
	}
}

// Encode appends the encoding of p to dst and returns it. It fails only for
// header values that AMQP cannot carry.
func Encode(dst []byte, p *amqp.Publishing) ([]byte, error) {
	b := append(dst, version)
	for _, s := range [...]string{p.ContentType, p.ContentEncoding, p.CorrelationId, p.ReplyTo,
		p.Expiration, p.MessageId, p.Type, p.UserId, p.AppId} {
		b = codec.AppendString(b, s)
	}
	b = append(b, p.DeliveryMode, p.Priority)
	b = codec.AppendUnixTime(b, p.Timestamp)
	if p.Headers == nil {
		b = append(b, 0)
	} else {
		b = append(b, 1)
		var err error
		if b, err = appendTable(b, p.Headers); err != nil {
			return nil, err
		}
	}
	return codec.AppendBytes(b, p.Body), nil
}

// Decode rebuilds the publishing encoded in b. The result does not alias b.
func Decode(b []byte) (amqp.Publishing, error) {
	d := codec.NewDecoder(b, ErrCorrupt)
	var p amqp.Publishing
	if v := d.Byte(); v != version {
		return p, fmt.Errorf("%w: unknown version %d", ErrCorrupt, v)
	}
	for _, s := range [...]*string{&p.ContentType, &p.ContentEncoding, &p.CorrelationId, &p.ReplyTo,
		&p.Expiration, &p.MessageId, &p.Type, &p.UserId, &p.AppId} {
		*s = d.String()
	}
	p.DeliveryMode = d.Byte()
	p.Priority = d.Byte()
	p.Timestamp = d.UnixTime()
	if d.Byte() == 1 {
		p.Headers = readTable(d, 0)
	}
	p.Body = d.Bytes()
	if err := d.End(); err != nil {
		return amqp.Publishing{}, err
	}
	return p, nil
}

// appendTable writes the entries in key order: the same table always
// encodes to the same bytes (Fingerprint hashes them).
func appendTable(b []byte, t amqp.Table) ([]byte, error) {
	b = binary.AppendUvarint(b, uint64(len(t)))
	for _, k := range slices.Sorted(maps.Keys(t)) {
		b = codec.AppendString(b, k)
		var err error
		if b, err = appendValue(b, t[k]); err != nil {
			return nil, fmt.Errorf("header %q: %w", k, err)
		}
	}
	return b, nil
}

// appendValue writes a tag and payload. Tags follow the AMQP field types that
// amqp091-go reads and writes; Go int is written as 'I' exactly as the
// library would put it on the wire.
func appendValue(b []byte, v any) ([]byte, error) {
	switch v := v.(type) {
	case nil:
		return append(b, 'V'), nil
	case bool:
		if v {
			return append(b, 't', 1), nil
		}
		return append(b, 't', 0), nil
	case int8:
		return append(b, 'b', byte(v)), nil
	case uint8:
		return append(b, 'B', v), nil
	case int16:
		return binary.BigEndian.AppendUint16(append(b, 's'), uint16(v)), nil
	case uint16:
		return binary.BigEndian.AppendUint16(append(b, 'u'), v), nil
	case int:
		if v < math.MinInt32 || v > math.MaxInt32 {
			return nil, fmt.Errorf("int %d does not fit AMQP's 32-bit field", v)
		}
		return binary.BigEndian.AppendUint32(append(b, 'I'), uint32(int32(v))), nil
	case int32:
		return binary.BigEndian.AppendUint32(append(b, 'I'), uint32(v)), nil
	case uint32:
		return binary.BigEndian.AppendUint32(append(b, 'i'), v), nil
	case int64:
		return binary.BigEndian.AppendUint64(append(b, 'l'), uint64(v)), nil
	case float32:
		return binary.BigEndian.AppendUint32(append(b, 'f'), math.Float32bits(v)), nil
	case float64:
		return binary.BigEndian.AppendUint64(append(b, 'd'), math.Float64bits(v)), nil
	case amqp.Decimal:
		return binary.BigEndian.AppendUint32(append(b, 'D', v.Scale), uint32(v.Value)), nil
	case string:
		return codec.AppendString(append(b, 'S'), v), nil
	case []byte:
		return codec.AppendBytes(append(b, 'x'), v), nil
	case time.Time:
		return codec.AppendUnixTime(append(b, 'T'), v), nil
	case amqp.Table:
		return appendTable(append(b, 'F'), v)
	case []any:
		b = binary.AppendUvarint(append(b, 'A'), uint64(len(v)))
		for i, e := range v {
			var err error
			if b, err = appendValue(b, e); err != nil {
				return nil, fmt.Errorf("array element %d: %w", i, err)
			}
		}
		return b, nil
	}
	return nil, fmt.Errorf("value of type %T is not an AMQP field type", v)
}

// readTable reads what appendTable wrote, at depth.
func readTable(d *codec.Decoder, depth int) amqp.Table {
	if depth > maxDepth {
		d.Fail("nesting too deep")
		return nil
	}
	n := d.Uvarint()
	if n > uint64(d.Len()) { // every entry takes at least one byte
		d.Fail("table length")
		return nil
	}
	t := make(amqp.Table, n)
	for i := uint64(0); i < n && d.Err() == nil; i++ {
		k := d.String()
		t[k] = readValue(d, depth)
	}
	return t
}

// readValue reads what appendValue wrote, at depth.
func readValue(d *codec.Decoder, depth int) any {
	switch tag := d.Byte(); tag {
	case 'V':
		return nil
	case 't':
		return d.Byte() != 0
	case 'b':
		return int8(d.Byte())
	case 'B':
		return d.Byte()
	case 's':
		return int16(d.U16())
	case 'u':
		return d.U16()
	case 'I':
		return int32(d.U32())
	case 'i':
		return d.U32()
	case 'l':
		return int64(d.U64())
	case 'f':
		return math.Float32frombits(d.U32())
	case 'd':
		return math.Float64frombits(d.U64())
	case 'D':
		scale := d.Byte()
		return amqp.Decimal{Scale: scale, Value: int32(d.U32())}
	case 'S':
		return d.String()
	case 'x':
		return d.Bytes()
	case 'T':
		return d.UnixTime()
	case 'F':
		return readTable(d, depth+1)
	case 'A':
		if depth+1 > maxDepth {
			d.Fail("nesting too deep")
			return nil
		}
		n := d.Uvarint()
		if n > uint64(d.Len()) {
			d.Fail("array length")
			return nil
		}
		a := make([]any, 0, n)
		for i := uint64(0); i < n && d.Err() == nil; i++ {
			a = append(a, readValue(d, depth+1))
		}
		return a
	default:
		d.Fail(fmt.Sprintf("unknown value tag %q", tag))
		return nil
	}
}

// HeaderIs reports whether the message encoded in b has header name with
// the text value: a string, or a byte array as some clients send text, equal
// to value; an integer or a boolean whose decimal (true/false) form is value.
// Other types never match. It is the header selector of bulk actions
// (storage.ListFilter), so an operator can pick a tenant's or a
// correlation's messages.
func HeaderIs(b []byte, name, value string) (bool, error) {
	p, err := Decode(b)
	if err != nil {
		return false, err
	}
	v, ok := p.Headers[name]
	if !ok {
		return false, nil
	}
	switch v := v.(type) {
	case string:
		return v == value, nil
	case []byte:
		return string(v) == value, nil
	case bool, int8, uint8, int16, uint16, int32, uint32, int64, uint64, int:
		return fmt.Sprint(v) == value, nil
	}
	return false, nil
}
