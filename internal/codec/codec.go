// Package codec is the one byte reader and the appenders behind the binary
// encodings the bridge writes by hand: AMQP 0-9-1 frames and method fields
// (broker's raw connection, amqp.go), the stored message (package message)
// and bbolt's records (storage/boltstore/codec.go). Each format stays with
// its owner; this package holds what they share, so that a length check or
// a time field is written once.
//
// FuzzDecoders (storage/boltstore/fuzz_test.go) feeds arbitrary bytes to the
// three decoders built on Decoder.
package codec

import (
	"encoding/binary"
	"fmt"
	"math"
	"time"
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
