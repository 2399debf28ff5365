package integration

import (
	"encoding/json"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	amqp "github.com/rabbitmq/amqp091-go"
)

// Rebus's external timeout manager (docs/contract.md §2.8): Rebus endpoints
// configured with UseExternalTimeoutManager(queue) send the messages they
// defer to that queue; the bridge delivers each to its recipient when due.
// No .NET runtime runs here, so the tests publish what Rebus.RabbitMq
// publishes, built as its source builds it (protocol/rebus names the files).

// dotnetO formats t as .NET's DateTimeOffset.ToString("O") does: the clock
// time at t's offset, 7 fraction digits, the offset in numbers even at zero
// (dotnet/runtime DateTimeFormat.TryFormatO; Rebus writes rbs2-deferred-until
// and rbs2-senttime with it).
func dotnetO(t time.Time) string { return t.Format("2006-01-02T15:04:05.0000000-07:00") }

// cet is the offset of the sending host in these tests (DateTimeOffset.Now).
var cet = time.FixedZone("", 3600)

// rebusDeferred is what a Rebus 8 endpoint "orders" publishes when it
// defers a message to recipient until due (bus.Defer, or
// TransportMessage.Defer with count > 1): every header as the UTF-8 text of
// its value, which RabbitMQ.Client writes as an AMQP long string, the same
// type amqp091-go writes a Go string as; the properties derived from the
// headers (RabbitMqTransport.CreateBasicProperties). due is truncated to
// the 100 ns .NET keeps.
func rebusDeferred(msgID, recipient string, due time.Time, count string) (amqp.Publishing, time.Time) {
	due = due.Truncate(100)
	return amqp.Publishing{
		MessageId: msgID, ContentType: "application/json", ContentEncoding: "utf-8", DeliveryMode: amqp.Persistent,
		Body: []byte(`{"InvoiceId":"` + msgID + `"}`),
		Headers: amqp.Table{
			"rbs2-msg-id":          msgID,
			"rbs2-intent":          "p2p",
			"rbs2-return-address":  "orders",
			"rbs2-sender-address":  "orders",
			"rbs2-senttime":        dotnetO(time.Now().In(cet)),
			"rbs2-msg-type":        "Billing.Messages.InvoiceDue, Billing.Messages",
			"rbs2-corr-id":         msgID,
			"rbs2-corr-seq":        "0",
			"rbs2-content-type":    "application/json;charset=utf-8",
			"rbs2-deferred-until":  dotnetO(due.In(cet)),
			"rbs2-defer-recipient": recipient,
			"rbs2-defer-count":     count,
		},
	}, due
}

// rebusSend publishes msg as a Rebus.RabbitMq sender sends to the timeout
// manager: it checks the queue and the exchange exist (passively) and binds
// the queue, then publishes to the direct exchange with the queue's name as
// routing key (CheckQueueExistence, GetPublishInfo).
func rebusSend(t *testing.T, conn *amqp.Connection, pub *publisher, directX, queue string, msgs ...amqp.Publishing) {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if _, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil); err != nil {
		t.Fatalf("the timeout manager queue %q does not exist: %v", queue, err)
	}
	if err := ch.ExchangeDeclarePassive(directX, amqp.ExchangeDirect, true, false, false, false, nil); err != nil {
		t.Fatalf("the direct exchange %q does not exist: %v", directX, err)
	}
	if err := ch.QueueBind(queue, queue, directX, false, nil); err != nil {
		t.Fatal(err)
	}
	pub.PublishTo(directX, queue, msgs...)
}

// forwardedAs asserts that a is msg as the recipient must receive it,
// through exchange with key: the body and every property as sent, every
// header as sent (same value, same AMQP type) except rbs2-deferred-until,
// and not before due.
func forwardedAs(t *testing.T, a arrival, msg amqp.Publishing, due time.Time, exchange, key string) {
	t.Helper()
	forwardedWithout(t, a, msg, due, exchange, key, "rbs2-deferred-until")
}

// forwardedWithout asserts that a is msg, through exchange with key and
// not before due, with the body, every property and every header as sent
// but dropped.
func forwardedWithout(t *testing.T, a arrival, msg amqp.Publishing, due time.Time, exchange, key, dropped string) {
	t.Helper()
	id := msg.MessageId
	if a.At.Before(due) {
		t.Errorf("%s delivered %s early", id, due.Sub(a.At))
	}
	if a.Exchange != exchange || a.RoutingKey != key {
		t.Errorf("%s came through exchange %q with key %q, want %q %q", id, a.Exchange, a.RoutingKey, exchange, key)
	}
	want := maps.Clone(msg.Headers)
	delete(want, dropped)
	if diff := cmp.Diff(want, a.Headers); diff != "" {
		t.Errorf("%s headers (-sent +received):\n%s", id, diff)
	}
	got := amqp.Publishing{MessageId: a.MessageId, ContentType: a.ContentType, ContentEncoding: a.ContentEncoding,
		DeliveryMode: a.DeliveryMode, Body: a.Body, Priority: a.Priority, CorrelationId: a.CorrelationId, ReplyTo: a.ReplyTo,
		Expiration: a.Expiration, Timestamp: a.Timestamp, Type: a.Type, UserId: a.UserId, AppId: a.AppId}
	sent := msg
	sent.Headers = nil
	if diff := cmp.Diff(sent, got); diff != "" {
		t.Errorf("%s properties or body (-sent +received):\n%s", id, diff)
	}
}

// A bridge with DELAYBRIDGE_REBUS_QUEUE creates the timeout manager queue
// (quorum, as DELAYBRIDGE_QUEUE_TYPE says) so that Rebus senders' checks
// pass, and delivers what they defer: to a plain recipient through the
// direct exchange with its name as routing key, to key@exchange through
// that exchange with that key, never early, with exactly the bytes sent
// less rbs2-deferred-until, headers sent as byte arrays too. A message sent
// twice is delivered once; the same message deferred again is delivered
// again. A pending one cancels by its id; an unroutable recipient ends on
// the error queue after the retries, and so, at once, does what is not a
// deferred message Rebus could deliver.
func TestRebusExternalTimeoutManager(t *testing.T) {
	t.Parallel()
	ep := uniqueEndpoint(t)
	tm, directX, topicX := ep+".timeouts", ep+".RebusDirect", ep+".BillingTopics"
	deleteQueuesOnCleanup(t, tm)
	deleteExchangesOnCleanup(t, directX)
	b, conn, pub := startWithPublisher(t, map[string]string{
		"DELAYBRIDGE_ENDPOINT": ep, "DELAYBRIDGE_REBUS_QUEUE": tm, "DELAYBRIDGE_REBUS_DIRECT_EXCHANGE": directX,
		"DELAYBRIDGE_QUEUE_TYPE": "quorum", "DELAYBRIDGE_NUMBER_OF_RETRIES": "1", "DELAYBRIDGE_POLL_INTERVAL": "100ms",
		"DELAYBRIDGE_ADMIN_TOKEN": adminToken,
	})
	errs := consume(t, conn, b.ErrorQ)

	// The recipients: an endpoint's input queue, bound as Rebus binds it,
	// and a queue behind a topic exchange of the application's.
	billing := ep + ".billing"
	billingC := bindAndConsume(t, conn, billing, directX, billing, nil)
	declareExchange(t, conn, topicX, amqp.ExchangeTopic)
	invoices := ep + ".invoices"
	invoicesC := bindAndConsume(t, conn, invoices, topicX, "invoices.#", nil)

	start := time.Now()
	plain, plainDue := rebusDeferred("6f2c1b9e-0d4a-4c57-9a51-3f0e8b2d7c41", billing, start.Add(2*time.Second), "1")
	routed, routedDue := rebusDeferred("0b7d9a52-3c1e-4f6b-8d2a-95e4c1f07a13", "invoices.due@"+topicX, start.Add(2200*time.Millisecond), "1")
	bytesMsg, bytesDue := rebusDeferred("c4e81f3a-7b29-4d05-a6c8-2f91d3b5e760", billing, start.Add(2400*time.Millisecond), "1")
	for k, v := range bytesMsg.Headers {
		bytesMsg.Headers[k] = []byte(v.(string)) // byte arrays ('x')
	}
	// The same message deferred again while the first deferral is pending
	// (TransportMessage.Defer: same rbs2-msg-id, a later due time, count 2).
	again, againDue := rebusDeferred(plain.MessageId, billing, start.Add(2600*time.Millisecond), "2")
	cancelled, _ := rebusDeferred("9a0e6c1d-52f7-4b38-b1e4-7d3c08a2f659", billing, start.Add(time.Hour), "1")
	unroutable, unroutableDue := rebusDeferred("5d3b2e8f-a1c4-4e97-8b06-c2f7e9d41a35", ep+".nobody", start.Add(2*time.Second), "1")
	rebusSend(t, conn, pub, directX, tm, plain, plain, routed, bytesMsg, again, cancelled, unroutable)

	// Not deferred messages Rebus could deliver: at once to the error queue.
	bad := func(id string, edit func(amqp.Table)) amqp.Publishing {
		m, _ := rebusDeferred(id, billing, start.Add(2*time.Second), "1")
		edit(m.Headers)
		return m
	}
	rebusSend(t, conn, pub, directX, tm,
		bad("bad-no-due", func(h amqp.Table) { delete(h, "rbs2-deferred-until") }),
		bad("bad-time", func(h amqp.Table) { h["rbs2-deferred-until"] = start.UTC().Format(time.RFC3339Nano) }),
		bad("bad-no-recipient", func(h amqp.Table) { delete(h, "rbs2-defer-recipient") }),
		bad("bad-loop", func(h amqp.Table) { h["rbs2-defer-recipient"] = tm }),
	)

	// The pending one shows in ls under its id, and cancels by it.
	cancelID := cancelled.MessageId + "/" + billing + "/" + cancelled.Headers["rbs2-deferred-until"].(string)
	// ls filtered to the recipient names exactly the rows for it.
	deadline := time.Now().Add(livenessBound)
	for {
		var page struct {
			Timeouts []struct {
				ID       string `json:"id"`
				Exchange string `json:"exchange"`
				Key      string `json:"routing_key"`
			}
		}
		out := mustCLI(t, b, "ls", "--json", "--all", "--exchange", directX, "--routing-key", billing)
		if err := json.Unmarshal([]byte(out), &page); err != nil {
			t.Fatalf("ls --json: %v: %s", err, out)
		}
		found := false
		for _, r := range page.Timeouts {
			if r.Exchange != directX || r.Key != billing {
				t.Fatalf("ls --exchange %s --routing-key %s lists %+v", directX, billing, r)
			}
			found = found || r.ID == cancelID
		}
		if found {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%q never showed in ls: %s", cancelID, out)
		}
		time.Sleep(100 * time.Millisecond)
	}
	mustCLI(t, b, "cancel", cancelID)

	got := billingC.WaitFor(3, livenessBound)
	byID := map[string][]arrival{}
	for _, a := range got {
		byID[a.MessageId] = append(byID[a.MessageId], a)
	}
	if n := len(byID[plain.MessageId]); n != 2 {
		t.Fatalf("%d deliveries of %s, want 2: the first deferral (sent twice) and the second", n, plain.MessageId)
	}
	forwardedAs(t, byID[plain.MessageId][0], plain, plainDue, directX, billing)
	forwardedAs(t, byID[plain.MessageId][1], again, againDue, directX, billing)
	forwardedAs(t, byID[bytesMsg.MessageId][0], bytesMsg, bytesDue, directX, billing)
	forwardedAs(t, invoicesC.WaitFor(1, livenessBound)[0], routed, routedDue, topicX, "invoices.due")

	copies := errs.WaitFor(5, livenessBound+5*time.Second)
	errByID := refusedAtIngest(t, copies, tm, start, map[string]string{
		"bad-no-due":       "no header rbs2-deferred-until",
		"bad-time":         "is not a .NET round-trip time",
		"bad-no-recipient": "no header rbs2-defer-recipient",
		"bad-loop":         "the timeout manager queue itself",
	})
	for _, id := range []string{"bad-no-due", "bad-time", "bad-no-recipient", "bad-loop"} {
		c, ok := errByID[id]
		if !ok {
			continue
		}
		if c.Headers["rbs2-msg-id"] != id || !strings.HasPrefix(string(c.Body), `{"InvoiceId"`) {
			t.Errorf("%s: the error copy lost the message: %v %q", id, c.Headers, c.Body)
		}
	}
	if c, ok := errByID[unroutable.MessageId]; !ok {
		t.Errorf("the unroutable one is not on the error queue")
	} else {
		checkErrorHeaders(t, c.Headers, "dispatch", 2, b.TimeoutsQueue(), []string{"NO_ROUTE"}, unroutableDue)
		if headerString(c.Headers, "x-delaybridge-exchange") != directX || headerString(c.Headers, "x-delaybridge-routing-key") != ep+".nobody" {
			t.Errorf("the unroutable one's copy names %v %v", c.Headers["x-delaybridge-exchange"], c.Headers["x-delaybridge-routing-key"])
		}
	}

	if n := len(billingC.Quiet(quietPeriod)); n != 3 {
		t.Errorf("%d deliveries to %s, want 3 (none of the cancelled one, no duplicates)", n, billing)
	}
	if n := len(errs.All()); n != 5 {
		t.Errorf("%d copies on the error queue, want 5", n)
	}
	if n := len(invoicesC.All()); n != 1 {
		t.Errorf("%d deliveries to %s, want 1", n, invoices)
	}
	waitQueueEmpty(t, conn, tm, livenessBound)
	if !b.Running() {
		t.Fatalf("bridge exited with code %d", b.Wait(0))
	}
}

// When a Rebus endpoint declared the timeout manager queue and the direct
// exchange first, with its own arguments (a classic queue with
// x-ha-policy, an exchange with an alternate exchange), a bridge whose
// DELAYBRIDGE_QUEUE_TYPE is quorum starts, consumes the queue as it is and
// delivers; the endpoint's own declarations keep working.
func TestRebusQueueDeclaredByRebus(t *testing.T) {
	t.Parallel()
	ep := uniqueEndpoint(t)
	tm, directX := ep+".timeouts", ep+".RebusDirect"
	deleteQueuesOnCleanup(t, tm)
	deleteExchangesOnCleanup(t, directX)
	conn := dial(t)
	rebusDeclares := func() error {
		ch, err := conn.Channel()
		if err != nil {
			return err
		}
		defer ch.Close()
		// RabbitMqTransport.DeclareExchanges and DeclareQueue, with
		// RabbitMqQueueOptionsBuilder's default arguments.
		if err := ch.ExchangeDeclare(directX, amqp.ExchangeDirect, true, false, false, false, amqp.Table{"alternate-exchange": ep + ".unrouted"}); err != nil {
			return err
		}
		if _, err := ch.QueueDeclare(tm, true, false, false, false, amqp.Table{"x-ha-policy": "all"}); err != nil {
			return err
		}
		return ch.QueueBind(tm, tm, directX, false, nil)
	}
	if err := rebusDeclares(); err != nil {
		t.Fatal(err)
	}
	b := startBridge(t, map[string]string{
		"DELAYBRIDGE_ENDPOINT": ep, "DELAYBRIDGE_REBUS_QUEUE": tm, "DELAYBRIDGE_REBUS_DIRECT_EXCHANGE": directX,
		"DELAYBRIDGE_QUEUE_TYPE": "quorum", "DELAYBRIDGE_POLL_INTERVAL": "100ms",
	})
	pub := newPublisher(t, conn)
	billing := ep + ".billing"
	billingC := bindAndConsume(t, conn, billing, directX, billing, nil)
	msg, due := rebusDeferred("e2a4c6f8-1b3d-4e5f-8a9b-0c1d2e3f4a5b", billing, time.Now().Add(1500*time.Millisecond), "1")
	rebusSend(t, conn, pub, directX, tm, msg)
	forwardedAs(t, billingC.WaitFor(1, livenessBound)[0], msg, due, directX, billing)
	if err := rebusDeclares(); err != nil {
		t.Errorf("the endpoint's declarations fail after the bridge started: %v", err)
	}
	if !b.Running() {
		t.Fatalf("bridge exited with code %d", b.Wait(0))
	}
}

// A timeout manager queue the broker refuses to let the bridge use
// (another connection's exclusive queue) stops the bridge at start with
// exit 1 and a line naming the queue.
func TestRebusQueueRefusedAtStart(t *testing.T) {
	t.Parallel()
	env := bridgeEnv(t, nil)
	ep := env["DELAYBRIDGE_ENDPOINT"]
	tm, directX := ep+".timeouts", ep+".RebusDirect"
	env["DELAYBRIDGE_REBUS_QUEUE"], env["DELAYBRIDGE_REBUS_DIRECT_EXCHANGE"] = tm, directX
	deleteQueuesOnCleanup(t, ep+".Timeouts", ep+".TimeoutsDispatcher", env["DELAYBRIDGE_ERROR_QUEUE"])
	deleteExchangesOnCleanup(t, directX)
	ch, err := dial(t).Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(tm, false, true, true, false, nil); err != nil {
		t.Fatal(err)
	}
	p := execBridge(t, env)
	if code := p.Wait(30 * time.Second); code != 1 {
		t.Errorf("exit code %d, want 1", code)
	}
	if logs := p.Stderr(); !strings.Contains(logs, `declare queue \"`+tm+`\"`) || !strings.Contains(logs, "RESOURCE_LOCKED") {
		t.Errorf("no stderr line names queue %q and the broker's refusal:\n%s", tm, logs)
	}
}

// refusedAtIngest finds the error copy of each id in hints among copies,
// by message-id, and checks it is an ingest refusal from queue whose
// reason mentions the hint; it returns the copies by message-id.
func refusedAtIngest(t *testing.T, copies []arrival, queue string, start time.Time, hints map[string]string) map[string]arrival {
	t.Helper()
	byID := map[string]arrival{}
	for _, c := range copies {
		byID[c.MessageId] = c
	}
	for id, hint := range hints {
		c, ok := byID[id]
		if !ok {
			t.Errorf("%s is not on the error queue", id)
			continue
		}
		checkErrorHeaders(t, c.Headers, "ingest", 0, queue, []string{hint}, start)
	}
	return byID
}
