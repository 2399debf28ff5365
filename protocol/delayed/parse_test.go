package delayed

import (
	"maps"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/intake"
	"github.com/delaybridge/delaybridge/protocol/nsbtimeout"
	"github.com/delaybridge/delaybridge/wire"
)

// received is when the bridge takes the deliveries of these tests.
var received = time.Date(2026, 11, 21, 19, 0, 0, 0, time.UTC)

// delayedSource is E.Timeouts as the bridge consumes it with the delayed
// exchanges orders and audit bound to it.
var delayedSource = intake.MergeSources(append([]intake.Source{nsbtimeout.TimeoutsSource("e.Timeouts")},
	Protocol{TimeoutsQueue: "e.Timeouts", Exchanges: []Exchange{{Name: "orders", Type: "topic"}, {Name: "audit", Type: "fanout"}}}.Sources()...))[0]

// delayedDelivery is a delivery to E.Timeouts through the delayed exchange
// orders, as the broker hands it over.
func delayedDelivery(delay any, present bool) *amqp.Delivery {
	h := amqp.Table{"tenant": "eu", "attempt": int32(2)}
	if present {
		h[wire.HeaderDelay] = delay
	}
	return &amqp.Delivery{Exchange: "orders", RoutingKey: "orders.created.eu", MessageId: "m1",
		ContentType: "application/json", CorrelationId: "c1", ReplyTo: "replies", DeliveryMode: amqp.Persistent,
		Priority: 3, Timestamp: time.Unix(1763755200, 0), Type: "created", AppId: "shop", UserId: "guest",
		Expiration: "600000", Headers: h, Body: []byte(`{"id":42}`)}
}

// Every x-delay the plugin reads: the due time, and the header the message
// is forwarded with (the delay negated as int64 when it delayed, else as it
// came). Everything else, the bridge's own headers too, is forwarded as it
// came, to the routing exchange with the delivery's routing key.
func TestDelayedExchangeIntake(t *testing.T) {
	const day = 24 * time.Hour
	cases := []struct {
		name      string
		delay     any
		present   bool
		due       time.Duration
		forwarded any // x-delay of the forwarded message; nil with wantAbsent
	}{
		{"int8", int8(100), true, 100 * time.Millisecond, int64(-100)},
		{"uint8", uint8(200), true, 200 * time.Millisecond, int64(-200)},
		{"int16", int16(30000), true, 30 * time.Second, int64(-30000)},
		{"uint16", uint16(60000), true, time.Minute, int64(-60000)},
		{"int32", int32(1500), true, 1500 * time.Millisecond, int64(-1500)},
		{"uint32", uint32(4000000000), true, 4000000000 * time.Millisecond, int64(-4000000000)},
		{"int64", int64(5000), true, 5 * time.Second, int64(-5000)},
		{"int", 7, true, 7 * time.Millisecond, int64(-7)},
		{"string", "2500", true, 2500 * time.Millisecond, int64(-2500)},
		{"byte array", []byte("2500"), true, 2500 * time.Millisecond, int64(-2500)},
		{"float64", 1500.9, true, 1500 * time.Millisecond, int64(-1500)},
		{"float32", float32(99.99), true, 99 * time.Millisecond, int64(-99)},
		// The plugin routes these at once (its timer's limit); the bridge waits.
		{"over 49.7 days", int64(60 * 86400000), true, 60 * day, int64(-60 * 86400000)},
		{"400 days as float", float64(400 * 86400000), true, 400 * day, int64(-400 * 86400000)},
		{"zero", int32(0), true, 0, int32(0)},
		{"negative", int32(-5000), true, 0, int32(-5000)},
		{"negative string", "-5", true, 0, "-5"},
		{"float below one", 0.5, true, 0, 0.5},
		{"void", nil, true, 0, nil},
		{"absent", nil, false, 0, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := delayedDelivery(c.delay, c.present)
			before := maps.Clone(d.Headers)
			it := delayedSource.Parser.Parse(d, received)
			if it.Op != intake.OpSchedule {
				t.Fatalf("op %d (reason %q), want intake.OpSchedule", it.Op, it.Reason)
			}
			// Every publish is a send of its own, as the plugin delivers
			// each (docs/contract.md §2.7).
			if !it.NewSend {
				t.Fatal("not a new send: a second publish of the message would be taken for a redelivery")
			}
			if it.Exchange != "orders.route" || it.Destination != "orders.created.eu" || it.ID != "m1" {
				t.Fatalf("exchange %q routing key %q id %q; want orders.route, orders.created.eu, m1", it.Exchange, it.Destination, it.ID)
			}
			if want := received.Add(c.due); !it.DueAt.Equal(want) {
				t.Fatalf("due %s, want %s", it.DueAt.Format(time.RFC3339Nano), want.Format(time.RFC3339Nano))
			}
			want := amqp.Table{"tenant": "eu", "attempt": int32(2)}
			if c.present {
				want[wire.HeaderDelay] = c.forwarded
			}
			if diff := cmp.Diff(want, it.Msg.Headers); diff != "" {
				t.Fatalf("forwarded headers (-want +got):\n%s", diff)
			}
			m := it.Msg
			if string(m.Body) != `{"id":42}` || m.MessageId != "m1" || m.ContentType != "application/json" || m.CorrelationId != "c1" ||
				m.ReplyTo != "replies" || m.DeliveryMode != amqp.Persistent || m.Priority != 3 || !m.Timestamp.Equal(time.Unix(1763755200, 0)) ||
				m.Type != "created" || m.AppId != "shop" || m.Expiration != "600000" {
				t.Fatalf("properties or body not kept: %+v", m)
			}
			if m.UserId != "" {
				t.Fatalf("user-id %q kept: the broker refuses a forward whose user-id is not the bridge's user", m.UserId)
			}
			if diff := cmp.Diff(before, d.Headers); diff != "" {
				t.Fatalf("the delivery's headers changed (-before +after):\n%s", diff)
			}
			if err := it.Validate(); err != nil {
				t.Fatalf("Validate: %v", err)
			}
		})
	}
}

// What the plugin would route at once without a word is refused to the
// error queue, naming x-delay.
func TestDelayedExchangeRefusesAnUnreadableDelay(t *testing.T) {
	for name, delay := range map[string]any{
		"boolean":        true,
		"decimal":        amqp.Decimal{Scale: 1, Value: 15},
		"words":          "soon",
		"decimal point":  "1.5",
		"empty string":   "",
		"NaN":            math.NaN(),
		"+Inf":           math.Inf(1),
		"timestamp":      received,
		"table":          amqp.Table{"ms": int32(5)},
		"array":          []any{int32(5)},
		"past 2262":      int64(1) << 61,
		"longer than Go": int64(math.MaxInt64),
		"huge string":    strings.Repeat("9", 100000),
	} {
		t.Run(name, func(t *testing.T) {
			it := delayedSource.Parser.Parse(delayedDelivery(delay, true), received)
			if it.Op != intake.OpReject {
				t.Fatalf("op %d, want intake.OpReject", it.Op)
			}
			if !strings.Contains(it.Reason, wire.HeaderDelay) || len(it.Reason) > 400 {
				t.Fatalf("reason %q must name %s and be short", it.Reason, wire.HeaderDelay)
			}
		})
	}
}

// The exchange a message was published to decides how it is read: through
// a delayed exchange the bridge's own headers mean nothing (not even a
// cancel), and the id is read as for any message; a message published
// another way is read by its headers.
func TestDelayedExchangeIsToldApartByTheDeliveryExchange(t *testing.T) {
	d := delayedDelivery(int32(1000), true)
	d.Exchange = "audit"
	d.RoutingKey = ""
	d.Headers[wire.HeaderDestination] = "elsewhere"
	d.Headers[wire.HeaderDueAt] = "2030-01-01T00:00:00Z"
	d.Headers[wire.HeaderCancel] = "m0"
	it := delayedSource.Parser.Parse(d, received)
	if it.Op != intake.OpSchedule || it.Exchange != "audit.route" || it.Destination != "" || !it.DueAt.Equal(received.Add(time.Second)) {
		t.Fatalf("got op %d exchange %q routing key %q due %s (reason %q)", it.Op, it.Exchange, it.Destination, it.DueAt, it.Reason)
	}
	for _, h := range []string{wire.HeaderDestination, wire.HeaderDueAt, wire.HeaderCancel} {
		if _, ok := it.Msg.Headers[h]; !ok {
			t.Errorf("header %s not forwarded", h)
		}
	}

	d = delayedDelivery(int32(1000), true)
	d.MessageId = ""
	d.Headers[wire.HeaderNSBMessageID] = "nsb-7"
	if it := delayedSource.Parser.Parse(d, received); it.ID != "nsb-7" {
		t.Errorf("id %q, want the NServiceBus.MessageId header's", it.ID)
	}
	d.Headers[wire.HeaderNSBMessageID] = nil
	if it := delayedSource.Parser.Parse(d, received); it.Op != intake.OpSchedule || it.ID != "" {
		t.Errorf("op %d id %q: a message without an id is scheduled and given one by ingest", it.Op, it.ID)
	}
	d.MessageId = "a\x00b"
	if it := delayedSource.Parser.Parse(d, received); it.Op != intake.OpReject || !strings.Contains(it.Reason, "message-id") {
		t.Errorf("an impossible message-id: op %d reason %q", it.Op, it.Reason)
	}

	for _, exchange := range []string{"", "orders.route", "other"} {
		d := &amqp.Delivery{Exchange: exchange, RoutingKey: "e.Timeouts", MessageId: "h1",
			Headers: amqp.Table{wire.HeaderDestination: "billing", wire.HeaderDelay: int32(1000)}}
		it := delayedSource.Parser.Parse(d, received)
		if it.Op != intake.OpSchedule || it.Exchange != "" || it.Destination != "billing" {
			t.Errorf("exchange %q: op %d exchange %q destination %q; want the headers read", exchange, it.Op, it.Exchange, it.Destination)
		}
		if _, ok := it.Msg.Headers[wire.HeaderDelay]; ok {
			t.Errorf("exchange %q: x-delay forwarded on a message read by its headers", exchange)
		}
	}
}
