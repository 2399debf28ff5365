package message

import (
	"encoding/hex"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// The stored encoding and the fingerprint are on disk (and a fingerprint is
// compared with a redelivery's): these bytes, written by the encoder before
// it moved onto internal/codec, must never change.
var golden = []struct {
	name string
	p    amqp.Publishing
	hex  string
}{
	{"full", fullPublishing(), "01106170706c69636174696f6e2f6a736f6e04677a697004636f7272077265706c6965730536303030300469642d310b4f72646572506c616365640567756573740473686f7002070180fba9910d0001130361727241034601016b6c0000000000000001410078016204626f6f6c74010562797465737804000102ff036465634402ffffcfc705656d7074795300036633326640600000036636346440020000000000000566616c736574000369313673f9c00369333249fffb1e00036936346cf00000000000000002693862f8036e696c5603737472530668c3a96c6c6f057461626c6546020361727241034900000001530374776f5605696e6e657246010464656570530178027473540180c49fd50c000375313675fde80375333269ee6b280002753842c810626f64790077697468ff62696e617279"},
	{"empty", amqp.Publishing{}, "010000000000000000000000000000"},
	{"times", amqp.Publishing{Timestamp: time.Unix(1<<40, 123).UTC(), Headers: amqp.Table{"old": time.Unix(-1<<40, 5).UTC()}, Body: []byte{}},
		"010000000000000000000000018080808080407b0101036f6c645401ffffffffff3f0500"},
}

func TestEncodingIsGolden(t *testing.T) {
	for _, g := range golden {
		enc, err := Encode(nil, &g.p)
		if err != nil {
			t.Fatalf("%s: %v", g.name, err)
		}
		if got := hex.EncodeToString(enc); got != g.hex {
			t.Errorf("%s: encoding changed\n got %s\nwant %s", g.name, got, g.hex)
		}
		want, _ := hex.DecodeString(g.hex)
		p, err := Decode(want)
		if err != nil {
			t.Fatalf("%s: decode of the golden bytes: %v", g.name, err)
		}
		again, err := Encode(nil, &p)
		if err != nil {
			t.Fatalf("%s: re-encode: %v", g.name, err)
		}
		if got := hex.EncodeToString(again); got != g.hex {
			t.Errorf("%s: golden bytes decode and encode to\n %s", g.name, got)
		}
	}
	d := sampleDelivery()
	fp, err := Fingerprint(&d)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := hex.EncodeToString(fp), "c68d9506b4ea56bfa9fc07615b268308"; got != want {
		t.Errorf("fingerprint of sampleDelivery = %s, want %s", got, want)
	}
}
