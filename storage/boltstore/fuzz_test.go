package boltstore

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"errors"
	"io"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/delaybridge/delaybridge/internal/codec"
	"github.com/delaybridge/delaybridge/message"
)

// FuzzDecoders feeds the same bytes to the three decoders built on
// internal/codec's reader: this package's records and rows, the stored
// message (package message) and AMQP frames with method fields (broker's
// raw connection). It lives here because the record decoders are not
// exported. Each decoder must refuse with its own sentinel error or return
// something that encodes and decodes again to the same thing; none may
// panic or read past its input.
//
//	go test -run '^$' -fuzz FuzzDecoders -fuzztime 60s ./storage/boltstore
func FuzzDecoders(f *testing.F) {
	for _, r := range sampleRecords() {
		f.Add(encodeRecord(r))
		f.Add(encodeRow(&r.Timeout))
	}
	f.Add(recordV1)
	f.Add(recordV2)
	f.Add(recordV3)
	// Messages: the golden bytes of message/golden_test.go (every header
	// type) and the seeds of its former fuzz target.
	full, _ := hex.DecodeString("01106170706c69636174696f6e2f6a736f6e04677a697004636f7272077265706c6965730536303030300469642d310b4f72646572506c616365640567756573740473686f7002070180fba9910d0001130361727241034601016b6c0000000000000001410078016204626f6f6c74010562797465737804000102ff036465634402ffffcfc705656d7074795300036633326640600000036636346440020000000000000566616c736574000369313673f9c00369333249fffb1e00036936346cf00000000000000002693862f8036e696c5603737472530668c3a96c6c6f057461626c6546020361727241034900000001530374776f5605696e6e657246010464656570530178027473540180c49fd50c000375313675fde80375333269ee6b280002753842c810626f64790077697468ff62696e617279")
	f.Add(full)
	f.Add([]byte{1})
	f.Add([]byte{1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff, 0x0f})
	// AMQP: the frames broker/readable_test.go's fake broker sends.
	for _, fr := range []struct {
		typ     byte
		payload []byte
	}{
		{codec.FrameMethod, codec.AppendLongBytes(codec.AppendLongBytes([]byte{0, 10, 0, 10, 0, 9}, nil), []byte("PLAIN"))},
		{codec.FrameMethod, []byte{0, 10, 0, 30, 0, 0, 0, 2, 0, 0, 0, 0}},
		{codec.FrameMethod, append(codec.AppendShortString([]byte{0, 10, 0, 50, 0, 200}, "bye"), 0, 0, 0, 0)},
		{codec.FrameHeader, []byte{0, 60, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4, 0x90, 0, 4, 't', 'e', 'x', 't', 2}},
		{codec.FrameHeartbeat, nil},
	} {
		var b bytes.Buffer
		w := bufio.NewWriter(&b)
		_ = codec.WriteFrame(w, fr.typ, 1, fr.payload)
		_ = w.Flush()
		f.Add(b.Bytes())
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		in := bytes.Clone(b)
		fuzzRecord(t, b)
		fuzzRow(t, b)
		fuzzMessage(t, b)
		fuzzFrame(t, b)
		if !bytes.Equal(in, b) {
			t.Fatal("a decoder wrote to its input")
		}
	})
}

func fuzzRecord(t *testing.T, b []byte) {
	r, err := decodeRecord(b)
	if err != nil {
		if !errors.Is(err, errCorrupt) {
			t.Fatalf("decodeRecord: %v does not wrap errCorrupt", err)
		}
		return
	}
	again, err := decodeRecord(encodeRecord(r))
	if err != nil {
		t.Fatalf("decodeRecord of a re-encoded record: %v", err)
	}
	if diff := cmp.Diff(r, again, cmp.AllowUnexported(record{})); diff != "" {
		t.Fatalf("record changed in a round trip:\n%s", diff)
	}
}

func fuzzRow(t *testing.T, b []byte) {
	row, err := decodeRow(b, true)
	if err != nil {
		if !errors.Is(err, errCorrupt) {
			t.Fatalf("decodeRow: %v does not wrap errCorrupt", err)
		}
		if _, err := decodeRow(b, false); err == nil {
			t.Fatal("decodeRow without the message took a row it refuses with it")
		}
		return
	}
	bare, err := decodeRow(b, false)
	if err != nil || bare.Message != nil || bare.ID != row.ID {
		t.Fatalf("decodeRow without the message: %+v, %v", bare, err)
	}
	exchange, key, err := rowDest(b)
	if err != nil || string(exchange) != row.Exchange || string(key) != row.Destination {
		t.Fatalf("rowDest = %q, %q, %v; decodeRow says %q, %q", exchange, key, err, row.Exchange, row.Destination)
	}
	again, err := decodeRow(encodeRow(row), true)
	if err != nil {
		t.Fatalf("decodeRow of a re-encoded row: %v", err)
	}
	if diff := cmp.Diff(row, again); diff != "" {
		t.Fatalf("row changed in a round trip:\n%s", diff)
	}
}

// fuzzMessage: a decoded message need not re-encode to its input (table
// keys are written in order, lengths minimally), but its encoding is a
// fixed point.
func fuzzMessage(t *testing.T, b []byte) {
	p, err := message.Decode(b)
	if err != nil {
		if !errors.Is(err, message.ErrCorrupt) {
			t.Fatalf("message.Decode: %v does not wrap ErrCorrupt", err)
		}
		return
	}
	enc, err := message.Encode(nil, &p)
	if err != nil {
		t.Fatalf("re-encode of a decoded message: %v", err)
	}
	p2, err := message.Decode(enc)
	if err != nil {
		t.Fatalf("decode of a re-encoded message: %v", err)
	}
	enc2, err := message.Encode(nil, &p2)
	if err != nil || !bytes.Equal(enc, enc2) {
		t.Fatalf("encoding is not a fixed point: %x then %x (%v)", enc, enc2, err)
	}
}

// fuzzFrame reads frames as broker's raw connection does, each written
// back byte for byte, and reads a method's fields from its payload.
func fuzzFrame(t *testing.T, b []byte) {
	r := bufio.NewReader(bytes.NewReader(b))
	consumed := 0
	for {
		f, err := codec.ReadFrame(r, 1<<12)
		if err != nil {
			if !errors.Is(err, codec.ErrMalformedAMQP) && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("ReadFrame: %v", err)
			}
			return
		}
		var out bytes.Buffer
		w := bufio.NewWriter(&out)
		if err := codec.WriteFrame(w, f.Type, f.Channel, f.Payload); err != nil || w.Flush() != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(out.Bytes(), b[consumed:consumed+out.Len()]) {
			t.Fatalf("frame written back as %x, read from %x", out.Bytes(), b[consumed:consumed+out.Len()])
		}
		consumed += out.Len()
		d := codec.NewDecoder(f.Payload, codec.ErrMalformedAMQP)
		d.U16() // class
		d.U16() // method
		for d.Err() == nil && d.Len() > 0 {
			switch d.Byte() % 4 {
			case 0:
				d.ShortString()
			case 1:
				d.LongBytes()
			case 2:
				d.U64()
			case 3:
				d.U32()
			}
		}
		if err := d.Err(); err != nil && !errors.Is(err, codec.ErrMalformedAMQP) {
			t.Fatalf("method fields: %v", err)
		}
	}
}
