package ingest

import (
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/broker/brokertest"
	"github.com/delaybridge/delaybridge/intake"
	"github.com/delaybridge/delaybridge/internal/amqptest"
	"github.com/delaybridge/delaybridge/wire"
)

func TestAllowListOfExchanges(t *testing.T) {
	ev := wire.Destination{Exchange: "events", Key: "orders.eu"}
	for _, c := range []struct {
		patterns []string
		d        wire.Destination
		want     bool
	}{
		{[]string{"*"}, ev, true}, // the default allows everything, as before
		{[]string{"orders.*"}, wire.Destination{Exchange: "orders.x"}, false},
		{[]string{"orders.*"}, wire.Queue("orders.x"), true},
		{[]string{"exchange:ev*"}, ev, true},
		{[]string{"exchange:ev*"}, wire.Queue("events"), false},
		{[]string{"exchange:events"}, wire.Destination{Exchange: "events", Key: ""}, true},
		{[]string{"exchange:other"}, ev, false},
	} {
		g, err := CompileGlobs(c.patterns)
		if err != nil {
			t.Fatal(err)
		}
		err = Rules{Allowed: g}.Check(intake.Parsed{Destination: c.d, DueAt: received}, 0, received)
		if (err == nil) != c.want {
			t.Errorf("patterns %q, %s: Check = %v, want allowed %v", c.patterns, c.d, err, c.want)
		}
		if err != nil && !strings.Contains(err.Error(), "DELAYBRIDGE_ALLOWED_DESTINATIONS") {
			t.Errorf("reason %q", err)
		}
	}
	// The reserved queues are queue names: an exchange's routing key equal
	// to one is not that queue.
	r := Rules{Reserved: []string{"e.Timeouts"}}
	if err := r.Check(intake.Parsed{Destination: wire.Destination{Exchange: "x", Key: "e.Timeouts"}, DueAt: received}, 0, received); err != nil {
		t.Errorf("exchange destination refused as a reserved queue: %v", err)
	}
	if err := r.Check(intake.Parsed{Destination: wire.Queue("e.Timeouts"), DueAt: received}, 0, received); err == nil {
		t.Error("reserved queue allowed")
	}
}

func TestExchangeDestinationIsStored(t *testing.T) {
	store, pub, s := &fakeStore{}, &brokertest.Publisher{}, amqptest.New(t)
	var woke []time.Time
	in := newIngester(store, pub, &woke)
	batch := deliveries(s,
		amqp.Table{wire.HeaderDestinationExchange: "events", wire.HeaderDestinationRoutingKey: "orders.eu", wire.HeaderDelay: int32(5)},
		amqp.Table{wire.HeaderDestination: "q", wire.HeaderDestinationExchange: "events", wire.HeaderDelay: int32(5)},
	)
	if err := in.take(pub, batch); err != nil {
		t.Fatal(err)
	}
	row, ok := store.rows["m0"]
	if !ok || row.Exchange != "events" || row.Destination != "orders.eu" {
		t.Fatalf("row %+v", row)
	}
	if _, ok := store.rows["m1"]; ok || len(pub.Sent()) != 1 {
		t.Fatalf("the message naming both kinds of destination was stored, or not sent to the error queue (%d copies)", len(pub.Sent()))
	}
	if got := pub.Sent()[0].Msg.Headers[wire.HeaderError]; !strings.Contains(got.(string), "both name a destination") {
		t.Fatalf("error copy reason %q", got)
	}
}
