package integration

import (
	"encoding/json"
	"maps"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/wire"
)

// NServiceBus's timeout manager protocol (docs/contract.md §2.2, §2.3, §2.5):
// no .NET runtime runs here, so the tests publish what an NServiceBus 5
// endpoint on the RabbitMQ transport 3.x sends to an external timeout
// manager, built as their source builds it: TimeoutManagerDeferrer.Defer
// and ClearDeferredMessages (Particular/NServiceBus 5.2.0,
// src/NServiceBus.Core/Timeout/Core/TimeoutManagerDeferrer.cs), the wire
// time of DateTimeExtensions.ToWireFormattedString, and the properties of
// RabbitMqTransportMessageExtensions.FillRabbitMqProperties
// (Particular/NServiceBus.RabbitMQ 3.5.2).

// nsbWireTime is DateTimeExtensions.ToWireFormattedString.
func nsbWireTime(t time.Time) string {
	return t.UTC().Format("2006-01-02 15:04:05") + ":" + t.UTC().Format(".000000")[1:] + " Z"
}

// nsbSagaTimeout is a saga's RequestTimeout as it reaches the timeout
// manager: every header a string, the properties derived from them.
// routeTo "" leaves out RouteExpiredTimeoutTo (a 3.x/4.x saga timeout, which
// goes back to its reply-to address); replyTo is both the
// NServiceBus.ReplyToAddress header and the reply-to property.
func nsbSagaTimeout(id, saga, routeTo, replyTo string, due time.Time) (amqp.Publishing, time.Time) {
	due = due.Truncate(time.Microsecond)
	h := amqp.Table{
		"NServiceBus.MessageId":            id,
		"NServiceBus.CorrelationId":        id,
		"NServiceBus.MessageIntent":        "Send",
		"NServiceBus.Version":              "5.2.0",
		"NServiceBus.TimeSent":             nsbWireTime(time.Now()),
		"NServiceBus.ContentType":          "text/xml",
		"NServiceBus.EnclosedMessageTypes": "Shop.OrderTimeout, Shop, Version=1.0.0.0, Culture=neutral, PublicKeyToken=null",
		"NServiceBus.ConversationId":       "0d1f2e3c-4b5a-6978-8a9b-0c1d2e3f4a5b",
		"NServiceBus.OriginatingEndpoint":  "Shop",
		"NServiceBus.OriginatingMachine":   "SHOP01",
		"NServiceBus.SagaId":               saga,
		"NServiceBus.OriginatingSagaId":    saga,
		"NServiceBus.OriginatingSagaType":  "Shop.OrderSaga, Shop, Version=1.0.0.0, Culture=neutral, PublicKeyToken=null",
		"NServiceBus.IsSagaTimeoutMessage": "True",
		"NServiceBus.ReplyToAddress":       replyTo,
		"NServiceBus.Timeout.Expire":       nsbWireTime(due),
		"$.diagnostics.originating.hostid": "4d7f0c2b9a1e4f3c8b6d5a7e9c0f1b2d",
		"NServiceBus.RelatedTo":            "a7c9e1f3-5b2d-4c6e-8f0a-1b3d5e7f9a2c",
	}
	if routeTo != "" {
		h["NServiceBus.Timeout.RouteExpiredTimeoutTo"] = routeTo
	}
	return amqp.Publishing{
		MessageId: id, CorrelationId: id, DeliveryMode: amqp.Persistent,
		Type: "Shop.OrderTimeout", ContentType: "text/xml", ReplyTo: replyTo,
		Body:    []byte(`<?xml version="1.0"?><OrderTimeout xmlns="http://tempuri.net/Shop"><OrderId>` + id + `</OrderId></OrderTimeout>`),
		Headers: h,
	}, due
}

// nsbClearTimeouts is ClearDeferredMessages(Headers.SagaId, saga): a
// control message with no body.
func nsbClearTimeouts(id, saga, replyTo string) amqp.Publishing {
	return amqp.Publishing{
		MessageId: id, CorrelationId: id, DeliveryMode: amqp.Persistent, ContentType: "application/octet-stream", ReplyTo: replyTo,
		Headers: amqp.Table{
			"NServiceBus.MessageId":      id,
			"NServiceBus.CorrelationId":  id,
			"NServiceBus.ControlMessage": "True",
			"NServiceBus.MessageIntent":  "Send",
			"NServiceBus.Version":        "5.2.0",
			"NServiceBus.TimeSent":       nsbWireTime(time.Now()),
			"NServiceBus.ReplyToAddress": replyTo,
			"NServiceBus.SagaId":         saga,
			"NServiceBus.ClearTimeouts":  "True",
		},
	}
}

// TestNServiceBusTimeoutManager: saga timeouts are delivered when due, with
// every property, the body and every header as sent but
// NServiceBus.Timeout.Expire, to RouteExpiredTimeoutTo, or without it to the
// reply-to address (the header, else the property); a ClearTimeouts cancels
// every pending timeout of its saga and of no other; the admin API and CLI
// cancel a saga's timeouts by saga id; culture-dependent Expire text of the
// 3.0 betas and a ClearTimeouts without a saga land on the error queue.
func TestNServiceBusTimeoutManager(t *testing.T) {
	t.Parallel()
	b, conn, pub := startWithPublisher(t, map[string]string{"DELAYBRIDGE_ADMIN_TOKEN": adminToken, "DELAYBRIDGE_POLL_INTERVAL": "100ms"})
	shop, replies := b.Endpoint+".Shop", b.Endpoint+".ShopReplies"
	shopC := declareAndConsume(t, conn, shop)
	repliesC := declareAndConsume(t, conn, replies)
	errs := declareAndConsume(t, conn, b.ErrorQ)

	const kept, cleared, other = "1a2b3c4d-0000-4e5f-8a9b-000000000001", "1a2b3c4d-0000-4e5f-8a9b-000000000002", "1a2b3c4d-0000-4e5f-8a9b-000000000003"
	start := time.Now()
	routed, routedDue := nsbSagaTimeout("t-routed", kept, shop, replies, start.Add(2*time.Second))
	// No RouteExpiredTimeoutTo: back to the reply-to address.
	replied, repliedDue := nsbSagaTimeout("t-replied", kept, "", replies, start.Add(2200*time.Millisecond))
	// Reply-to as the property only (the transport of NServiceBus 3 and 4).
	propOnly, propOnlyDue := nsbSagaTimeout("t-property", kept, "", replies, start.Add(2400*time.Millisecond))
	delete(propOnly.Headers, "NServiceBus.ReplyToAddress")
	gone1, gone1Due := nsbSagaTimeout("t-cleared-1", cleared, shop, shop, start.Add(2*time.Second))
	gone2, _ := nsbSagaTimeout("t-cleared-2", cleared, "", replies, start.Add(time.Hour))
	adm1, _ := nsbSagaTimeout("t-admin-1", other, shop, shop, start.Add(time.Hour))
	adm2, _ := nsbSagaTimeout("t-admin-2", other, shop, shop, start.Add(time.Hour))
	pub.PublishAll(b.TimeoutsQueue(), []amqp.Publishing{routed, replied, propOnly, gone1, gone2, adm1, adm2,
		nsbClearTimeouts("c-1", cleared, shop)})

	// Refused at once: culture text of the 3.0 betas, a clear without saga.
	beta, _ := nsbSagaTimeout("t-beta", kept, shop, shop, start)
	beta.Headers["NServiceBus.Timeout.Expire"] = "1/5/2012 1:14:15 PM"
	noSaga := nsbClearTimeouts("c-nosaga", "", shop)
	delete(noSaga.Headers, "NServiceBus.SagaId")
	pub.PublishAll(b.TimeoutsQueue(), []amqp.Publishing{beta, noSaga})

	// Once the admin timeouts are stored and the ClearTimeouts after them
	// applied, the CLI cancels saga "other" through the admin API.
	deadline := time.Now().Add(livenessBound)
	for {
		ids := listIDs(t, b)
		_, a1 := ids["t-admin-1"]
		_, a2 := ids["t-admin-2"]
		_, c1 := ids["t-cleared-1"]
		_, c2 := ids["t-cleared-2"]
		if a1 && a2 && !c1 && !c2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("want t-admin-1 and -2 pending and the cleared saga's timeouts gone, have %v", ids)
		}
		time.Sleep(100 * time.Millisecond)
	}
	out := mustCLI(t, b, "cancel", "--saga-id", other, "--json")
	var res struct{ Cancelled, Leased int }
	if err := json.Unmarshal([]byte(out), &res); err != nil || res.Cancelled != 2 || res.Leased != 0 {
		t.Fatalf("cancel --saga-id: %s (%v), want 2 cancelled", out, err)
	}
	for _, id := range []string{"t-admin-1", "t-admin-2"} {
		if _, ok := listIDs(t, b)[id]; ok {
			t.Errorf("%s is still pending after delaybridge cancel --saga-id", id)
		}
	}

	got := shopC.WaitFor(1, livenessBound)
	nsbForwardedAs(t, got[0], routed, routedDue, shop)
	rep := repliesC.WaitFor(2, livenessBound)
	byID := map[string]arrival{}
	for _, a := range rep {
		byID[a.MessageId] = a
	}
	nsbForwardedAs(t, byID["t-replied"], replied, repliedDue, replies)
	nsbForwardedAs(t, byID["t-property"], propOnly, propOnlyDue, replies)

	bad := errs.WaitFor(2, livenessBound)
	reasons := map[string]string{}
	for _, a := range bad {
		r, _ := a.Headers["x-delaybridge-error"].(string)
		reasons[a.MessageId] = r
	}
	if !strings.Contains(reasons["t-beta"], "culture-dependent") || !strings.Contains(reasons["c-nosaga"], "NServiceBus.SagaId") {
		t.Fatalf("error queue reasons %q", reasons)
	}

	// Past the cleared timeout's due time, nothing more arrives.
	time.Sleep(time.Until(gone1Due.Add(1500 * time.Millisecond)))
	if n, m := shopC.Count(), repliesC.Count(); n != 1 || m != 2 {
		t.Fatalf("%d on %s and %d on %s, want 1 and 2: a cleared timeout was delivered", n, shop, m, replies)
	}
}

// nsbForwardedAs asserts that a is msg as its destination receives it, not
// before due, and as NServiceBus's timeout manager dispatches a timeout
// (DispatchTimeoutBehavior in Particular/NServiceBus 7.x, TimeoutData
// .ToTransportMessage in 5.x): through the default exchange to queue, the
// body and every property as sent, every header as sent but
// NServiceBus.Timeout.Expire, except NServiceBus.TimeSent, the time of the
// forward (from the due time to the arrival, in the wire format), and
// NServiceBus.RelatedToTimeoutId, the id the timeout was stored under (its
// message id).
func nsbForwardedAs(t *testing.T, a arrival, msg amqp.Publishing, due time.Time, queue string) {
	t.Helper()
	if a.MessageId != msg.MessageId {
		t.Fatalf("no delivery of %s (got %q)", msg.MessageId, a.MessageId)
	}
	sent, _ := a.Headers["NServiceBus.TimeSent"].(string)
	at, err := wire.ParseNSBTime(sent)
	if err != nil || at.Before(due.Truncate(time.Microsecond)) || at.After(a.At) {
		t.Errorf("%s: NServiceBus.TimeSent %q (%v), want the time of the forward, from %v to %v", msg.MessageId, sent, err, due, a.At)
	}
	if id := a.Headers["NServiceBus.RelatedToTimeoutId"]; id != msg.MessageId {
		t.Errorf("%s: NServiceBus.RelatedToTimeoutId %#v, want the id it was stored under", msg.MessageId, id)
	}
	if _, ok := a.Headers["x-delaybridge-nsb-timeout"]; ok {
		t.Errorf("%s: the bridge's mark reached the destination", msg.MessageId)
	}
	want := msg
	want.Headers = maps.Clone(msg.Headers)
	a.Headers = maps.Clone(a.Headers)
	for _, h := range []string{"NServiceBus.TimeSent", "NServiceBus.RelatedToTimeoutId"} {
		delete(want.Headers, h)
		delete(a.Headers, h)
	}
	forwardedWithout(t, a, want, due, "", queue, "NServiceBus.Timeout.Expire")
}

// TestNServiceBusConventionalRoutingTopology: an NServiceBus endpoint on the
// RabbitMQ transport's default, conventional routing topology sends to an
// address by publishing, mandatory, to the exchange of the address's name
// with an empty routing key (ConventionalRoutingTopology.Send in
// Particular/NServiceBus.RabbitMQ, src/NServiceBus.Transport.RabbitMQ/Routing/,
// and src/NServiceBus.RabbitMQ/Routing/ in the 3.x transport of NServiceBus
// 5). The bridge's E.Timeouts exchange takes a saga's timeout that way, and
// its ClearTimeouts: neither is returned nor closes the channel, the
// timeout arrives when due, and the cleared saga's timeout never does.
func TestNServiceBusConventionalRoutingTopology(t *testing.T) {
	t.Parallel()
	b, conn, pub := startWithPublisher(t, map[string]string{"DELAYBRIDGE_POLL_INTERVAL": "100ms"})
	shop := b.Endpoint + ".Shop"
	shopC := declareAndConsume(t, conn, shop)
	const kept, cleared = "5e6f7a8b-0000-4c1d-9e2f-000000000001", "5e6f7a8b-0000-4c1d-9e2f-000000000002"
	start := time.Now()
	timeout, due := nsbSagaTimeout("conv-kept", kept, shop, shop, start.Add(2*time.Second))
	gone, goneDue := nsbSagaTimeout("conv-cleared", cleared, shop, shop, start.Add(2*time.Second))
	// Publishing to a missing exchange would close the channel: PublishTo
	// fails then, and on a return.
	pub.PublishTo(b.TimeoutsQueue(), "", timeout, gone, nsbClearTimeouts("conv-clear", cleared, shop))

	got := shopC.WaitFor(1, livenessBound)
	nsbForwardedAs(t, got[0], timeout, due, shop)
	time.Sleep(time.Until(goneDue.Add(1500 * time.Millisecond)))
	if n := shopC.Count(); n != 1 {
		t.Fatalf("%d deliveries on %s, want 1: the cleared saga's timeout was delivered", n, shop)
	}
}
