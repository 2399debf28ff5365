package codec

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"io"
	"math"
	"strings"
	"testing"
	"time"
)

var errTest = errors.New("test format")

// The first failure sticks: later reads return zero values and keep it.
func TestDecoderFailureSticks(t *testing.T) {
	d := NewDecoder([]byte{1, 2, 3}, errTest)
	if got := d.U16(); got != 0x0102 {
		t.Fatalf("U16 = %#x", got)
	}
	if got := d.U32(); got != 0 {
		t.Fatalf("U32 past the end = %d, want 0", got)
	}
	first := d.Err()
	if !errors.Is(first, errTest) || first.Error() != "test format: 4 bytes needed, 1 left" {
		t.Fatalf("Err = %v", first)
	}
	if d.Byte() != 0 || d.String() != "" || d.Bytes() != nil || d.NullableBytes() != nil || !d.Year1Time().IsZero() ||
		!d.UnixTime().IsZero() || d.Len() != 0 {
		t.Fatal("a read after a failure returned data")
	}
	d.Fail("later")
	if d.Err() != first || d.End() != first {
		t.Fatalf("the first failure was replaced: %v", d.Err())
	}
}

func TestDecoderEnd(t *testing.T) {
	d := NewDecoder([]byte{7, 8, 9}, errTest)
	d.Byte()
	if err := d.End(); !errors.Is(err, errTest) || !strings.Contains(err.Error(), "2 trailing bytes") {
		t.Fatalf("End with 2 bytes left = %v", err)
	}
	d = NewDecoder([]byte{7}, errTest)
	d.Byte()
	if err := d.End(); err != nil {
		t.Fatalf("End at the end = %v", err)
	}
}

func TestVarints(t *testing.T) {
	for _, b := range [][]byte{{}, {0x80}, bytes.Repeat([]byte{0xff}, 11)} {
		if d := NewDecoder(b, errTest); d.Uvarint() != 0 || !errors.Is(d.Err(), errTest) {
			t.Errorf("Uvarint of %x: no error", b)
		}
		if d := NewDecoder(b, errTest); d.Varint() != 0 || !errors.Is(d.Err(), errTest) {
			t.Errorf("Varint of %x: no error", b)
		}
	}
}

// Next's slice ends where the field does: appending to it cannot overwrite
// the bytes after it.
func TestNextCapacity(t *testing.T) {
	in := []byte{1, 2, 3, 4}
	d := NewDecoder(in, errTest)
	p := d.Next(2)
	_ = append(p, 9)
	if in[2] != 3 {
		t.Fatal("append to a field overwrote the next one")
	}
}

func TestStringsAndBytes(t *testing.T) {
	b := AppendString(nil, "héllo")
	b = AppendBytes(b, nil)
	b = AppendBytes(b, []byte{1, 2})
	b = AppendNullableBytes(b, nil)
	b = AppendNullableBytes(b, []byte{})
	b = AppendNullableBytes(b, []byte{3})
	if got, want := hex.EncodeToString(b), "0668c3a96c6c6f0002010200010203"; got != want {
		t.Fatalf("encoding %s, want %s", got, want)
	}
	d := NewDecoder(b, errTest)
	if s := d.String(); s != "héllo" {
		t.Fatalf("String = %q", s)
	}
	if p := d.Bytes(); p == nil || len(p) != 0 {
		t.Fatalf("Bytes of an empty field = %#v, want empty and not nil", p)
	}
	if p := d.Bytes(); !bytes.Equal(p, []byte{1, 2}) {
		t.Fatalf("Bytes = %x", p)
	}
	if p := d.NullableBytes(); p != nil {
		t.Fatalf("NullableBytes of nil = %#v", p)
	}
	if p := d.NullableBytes(); p == nil || len(p) != 0 {
		t.Fatalf("NullableBytes of empty = %#v", p)
	}
	if p := d.NullableBytes(); !bytes.Equal(p, []byte{3}) {
		t.Fatalf("NullableBytes = %x", p)
	}
	if err := d.End(); err != nil {
		t.Fatal(err)
	}
}

// The two time encodings are on disk: their bytes are pinned, and each
// keeps the zero time apart from every other instant.
func TestTimes(t *testing.T) {
	// The bytes were computed apart from this package; the 2026 record
	// time is the one storage/boltstore/codec_test.go pins in its records.
	cases := []struct {
		t           time.Time
		unix, year1 string
	}{
		{time.Time{}, "00", "0000"},
		{time.Unix(0, 0), "010000", "80dc8ff9ce0300"},
		{time.Date(2026, 11, 21, 20, 0, 0, 250000000, time.UTC), "0180e18fb00d80e59a77", "80bd9fa9dc0380e59a77"},
		// One nanosecond after the zero time: seconds 0 but not zero.
		{time.Date(1, 1, 1, 0, 0, 0, 1, time.UTC), "01ffdb8ff9ce0301", "0001"},
	}
	for _, c := range cases {
		if got := hex.EncodeToString(AppendUnixTime(nil, c.t)); got != c.unix {
			t.Errorf("AppendUnixTime(%s) = %s, want %s", c.t, got, c.unix)
		}
		if got := hex.EncodeToString(AppendYear1Time(nil, c.t)); got != c.year1 {
			t.Errorf("AppendYear1Time(%s) = %s, want %s", c.t, got, c.year1)
		}
		d := NewDecoder(AppendYear1Time(AppendUnixTime(nil, c.t), c.t), errTest)
		if got := d.UnixTime(); !got.Equal(c.t) || got.IsZero() != c.t.IsZero() || (!got.IsZero() && got.Location() != time.UTC) {
			t.Errorf("UnixTime of %s = %s", c.t, got)
		}
		if got := d.Year1Time(); !got.Equal(c.t) || got.IsZero() != c.t.IsZero() || (!got.IsZero() && got.Location() != time.UTC) {
			t.Errorf("Year1Time of %s = %s", c.t, got)
		}
		if err := d.End(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestTimeRejects(t *testing.T) {
	for name, c := range map[string]struct {
		b    []byte
		read func(*Decoder) time.Time
		want string
	}{
		"unix flag 2":           {[]byte{2}, (*Decoder).UnixTime, "bad time flag"},
		"unix nanoseconds 1e9":  {[]byte{1, 0, 0x80, 0x94, 0xeb, 0xdc, 0x03}, (*Decoder).UnixTime, "bad nanoseconds"},
		"unix cut":              {[]byte{1, 0}, (*Decoder).UnixTime, "bad uvarint"},
		"year1 nanoseconds 1e9": {[]byte{0, 0x80, 0x94, 0xeb, 0xdc, 0x03}, (*Decoder).Year1Time, "nanoseconds out of range"},
		"year1 seconds too low": {append(binary.AppendVarint(nil, math.MinInt64), 0), (*Decoder).Year1Time, "time out of range"},
		"year1 cut":             {[]byte{2}, (*Decoder).Year1Time, "bad uvarint"},
	} {
		d := NewDecoder(c.b, errTest)
		if got := c.read(d); !got.IsZero() || !errors.Is(d.Err(), errTest) || !strings.HasSuffix(d.Err().Error(), c.want) {
			t.Errorf("%s: %s, %v; want the zero time and %q", name, got, d.Err(), c.want)
		}
	}
}

func TestShortString(t *testing.T) {
	b := AppendShortString(nil, strings.Repeat("n", 300))
	if len(b) != 256 || b[0] != 255 {
		t.Fatalf("a 300-byte short string took %d bytes, length octet %d", len(b), b[0])
	}
	b = AppendLongBytes(b, []byte("long"))
	d := NewDecoder(b, errTest)
	if s := d.ShortString(); s != strings.Repeat("n", 255) {
		t.Fatalf("ShortString = %d bytes", len(s))
	}
	if p := d.LongBytes(); string(p) != "long" {
		t.Fatalf("LongBytes = %q", p)
	}
	if err := d.End(); err != nil {
		t.Fatal(err)
	}
	d = NewDecoder([]byte{0, 0, 0, 9, 'x'}, ErrMalformedAMQP)
	if d.LongBytes() != nil || !errors.Is(d.Err(), ErrMalformedAMQP) {
		t.Fatalf("a long string past the end: %v", d.Err())
	}
}

func TestFrames(t *testing.T) {
	var buf bytes.Buffer
	w := bufio.NewWriter(&buf)
	if err := WriteFrame(w, FrameMethod, 7, []byte{0, 10, 0, 11}); err != nil {
		t.Fatal(err)
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	if got, want := hex.EncodeToString(buf.Bytes()), "0100070000000400"+"0a000bce"; got != want {
		t.Fatalf("frame %s, want %s", got, want)
	}
	f, err := ReadFrame(bufio.NewReader(bytes.NewReader(buf.Bytes())), 4)
	if err != nil || f.Type != FrameMethod || f.Channel != 7 || !bytes.Equal(f.Payload, []byte{0, 10, 0, 11}) {
		t.Fatalf("ReadFrame = %+v, %v", f, err)
	}
	for name, c := range map[string]struct {
		b    []byte
		max  uint32
		want error
	}{
		"over frame_max": {buf.Bytes(), 3, ErrMalformedAMQP},
		"bad end octet":  {append(buf.Bytes()[:buf.Len()-1:buf.Len()-1], 0xCD), 4, ErrMalformedAMQP},
		"cut header":     {buf.Bytes()[:5], 4, io.ErrUnexpectedEOF},
		"cut payload":    {buf.Bytes()[:9], 4, io.ErrUnexpectedEOF},
		"no end octet":   {buf.Bytes()[:buf.Len()-1], 4, io.EOF},
	} {
		if _, err := ReadFrame(bufio.NewReader(bytes.NewReader(c.b)), c.max); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", name, err, c.want)
		}
	}
}

func TestBigEndian(t *testing.T) {
	b := binary.BigEndian.AppendUint16(nil, 0xfeed)
	b = binary.BigEndian.AppendUint32(b, 0xdeadbeef)
	b = binary.BigEndian.AppendUint64(b, 0x0123456789abcdef)
	d := NewDecoder(append(b, 0x7f), errTest)
	if a, b, c, e := d.U16(), d.U32(), d.U64(), d.Byte(); a != 0xfeed || b != 0xdeadbeef || c != 0x0123456789abcdef || e != 0x7f {
		t.Fatalf("read %#x %#x %#x %#x", a, b, c, e)
	}
	if err := d.End(); err != nil {
		t.Fatal(err)
	}
}

// Varint reads what binary.AppendVarint writes, at the edges too.
func TestVarintValues(t *testing.T) {
	vals := []int64{0, 1, -1, 63, -64, 64, -65, math.MaxInt64, math.MinInt64, 1 << 40, -1 << 40}
	var b []byte
	for _, v := range vals {
		b = binary.AppendVarint(b, v)
	}
	d := NewDecoder(b, errTest)
	for _, v := range vals {
		if got := d.Varint(); got != v {
			t.Errorf("Varint = %d, want %d", got, v)
		}
	}
	if err := d.End(); err != nil {
		t.Fatal(err)
	}
}
