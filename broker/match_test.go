package broker

import (
	"errors"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

func TestAmbiguousReturnMarksEveryCandidate(t *testing.T) {
	msgs := []Outgoing{
		{RoutingKey: "orders", Msg: amqp.Publishing{MessageId: ""}},
		{RoutingKey: "orders", Msg: amqp.Publishing{MessageId: ""}},
		{RoutingKey: "orders", Msg: amqp.Publishing{MessageId: "x"}},
		{RoutingKey: "billing", Msg: amqp.Publishing{MessageId: ""}},
	}
	results := make([]error, len(msgs))
	(&Publisher{}).matchReturn(msgs, results, amqp.Return{RoutingKey: "orders", MessageId: "", ReplyCode: 312, ReplyText: "NO_ROUTE"})
	for i, want := range []bool{true, true, false, false} {
		if got := errors.Is(results[i], ErrReturned); got != want {
			t.Errorf("msg %d returned=%v, want %v", i, got, want)
		}
	}
	// An exact match marks only its own publish.
	(&Publisher{}).matchReturn(msgs, results, amqp.Return{RoutingKey: "orders", MessageId: "x"})
	if !errors.Is(results[2], ErrReturned) || results[3] != nil {
		t.Fatalf("exact match: %v", results)
	}
}
