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
		b = appendString(b, s)
	}
	b = append(b, p.DeliveryMode, p.Priority)
	b = appendTime(b, p.Timestamp)
	if p.Headers == nil {
		b = append(b, 0)
	} else {
		b = append(b, 1)
		var err error
		if b, err = appendTable(b, p.Headers); err != nil {
			return nil, err
		}
	}
	b = binary.AppendUvarint(b, uint64(len(p.Body)))
	return append(b, p.Body...), nil
}

// Decode rebuilds the publishing encoded in b. The result does not alias b.
func Decode(b []byte) (amqp.Publishing, error) {
	r := reader{b: b}
	var p amqp.Publishing
	if v := r.byte(); v != version {
		return p, fmt.Errorf("%w: unknown version %d", ErrCorrupt, v)
	}
	for _, s := range [...]*string{&p.ContentType, &p.ContentEncoding, &p.CorrelationId, &p.ReplyTo,
		&p.Expiration, &p.MessageId, &p.Type, &p.UserId, &p.AppId} {
		*s = r.string()
	}
	p.DeliveryMode = r.byte()
	p.Priority = r.byte()
	p.Timestamp = r.time()
	if r.byte() == 1 {
		p.Headers = r.table(0)
	}
	p.Body = r.bytes()
	if r.err != nil {
		return amqp.Publishing{}, r.err
	}
	if len(r.b) != 0 {
		return amqp.Publishing{}, fmt.Errorf("%w: %d trailing bytes", ErrCorrupt, len(r.b))
	}
	return p, nil
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// appendTime writes seconds and nanoseconds separately: an AMQP timestamp is
// any 64-bit second count, far outside what UnixNano can hold.
func appendTime(b []byte, t time.Time) []byte {
	if t.IsZero() {
		return append(b, 0)
	}
	b = append(b, 1)
	b = binary.AppendVarint(b, t.Unix())
	return binary.AppendUvarint(b, uint64(t.Nanosecond()))
}

// appendTable writes the entries in key order: the same table always
// encodes to the same bytes (Fingerprint hashes them).
func appendTable(b []byte, t amqp.Table) ([]byte, error) {
	b = binary.AppendUvarint(b, uint64(len(t)))
	for _, k := range slices.Sorted(maps.Keys(t)) {
		b = appendString(b, k)
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
		return appendString(append(b, 'S'), v), nil
	case []byte:
		b = binary.AppendUvarint(append(b, 'x'), uint64(len(v)))
		return append(b, v...), nil
	case time.Time:
		return appendTime(append(b, 'T'), v), nil
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

// reader consumes b; the first error sticks and later reads return zero values.
type reader struct {
	b   []byte
	err error
}

func (r *reader) fail(what string) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: %s", ErrCorrupt, what)
	}
	r.b = nil
}

func (r *reader) take(n uint64) []byte {
	if r.err != nil {
		return nil
	}
	if n > uint64(len(r.b)) {
		r.fail("truncated")
		return nil
	}
	out := r.b[:n:n]
	r.b = r.b[n:]
	return out
}

func (r *reader) byte() byte {
	if s := r.take(1); s != nil {
		return s[0]
	}
	return 0
}

func (r *reader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.fail("bad length")
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) string() string { return string(r.take(r.uvarint())) }

func (r *reader) bytes() []byte {
	n := r.uvarint()
	s := r.take(n)
	if r.err != nil {
		return nil
	}
	return append(make([]byte, 0, n), s...)
}

func (r *reader) time() time.Time {
	switch r.byte() {
	case 0:
		return time.Time{}
	case 1:
		if r.err != nil {
			return time.Time{}
		}
		sec, n := binary.Varint(r.b)
		if n <= 0 {
			r.fail("bad time")
			return time.Time{}
		}
		r.b = r.b[n:]
		nsec := r.uvarint()
		if nsec >= 1e9 {
			r.fail("bad nanoseconds")
			return time.Time{}
		}
		return time.Unix(sec, int64(nsec)).UTC()
	}
	r.fail("bad time flag")
	return time.Time{}
}

func (r *reader) u16() uint16 {
	if s := r.take(2); s != nil {
		return binary.BigEndian.Uint16(s)
	}
	return 0
}

func (r *reader) u32() uint32 {
	if s := r.take(4); s != nil {
		return binary.BigEndian.Uint32(s)
	}
	return 0
}

func (r *reader) u64() uint64 {
	if s := r.take(8); s != nil {
		return binary.BigEndian.Uint64(s)
	}
	return 0
}

func (r *reader) table(depth int) amqp.Table {
	if depth > maxDepth {
		r.fail("nesting too deep")
		return nil
	}
	n := r.uvarint()
	if n > uint64(len(r.b)) { // every entry takes at least one byte
		r.fail("table length")
		return nil
	}
	t := make(amqp.Table, n)
	for i := uint64(0); i < n && r.err == nil; i++ {
		k := r.string()
		t[k] = r.value(depth)
	}
	return t
}

func (r *reader) value(depth int) any {
	switch tag := r.byte(); tag {
	case 'V':
		return nil
	case 't':
		return r.byte() != 0
	case 'b':
		return int8(r.byte())
	case 'B':
		return r.byte()
	case 's':
		return int16(r.u16())
	case 'u':
		return r.u16()
	case 'I':
		return int32(r.u32())
	case 'i':
		return r.u32()
	case 'l':
		return int64(r.u64())
	case 'f':
		return math.Float32frombits(r.u32())
	case 'd':
		return math.Float64frombits(r.u64())
	case 'D':
		scale := r.byte()
		return amqp.Decimal{Scale: scale, Value: int32(r.u32())}
	case 'S':
		return r.string()
	case 'x':
		return r.bytes()
	case 'T':
		return r.time()
	case 'F':
		return r.table(depth + 1)
	case 'A':
		if depth+1 > maxDepth {
			r.fail("nesting too deep")
			return nil
		}
		n := r.uvarint()
		if n > uint64(len(r.b)) {
			r.fail("array length")
			return nil
		}
		a := make([]any, 0, n)
		for i := uint64(0); i < n && r.err == nil; i++ {
			a = append(a, r.value(depth+1))
		}
		return a
	default:
		r.fail(fmt.Sprintf("unknown value tag %q", tag))
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
