package integration

import (
	"fmt"
	"maps"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	amqp "github.com/rabbitmq/amqp091-go"
)

// MassTransit's message scheduler (docs/contract.md §2.10): endpoints
// configured with UseMessageScheduler(new Uri("queue:quartz")) send
// ScheduleMessage and CancelScheduledMessage to that queue, and with
// UsePublishMessageScheduler() publish them. No .NET runtime runs here, so
// the tests publish what MassTransit's RabbitMQ transport publishes, built as
// its source builds it (protocol/masstransit names the files).

const (
	mtContentType     = "application/vnd.masstransit+json"
	mtScheduleX       = "MassTransit.Scheduling:ScheduleMessage"
	mtCancelX         = "MassTransit.Scheduling:CancelScheduledMessage"
	mtScheduleURN     = "urn:message:" + mtScheduleX
	mtCancelURN       = "urn:message:" + mtCancelX
	mtRecurringURN    = "urn:message:MassTransit.Scheduling:ScheduleRecurringMessage"
	mtHost            = `{"machineName":"orders-1","processName":"Orders","processId":4711,"assembly":"Orders","assemblyVersion":"1.0.0.0","frameworkVersion":"8.0.11","massTransitVersion":"8.3.4.0","operatingSystemVersion":"Unix 6.8.0.49"}`
	mtSentTime        = "2026-11-24T12:40:30.1234567Z"
	mtConversationID  = "3c0b0000-5d3f-0015-6a2d-08dd0c8a9f6e"
	mtPayloadTypeJSON = `["urn:message:Billing.Contracts:InvoiceDue","urn:message:Billing.Contracts:IInvoiceEvent"]`
)

// stjTime formats t as System.Text.Json writes a UTC DateTime (Z) or a
// DateTimeOffset at +00:00: 100 ns digits, trailing zeros dropped.
func stjTime(t time.Time, zone string) string {
	return t.UTC().Format("2006-01-02T15:04:05.9999999") + zone
}

// mtEnvelope is a JsonMessageEnvelope as System.Text.Json writes it
// (camelCase, indented, nulls written) with message inside.
func mtEnvelope(msgID, urn, dest, message string) string {
	return `{
  "messageId": "` + msgID + `",
  "requestId": null,
  "correlationId": null,
  "conversationId": "` + mtConversationID + `",
  "initiatorId": null,
  "sourceAddress": "rabbitmq://localhost/orders",
  "destinationAddress": "` + dest + `",
  "responseAddress": null,
  "faultAddress": null,
  "messageType": [
    "` + urn + `"
  ],
  "message": ` + message + `,
  "expirationTime": null,
  "sentTime": "` + mtSentTime + `",
  "headers": {
    "Tenant": "eu-1"
  },
  "host": ` + mtHost + `
}`
}

// mtSchedule is the ScheduleMessage an endpoint "orders" sends for a
// payload due at due for destination, and the envelope and AMQP headers the
// destination must receive (ScheduleMessageConsumer, ScheduledMessageJob).
func mtSchedule(msgID, token, destination string, due time.Time, payload string) (sent amqp.Publishing, forwarded string, headers amqp.Table) {
	due = due.Truncate(100)
	message := `{
    "correlationId": "` + token + `",
    "scheduledTime": "` + stjTime(due, "Z") + `",
    "payloadType": ` + mtPayloadTypeJSON + `,
    "destination": "` + destination + `",
    "payload": ` + payload + `
  }`
	sent = amqp.Publishing{MessageId: msgID, ContentType: mtContentType, DeliveryMode: amqp.Persistent,
		Headers: amqp.Table{"Tenant": "eu-1"}, Body: []byte(mtEnvelope(msgID, mtScheduleURN, "rabbitmq://localhost/quartz", message))}
	n := strings.ReplaceAll(token, "-", "")
	at := stjTime(due, "+00:00")
	forwarded = `{"messageId":"` + msgID + `","requestId":null,"correlationId":null,"conversationId":"` + mtConversationID +
		`","initiatorId":null,"sourceAddress":"rabbitmq://localhost/orders","destinationAddress":"` + destination +
		`","responseAddress":null,"faultAddress":null,"messageType":` + mtPayloadTypeJSON + `,"message":` + payload +
		`,"expirationTime":null,"sentTime":"` + mtSentTime + `","headers":{"Tenant":"eu-1","MT-Quartz-Sent":"` + at +
		`","MT-Quartz-Scheduled":"` + at + `","MT-Scheduling-TokenId":"` + n + `","MT-Quartz-ScheduleId":"` + n +
		`","MT-Quartz-ScheduleGroup":"DEFAULT"},"host":` + mtHost + `}`
	ts := due.Truncate(time.Second)
	headers = amqp.Table{"Tenant": "eu-1", "MT-Quartz-Sent": ts, "MT-Quartz-Scheduled": ts, "MT-Scheduling-TokenId": n,
		"MT-Quartz-ScheduleId": n, "MT-Quartz-ScheduleGroup": "DEFAULT"}
	return sent, forwarded, headers
}

// mtCancel is the CancelScheduledMessage of token.
func mtCancel(msgID, token string) amqp.Publishing {
	message := `{
    "correlationId": "` + msgID + `",
    "timestamp": "` + mtSentTime + `",
    "tokenId": "` + token + `"
  }`
	return amqp.Publishing{MessageId: msgID, ContentType: mtContentType, DeliveryMode: amqp.Persistent,
		Body: []byte(mtEnvelope(msgID, mtCancelURN, "rabbitmq://localhost/quartz", message))}
}

// mtScheduled asserts that a is the scheduled payload: exactly the
// envelope and AMQP headers of forwarded and headers, the ScheduleMessage's
// properties, through exchange with an empty routing key, not before due.
func mtScheduled(t *testing.T, a arrival, sent amqp.Publishing, forwarded string, headers amqp.Table, due time.Time, exchange string) {
	t.Helper()
	id := sent.MessageId
	if a.At.Before(due) {
		t.Errorf("%s delivered %s early", id, due.Sub(a.At))
	}
	if a.Exchange != exchange || a.RoutingKey != "" {
		t.Errorf("%s came through exchange %q with key %q, want %q and none", id, a.Exchange, a.RoutingKey, exchange)
	}
	// MT-Quartz-Sent is the time of the send (the trigger's fire time),
	// between the due time and the arrival; the rest is exact.
	m := regexp.MustCompile(`"MT-Quartz-Sent":"([^"]*)"`).FindSubmatch(a.Body)
	if m == nil {
		t.Fatalf("%s: no MT-Quartz-Sent in %s", id, a.Body)
	}
	sentAt, err := time.Parse(time.RFC3339Nano, string(m[1]))
	if err != nil || sentAt.Before(due) || sentAt.After(a.At) {
		t.Errorf("%s: MT-Quartz-Sent %s (%v), want between %s and %s", id, m[1], err, due, a.At)
	}
	forwarded = strings.Replace(forwarded, `"MT-Quartz-Sent":"`+stjTime(due, "+00:00")+`"`, string(m[0]), 1)
	headers = maps.Clone(headers)
	headers["MT-Quartz-Sent"] = sentAt.UTC().Truncate(time.Second)
	if string(a.Body) != forwarded {
		t.Errorf("%s envelope:\n%s\nwant:\n%s", id, a.Body, forwarded)
	}
	if diff := cmp.Diff(headers, a.Headers); diff != "" {
		t.Errorf("%s AMQP headers (-want +got):\n%s", id, diff)
	}
	if a.MessageId != sent.MessageId || a.ContentType != sent.ContentType || a.DeliveryMode != sent.DeliveryMode || a.Expiration != "" {
		t.Errorf("%s properties: %+v", id, a.Delivery)
	}
}

// A bridge with DELAYBRIDGE_MASSTRANSIT_QUEUE takes ScheduleMessage sent
// to the queue and published to the contract's exchange, and at
// scheduledTime sends the payload to the exchange its destination names
// (queue:name and rabbitmq://host/name alike), never early, in exactly the
// envelope MassTransit's Quartz scheduler sends. A second ScheduleMessage
// with the same token replaces the first (a message sent twice is delivered
// once); CancelScheduledMessage cancels by token; a ScheduleRecurringMessage
// without a Guid token and bad input go to the error queue at once with a
// reason.
func TestMassTransitScheduler(t *testing.T) {
	t.Parallel()
	ep := uniqueEndpoint(t)
	q := ep + ".quartz"
	deleteQueuesOnCleanup(t, q)
	deleteExchangesOnCleanup(t, q)
	b, conn, pub := startWithPublisher(t, map[string]string{
		"DELAYBRIDGE_ENDPOINT": ep, "DELAYBRIDGE_MASSTRANSIT_QUEUE": q, "DELAYBRIDGE_POLL_INTERVAL": "100ms",
	})
	errs := consume(t, conn, b.ErrorQ)

	// The destination, as a MassTransit receive endpoint declares it: a
	// fanout exchange of the queue's name bound to the queue.
	billing := ep + ".billing"
	deleteExchangesOnCleanup(t, billing)
	declareExchange(t, conn, billing, amqp.ExchangeFanout)
	billingC := bindAndConsume(t, conn, billing, billing, "", nil)

	start := time.Now()
	token := func(i int) string { return fmt.Sprintf("9f1c2a7e-4b3d-4e8f-a1c2-%012d", i) }
	msgID := func(i int) string { return fmt.Sprintf("3c0b0000-5d3f-0015-2b1e-%012d", i) }
	sendDue, pubDue, replDue := start.Add(2*time.Second), start.Add(2200*time.Millisecond), start.Add(2400*time.Millisecond)
	sendMsg, sendFwd, sendH := mtSchedule(msgID(1), token(1), "queue:"+billing, sendDue, `{"invoiceId":1}`)
	pubMsg, pubFwd, pubH := mtSchedule(msgID(2), token(2), "rabbitmq://localhost/"+billing, pubDue, `{"invoiceId":2,"customer":"Ünïcode & Co"}`)
	replaced, _, _ := mtSchedule(msgID(3), token(3), "queue:"+billing, start.Add(time.Hour), `{"invoiceId":3}`)
	replMsg, replFwd, replH := mtSchedule(msgID(4), token(3), "queue:"+billing, replDue, `{"invoiceId":4}`)
	cancelled, _, _ := mtSchedule(msgID(5), token(5), "queue:"+billing, start.Add(2500*time.Millisecond), `{"invoiceId":5}`)

	// UseMessageScheduler(new Uri("queue:quartz")): sent through the
	// queue's exchange; the first one twice.
	pub.PublishTo(q, "", sendMsg, sendMsg, replaced, replMsg, cancelled)
	// UsePublishMessageScheduler(): published to the contracts' exchanges.
	pub.PublishTo(mtScheduleX, "", pubMsg)
	pub.PublishTo(mtCancelX, "", mtCancel(msgID(6), token(5)))

	// Refused at once.
	recurring := mtCancel("bad-recurring", token(7))
	recurring.Body = []byte(strings.Replace(string(recurring.Body), mtCancelURN, mtRecurringURN, 1))
	badType, _, _ := mtSchedule("bad-content-type", token(8), "queue:"+billing, sendDue, `{}`)
	badType.ContentType = "application/json"
	badToken, _, _ := mtSchedule("bad-token", "not-a-guid", "queue:"+billing, sendDue, `{}`)
	loop, _, _ := mtSchedule("bad-loop", token(9), "queue:"+q, sendDue, `{}`)
	pub.PublishTo(q, "", recurring, badType, badToken, loop)

	got := billingC.WaitFor(3, livenessBound)
	byID := map[string]arrival{}
	for _, a := range got {
		byID[a.MessageId] = a
	}
	mtScheduled(t, byID[sendMsg.MessageId], sendMsg, sendFwd, sendH, sendDue.Truncate(100), billing)
	mtScheduled(t, byID[pubMsg.MessageId], pubMsg, pubFwd, pubH, pubDue.Truncate(100), billing)
	mtScheduled(t, byID[replMsg.MessageId], replMsg, replFwd, replH, replDue.Truncate(100), billing)

	copies := errs.WaitFor(4, livenessBound)
	errByID := refusedAtIngest(t, copies, q, start, map[string]string{
		"bad-recurring":    "ScheduleRecurringMessage: correlationId",
		"bad-content-type": "content type",
		"bad-token":        "is not a Guid",
		"bad-loop":         "would come back",
	})
	for id, c := range errByID {
		if strings.HasPrefix(id, "bad-") && !strings.Contains(string(c.Body), `"messageId": "`+id+`"`) {
			t.Errorf("%s: the error copy lost the message: %q", id, c.Body)
		}
	}

	if n := len(billingC.Quiet(quietPeriod)); n != 3 {
		t.Errorf("%d deliveries to %s, want 3 (one per token: none of the replaced or cancelled ones, no duplicates)", n, billing)
	}
	if n := len(errs.All()); n != 4 {
		t.Errorf("%d copies on the error queue, want 4", n)
	}
	waitQueueEmpty(t, conn, q, livenessBound)
	if !b.Running() {
		t.Fatalf("bridge exited with code %d", b.Wait(0))
	}
}
