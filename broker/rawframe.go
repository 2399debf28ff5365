package broker

// A minimal AMQP 0-9-1 codec for rawConn (rawconn.go): frames, and the field
// types of the few methods the sweep speaks. amqp091-go's own codec is not
// exported, and the sweep must read what that codec refuses.

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Frame types and the frame-end octet (AMQP 0-9-1 §4.2.3).
const (
	frameMethod    = 1
	frameHeader    = 2
	frameBody      = 3
	frameHeartbeat = 8
	frameEnd       = 0xCE
)

// errMalformed is a frame or field that does not follow the protocol.
var errMalformed = errors.New("malformed AMQP data")

// rawFrame is one frame as read from the wire.
type rawFrame struct {
	typ     byte
	channel uint16
	payload []byte
}

// readRawFrame reads one frame; a payload over maxPayload is refused before
// it is allocated.
func readRawFrame(r *bufio.Reader, maxPayload uint32) (rawFrame, error) {
	var hdr [7]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return rawFrame{}, err
	}
	f := rawFrame{typ: hdr[0], channel: binary.BigEndian.Uint16(hdr[1:3])}
	size := binary.BigEndian.Uint32(hdr[3:7])
	if size > maxPayload {
		return rawFrame{}, fmt.Errorf("%w: a frame of %d bytes exceeds frame_max", errMalformed, size)
	}
	f.payload = make([]byte, size)
	if _, err := io.ReadFull(r, f.payload); err != nil {
		return rawFrame{}, err
	}
	end, err := r.ReadByte()
	if err != nil {
		return rawFrame{}, err
	}
	if end != frameEnd {
		return rawFrame{}, fmt.Errorf("%w: frame end octet 0x%02x", errMalformed, end)
	}
	return f, nil
}

// writeRawFrame writes one frame (buffered; the caller flushes).
func writeRawFrame(w *bufio.Writer, typ byte, channel uint16, payload []byte) error {
	var hdr [7]byte
	hdr[0] = typ
	binary.BigEndian.PutUint16(hdr[1:3], channel)
	binary.BigEndian.PutUint32(hdr[3:7], uint32(len(payload)))
	if _, err := w.Write(hdr[:]); err != nil {
		return err
	}
	if _, err := w.Write(payload); err != nil {
		return err
	}
	return w.WriteByte(frameEnd)
}

// encoder builds a method payload.
type encoder struct{ b []byte }

func (e *encoder) u8(v byte)    { e.b = append(e.b, v) }
func (e *encoder) u16(v uint16) { e.b = binary.BigEndian.AppendUint16(e.b, v) }
func (e *encoder) u32(v uint32) { e.b = binary.BigEndian.AppendUint32(e.b, v) }
func (e *encoder) u64(v uint64) { e.b = binary.BigEndian.AppendUint64(e.b, v) }

// shortstr writes s, cut at 255 bytes (every caller passes a name the
// protocol already limits to that).
func (e *encoder) shortstr(s string) {
	if len(s) > 255 {
		s = s[:255]
	}
	e.u8(byte(len(s)))
	e.b = append(e.b, s...)
}

func (e *encoder) longstr(s []byte) {
	e.u32(uint32(len(s)))
	e.b = append(e.b, s...)
}

// decoder reads fields; the first short read sets err and makes every later
// read return zero values, so callers check err once.
type decoder struct {
	b   []byte
	off int
	err error
}

func (d *decoder) remaining() int { return len(d.b) - d.off }

// take returns the next n bytes, or nil after setting err.
func (d *decoder) take(n uint64) []byte {
	if d.err != nil {
		return nil
	}
	if n > uint64(d.remaining()) {
		d.err = fmt.Errorf("%w: %d bytes needed, %d left", errMalformed, n, d.remaining())
		return nil
	}
	v := d.b[d.off : d.off+int(n)]
	d.off += int(n)
	return v
}

func (d *decoder) u8() byte {
	if b := d.take(1); b != nil {
		return b[0]
	}
	return 0
}

func (d *decoder) u16() uint16 {
	if b := d.take(2); b != nil {
		return binary.BigEndian.Uint16(b)
	}
	return 0
}

func (d *decoder) u32() uint32 {
	if b := d.take(4); b != nil {
		return binary.BigEndian.Uint32(b)
	}
	return 0
}

func (d *decoder) u64() uint64 {
	if b := d.take(8); b != nil {
		return binary.BigEndian.Uint64(b)
	}
	return 0
}

func (d *decoder) shortstr() string { return string(d.take(uint64(d.u8()))) }

func (d *decoder) longstr() []byte { return d.take(uint64(d.u32())) }
