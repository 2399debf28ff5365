package dispatch

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/message"
	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/wire"
)

func (f *fixture) insertTo(id string, dest wire.Destination, due time.Time, p amqp.Publishing) {
	f.t.Helper()
	enc, err := message.Encode(nil, &p)
	if err != nil {
		f.t.Fatal(err)
	}
	row := storage.Timeout{ID: id, Destination: dest.Key, Exchange: dest.Exchange, DueAt: due, ReceivedAt: t0, Message: enc}
	if _, err := f.store.Insert(context.Background(), []storage.Timeout{row}); err != nil {
		f.t.Fatal(err)
	}
}

// An exchange destination is published to its exchange with its routing
// key, mandatory, and removed once confirmed.
func TestForwardsToExchange(t *testing.T) {
	f := newFixture(t, 3)
	f.insertTo("a", wire.Destination{Exchange: "events", Key: "orders.eu"}, t0, amqp.Publishing{MessageId: "a", Body: []byte("x")})
	f.insertTo("b", wire.Destination{Exchange: "fan"}, t0, amqp.Publishing{MessageId: "b"})
	if _, err := f.deliver(f.lease()...); err != nil {
		t.Fatal(err)
	}
	if len(f.pub.Sent()) != 2 {
		t.Fatalf("%d publishes, want 2", len(f.pub.Sent()))
	}
	for _, m := range f.pub.Sent() {
		want := map[string][2]string{"a": {"events", "orders.eu"}, "b": {"fan", ""}}[m.Msg.MessageId]
		if m.Exchange != want[0] || m.RoutingKey != want[1] || !m.Mandatory {
			t.Errorf("%s published to exchange %q key %q mandatory %v, want %q %q", m.Msg.MessageId, m.Exchange, m.RoutingKey, m.Mandatory, want[0], want[1])
		}
	}
	for _, id := range []string{"a", "b"} {
		if _, ok := f.pending(id); ok {
			t.Errorf("%s still pending after its confirm", id)
		}
	}
}

// A missing exchange is the message's failure: counted, retried, then the
// error queue, whose copy says where the forward went so replay can send it
// there again.
func TestMissingExchangeFailsThenErrorQueue(t *testing.T) {
	f := newFixture(t, 1)
	dest := wire.Destination{Exchange: "gone", Key: "k"}
	f.pub.Outcome = func(m broker.Outgoing) error {
		if m.Exchange == "gone" {
			return fmt.Errorf("%w: %q", broker.ErrNoExchange, m.Exchange)
		}
		return nil
	}
	f.insertTo("a", dest, t0, amqp.Publishing{MessageId: "a"})
	if _, err := f.deliver(f.lease()...); err != nil {
		t.Fatal(err)
	}
	row, ok := f.pending("a")
	if !ok || row.Attempts != 1 || !strings.Contains(row.LastError, "exchange does not exist") {
		t.Fatalf("after one failure: %+v", row)
	}
	if _, refused := f.d.dests.refused(dest, f.clock.Now()); !refused {
		t.Fatal("a missing exchange is not remembered as refusing")
	}
	f.clock.Advance(time.Hour)
	if _, err := f.deliver(f.lease()...); err != nil {
		t.Fatal(err)
	}
	eq := f.pub.To("error")
	if len(eq) != 1 {
		t.Fatalf("%d on the error queue, want 1", len(eq))
	}
	h := eq[0].Msg.Headers
	if h[wire.HeaderForwardExchange] != "gone" || h[wire.HeaderForwardRoutingKey] != "k" {
		t.Fatalf("error copy does not say where the forward went: %v", h)
	}
	if r := h[wire.HeaderError].(string); !strings.Contains(r, `exchange "gone" routing key "k"`) {
		t.Fatalf("reason %q does not name the destination", r)
	}
	if _, ok := f.pending("a"); ok {
		t.Fatal("still pending after the error queue")
	}
}
