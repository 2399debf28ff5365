package masstransit

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/intake"
)

var opts = Options{Queue: "quartz"}

// The fixtures are what an endpoint "orders" configured with
// UseMessageScheduler(new Uri("queue:quartz")) sends (testdata): the JSON
// envelope as System.Text.Json writes a JsonMessageEnvelope (camelCase,
// indented, nulls written), and the message's properties and headers as
// RabbitMqSendTransportContext sets them.
const (
	fixtureToken  = "9f1c2a7e-4b3d-4e8f-a1c2-3d4e5f6a7b8c"
	fixtureTokenN = "9f1c2a7e4b3d4e8fa1c23d4e5f6a7b8c"
	fixtureMsgID  = "3c0b0000-5d3f-0015-2b1e-08dd0c8a9f6e"
)

var fixtureDue = time.Date(2026, 11, 24, 12, 45, 30, 123456700, time.UTC)

func read(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func delivery(body []byte) *amqp.Delivery {
	return &amqp.Delivery{Exchange: "quartz", ContentType: ContentType, DeliveryMode: amqp.Persistent, MessageId: fixtureMsgID,
		Expiration: "60000", Headers: amqp.Table{"Tenant": "eu-1"}, Body: body}
}

// A ScheduleMessage replaces its token's pending message by the payload,
// due at scheduledTime, for the exchange its destination names; the
// forwarded envelope is the fixture's exact bytes (testdata/scheduled.json).
func TestParseSchedule(t *testing.T) {
	d := delivery(read(t, "schedule.json"))
	it := opts.Parse(d, time.Now())
	if it.Op != intake.OpReplace {
		t.Fatalf("op %d, reason %q", it.Op, it.Reason)
	}
	if err := it.Validate(); err != nil {
		t.Fatal(err)
	}
	if it.Exchange != "billing" || it.Destination != "" || !it.DueAt.Equal(fixtureDue) || it.SagaID != fixtureToken ||
		!strings.HasPrefix(it.ID, fixtureToken+"/") {
		t.Fatalf("got %q %q at %s, group %q, id %q", it.Exchange, it.Destination, it.DueAt, it.SagaID, it.ID)
	}
	if again := opts.Parse(d, time.Now()); again.ID == it.ID {
		t.Fatal("a redelivery got the same id: the replace's own tombstone would drop it")
	}
	if v, ok := it.Msg.Headers[stampHeader]; !ok || v != "" {
		t.Fatalf("stored without the stamp mark: %v", it.Msg.Headers)
	}
	// Sent exactly at its due time, by the intake turned off since
	// (Options.Stamp: rows stored while it was on are stamped after).
	m := Options{}.Stamp(it.Msg, "", fixtureDue)
	if want := read(t, "scheduled.json"); string(m.Body) != string(want) {
		t.Fatalf("forwarded envelope:\n%s\nwant:\n%s", m.Body, want)
	}
	ts := time.Date(2026, 11, 24, 12, 45, 30, 0, time.UTC)
	want := amqp.Table{"Tenant": "eu-1", HeaderSent: ts, HeaderScheduled: ts, HeaderTokenID: fixtureTokenN,
		HeaderScheduleID: fixtureTokenN, HeaderScheduleGroup: "DEFAULT"}
	if diff := cmp.Diff(want, m.Headers); diff != "" {
		t.Fatalf("AMQP headers (-want +got):\n%s", diff)
	}
	if m.MessageId != fixtureMsgID || m.ContentType != ContentType || m.DeliveryMode != amqp.Persistent || m.Expiration != "" {
		t.Fatalf("properties: %+v", m)
	}
	if len(d.Headers) != 1 {
		t.Fatal("the delivery's own headers were changed")
	}
}

// Property names are read without regard to case, a header of the
// scheduler's name is overwritten in place, and an envelope without
// headers gets the scheduler's.
func TestParseScheduleLenient(t *testing.T) {
	body := `{"MessageId":"a","MessageType":["urn:message:MassTransit.Scheduling:ScheduleMessage"],` +
		`"Message":{"CorrelationId":"` + fixtureTokenN + `","ScheduledTime":"2026-11-24T13:45:30.5+01:00",` +
		`"PayloadType":["urn:message:X:Y"],"Destination":"rabbitmq://mq.example:5673/billing-vh/invoices%2Ddue?bind=true","Payload":{"a":1}},` +
		`"Headers":{"mt-quartz-sent":"old","x":[1,2]}}`
	it := opts.Parse(delivery([]byte(body)), time.Now())
	if it.Op != intake.OpReplace || it.Exchange != "invoices-due" || it.SagaID != fixtureToken ||
		!it.DueAt.Equal(time.Date(2026, 11, 24, 12, 45, 30, 5e8, time.UTC)) {
		t.Fatalf("got %+v", it)
	}
	want := `{"messageId":"a","destinationAddress":"rabbitmq://mq.example:5673/billing-vh/invoices%2Ddue?bind=true",` +
		`"messageType":["urn:message:X:Y"],"message":{"a":1},"headers":{"mt-quartz-sent":"2026-11-24T12:45:30.5+00:00","x":[1,2],` +
		`"MT-Quartz-Scheduled":"2026-11-24T12:45:30.5+00:00","MT-Scheduling-TokenId":"` + fixtureTokenN + `","MT-Quartz-ScheduleId":"` +
		fixtureTokenN + `","MT-Quartz-ScheduleGroup":"DEFAULT"}}`
	if string(it.Msg.Body) != want {
		t.Fatalf("envelope\n%s\nwant\n%s", it.Msg.Body, want)
	}
	body = strings.Replace(body, `,"Headers":{"mt-quartz-sent":"old","x":[1,2]}`, "", 1)
	it = opts.Parse(delivery([]byte(body)), time.Now())
	if it.Op != intake.OpReplace || !strings.Contains(string(it.Msg.Body), `"headers":{"MT-Quartz-Sent":`) {
		t.Fatalf("got %+v", it)
	}
}

// A CancelScheduledMessage cancels its token's group.
func TestParseCancel(t *testing.T) {
	it := opts.Parse(delivery(read(t, "cancel.json")), time.Now())
	if it.Op != intake.OpCancelSaga || it.SagaID != fixtureToken {
		t.Fatalf("got %+v", it)
	}
	if err := it.Validate(); err != nil {
		t.Fatal(err)
	}
}

// Bad input is refused with a reason.
func TestParseRefused(t *testing.T) {
	good := string(read(t, "schedule.json"))
	edit := func(old, new string) string {
		if !strings.Contains(good, old) {
			t.Fatalf("fixture has no %q", old)
		}
		return strings.Replace(good, old, new, 1)
	}
	for name, c := range map[string]struct {
		body, contentType, why string
	}{
		"content type":    {good, "application/json", "content type"},
		"not json":        {"<xml/>", ContentType, "not a MassTransit envelope"},
		"trailing text":   {good + "{}", ContentType, "not a MassTransit envelope"},
		"no type":         {edit(`"messageType": [`, `"messageTypes": [`), ContentType, "messageType is missing"},
		"message array":   {`{"messageType":["urn:message:MassTransit.Scheduling:ScheduleMessage"],"message":[]}`, ContentType, "message: not a JSON object"},
		"other type":      {edit("MassTransit.Scheduling:ScheduleMessage", "Billing.Contracts:InvoiceDue"), ContentType, "CancelScheduledMessage, ScheduleRecurringMessage"},
		"token":           {edit(fixtureToken, "not-a-guid"), ContentType, "correlationId \"not-a-guid\" is not a Guid"},
		"token missing":   {edit(`"correlationId": "`+fixtureToken+`",`, ""), ContentType, "correlationId is missing"},
		"time":            {edit("2026-11-24T12:45:30.1234567Z", "tomorrow"), ContentType, "scheduledTime"},
		"time number":     {edit(`"2026-11-24T12:45:30.1234567Z"`, "5"), ContentType, "scheduledTime is missing"},
		"payload type":    {edit(`"payloadType": [`, `"payloadTypes": [`), ContentType, "payloadType is missing"},
		"destination":     {edit(`"queue:billing"`, "null"), ContentType, "destination is missing"},
		"scheme":          {edit(`"queue:billing"`, `"sb://ns.servicebus.windows.net/billing"`), ContentType, "not a RabbitMQ one"},
		"own queue":       {edit(`"queue:billing"`, `"rabbitmq://localhost/quartz"`), ContentType, "would come back"},
		"contract":        {edit(`"queue:billing"`, `"exchange:MassTransit.Scheduling:ScheduleMessage"`), ContentType, "would come back"},
		"no name":         {edit(`"queue:billing"`, `"rabbitmq://localhost/"`), ContentType, "names no queue or exchange"},
		"payload":         {edit(`"payload": {`, `"payloads": {`), ContentType, "payload is missing"},
		"headers":         {edit(`"headers": {`, `"headers": [1], "x": {`), ContentType, "headers: not a JSON object"},
		"cancel token":    {strings.Replace(string(read(t, "cancel.json")), `"tokenId": "`, `"tokenId": "x`, 1), ContentType, "tokenId"},
		"control in name": {edit(`"queue:billing"`, `"queue:bill%01ing"`), ContentType, "control characters"},
	} {
		d := delivery([]byte(c.body))
		d.ContentType = c.contentType
		it := opts.Parse(d, time.Now())
		if it.Op != intake.OpReject || !strings.Contains(it.Reason, c.why) {
			t.Errorf("%s: op %d, reason %q; want a refusal mentioning %q", name, it.Op, it.Reason, c.why)
		}
	}
}

// Addresses as MassTransit's RabbitMQ transport resolves them.
func TestExchange(t *testing.T) {
	for a, want := range map[string]string{
		"queue:billing":                         "billing",
		"queue:billing?bind=true&durable=false": "billing",
		"exchange:Billing.Contracts:InvoiceDue": "Billing.Contracts:InvoiceDue",
		"rabbitmq://localhost/billing":          "billing",
		"rabbitmq://localhost/vh/billing":       "billing",
		"rabbitmqs://h:5671/vh/billing?x=1":     "billing",
		"amqp://h/billing":                      "billing",
		"RabbitMQ://h/%2F/billing":              "billing",
		"rabbitmq://h/a%20b":                    "a b",
	} {
		got, err := opts.Exchange(a)
		if err != nil || got != want {
			t.Errorf("%q: %q, %v; want %q", a, got, err, want)
		}
	}
}

// scheduledTime as System.Text.Json writes a DateTime of each kind.
func TestParseTime(t *testing.T) {
	for s, want := range map[string]time.Time{
		"2026-11-24T12:45:30.1234567Z":      fixtureDue,
		"2026-11-24T12:45:30Z":              time.Date(2026, 11, 24, 12, 45, 30, 0, time.UTC),
		"2026-11-24T13:45:30.1234567+01:00": fixtureDue,
		"2026-11-24T12:45:30.1234567":       fixtureDue,
		"2026-11-24T12:45:30.123456789Z":    time.Date(2026, 11, 24, 12, 45, 30, 123456700, time.UTC),
	} {
		got, err := ParseTime(s)
		if err != nil || !got.Equal(want) {
			t.Errorf("%q: %s, %v; want %s", s, got, err, want)
		}
	}
	for _, s := range []string{"", "2026-11-24", "2026-11-24 12:45:30Z", "2026-13-24T12:45:30Z"} {
		if _, err := ParseTime(s); err == nil {
			t.Errorf("%q was accepted", s)
		}
	}
}

// The queue is bound to its own exchange and to each contract's, all
// fanout without arguments; the queue has no arguments at all, as a
// MassTransit sender declares it (no x-queue-type: a quorum one would be
// refused to every sender).
func TestTopology(t *testing.T) {
	var got []string
	for _, f := range opts.Topology() {
		if f.Queue != "quartz" || f.ExchangeType != "fanout" || f.RoutingKey != "" || len(f.QueueArgs) != 0 || len(f.ExchangeArgs) != 0 {
			t.Fatalf("%+v", f)
		}
		got = append(got, f.Exchange)
	}
	want := []string{"quartz", ExchangeSchedule, ExchangeCancel, ExchangeRecurring, ExchangeCancelRecurring, ExchangePauseRecurring,
		ExchangeResumeRecurring}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatal(diff)
	}
	if srcs := opts.Sources(); len(srcs) != 1 || srcs[0].Queue != "quartz" || srcs[0].Name != "masstransit" {
		t.Fatalf("sources %+v", srcs)
	}
	if r, x := opts.Reserved(), opts.Routes(); !cmp.Equal(r, []string{"quartz"}) || x != nil {
		t.Fatalf("reserved %q, routes %q: the queue is no destination, and the allowed patterns decide on every exchange", r, x)
	}
	// Off: nothing of any; the stamper still stamps (TestStamp).
	off := Options{}
	if off.Sources() != nil || off.Topology() != nil || off.Reserved() != nil {
		t.Fatalf("an intake without a queue has sources %+v, topology %+v, reserved %q", off.Sources(), off.Topology(), off.Reserved())
	}
}

// Stamper sets MT-Quartz-Sent to the time of the send (JobDataMessageContext:
// the trigger's FireTimeUtc), in the envelope and the AMQP headers, leaves
// MT-Quartz-Scheduled at the scheduled time, and sets the AMQP expiration to
// what is left of expirationTime (ScheduledMessageJob), 1 s once it passed.
func TestStamp(t *testing.T) {
	body := strings.Replace(string(read(t, "schedule.json")), `"expirationTime": null`, `"expirationTime": "2026-11-24T12:46:00.1234567Z"`, 1)
	it := opts.Parse(delivery([]byte(body)), time.Now())
	if it.Op != intake.OpReplace {
		t.Fatalf("op %d, reason %q", it.Op, it.Reason)
	}
	late := fixtureDue.Add(1500 * time.Millisecond)
	m := Stamper{}.Stamp(it.Msg, "", late)
	want := strings.Replace(string(read(t, "scheduled.json")), `"MT-Quartz-Sent":"2026-11-24T12:45:30.1234567+00:00"`,
		`"MT-Quartz-Sent":"2026-11-24T12:45:31.6234567+00:00"`, 1)
	want = strings.Replace(want, `"expirationTime":null`, `"expirationTime":"2026-11-24T12:46:00.1234567Z"`, 1)
	if string(m.Body) != want {
		t.Fatalf("envelope:\n%s\nwant:\n%s", m.Body, want)
	}
	if got := m.Headers[HeaderSent]; got != time.Date(2026, 11, 24, 12, 45, 31, 0, time.UTC) {
		t.Fatalf("%s = %v", HeaderSent, got)
	}
	if got := m.Headers[HeaderScheduled]; got != time.Date(2026, 11, 24, 12, 45, 30, 0, time.UTC) {
		t.Fatalf("%s = %v", HeaderScheduled, got)
	}
	if _, ok := m.Headers[stampHeader]; ok || m.Expiration != "28500" {
		t.Fatalf("headers %v, expiration %q", m.Headers, m.Expiration)
	}
	if _, ok := it.Msg.Headers[stampHeader]; !ok {
		t.Fatal("Stamp changed the stored message's headers")
	}
	if m := (Stamper{}).Stamp(it.Msg, "", fixtureDue.Add(time.Hour)); m.Expiration != "1000" {
		t.Fatalf("expired: expiration %q", m.Expiration)
	}
	// Not this package's: untouched.
	other := amqp.Publishing{Headers: amqp.Table{HeaderSent: "x"}, Body: []byte("{}"), Expiration: "5"}
	if got := (Stamper{}).Stamp(other, "", late); got.Headers[HeaderSent] != "x" || got.Expiration != "5" {
		t.Fatalf("foreign message changed: %+v", got)
	}
}
