package nsbtimeout

import (
	"math"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/wire"
)

var received = time.Date(2026, 11, 21, 19, 0, 0, 0, time.UTC)

func delivery(h amqp.Table) *amqp.Delivery {
	return &amqp.Delivery{Headers: h, MessageId: "m1"}
}

func TestDueTimeForms(t *testing.T) {
	at := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			t.Fatal(err)
		}
		return v.UTC()
	}
	cases := []struct {
		name string
		h    amqp.Table
		want time.Time
	}{
		{"x-due-at Z", amqp.Table{wire.HeaderDueAt: "2026-11-21T20:00:00.250Z"}, at("2026-11-21T20:00:00.250Z")},
		{"x-due-at offset", amqp.Table{wire.HeaderDueAt: "2026-11-21T22:00:00+02:00"}, at("2026-11-21T20:00:00Z")},
		{"x-due-at lower case", amqp.Table{wire.HeaderDueAt: "2026-11-21t20:00:00.5z"}, at("2026-11-21T20:00:00.5Z")},
		{"x-due-at nanos", amqp.Table{wire.HeaderDueAt: "2026-11-21T20:00:00.123456789Z"}, at("2026-11-21T20:00:00.123456789Z")},
		{"x-due-at bytes", amqp.Table{wire.HeaderDueAt: []byte("2026-11-21T20:00:00Z")}, at("2026-11-21T20:00:00Z")},
		{"x-due-at timestamp", amqp.Table{wire.HeaderDueAt: time.Unix(1763755200, 0)}, time.Unix(1763755200, 0).UTC()},
		{"nsb expire", amqp.Table{wire.HeaderNSBExpire: "2026-11-21 20:00:00:250000 Z"}, at("2026-11-21T20:00:00.25Z")},
		// The exact strings of NServiceBus's DateTimeExtensionsTests (7.x):
		// a literal one and ToWireFormattedString(2016-08-29 16:37:25.075).
		{"nsb expire framework fixture", amqp.Table{wire.HeaderNSBExpire: "2016-08-16 10:06:20:123456 Z"}, at("2016-08-16T10:06:20.123456Z")},
		{"nsb expire framework round trip", amqp.Table{wire.HeaderNSBExpire: []byte("2016-08-29 16:37:25:075000 Z")}, at("2016-08-29T16:37:25.075Z")},
		{"nsb expire 7 digits", amqp.Table{wire.HeaderNSBExpire: "2026-11-21 20:00:00:1234567 Z"}, at("2026-11-21T20:00:00.1234567Z")},
		{"x-delay int8", amqp.Table{wire.HeaderDelay: int8(100)}, received.Add(100 * time.Millisecond)},
		{"x-delay uint8", amqp.Table{wire.HeaderDelay: uint8(200)}, received.Add(200 * time.Millisecond)},
		{"x-delay int16", amqp.Table{wire.HeaderDelay: int16(30000)}, received.Add(30 * time.Second)},
		{"x-delay uint16", amqp.Table{wire.HeaderDelay: uint16(60000)}, received.Add(60 * time.Second)},
		{"x-delay int32", amqp.Table{wire.HeaderDelay: int32(1500)}, received.Add(1500 * time.Millisecond)},
		{"x-delay uint32", amqp.Table{wire.HeaderDelay: uint32(4000000000)}, received.Add(4000000000 * time.Millisecond)},
		{"x-delay int64", amqp.Table{wire.HeaderDelay: int64(86400000 * 365)}, received.Add(365 * 24 * time.Hour)},
		{"x-delay int", amqp.Table{wire.HeaderDelay: 5}, received.Add(5 * time.Millisecond)},
		{"x-delay string", amqp.Table{wire.HeaderDelay: "1500"}, received.Add(1500 * time.Millisecond)},
		{"x-delay string spaces", amqp.Table{wire.HeaderDelay: " 1500 "}, received.Add(1500 * time.Millisecond)},
		{"x-delay zero", amqp.Table{wire.HeaderDelay: int32(0)}, received},
		{"x-delay negative", amqp.Table{wire.HeaderDelay: int32(-5000)}, received},
		{"x-delay negative string", amqp.Table{wire.HeaderDelay: "-5"}, received},
		{"x-delay float64 truncated", amqp.Table{wire.HeaderDelay: 1500.9}, received.Add(1500 * time.Millisecond)},
		{"x-delay float32 truncated", amqp.Table{wire.HeaderDelay: float32(250.5)}, received.Add(250 * time.Millisecond)},
		{"x-delay float below one", amqp.Table{wire.HeaderDelay: 0.9}, received},
		{"x-delay float negative", amqp.Table{wire.HeaderDelay: -0.9}, received},
		{"x-delay float -Inf", amqp.Table{wire.HeaderDelay: math.Inf(-1)}, received},
		{"x-delay float 400 days", amqp.Table{wire.HeaderDelay: float64(400 * 86400000)}, received.Add(400 * 24 * time.Hour)},
		{"past due", amqp.Table{wire.HeaderDueAt: "2000-01-01T00:00:00Z"}, at("2000-01-01T00:00:00Z")},
		{"far future", amqp.Table{wire.HeaderDueAt: "2262-04-11T23:47:16Z"}, at("2262-04-11T23:47:16Z")},
		{"x-due-at wins over others", amqp.Table{wire.HeaderDueAt: "2026-11-21T20:00:00Z", wire.HeaderNSBExpire: "2030-01-01 00:00:00:000000 Z", wire.HeaderDelay: int32(1)}, at("2026-11-21T20:00:00Z")},
		{"expire wins over delay", amqp.Table{wire.HeaderNSBExpire: "2030-01-01 00:00:00:000000 Z", wire.HeaderDelay: int32(1)}, at("2030-01-01T00:00:00Z")},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.h[wire.HeaderDestination] = "orders"
			p, err := Parse(delivery(c.h), received)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if !p.DueAt.Equal(c.want) {
				t.Fatalf("due %s, want %s", p.DueAt.Format(time.RFC3339Nano), c.want.Format(time.RFC3339Nano))
			}
		})
	}
}

func TestParseRejectsWithAClearReason(t *testing.T) {
	due := "2026-11-21T20:00:00Z"
	cases := []struct {
		name string
		d    *amqp.Delivery
		want string // part of the reason
	}{
		{"no destination", delivery(amqp.Table{wire.HeaderDueAt: due}), "no destination"},
		{"empty destination", delivery(amqp.Table{wire.HeaderDestination: "", wire.HeaderDueAt: due}), "is empty"},
		{"destination not a string", delivery(amqp.Table{wire.HeaderDestination: int32(5), wire.HeaderDueAt: due}), "must be a string"},
		{"destination too long", delivery(amqp.Table{wire.HeaderDestination: strings.Repeat("q", 256), wire.HeaderDueAt: due}), "at most 255"},
		{"destination control chars", delivery(amqp.Table{wire.HeaderDestination: "a\nb", wire.HeaderDueAt: due}), "control"},
		{"destination bad utf8", delivery(amqp.Table{wire.HeaderDestination: "\xff\xfe", wire.HeaderDueAt: due}), "UTF-8"},
		// Reply-to is the fallback of NServiceBus timeouts only.
		{"reply-to is no destination", &amqp.Delivery{MessageId: "m1", ReplyTo: "Sales", Headers: amqp.Table{wire.HeaderDueAt: due}}, "no destination"},
		{"reply-to header is no destination", delivery(amqp.Table{wire.HeaderNSBReplyTo: "Sales", wire.HeaderDueAt: due}), "no destination"},
		{"nsb timeout without any address", delivery(amqp.Table{wire.HeaderNSBExpire: "2026-11-21 20:00:00:000000 Z"}), "reply-to address"},
		{"nsb reply-to header empty", &amqp.Delivery{MessageId: "m1", ReplyTo: "Sales", Headers: amqp.Table{wire.HeaderNSBExpire: "2026-11-21 20:00:00:000000 Z", wire.HeaderNSBReplyTo: ""}}, "reply-to address"},
		{"nsb reply-to header not text", delivery(amqp.Table{wire.HeaderNSBExpire: "2026-11-21 20:00:00:000000 Z", wire.HeaderNSBReplyTo: int32(1)}), "must be a string"},
		{"nsb reply-to property bad", &amqp.Delivery{MessageId: "m1", ReplyTo: "a\nb", Headers: amqp.Table{wire.HeaderNSBExpire: "2026-11-21 20:00:00:000000 Z"}}, "reply-to property"},
		{"no due time", delivery(amqp.Table{wire.HeaderDestination: "q"}), "no due time"},
		{"bad x-due-at", delivery(amqp.Table{wire.HeaderDestination: "q", wire.HeaderDueAt: "tomorrow"}), "RFC 3339"},
		{"x-due-at without zone", delivery(amqp.Table{wire.HeaderDestination: "q", wire.HeaderDueAt: "2026-11-21T20:00:00"}), "RFC 3339"},
		{"x-due-at number", delivery(amqp.Table{wire.HeaderDestination: "q", wire.HeaderDueAt: int64(5)}), "RFC 3339 string"},
		{"bad nsb expire", delivery(amqp.Table{wire.HeaderDestination: "q", wire.HeaderNSBExpire: "2026-11-21T20:00:00Z"}), "NServiceBus wire format"},
		// The framework's own refusals (DateTimeExtensionsTests, 7.x).
		{"nsb expire short year", delivery(amqp.Table{wire.HeaderDestination: "q", wire.HeaderNSBExpire: "201-08-16 10:06:20:123456 Z"}), "NServiceBus wire format"},
		{"nsb expire letter", delivery(amqp.Table{wire.HeaderDestination: "q", wire.HeaderNSBExpire: "201j-08-16 10:06:20:123456 Z"}), "NServiceBus wire format"},
		{"nsb expire no zone", delivery(amqp.Table{wire.HeaderDestination: "q", wire.HeaderNSBExpire: "2016-08-16 10:06:20:123456"}), "NServiceBus wire format"},
		{"nsb expire number", delivery(amqp.Table{wire.HeaderDestination: "q", wire.HeaderNSBExpire: int64(5)}), "must be a string"},
		// DateTime.ToString() as the 3.0 betas wrote it, in three cultures.
		{"nsb expire 3.0 beta en-US", delivery(amqp.Table{wire.HeaderDestination: "q", wire.HeaderNSBExpire: "1/5/2012 1:14:15 PM"}), "culture-dependent"},
		{"nsb expire 3.0 beta invariant", delivery(amqp.Table{wire.HeaderDestination: "q", wire.HeaderNSBExpire: "01/05/2012 13:14:15"}), "culture-dependent"},
		{"nsb expire 3.0 beta de-DE", delivery(amqp.Table{wire.HeaderDestination: "q", wire.HeaderNSBExpire: "05.01.2012 13:14:15"}), "culture-dependent"},
		{"nsb expire bad date", delivery(amqp.Table{wire.HeaderDestination: "q", wire.HeaderNSBExpire: "2026-13-41 20:00:00:000000 Z"}), "month out of range"},
		{"x-delay NaN", delivery(amqp.Table{wire.HeaderDestination: "q", wire.HeaderDelay: math.NaN()}), "NaN"},
		{"x-delay float +Inf", delivery(amqp.Table{wire.HeaderDestination: "q", wire.HeaderDelay: math.Inf(1)}), "longer than"},
		{"x-delay float overflow", delivery(amqp.Table{wire.HeaderDestination: "q", wire.HeaderDelay: 1e19}), "longer than"},
		{"x-delay bool", delivery(amqp.Table{wire.HeaderDestination: "q", wire.HeaderDelay: true}), "boolean"},
		{"x-delay decimal", delivery(amqp.Table{wire.HeaderDestination: "q", wire.HeaderDelay: amqp.Decimal{Scale: 1, Value: 15}}), "a decimal"},
		{"x-delay timestamp", delivery(amqp.Table{wire.HeaderDestination: "q", wire.HeaderDelay: received}), "a timestamp"},
		{"x-delay table", delivery(amqp.Table{wire.HeaderDestination: "q", wire.HeaderDelay: amqp.Table{}}), "a table"},
		{"x-delay words", delivery(amqp.Table{wire.HeaderDestination: "q", wire.HeaderDelay: "ten"}), "whole number"},
		{"x-delay decimal point", delivery(amqp.Table{wire.HeaderDestination: "q", wire.HeaderDelay: "1.5"}), "whole number"},
		{"x-delay overflow", delivery(amqp.Table{wire.HeaderDestination: "q", wire.HeaderDelay: int64(1) << 62}), "longer than"},
		{"x-delay huge string", delivery(amqp.Table{wire.HeaderDestination: "q", wire.HeaderDelay: strings.Repeat("9", 100000)}), "whole number"},
		{"id too long", &amqp.Delivery{Headers: amqp.Table{wire.HeaderDestination: "q", wire.HeaderDueAt: due, wire.HeaderNSBMessageID: strings.Repeat("i", 300)}}, "at most 255"},
		{"id control chars", &amqp.Delivery{MessageId: "a\x00b", Headers: amqp.Table{wire.HeaderDestination: "q", wire.HeaderDueAt: due}}, "control"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse(c.d, received)
			if err == nil {
				t.Fatal("Parse accepted it")
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("reason %q does not mention %q", err, c.want)
			}
			if len(err.Error()) > 400 {
				t.Fatalf("reason is %d bytes; huge inputs must be clipped", len(err.Error()))
			}
		})
	}
}

func TestDestinationAndIdentity(t *testing.T) {
	due := "2026-11-21T20:00:00Z"
	nsbDue := "2026-11-21 20:00:00:000000 Z"
	cases := []struct {
		name             string
		d                *amqp.Delivery
		wantDest, wantID string
	}{
		{"x-destination", &amqp.Delivery{MessageId: "a", Headers: amqp.Table{wire.HeaderDestination: "orders", wire.HeaderDueAt: due}}, "orders", "a"},
		{"nsb destination", &amqp.Delivery{MessageId: "a", Headers: amqp.Table{wire.HeaderNSBDestination: "billing", wire.HeaderDueAt: due}}, "billing", "a"},
		{"x-destination wins", &amqp.Delivery{MessageId: "a", Headers: amqp.Table{wire.HeaderDestination: "orders", wire.HeaderNSBDestination: "billing", wire.HeaderDueAt: due}}, "orders", "a"},
		{"destination as bytes", &amqp.Delivery{MessageId: "a", Headers: amqp.Table{wire.HeaderDestination: []byte("orders"), wire.HeaderDueAt: due}}, "orders", "a"},
		{"nsb message id", &amqp.Delivery{Headers: amqp.Table{wire.HeaderDestination: "q", wire.HeaderDueAt: due, wire.HeaderNSBMessageID: "nsb-1"}}, "q", "nsb-1"},
		{"property wins", &amqp.Delivery{MessageId: "prop", Headers: amqp.Table{wire.HeaderDestination: "q", wire.HeaderDueAt: due, wire.HeaderNSBMessageID: "nsb-1"}}, "q", "prop"},
		{"no id: caller assigns", &amqp.Delivery{Headers: amqp.Table{wire.HeaderDestination: "q", wire.HeaderDueAt: due}}, "q", ""},
		{"blank id is no id", &amqp.Delivery{MessageId: "  ", Headers: amqp.Table{wire.HeaderDestination: "q", wire.HeaderDueAt: due}}, "q", ""},
		// An NServiceBus timeout without RouteExpiredTimeoutTo goes to its
		// reply-to address, as the framework's timeout manager sends it.
		{"nsb reply-to header", &amqp.Delivery{MessageId: "a", Headers: amqp.Table{wire.HeaderNSBExpire: nsbDue, wire.HeaderNSBReplyTo: "Sales"}}, "Sales", "a"},
		{"nsb reply-to property", &amqp.Delivery{MessageId: "a", ReplyTo: "Sales", Headers: amqp.Table{wire.HeaderNSBExpire: nsbDue}}, "Sales", "a"},
		{"nsb reply-to header wins", &amqp.Delivery{MessageId: "a", ReplyTo: "Other", Headers: amqp.Table{wire.HeaderNSBExpire: nsbDue, wire.HeaderNSBReplyTo: []byte("Sales")}}, "Sales", "a"},
		{"route wins over reply-to", &amqp.Delivery{MessageId: "a", ReplyTo: "Sales", Headers: amqp.Table{wire.HeaderNSBExpire: nsbDue, wire.HeaderNSBReplyTo: "Sales", wire.HeaderNSBDestination: "billing"}}, "billing", "a"},
		{"x-destination wins over reply-to", &amqp.Delivery{MessageId: "a", ReplyTo: "Sales", Headers: amqp.Table{wire.HeaderNSBExpire: nsbDue, wire.HeaderDestination: "orders"}}, "orders", "a"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p, err := Parse(c.d, received)
			if err != nil {
				t.Fatal(err)
			}
			if p.Destination != wire.Queue(c.wantDest) || p.ID != c.wantID {
				t.Fatalf("got destination %q id %q, want %q %q", p.Destination, p.ID, c.wantDest, c.wantID)
			}
		})
	}
}

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
			p, err := Parse(&amqp.Delivery{MessageId: "a", Headers: c.h}, received)
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
			_, err := Parse(&amqp.Delivery{MessageId: "a", Headers: c.h}, received)
			if err == nil {
				t.Fatal("Parse accepted it")
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("reason %q does not mention %q", err, c.want)
			}
		})
	}
}

// Due times after storage.MaxDueAt (2262) are refused at ingest, from every
// due-time header (docs/contract.md §2.3): bbolt cannot keep them in order,
// and they used to be accepted up to year 9999.
func TestParseRefusesDueTimesAfterMaxDueAt(t *testing.T) {
	for _, c := range []struct {
		name string
		h    amqp.Table
		ok   bool
	}{
		{"x-due-at at the limit", amqp.Table{wire.HeaderDueAt: "2262-04-11T23:47:16.854775807Z"}, true},
		{"x-due-at after it", amqp.Table{wire.HeaderDueAt: "2262-04-11T23:47:16.854775808Z"}, false},
		{"x-due-at year 9999", amqp.Table{wire.HeaderDueAt: "9999-12-31T23:59:59Z"}, false},
		{"x-due-at timestamp 2300", amqp.Table{wire.HeaderDueAt: time.Date(2300, 1, 1, 0, 0, 0, 0, time.UTC)}, false},
		{"Expire year 9999", amqp.Table{wire.HeaderNSBExpire: "9999-12-31 23:59:59:000000 Z"}, false},
		{"Expire 2262", amqp.Table{wire.HeaderNSBExpire: "2262-01-01 00:00:00:000000 Z"}, true},
		{"x-delay 200 years", amqp.Table{wire.HeaderDelay: int64(200 * 365 * 24 * time.Hour / time.Millisecond)}, true},
		{"x-delay 290 years", amqp.Table{wire.HeaderDelay: int64(290 * 365 * 24 * time.Hour / time.Millisecond)}, false},
	} {
		c.h[wire.HeaderDestination] = "orders"
		p, err := Parse(delivery(c.h), received)
		switch {
		case c.ok && err != nil:
			t.Errorf("%s: refused: %v", c.name, err)
		case c.ok && p.DueAt.After(storage.MaxDueAt):
			t.Errorf("%s: accepted due %s after the limit", c.name, p.DueAt)
		case !c.ok && err == nil:
			t.Errorf("%s: accepted with due %s, want it refused", c.name, p.DueAt)
		case !c.ok && !strings.Contains(err.Error(), "outside years 0000 to 2262 (the latest due time is 2262-04-11T23:47:16.854775807Z)"):
			t.Errorf("%s: reason %q does not say the range", c.name, err)
		}
	}
}
