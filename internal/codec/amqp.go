package codec

// AMQP 0-9-1 frames and the field types of the few methods broker's raw
// connection (broker/rawconn.go) speaks. amqp091-go's own codec is not
// exported, and that connection must read what that codec refuses.

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Frame types and the frame-end octet (AMQP 0-9-1 §4.2.3).
const (
	FrameMethod    = 1
	FrameHeader    = 2
	FrameBody      = 3
	FrameHeartbeat = 8
	FrameEnd       = 0xCE
)

// ErrMalformedAMQP is a frame or field that does not follow the protocol;
// pass it to NewDecoder to read a frame's payload.
var ErrMalformedAMQP = errors.New("malformed AMQP data")

// Frame is one frame as read from the wire.
type Frame struct {
	Type    byte
	Channel uint16
	Payload []byte
}

// ReadFrame reads one frame; a payload over maxPayload is refused before it
// is allocated.
func ReadFrame(r *bufio.Reader, maxPayload uint32) (Frame, error) {
	var hdr [7]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return Frame{}, err
	}
	f := Frame{Type: hdr[0], Channel: binary.BigEndian.Uint16(hdr[1:3])}
	size := binary.BigEndian.Uint32(hdr[3:7])
	if size > maxPayload {
		return Frame{}, fmt.Errorf("%w: a frame of %d bytes exceeds frame_max", ErrMalformedAMQP, size)
	}
	f.Payload = make([]byte, size)
	if _, err := io.ReadFull(r, f.Payload); err != nil {
		return Frame{}, err
	}
	end, err := r.ReadByte()
	if err != nil {
		return Frame{}, err
	}
	if end != FrameEnd {
		return Frame{}, fmt.Errorf("%w: frame end octet 0x%02x", ErrMalformedAMQP, end)
	}
	return f, nil
}

// WriteFrame writes one frame (buffered; the caller flushes).
func WriteFrame(w *bufio.Writer, typ byte, channel uint16, payload []byte) error {
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
	return w.WriteByte(FrameEnd)
}

// AppendShortString appends s as an AMQP short string: a length octet and
// the bytes, cut at 255 (every caller passes a name the protocol already
// limits to that).
func AppendShortString(b []byte, s string) []byte {
	if len(s) > 255 {
		s = s[:255]
	}
	b = append(b, byte(len(s)))
	return append(b, s...)
}

// ShortString reads an AMQP short string.
func (d *Decoder) ShortString() string { return string(d.Next(uint64(d.Byte()))) }

// AppendLongBytes appends p as an AMQP long string: a big-endian uint32
// length and the bytes.
func AppendLongBytes(b, p []byte) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(p)))
	return append(b, p...)
}

// LongBytes reads an AMQP long string as a slice of the input.
func (d *Decoder) LongBytes() []byte { return d.Next(uint64(d.U32())) }
