package broker

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

func TestPublishable(t *testing.T) {
	long := strings.Repeat("x", 256)
	ok255 := strings.Repeat("x", 255)
	for _, tc := range []struct {
		name     string
		exchange string
		key      string
		msg      amqp.Publishing
		frameMax int
		want     string // "" means publishable
	}{
		{name: "plain", key: "q", msg: amqp.Publishing{MessageId: "m", Body: []byte("b")}},
		{name: "255-byte key", key: ok255},
		{name: "256-byte routing key", key: long, want: "routing key is 256 bytes"},
		{name: "256-byte exchange", exchange: long, key: "q", want: "exchange is 256 bytes"},
		{name: "long message-id", key: "q", msg: amqp.Publishing{MessageId: long}, want: "property message-id"},
		{name: "long app-id", key: "q", msg: amqp.Publishing{AppId: long}, want: "property app-id"},
		{name: "long header key", key: "q", msg: amqp.Publishing{Headers: amqp.Table{long: "v"}}, want: "over AMQP's 255"},
		{name: "long nested key", key: "q", msg: amqp.Publishing{Headers: amqp.Table{"t": amqp.Table{long: int32(1)}}}, want: "over AMQP's 255"},
		{name: "unsupported type", key: "q", msg: amqp.Publishing{Headers: amqp.Table{"u": uint64(1)}}, want: "uint64"},
		{name: "unsupported in array", key: "q", msg: amqp.Publishing{Headers: amqp.Table{"a": []any{int32(1), struct{}{}}}}, want: "array element 1"},
		{name: "every field type", key: "q", msg: amqp.Publishing{Headers: amqp.Table{
			"n": nil, "t": true, "B": byte(1), "b": int8(1), "s": int16(1), "u": uint16(1), "I": int32(1), "i": uint32(1), "int": 1,
			"l": int64(1), "f": float32(1), "d": float64(1), "D": amqp.Decimal{Scale: 1, Value: 1}, "S": "s", "x": []byte("x"),
			"T": time.Now(), "A": []any{"a", int32(1)}, "F": amqp.Table{"k": "v"},
		}}},
		{name: "headers within the frame", key: "q", msg: amqp.Publishing{Headers: amqp.Table{"big": strings.Repeat("v", 4000)}}, frameMax: 4096},
		{name: "headers over the frame", key: "q", msg: amqp.Publishing{Headers: amqp.Table{"big": strings.Repeat("v", 4100)}}, frameMax: 4096, want: "frame size of 4096"},
		{name: "no frame limit", key: "q", msg: amqp.Publishing{Headers: amqp.Table{"big": strings.Repeat("v", 1<<20)}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Publishable(tc.exchange, tc.key, &tc.msg, tc.frameMax)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrUnpublishable) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v; want ErrUnpublishable mentioning %q", err, tc.want)
			}
		})
	}
}

// A message the client cannot encode fails alone, as
// ErrUnpublishable: the channel and connection stay up, and the other
// messages of its window are confirmed. (amqp091-go shuts the connection
// down when it cannot write a frame, which failed every publish in flight.)
func TestUnpublishableMessageFailsAlone(t *testing.T) {
	ch, q, pub := tempQueuePublisher(t)

	msgs := []Outgoing{
		{RoutingKey: q.Name, Mandatory: true, Msg: amqp.Publishing{MessageId: "a"}},
		{RoutingKey: strings.Repeat("q", 300), Mandatory: true, Msg: amqp.Publishing{MessageId: "long-key"}},
		{RoutingKey: q.Name, Mandatory: true, Msg: amqp.Publishing{MessageId: "b"}},
		{RoutingKey: q.Name, Mandatory: true, Msg: amqp.Publishing{MessageId: "bad-header", Headers: amqp.Table{strings.Repeat("k", 300): "v"}}},
		{RoutingKey: q.Name, Mandatory: true, Msg: amqp.Publishing{MessageId: "c"}},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	results := pub.Publish(ctx, msgs)
	for i, want := range []error{nil, ErrUnpublishable, nil, ErrUnpublishable, nil} {
		if want == nil && results[i] != nil || want != nil && !errors.Is(results[i], want) {
			t.Errorf("message %d (%s): %v, want %v", i, msgs[i].Msg.MessageId, results[i], want)
		}
	}
	if ch.IsClosed() || pub.Channel().IsClosed() { // ch shares the connection
		t.Fatal("an unencodable message closed the connection or channel")
	}
	// And the publisher goes on working.
	if res := pub.Publish(ctx, msgs[:1]); res[0] != nil {
		t.Fatalf("publish after: %v", res[0])
	}
	if st, err := ch.QueueDeclarePassive(q.Name, false, true, true, false, nil); err != nil || st.Messages != 4 {
		t.Fatalf("queue has %d messages (%v), want 4", st.Messages, err)
	}
}
