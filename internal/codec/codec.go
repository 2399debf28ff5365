// Package codec is the one byte reader and the appenders behind the binary
// encodings the bridge writes by hand: AMQP 0-9-1 frames and method fields
// (broker's raw connection, amqp.go), the stored message (package message)
// and bbolt's records (storage/boltstore/codec.go). Each format stays with
// its owner; this package holds what they share, so that a length check or
// a time field is written once, and the stored message's typed header
// tables (AppendTable, Decoder.Table), whose reader recurses through
// Decoder's own reads.
//
// FuzzDecoders (storage/boltstore/fuzz_test.go) feeds arbitrary bytes to the
// three decoders built on Decoder.
package codec

import (
	"encoding/binary"
	"fmt"
	"maps"
	"math"
	"slices"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Decoder consumes a byte slice. The first failure sticks: every later read
// returns zero values, so a caller checks Err once, after its last read.
type Decoder struct {
	b   []byte
	err error
	// corrupt is the sentinel every error wraps (the format's own:
	// message.ErrCorrupt, boltstore's errCorrupt, broker's errMalformed).
	corrupt error
}

// NewDecoder reads b; its errors wrap corrupt.
func NewDecoder(b []byte, corrupt error) *Decoder {
	return &Decoder{b: b, corrupt: corrupt}
}

// Err is the first failure, or nil.
func (d *Decoder) Err() error { return d.err }

// Len is how many bytes are left.
func (d *Decoder) Len() int { return len(d.b) }

// Fail records a failure, "<corrupt>: what", unless one is recorded already,
// and drops what is left.
func (d *Decoder) Fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: %s", d.corrupt, what)
	}
	d.b = nil
}

// End fails on trailing bytes and returns the first failure.
func (d *Decoder) End() error {
	if d.err == nil && len(d.b) != 0 {
		d.Fail(fmt.Sprintf("%d trailing bytes", len(d.b)))
	}
	return d.err
}

// Next returns the next n bytes, a slice of the input whose capacity ends
// with it, or nil after a failure.
func (d *Decoder) Next(n uint64) []byte {
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.b)) {
		d.short(n)
		return nil
	}
	p := d.b[:n:n]
	d.b = d.b[n:]
	return p
}

// short is Next's failure, apart to keep Next small.
func (d *Decoder) short(n uint64) {
	d.Fail(fmt.Sprintf("%d bytes needed, %d left", n, len(d.b)))
}

// Byte reads one byte.
func (d *Decoder) Byte() byte {
	if p := d.Next(1); p != nil {
		return p[0]
	}
	return 0
}

// U16 reads a big-endian (network order) uint16.
func (d *Decoder) U16() uint16 { return uint16(d.bigEndian(2)) }

// U32 reads a big-endian uint32.
func (d *Decoder) U32() uint32 { return uint32(d.bigEndian(4)) }

// U64 reads a big-endian uint64.
func (d *Decoder) U64() uint64 { return d.bigEndian(8) }

// bigEndian reads an n-byte big-endian unsigned integer, n <= 8.
func (d *Decoder) bigEndian(n uint64) uint64 {
	var v uint64
	for _, c := range d.Next(n) {
		v = v<<8 | uint64(c)
	}
	return v
}

// Uvarint reads an encoding/binary uvarint.
func (d *Decoder) Uvarint() uint64 { return d.uvarint("bad uvarint") }

// Varint reads an encoding/binary varint: a uvarint of the zig-zag
// encoding, decoded as binary.Varint does.
func (d *Decoder) Varint() int64 {
	ux := d.uvarint("bad varint")
	x := int64(ux >> 1)
	if ux&1 != 0 {
		x = ^x
	}
	return x
}

func (d *Decoder) uvarint(bad string) uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.Fail(bad)
		return 0
	}
	d.b = d.b[n:]
	return v
}

// AppendString appends s as a uvarint length and its bytes.
func AppendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// String reads what AppendString wrote; the result does not alias the input.
func (d *Decoder) String() string { return string(d.Next(d.Uvarint())) }

// AppendBytes appends p as a uvarint length and its bytes; nil and empty
// encode alike.
func AppendBytes(b, p []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(p)))
	return append(b, p...)
}

// Bytes reads what AppendBytes wrote into a new slice, never nil unless the
// read failed.
func (d *Decoder) Bytes() []byte {
	n := d.Uvarint()
	p := d.Next(n)
	if d.err != nil {
		return nil
	}
	return append(make([]byte, 0, n), p...)
}

// AppendNullableBytes appends p as a uvarint of its length plus one and its
// bytes; a nil p is the uvarint 0, so nil and empty stay apart.
func AppendNullableBytes(b, p []byte) []byte {
	if p == nil {
		return binary.AppendUvarint(b, 0)
	}
	b = binary.AppendUvarint(b, uint64(len(p))+1)
	return append(b, p...)
}

// NullableBytes reads what AppendNullableBytes wrote, as a slice of the
// input (callers that keep it copy it): nil for a nil slice or a failure.
func (d *Decoder) NullableBytes() []byte {
	if n := d.Uvarint(); n > 0 {
		return d.Next(n - 1)
	}
	return nil
}

// Two time encodings, one per format that has always used it; neither may
// change, since both are on disk.

// AppendUnixTime appends t as the stored message writes times: a byte 0 for
// the zero time, or a byte 1, the Unix seconds as a varint and the
// nanoseconds as a uvarint. Seconds and nanoseconds are apart because an
// AMQP timestamp is any 64-bit second count, far outside what UnixNano
// holds.
func AppendUnixTime(b []byte, t time.Time) []byte {
	if t.IsZero() {
		return append(b, 0)
	}
	return appendSeconds(append(b, 1), t.Unix(), t)
}

// UnixTime reads what AppendUnixTime wrote, in UTC.
func (d *Decoder) UnixTime() time.Time {
	switch d.Byte() {
	case 0:
		return time.Time{}
	case 1:
		sec, nsec, ok := d.seconds("bad nanoseconds")
		if !ok {
			return time.Time{}
		}
		return time.Unix(sec, nsec).UTC()
	}
	d.Fail("bad time flag")
	return time.Time{}
}

// secondsToUnix is the offset between seconds since year 1 and Unix seconds.
const secondsToUnix int64 = 62135596800

// AppendYear1Time appends t as bbolt's records write times: the seconds
// since 0001-01-01T00:00:00Z as a varint, then the nanoseconds (< 1e9) as a
// uvarint. The zero time, which is that instant, is 0,0.
func AppendYear1Time(b []byte, t time.Time) []byte {
	if t.IsZero() {
		return append(b, 0, 0)
	}
	return appendSeconds(b, t.Unix()+secondsToUnix, t)
}

// Year1Time reads what AppendYear1Time wrote: 0,0 as the zero time.Time,
// every other time in UTC.
func (d *Decoder) Year1Time() time.Time {
	sec, nsec, ok := d.seconds("nanoseconds out of range")
	if !ok {
		return time.Time{}
	}
	if sec == 0 && nsec == 0 {
		return time.Time{}
	}
	if sec < math.MinInt64+secondsToUnix {
		d.Fail("time out of range")
		return time.Time{}
	}
	return time.Unix(sec-secondsToUnix, nsec).UTC()
}

// appendSeconds appends sec as a varint and t's nanoseconds as a uvarint,
// the tail of both time encodings.
func appendSeconds(b []byte, sec int64, t time.Time) []byte {
	b = binary.AppendVarint(b, sec)
	return binary.AppendUvarint(b, uint64(t.Nanosecond()))
}

// seconds reads what appendSeconds wrote; nanoseconds of a second or more
// fail with badNanos.
func (d *Decoder) seconds(badNanos string) (sec, nsec int64, ok bool) {
	sec = d.Varint()
	n := d.Uvarint()
	if d.err != nil {
		return 0, 0, false
	}
	if n >= 1e9 {
		d.Fail(badNanos)
		return 0, 0, false
	}
	return sec, int64(n), true
}

// AMQP field tables, as the stored message (package message) writes its
// headers: every AMQP field type keeps a tag of its own, so a header that
// arrived as an int16 leaves as an int16.

// maxTableDepth bounds nested tables and arrays when reading, so corrupt
// input cannot exhaust the stack.
const maxTableDepth = 64

// AppendTable appends t with its entries in key order: the same table always
// encodes to the same bytes (message.Fingerprint hashes them). It fails only
// for values that AMQP cannot carry.
func AppendTable(b []byte, t amqp.Table) ([]byte, error) {
	b = binary.AppendUvarint(b, uint64(len(t)))
	for _, k := range slices.Sorted(maps.Keys(t)) {
		b = AppendString(b, k)
		var err error
		if b, err = appendFieldValue(b, t[k]); err != nil {
			return nil, fmt.Errorf("header %q: %w", k, err)
		}
	}
	return b, nil
}

// appendFieldValue appends a tag and payload. Tags follow the AMQP field types that
// amqp091-go reads and writes; Go int is written as 'I' exactly as the
// library would put it on the wire.
func appendFieldValue(b []byte, v any) ([]byte, error) {
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
		return AppendString(append(b, 'S'), v), nil
	case []byte:
		return AppendBytes(append(b, 'x'), v), nil
	case time.Time:
		return AppendUnixTime(append(b, 'T'), v), nil
	case amqp.Table:
		return AppendTable(append(b, 'F'), v)
	case []any:
		b = binary.AppendUvarint(append(b, 'A'), uint64(len(v)))
		for i, e := range v {
			var err error
			if b, err = appendFieldValue(b, e); err != nil {
				return nil, fmt.Errorf("array element %d: %w", i, err)
			}
		}
		return b, nil
	}
	return nil, fmt.Errorf("value of type %T is not an AMQP field type", v)
}

// Table reads what AppendTable wrote; the result does not alias the input.
func (d *Decoder) Table() amqp.Table { return d.tableAt(0) }

// tableAt reads a table nested depth deep.
func (d *Decoder) tableAt(depth int) amqp.Table {
	if depth > maxTableDepth {
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
		t[k] = d.fieldValue(depth)
	}
	return t
}

// fieldValue reads what appendFieldValue wrote, depth deep.
func (d *Decoder) fieldValue(depth int) any {
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
		return d.tableAt(depth + 1)
	case 'A':
		if depth+1 > maxTableDepth {
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
			a = append(a, d.fieldValue(depth+1))
		}
		return a
	default:
		d.Fail(fmt.Sprintf("unknown value tag %q", tag))
		return nil
	}
}
