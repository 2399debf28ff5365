package rebus

import (
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/intake"
	"github.com/delaybridge/delaybridge/wire"
)

var opts = Options{Queue: "timeouts", DirectExchange: DefaultDirectExchange, QueueType: "quorum"}

// Fixtures: a message an endpoint "orders" defers with bus.Defer for the
// endpoint "billing", as Rebus 8 writes it and Rebus.RabbitMq publishes it.
const (
	fixtureMsgID = "6f2c1b9e-0d4a-4c57-9a51-3f0e8b2d7c41" // Guid.NewGuid().ToString(): AssignDefaultHeadersStep
	// DateTimeOffset.Now.ToString("O") on a host at UTC+01:00
	// (DateTimeExtensions.ToIso8601DateTimeOffset; .NET's TryFormatO).
	fixtureUntil = "2026-11-24T13:45:30.1234567+01:00"
	fixtureSent  = "2026-11-24T13:40:30.1234567+01:00"
)

// fixtureDue is the instant fixtureUntil denotes.
var fixtureDue = time.Date(2026, 11, 24, 12, 45, 30, 123456700, time.UTC)

// fixtureHeaders are the message's headers, each the UTF-8 text Rebus.RabbitMq
// writes as an AMQP long string (RabbitMqTransport.CreateBasicProperties),
// which amqp091-go hands over as a Go string.
func fixtureHeaders() amqp.Table {
	return amqp.Table{
		"rbs2-msg-id":          fixtureMsgID,
		"rbs2-intent":          "p2p",                                           // RebusBus.CreateMessage
		"rbs2-return-address":  "orders",                                        // AssignDefaultHeadersStep
		"rbs2-sender-address":  "orders",                                        // AssignDefaultHeadersStep
		"rbs2-senttime":        fixtureSent,                                     // AssignDefaultHeadersStep, ToString("O")
		"rbs2-msg-type":        "Billing.Messages.InvoiceDue, Billing.Messages", // simple assembly-qualified name
		"rbs2-corr-id":         fixtureMsgID,                                    // FlowCorrelationIdStep
		"rbs2-corr-seq":        "0",                                             // FlowCorrelationIdStep
		"rbs2-content-type":    "application/json;charset=utf-8",                // JsonSerializer
		"rbs2-deferred-until":  fixtureUntil,                                    // MessageExtensions.SetDeferHeaders
		"rbs2-defer-recipient": "billing",                                       // SetDeferHeaders: the message type's route
		"rbs2-defer-count":     "1",                                             // SetDeferHeaders
	}
}

// fixture is the delivery the bridge takes off the timeout manager queue:
// the properties as CreateBasicProperties derives them from the headers
// (message-id from rbs2-msg-id, content type and charset split from
// rbs2-content-type, persistent unless rbs2-express).
func fixture(h amqp.Table) *amqp.Delivery {
	return &amqp.Delivery{Exchange: DefaultDirectExchange, RoutingKey: "timeouts", MessageId: fixtureMsgID,
		ContentType: "application/json", ContentEncoding: "utf-8", DeliveryMode: amqp.Persistent,
		Headers: h, Body: []byte(`{"InvoiceId":42}`)}
}

// A deferred message is due at rbs2-deferred-until, goes to its recipient
// through the direct exchange, and is forwarded with every property, every
// other header and the body as it came, rbs2-deferred-until alone removed.
func TestParseDeferredMessage(t *testing.T) {
	d := fixture(fixtureHeaders())
	it := opts.Parse(d, time.Now())
	if it.Op != intake.OpSchedule {
		t.Fatalf("op %d, reason %q", it.Op, it.Reason)
	}
	if err := it.Validate(); err != nil {
		t.Fatal(err)
	}
	if it.Exchange != "RebusDirect" || it.Destination != "billing" || !it.DueAt.Equal(fixtureDue) {
		t.Fatalf("to %q %q at %s, want RebusDirect billing at %s", it.Exchange, it.Destination, it.DueAt, fixtureDue)
	}
	if want := fixtureMsgID + "/billing/" + fixtureUntil; it.ID != want {
		t.Fatalf("id %q, want %q", it.ID, want)
	}
	want := fixtureHeaders()
	delete(want, "rbs2-deferred-until")
	if diff := cmp.Diff(want, it.Msg.Headers); diff != "" {
		t.Fatalf("forwarded headers (-want +got):\n%s", diff)
	}
	if it.Msg.MessageId != fixtureMsgID || it.Msg.ContentType != "application/json" || it.Msg.ContentEncoding != "utf-8" ||
		it.Msg.DeliveryMode != amqp.Persistent || string(it.Msg.Body) != `{"InvoiceId":42}` {
		t.Fatalf("forwarded properties or body changed: %+v", it.Msg)
	}
	if d.Headers["rbs2-deferred-until"] != fixtureUntil {
		t.Fatal("the delivery's own headers were changed")
	}
}

// Headers arrive as long strings or as byte arrays; both read as UTF-8.
func TestParseByteArrayHeaders(t *testing.T) {
	h := fixtureHeaders()
	for _, k := range []string{"rbs2-msg-id", "rbs2-deferred-until", "rbs2-defer-recipient"} {
		h[k] = []byte(h[k].(string))
	}
	it := opts.Parse(fixture(h), time.Now())
	if it.Op != intake.OpSchedule || it.Destination != "billing" || !it.DueAt.Equal(fixtureDue) ||
		it.ID != fixtureMsgID+"/billing/"+fixtureUntil {
		t.Fatalf("got %+v", it)
	}
}

// Addresses as Rebus.RabbitMq resolves them (FullyQualifiedRoutingKey).
func TestRecipient(t *testing.T) {
	for addr, want := range map[string]wire.Destination{
		"billing":                    {Exchange: "RebusDirect", Key: "billing"},
		"invoices.due@BillingTopics": {Exchange: "BillingTopics", Key: "invoices.due"},
		"a@b@x":                      {Exchange: "x", Key: "a@b"}, // the last @ splits
		"billing@":                   wire.Queue("billing"),       // the default exchange
		"@audit":                     {Exchange: "audit", Key: ""},
		"timeouts@OtherDirect":       {Exchange: "OtherDirect", Key: "timeouts"},
		"billing@" + "RebusDirect":   {Exchange: "RebusDirect", Key: "billing"},
		strings.Repeat("q", 255):     {Exchange: "RebusDirect", Key: strings.Repeat("q", 255)},
		"sp ace@x":                   {Exchange: "x", Key: "sp ace"},
		"ünïcode@Ëxchange":           {Exchange: "Ëxchange", Key: "ünïcode"},
		"orders.eu.#@amq.topic":      {Exchange: "amq.topic", Key: "orders.eu.#"},
		"billing@" + "RebusDirect2 ": {Exchange: "RebusDirect2 ", Key: "billing"},
	} {
		got, err := opts.Recipient(addr)
		if err != nil || got != want {
			t.Errorf("%q: %+v, %v; want %+v", addr, got, err, want)
		}
	}
	for addr, why := range map[string]string{
		"":                              "empty",
		"timeouts":                      "timeout manager queue itself",
		"timeouts@RebusDirect":          "timeout manager queue itself",
		"timeouts@":                     "timeout manager queue itself",
		"billing@amq.default":           "amq.default",
		"@":                             "empty",
		strings.Repeat("q", 256):        "at most 255",
		"bill\x01ing":                   "control characters",
		"billing@x\xff":                 "UTF-8",
		"k@" + strings.Repeat("x", 256): "at most 255",
	} {
		if got, err := opts.Recipient(addr); err == nil || !strings.Contains(err.Error(), why) {
			t.Errorf("%.40q: %+v, %v; want an error saying %q", addr, got, err, why)
		}
	}
}

// Due times as .NET's TryParseExact with "O" reads them, except that a time
// without an offset is refused.
func TestParseTime(t *testing.T) {
	for s, want := range map[string]time.Time{
		fixtureUntil:                        fixtureDue,
		"2026-11-24T12:45:30.1234567+00:00": fixtureDue,
		"2026-11-24T12:45:30.1234567Z":      fixtureDue,
		"2026-11-24T07:15:30.1234567-05:30": fixtureDue,
		"2026-11-24T13:45:30.1234567+1:00":  fixtureDue, // .NET reads a one-digit offset hour too
		"2026-11-25T02:45:30.1234567+14:00": fixtureDue,
		"2026-11-23T22:45:30.1234567-14:00": fixtureDue,
		"0001-01-01T00:00:00.0000000+00:00": time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC),
		"9999-12-31T23:59:59.9999999+00:00": time.Date(9999, 12, 31, 23, 59, 59, 999999900, time.UTC),
		"2024-02-29T00:00:00.0000001+00:00": time.Date(2024, 2, 29, 0, 0, 0, 100, time.UTC),
		"2026-03-29T02:30:00.0000000+01:00": time.Date(2026, 3, 29, 1, 30, 0, 0, time.UTC),
	} {
		got, err := ParseTime(s)
		if err != nil || !got.Equal(want) || got.Location() != time.UTC {
			t.Errorf("%q: %s, %v; want %s UTC", s, got, err, want)
		}
	}
	for s, why := range map[string]string{
		"2026-11-24T13:45:30.1234567":        "no offset",
		"2026-11-24T13:45:30.123456+01:00":   "not a .NET round-trip time",
		"2026-11-24T13:45:30.12345678+01:00": "not a .NET round-trip time",
		"2026-11-24T13:45:30,1234567+01:00":  "not a .NET round-trip time",
		"2026-11-24T13:45:30+01:00":          "not a .NET round-trip time",
		"2026-11-24T13:45:30Z":               "not a .NET round-trip time",
		"2026-11-24 13:45:30.1234567+01:00":  "not a .NET round-trip time",
		"2026-11-24T13:45:30.1234567z":       "not a .NET round-trip time",
		"2026-11-24T13:45:30.1234567 +01:00": "not a .NET round-trip time",
		"2026-11-24T13:45:30.1234567+0100":   "not a .NET round-trip time",
		"2026-11-24T13:45:30.1234567+01:00 ": "not a .NET round-trip time",
		" 2026-11-24T13:45:30.1234567+01:00": "not a .NET round-trip time",
		"2026-11-24T13:45:30.1234567+01:60":  "not a .NET round-trip time",
		"2026-11-24T13:45:30.1234567+:1000":  "not a .NET round-trip time",
		"2026-11-24T13:45:30.1234567+a:00":   "not a .NET round-trip time",
		"2026-11-24T13:45:30.1234567ZZ":      "not a .NET round-trip time",
		"2026-11-24T13:45:30.1234567+14:01":  "beyond ±14:00",
		"2026-11-24T13:45:30.1234567-15:00":  "beyond ±14:00",
		"2026-02-30T13:45:30.1234567+01:00":  "not a .NET round-trip time",
		"2026-11-24T24:00:00.0000000+01:00":  "not a .NET round-trip time",
		"2026-11-24T13:45:60.0000000+01:00":  "not a .NET round-trip time",
		"0000-01-01T00:00:00.0000000+00:00":  "not a .NET round-trip time",
		"+2026-11-24T13:45:30.1234567+01:00": "not a .NET round-trip time",
		"2026-11-24T13:45:30.-234567+01:00":  "not a .NET round-trip time",
		"":                                   "not a .NET round-trip time",
		strings.Repeat("2", 100):             "…",
	} {
		if got, err := ParseTime(s); err == nil || !strings.Contains(err.Error(), why) {
			t.Errorf("%.40q: %s, %v; want an error saying %q", s, got, err, why)
		}
	}
}

// ParseTime reads back every time as .NET writes it for a DateTimeOffset
// (the layout below is TryFormatO's: 7 fraction digits, numeric offset).
func FuzzParseTime(f *testing.F) {
	f.Add(int64(1795873530123456700), int16(60))
	f.Add(int64(0), int16(-840))
	f.Add(int64(-62135596800000000), int16(0))
	f.Fuzz(func(t *testing.T, unixNano int64, offsetMinutes int16) {
		off := int(offsetMinutes) % (14*60 + 1)
		in := time.Unix(0, unixNano).Truncate(100).In(time.FixedZone("", off*60))
		s := in.Format("2006-01-02T15:04:05.0000000-07:00")
		got, err := ParseTime(s)
		if in.Year() < 1 || in.Year() > 9999 {
			return // not a year .NET writes in four digits
		}
		if err != nil || !got.Equal(in) {
			t.Fatalf("%q: %s, %v; want %s", s, got, err, in.UTC())
		}
	})
}

// Everything that is not a deferred message Rebus could deliver is refused
// with a reason naming the header.
func TestParseRefusals(t *testing.T) {
	for name, tc := range map[string]struct {
		edit func(amqp.Table)
		why  string
	}{
		"no due time":        {func(h amqp.Table) { delete(h, "rbs2-deferred-until") }, "no header rbs2-deferred-until: only messages Rebus defers"},
		"void due time":      {func(h amqp.Table) { h["rbs2-deferred-until"] = nil }, "no header rbs2-deferred-until"},
		"due time not text":  {func(h amqp.Table) { h["rbs2-deferred-until"] = int64(1795873530) }, "header rbs2-deferred-until must be a string"},
		"due time as RFC":    {func(h amqp.Table) { h["rbs2-deferred-until"] = "2026-11-24T12:45:30Z" }, "header rbs2-deferred-until: \"2026-11-24T12:45:30Z\" is not a .NET round-trip time"},
		"due time, no zone":  {func(h amqp.Table) { h["rbs2-deferred-until"] = "2026-11-24T12:45:30.1234567" }, "has no offset"},
		"no recipient":       {func(h amqp.Table) { delete(h, "rbs2-defer-recipient") }, "no header rbs2-defer-recipient"},
		"recipient not text": {func(h amqp.Table) { h["rbs2-defer-recipient"] = true }, "header rbs2-defer-recipient must be a string"},
		"empty recipient":    {func(h amqp.Table) { h["rbs2-defer-recipient"] = "" }, "header rbs2-defer-recipient: it is empty"},
		"loop":               {func(h amqp.Table) { h["rbs2-defer-recipient"] = "timeouts" }, `header rbs2-defer-recipient: "timeouts" is the timeout manager queue itself`},
		"msg id not text":    {func(h amqp.Table) { h["rbs2-msg-id"] = int32(7) }, "header rbs2-msg-id must be a string"},
	} {
		h := fixtureHeaders()
		tc.edit(h)
		it := opts.Parse(fixture(h), time.Now())
		if it.Op != intake.OpReject || !strings.Contains(it.Reason, tc.why) {
			t.Errorf("%s: %+v; want a rejection saying %q", name, it, tc.why)
		}
	}
	// Beyond what the stores keep in order: refused by the intake's rules.
	h := fixtureHeaders()
	h["rbs2-deferred-until"] = "2300-01-01T00:00:00.0000000+00:00"
	if it := opts.Parse(fixture(h), time.Now()); it.Op != intake.OpSchedule || it.Validate() == nil {
		t.Errorf("a due time in 2300 passed: %+v", it)
	}
}

// One deferral is one id: the same message sent twice has one id, a new due
// time or another recipient makes another. Without an id, or when the parts
// do not fit one, the bridge makes one up and the message-id property stays
// as it came.
func TestDeferID(t *testing.T) {
	id := func(edit func(*amqp.Delivery)) (string, amqp.Publishing) {
		t.Helper()
		d := fixture(fixtureHeaders())
		edit(d)
		it := opts.Parse(d, time.Now())
		if it.Op != intake.OpSchedule {
			t.Fatalf("refused: %s", it.Reason)
		}
		if err := it.Validate(); err != nil {
			t.Fatal(err)
		}
		return it.ID, it.Msg
	}
	same := func(*amqp.Delivery) {}
	first, _ := id(same)
	if again, _ := id(same); again != first {
		t.Errorf("the same message twice: ids %q and %q", first, again)
	}
	later, _ := id(func(d *amqp.Delivery) {
		d.Headers["rbs2-deferred-until"] = "2026-11-24T13:46:30.1234567+01:00"
		d.Headers["rbs2-defer-count"] = "2"
	})
	other, _ := id(func(d *amqp.Delivery) { d.Headers["rbs2-defer-recipient"] = "shipping" })
	if later == first || other == first || later == other {
		t.Errorf("distinct deferrals share an id: %q %q %q", first, later, other)
	}
	fromProperty, _ := id(func(d *amqp.Delivery) { delete(d.Headers, "rbs2-msg-id"); d.MessageId = "prop-id" })
	if fromProperty != "prop-id/billing/"+fixtureUntil {
		t.Errorf("without rbs2-msg-id: %q", fromProperty)
	}
	for name, edit := range map[string]func(*amqp.Delivery){
		"no id": func(d *amqp.Delivery) { delete(d.Headers, "rbs2-msg-id"); d.MessageId = "" },
		"blank": func(d *amqp.Delivery) { d.Headers["rbs2-msg-id"] = " "; d.MessageId = "" },
		"too long": func(d *amqp.Delivery) {
			d.Headers["rbs2-defer-recipient"] = strings.Repeat("b", 230)
		},
		"control characters": func(d *amqp.Delivery) { d.Headers["rbs2-msg-id"] = "a\tb" },
	} {
		before := fixture(fixtureHeaders())
		edit(before)
		gen, msg := id(edit)
		if _, err := uuid.Parse(gen); err != nil {
			t.Errorf("%s: id %q, want a generated UUID", name, gen)
		}
		if msg.MessageId != before.MessageId {
			t.Errorf("%s: message-id property %q, want %q as it came", name, msg.MessageId, before.MessageId)
		}
		if again, _ := id(edit); again == gen {
			t.Errorf("%s: a generated id repeats", name)
		}
	}
}

// The source consumes the configured queue with this package's parser; the
// topology declares the queue with the bridge's queue type and the direct
// exchange with the endpoints' arguments, and binds the queue to it by its
// name, as the senders route, then NServiceBus's conventional exchange of
// the queue. The queue is no destination; the direct exchange is one. With
// no queue the intake is off: nothing of any.
func TestSourceAndTopology(t *testing.T) {
	o := Options{Queue: "tm", DirectExchange: "BusDirect", QueueType: "classic", DirectExchangeArgs: amqp.Table{"alternate-exchange": "unrouted"}}
	srcs := o.Sources()
	if len(srcs) != 1 {
		t.Fatalf("sources %+v", srcs)
	}
	src := srcs[0]
	if src.Queue != "tm" || src.Name != "rebus" || src.Parser == nil {
		t.Fatalf("source %+v", src)
	}
	h := fixtureHeaders()
	if it := src.Parser.Parse(fixture(h), time.Now()); it.Exchange != "BusDirect" || it.Destination != "billing" {
		t.Fatalf("parsed %+v", it)
	}
	fs := o.Topology()
	if len(fs) != 2 || !cmp.Equal(fs[1], broker.ConventionalExchange("tm")) {
		t.Fatalf("topology %+v", fs)
	}
	f := fs[0]
	if f.Queue != "tm" || f.Exchange != "BusDirect" || f.ExchangeType != "direct" || f.RoutingKey != "tm" ||
		!maps.Equal(f.QueueArgs, amqp.Table{"x-queue-type": "classic"}) || !maps.Equal(f.ExchangeArgs, amqp.Table{"alternate-exchange": "unrouted"}) {
		t.Fatalf("topology %+v", f)
	}
	if r, x := o.Reserved(), o.Routes(); !slices.Equal(r, []string{"tm"}) || !slices.Equal(x, []string{"BusDirect"}) {
		t.Fatalf("reserved %q, routes %q", r, x)
	}
	off := Options{DirectExchange: "BusDirect", QueueType: "classic"}
	if off.Sources() != nil || off.Topology() != nil || off.Reserved() != nil || off.Routes() != nil {
		t.Fatalf("an intake without a queue has sources %+v, topology %+v, reserved %q, routes %q", off.Sources(), off.Topology(), off.Reserved(), off.Routes())
	}
}

// ParseTime never panics, and what it accepts has the shape of "O".
func FuzzParseTimeText(f *testing.F) {
	for _, s := range []string{fixtureUntil, "2026-11-24T12:45:30.1234567Z", "2026-11-24T13:45:30.1234567+1:00", "2026-11-24T13:45:30.1234567+:1000", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := ParseTime(s)
		if err != nil {
			return
		}
		if n := len(s); n != 28 && n != 32 && n != 33 || got.Location() != time.UTC {
			t.Fatalf("accepted %q (%d bytes) as %s", s, len(s), got)
		}
	})
}
