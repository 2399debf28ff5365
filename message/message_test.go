package message

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	amqp "github.com/rabbitmq/amqp091-go"
)

func fullPublishing() amqp.Publishing {
	return amqp.Publishing{
		Headers: amqp.Table{
			"nil": nil, "bool": true, "false": false, "i8": int8(-8), "u8": uint8(200),
			"i16": int16(-1600), "u16": uint16(65000), "i32": int32(-320000), "u32": uint32(4000000000),
			"i64": int64(-1 << 60), "f32": float32(3.5), "f64": 2.25, "dec": amqp.Decimal{Scale: 2, Value: -12345},
			"str": "héllo", "empty": "", "bytes": []byte{0, 1, 2, 255}, "ts": time.Unix(1700000000, 0).UTC(),
			"table": amqp.Table{"inner": amqp.Table{"deep": "x"}, "arr": []any{int32(1), "two", nil}},
			"arr":   []any{amqp.Table{"k": int64(1)}, []any{}, []byte("b")},
		},
		ContentType: "application/json", ContentEncoding: "gzip", DeliveryMode: amqp.Persistent, Priority: 7,
		CorrelationId: "corr", ReplyTo: "replies", Expiration: "60000", MessageId: "id-1",
		Timestamp: time.Unix(1763000000, 0).UTC(), Type: "OrderPlaced", UserId: "guest", AppId: "shop",
		Body: []byte("body\x00with\xffbinary"),
	}
}

func TestRoundTripKeepsEveryFieldAndType(t *testing.T) {
	for name, p := range map[string]amqp.Publishing{
		"full":       fullPublishing(),
		"empty":      {},
		"emptyTable": {Headers: amqp.Table{}, Body: []byte{}},
		// AMQP timestamps are 64-bit seconds: far beyond UnixNano's years 1678-2262.
		"extremeTimes": {Timestamp: time.Unix(1<<40, 0).UTC(), Headers: amqp.Table{
			"old": time.Unix(-1<<40, 0).UTC(), "max": time.Unix(1<<62, 0).UTC()}},
	} {
		t.Run(name, func(t *testing.T) {
			enc, err := Encode(nil, &p)
			if err != nil {
				t.Fatal(err)
			}
			got, err := Decode(enc)
			if err != nil {
				t.Fatal(err)
			}
			// []byte{} and nil body are the same on the wire.
			if len(p.Body) == 0 && len(got.Body) == 0 {
				got.Body = p.Body
			}
			if diff := cmp.Diff(p, got); diff != "" {
				t.Fatalf("round trip changed the message (-want +got):\n%s", diff)
			}
		})
	}
}

// FromDelivery keeps every property and the body: each field of
// amqp.Publishing is set (none left at its zero value, so that dropping any
// one shows) on a delivery under the same name, and must come back. The
// delivery's own fields (tag, exchange, routing key, …) are not properties
// and must not matter.
func TestFromDeliveryCopiesEveryField(t *testing.T) {
	want := fullPublishing()
	d := amqp.Delivery{ConsumerTag: "ctag", DeliveryTag: 42, Redelivered: true, Exchange: "E",
		RoutingKey: "E.Timeouts", MessageCount: 3}
	wv, dv := reflect.ValueOf(want), reflect.ValueOf(&d).Elem()
	for i := range wv.NumField() {
		f := wv.Type().Field(i)
		if wv.Field(i).IsZero() {
			t.Fatalf("fullPublishing leaves %s at its zero value: a FromDelivery that drops it would pass", f.Name)
		}
		df := dv.FieldByName(f.Name)
		if !df.IsValid() || df.Type() != f.Type {
			t.Fatalf("amqp.Delivery has no field %s %s to copy", f.Name, f.Type)
		}
		df.Set(wv.Field(i))
	}
	if d.Priority != 7 || d.DeliveryMode != amqp.Persistent {
		t.Fatalf("the delivery is not set up as intended: %+v", d)
	}
	got := FromDelivery(&d)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("FromDelivery lost or changed a field (-want +got):\n%s", diff)
	}
}

func TestGoIntIsWrittenAsAMQPInt32(t *testing.T) {
	enc, err := Encode(nil, &amqp.Publishing{Headers: amqp.Table{"n": 42}})
	if err != nil {
		t.Fatal(err)
	}
	got, err := Decode(enc)
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := got.Headers["n"].(int32); !ok || v != 42 {
		t.Fatalf("got %T %v, want int32 42 (as amqp091-go puts int on the wire)", got.Headers["n"], got.Headers["n"])
	}
	if _, err := Encode(nil, &amqp.Publishing{Headers: amqp.Table{"n": 1 << 40}}); err == nil {
		t.Fatal("an int beyond 32 bits must be refused, not truncated")
	}
}

func TestEncodeRejectsNonAMQPValues(t *testing.T) {
	_, err := Encode(nil, &amqp.Publishing{Headers: amqp.Table{"bad": struct{}{}}})
	if err == nil {
		t.Fatal("want an error for a struct header value")
	}
}

func TestDecodeRejectsGarbage(t *testing.T) {
	p := fullPublishing()
	enc, err := Encode(nil, &p)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range [][]byte{nil, {}, {9}, enc[:len(enc)-1], append(append([]byte{}, enc...), 0)} {
		if _, err := Decode(b); !errors.Is(err, ErrCorrupt) {
			t.Errorf("Decode(%d bytes) = %v, want ErrCorrupt", len(b), err)
		}
	}
}

func TestDecodeDoesNotAliasInput(t *testing.T) {
	p := amqp.Publishing{Headers: amqp.Table{"x": []byte("abc")}, Body: []byte("body")}
	enc, _ := Encode(nil, &p)
	got, err := Decode(enc)
	if err != nil {
		t.Fatal(err)
	}
	for i := range enc {
		enc[i] = 0
	}
	if string(got.Body) != "body" || string(got.Headers["x"].([]byte)) != "abc" {
		t.Fatal("decoded message changed when its input buffer was overwritten")
	}
}
