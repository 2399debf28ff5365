package broker

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// A forward to an exchange that does not exist fails on its own
// (ErrNoExchange), without the channel error that would fail every other
// publish in flight; forwards to an existing exchange, in the same window,
// are routed by its bindings.
func TestPublishToMissingExchangeFailsAlone(t *testing.T) {
	ch, q, pub := tempQueuePublisher(t)
	x := fmt.Sprintf("delaybridge-test-x-%d", time.Now().UnixNano())
	if err := ch.ExchangeDeclare(x, "topic", false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(q.Name, "orders.*", x, false, nil); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out := []Outgoing{
		{Exchange: x, RoutingKey: "orders.eu", Mandatory: true, Msg: amqp.Publishing{MessageId: "a", Body: []byte("a")}},
		{Exchange: x + "-missing", RoutingKey: "orders.eu", Mandatory: true, Msg: amqp.Publishing{MessageId: "b"}},
		{Exchange: x, RoutingKey: "billing", Mandatory: true, Msg: amqp.Publishing{MessageId: "c"}},
		{RoutingKey: q.Name, Mandatory: true, Msg: amqp.Publishing{MessageId: "d", Body: []byte("d")}},
	}
	for round := range 2 { // the second round uses the cached check
		res := pub.Publish(ctx, out)
		if res[0] != nil || res[3] != nil {
			t.Fatalf("round %d: routed forwards failed: %v, %v", round, res[0], res[3])
		}
		if !errors.Is(res[1], ErrNoExchange) {
			t.Fatalf("round %d: forward to a missing exchange: %v, want ErrNoExchange", round, res[1])
		}
		if !errors.Is(res[2], ErrReturned) {
			t.Fatalf("round %d: forward no binding routes: %v, want ErrReturned", round, res[2])
		}
		if pub.Channel().IsClosed() {
			t.Fatalf("round %d: the publish channel closed", round)
		}
	}
	for _, want := range []string{"a", "d", "a", "d"} {
		m, ok, err := ch.Get(q.Name, true)
		if err != nil || !ok {
			t.Fatalf("get: %v, %v", ok, err)
		}
		if m.MessageId != want {
			t.Fatalf("got %q, want %q", m.MessageId, want)
		}
		if want == "a" && (m.Exchange != x || m.RoutingKey != "orders.eu") {
			t.Fatalf("routed through %q %q", m.Exchange, m.RoutingKey)
		}
	}
}
