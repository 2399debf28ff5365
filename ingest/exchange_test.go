package ingest

import (
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/intake"
	"github.com/delaybridge/delaybridge/internal/amqptest"
	"github.com/delaybridge/delaybridge/protocol/nsbtimeout"
	"github.com/delaybridge/delaybridge/wire"
)

func TestExchangeDestinationIsParsed(t *testing.T) {
	due := "2026-11-21T20:00:00Z"
	for name, c := range map[string]struct {
		h    amqp.Table
		want wire.Destination
	}{
		"exchange and key":   {amqp.Table{wire.HeaderDestinationExchange: "events", wire.HeaderDestinationRoutingKey: "orders.eu"}, wire.Destination{Exchange: "events", Key: "orders.eu"}},
		"key defaults empty": {amqp.Table{wire.HeaderDestinationExchange: "fan"}, wire.Destination{Exchange: "fan"}},
		"empty key":          {amqp.Table{wire.HeaderDestinationExchange: "fan", wire.HeaderDestinationRoutingKey: ""}, wire.Destination{Exchange: "fan"}},
		"as bytes":           {amqp.Table{wire.HeaderDestinationExchange: []byte("events"), wire.HeaderDestinationRoutingKey: []byte("a.b")}, wire.Destination{Exchange: "events", Key: "a.b"}},
		"amq.topic":          {amqp.Table{wire.HeaderDestinationExchange: "amq.topic", wire.HeaderDestinationRoutingKey: "x"}, wire.Destination{Exchange: "amq.topic", Key: "x"}},
	} {
		t.Run(name, func(t *testing.T) {
			c.h[wire.HeaderDueAt] = due
			p, err := nsbtimeout.Parse(&amqp.Delivery{MessageId: "a", Headers: c.h}, received)
			if err != nil {
				t.Fatal(err)
			}
			if p.Destination != c.want {
				t.Fatalf("destination %+v, want %+v", p.Destination, c.want)
			}
		})
	}
}

func TestExchangeDestinationIsRefused(t *testing.T) {
	due := "2026-11-21T20:00:00Z"
	long := strings.Repeat("x", 256)
	for name, c := range map[string]struct {
		h    amqp.Table
		want string
	}{
		"with x-destination":       {amqp.Table{wire.HeaderDestination: "q", wire.HeaderDestinationExchange: "events"}, "both name a destination"},
		"with the nsb destination": {amqp.Table{wire.HeaderNSBDestination: "q", wire.HeaderDestinationExchange: "events"}, "both name a destination"},
		"key without exchange":     {amqp.Table{wire.HeaderDestination: "q", wire.HeaderDestinationRoutingKey: "k"}, "needs " + wire.HeaderDestinationExchange},
		"empty exchange":           {amqp.Table{wire.HeaderDestinationExchange: ""}, "is empty"},
		"default exchange's name":  {amqp.Table{wire.HeaderDestinationExchange: "amq.default"}, "default exchange"},
		"long exchange":            {amqp.Table{wire.HeaderDestinationExchange: long}, "at most 255"},
		"long key":                 {amqp.Table{wire.HeaderDestinationExchange: "e", wire.HeaderDestinationRoutingKey: long}, "at most 255"},
		"key with NUL":             {amqp.Table{wire.HeaderDestinationExchange: "e", wire.HeaderDestinationRoutingKey: "a\x00b"}, "control"},
		"exchange not UTF-8":       {amqp.Table{wire.HeaderDestinationExchange: "\xff"}, "UTF-8"},
		"exchange a number":        {amqp.Table{wire.HeaderDestinationExchange: int32(1)}, "must be a string"},
		"key a number":             {amqp.Table{wire.HeaderDestinationExchange: "e", wire.HeaderDestinationRoutingKey: int32(1)}, "must be a string"},
	} {
		t.Run(name, func(t *testing.T) {
			c.h[wire.HeaderDueAt] = due
			_, err := nsbtimeout.Parse(&amqp.Delivery{MessageId: "a", Headers: c.h}, received)
			if err == nil {
				t.Fatal("Parse accepted it")
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("reason %q does not mention %q", err, c.want)
			}
		})
	}
}

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
	store, pub, s := &fakeStore{}, &fakePublisher{}, amqptest.New(t)
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
	if _, ok := store.rows["m1"]; ok || len(pub.sent) != 1 {
		t.Fatalf("the message naming both kinds of destination was stored, or not sent to the error queue (%d copies)", len(pub.sent))
	}
	if got := pub.sent[0].Msg.Headers[wire.HeaderError]; !strings.Contains(got.(string), "both name a destination") {
		t.Fatalf("error copy reason %q", got)
	}
}
