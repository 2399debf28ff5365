package integration

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	amqp "github.com/rabbitmq/amqp091-go"
)

// Delayed exchanges (docs/contract.md §2.7): the bridge in the place of the
// delayed-message-exchange plugin. Publishers send to the exchange with a
// routing key and x-delay; consumers bind to <name>.route.

// delayedExchange returns a unique delayed exchange name; it and its
// routing exchange are deleted when the test ends (after the bridges it
// starts later are gone).
func delayedExchange(t *testing.T, kind string) string {
	t.Helper()
	name := uniqueEndpoint(t) + "." + kind
	deleteExchangesOnCleanup(t, name, name+".route")
	return name
}

// bindAndConsume declares a queue (deleted at cleanup), binds it to
// exchange with key and args, and consumes it.
func bindAndConsume(t *testing.T, conn *amqp.Connection, queue, exchange, key string, args amqp.Table) *consumer {
	t.Helper()
	declareQueue(t, conn, queue)
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("open channel: %v", err)
	}
	defer ch.Close()
	if err := ch.QueueBind(queue, key, exchange, false, args); err != nil {
		t.Fatalf("bind %q to %q with %q: %v", queue, exchange, key, err)
	}
	return consume(t, conn, queue)
}

// delayCase is one x-delay value published to a delayed exchange.
type delayCase struct {
	name  string
	delay any  // the x-delay header's value
	ms    int  // the delay it means, 0 for at once
	void  bool // x-delay is present without a value
	// forwarded is x-delay as the message arrives: the delay negated, as
	// int64, when it delayed; as it came otherwise.
	forwarded any
}

// Every x-delay the plugin reads delays as the plugin would: integers of
// every AMQP type, a decimal string, a float truncated; zero, negative or
// void at once. The message arrives never early, through the routing
// exchange with its routing key, body, properties and headers, the
// bridge's own headers included (they mean nothing here), with x-delay
// negated.
func TestDelayedExchangeXDelayTypes(t *testing.T) {
	t.Parallel()
	name := delayedExchange(t, "types")
	b, conn, pub := startWithPublisher(t, map[string]string{"DELAYBRIDGE_DELAYED_EXCHANGES": name + ":topic", "DELAYBRIDGE_POLL_INTERVAL": "100ms"})
	got := bindAndConsume(t, conn, b.Endpoint+".all", name+".route", "types.#", nil)
	errs := consume(t, conn, b.ErrorQ)

	cases := []delayCase{
		{"int8", int8(120), 120, false, int64(-120)},
		{"uint8", uint8(250), 250, false, int64(-250)},
		{"int16", int16(1500), 1500, false, int64(-1500)},
		{"uint16", uint16(1400), 1400, false, int64(-1400)},
		{"int32", int32(1500), 1500, false, int64(-1500)},
		{"uint32", uint32(1300), 1300, false, int64(-1300)},
		{"int64", int64(1600), 1600, false, int64(-1600)},
		{"string", "1500", 1500, false, int64(-1500)},
		{"byte-array", []byte("1200"), 1200, false, int64(-1200)},
		{"float64", float64(1500.9), 1500, false, int64(-1500)},
		{"float32", float32(1250.5), 1250, false, int64(-1250)},
		{"zero", int32(0), 0, false, int32(0)},
		{"negative", int32(-5000), 0, false, int32(-5000)},
		{"negative-string", "-20", 0, false, "-20"},
		{"void", nil, 0, true, nil},
	}
	farOff := time.Now().Add(24 * time.Hour).UTC().Format(time.RFC3339)
	notBefore := map[string]time.Time{}
	for _, c := range cases {
		h := amqp.Table{"x-delay": c.delay, "x-test": c.name,
			// The bridge's own headers would say: another queue, tomorrow.
			"x-destination": b.Endpoint + ".elsewhere", "x-due-at": farOff}
		before := time.Now()
		pub.PublishTo(name, "types."+c.name, amqp.Publishing{MessageId: "xd-" + c.name, Body: []byte("body of " + c.name),
			ContentType: "text/plain", CorrelationId: "corr-" + c.name, DeliveryMode: amqp.Persistent, Headers: h})
		notBefore["xd-"+c.name] = before.Add(time.Duration(c.ms) * time.Millisecond)
	}
	got.WaitFor(len(cases), livenessBound)
	byID := byMessageID(got.Quiet(quietPeriod))
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			as := byID["xd-"+c.name]
			if len(as) != 1 {
				t.Fatalf("%d deliveries, want exactly 1", len(as))
			}
			d := as[0]
			if due := notBefore[d.MessageId]; d.At.Before(due) {
				t.Errorf("delivered %s EARLY", due.Sub(d.At))
			}
			if d.Exchange != name+".route" || d.RoutingKey != "types."+c.name {
				t.Errorf("arrived through %q with key %q, want %q with %q", d.Exchange, d.RoutingKey, name+".route", "types."+c.name)
			}
			if string(d.Body) != "body of "+c.name || d.ContentType != "text/plain" || d.CorrelationId != "corr-"+c.name || d.DeliveryMode != amqp.Persistent {
				t.Errorf("body or properties changed: %q %q %q %d", d.Body, d.ContentType, d.CorrelationId, d.DeliveryMode)
			}
			want := amqp.Table{"x-delay": c.forwarded, "x-test": c.name, "x-destination": b.Endpoint + ".elsewhere", "x-due-at": farOff}
			if diff := cmp.Diff(want, d.Headers); diff != "" {
				t.Errorf("headers (-want +got):\n%s", diff)
			}
		})
	}
	if n := errs.Count(); n != 0 {
		t.Errorf("%d messages on the error queue, want none", n)
	}
}

// An x-delay the plugin would have ignored without a word (routing the
// message at once) goes to the error queue with the reason, the message
// as it came.
func TestDelayedExchangeRefusesAnUnreadableXDelay(t *testing.T) {
	t.Parallel()
	name := delayedExchange(t, "refused")
	b, conn, pub := startWithPublisher(t, map[string]string{"DELAYBRIDGE_DELAYED_EXCHANGES": name + ":topic"})
	got := bindAndConsume(t, conn, b.Endpoint+".all", name+".route", "#", nil)
	errs := consume(t, conn, b.ErrorQ)
	refused := map[string]any{"bool": true, "words": "soon", "decimal-point": "1.5", "decimal": amqp.Decimal{Scale: 1, Value: 15},
		"timestamp": time.Unix(1763755200, 0), "table": amqp.Table{"ms": int32(5)}}
	before := time.Now()
	for n, v := range refused {
		pub.PublishTo(name, "refused."+n, amqp.Publishing{MessageId: "refused-" + n, Body: []byte("body of " + n),
			Headers: amqp.Table{"x-delay": v, "x-test": n}})
	}
	errs.WaitFor(len(refused), livenessBound)
	moved := errs.Quiet(quietPeriod)
	if len(moved) != len(refused) {
		t.Errorf("%d error copies, want %d", len(moved), len(refused))
	}
	for _, m := range moved {
		n := strings.TrimPrefix(m.MessageId, "refused-")
		checkErrorHeaders(t, m.Headers, "ingest", 0, b.TimeoutsQueue(), []string{"x-delay"}, before)
		if diff := cmp.Diff(refused[n], m.Headers["x-delay"]); diff != "" || m.Headers["x-test"] != n || string(m.Body) != "body of "+n {
			t.Errorf("%s: the copy is not the message as it came: x-delay (-sent +copy) %s, x-test %v, body %q", m.MessageId, diff, m.Headers["x-test"], m.Body)
		}
		if m.RoutingKey != b.ErrorQ {
			t.Errorf("%s: copy published with key %q", m.MessageId, m.RoutingKey)
		}
	}
	if n := got.Count(); n != 0 {
		t.Errorf("%d messages routed, want none", n)
	}
}

// Every routing exchange type the plugin's x-delayed-type allows routes as
// it did: the bridge forwards with the original routing key (empty for the
// usual fanout publish) and headers, and a message without x-delay goes at
// once. An allow-list that names none of them does not stand in the way:
// DELAYBRIDGE_DELAYED_EXCHANGES named them.
func TestDelayedExchangeOfEveryType(t *testing.T) {
	t.Parallel()
	direct, fanout, headers := delayedExchange(t, "direct"), delayedExchange(t, "fanout"), delayedExchange(t, "headers")
	b := startBridge(t, map[string]string{"DELAYBRIDGE_POLL_INTERVAL": "100ms", "DELAYBRIDGE_ALLOWED_DESTINATIONS": "only-this-queue",
		"DELAYBRIDGE_DELAYED_EXCHANGES": direct + ":direct," + fanout + ":fanout," + headers + ":headers"})
	conn := dial(t)
	pub := newPublisher(t, conn)
	cases := []struct {
		exchange, key string
		headers       amqp.Table
		c             *consumer
	}{
		{direct, "invoice", nil, bindAndConsume(t, conn, b.Endpoint+".direct", direct+".route", "invoice", nil)},
		{fanout, "", nil, bindAndConsume(t, conn, b.Endpoint+".fanout", fanout+".route", "", nil)},
		{headers, "", amqp.Table{"tenant": "eu"}, bindAndConsume(t, conn, b.Endpoint+".headers", headers+".route", "",
			amqp.Table{"x-match": "all", "tenant": "eu"})},
	}
	for _, c := range cases {
		t.Run(c.exchange[strings.LastIndexByte(c.exchange, '.')+1:], func(t *testing.T) {
			h := amqp.Table{"x-delay": int32(800)}
			for k, v := range c.headers {
				h[k] = v
			}
			before := time.Now()
			pub.PublishTo(c.exchange, c.key, amqp.Publishing{MessageId: "delayed", Body: []byte("later"), Headers: h})
			pub.PublishTo(c.exchange, c.key, amqp.Publishing{MessageId: "now", Body: []byte("now"), Headers: c.headers})
			got := c.c.WaitFor(2, livenessBound)
			got = c.c.Quiet(quietPeriod)
			if len(got) != 2 || got[0].MessageId != "now" || got[1].MessageId != "delayed" {
				t.Fatalf("got %d deliveries, want now then delayed", len(got))
			}
			if got[0].Exchange != c.exchange || got[1].Exchange != c.exchange+".route" {
				t.Errorf("now came through %q, delayed through %q", got[0].Exchange, got[1].Exchange)
			}
			if d := got[1]; d.At.Before(before.Add(800*time.Millisecond)) || d.RoutingKey != c.key || string(d.Body) != "later" {
				t.Errorf("delayed: arrived %s after the publish, key %q, body %q", d.At.Sub(before), d.RoutingKey, d.Body)
			}
		})
	}
}

// A message without x-delay never touches the bridge: the broker routes it
// through the routing exchange at once, bridge or not. One with x-delay
// waits in E.Timeouts while the bridge is down.
func TestDelayedExchangeWithoutXDelayNeedsNoBridge(t *testing.T) {
	t.Parallel()
	name := delayedExchange(t, "nodelay")
	b, conn, pub := startWithPublisher(t, map[string]string{"DELAYBRIDGE_DELAYED_EXCHANGES": name + ":topic"})
	c := bindAndConsume(t, conn, b.Endpoint+".orders", name+".route", "orders.*", nil)
	b.Stop()

	pub.PublishTo(name, "orders.now", amqp.Publishing{MessageId: "now", Body: []byte("at once"), Headers: amqp.Table{"x-other": int32(1)}})
	got := c.WaitFor(1, livenessBound)
	if d := got[0]; d.Exchange != name || d.RoutingKey != "orders.now" || string(d.Body) != "at once" || d.Headers["x-other"] != int32(1) {
		t.Errorf("got %q through %q with key %q, headers %v", d.Body, d.Exchange, d.RoutingKey, d.Headers)
	}
	pub.PublishTo(name, "orders.later", amqp.Publishing{MessageId: "later", Headers: amqp.Table{"x-delay": int32(50)}})
	deadline := time.Now().Add(livenessBound)
	for queueDepth(t, conn, b.TimeoutsQueue()) != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("the message with x-delay is not waiting in %s", b.TimeoutsQueue())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got := c.Quiet(quietPeriod); len(got) != 1 {
		t.Errorf("%d deliveries without the bridge, want only the one without x-delay", len(got))
	}
}

// Every publish to a delayed exchange is delivered, as the plugin delivers
// it (docs/contract.md §2.7): the very same message published twice, and a
// third message with its id, all pending at once, arrive three times, each
// at its own time, none early; nothing is counted as dropped.
func TestDelayedExchangeDeliversEveryPublishOfOneID(t *testing.T) {
	t.Parallel()
	name := delayedExchange(t, "sameid")
	b := startBridge(t, map[string]string{"DELAYBRIDGE_DELAYED_EXCHANGES": name + ":direct"})
	conn := dial(t)
	pub := newPublisher(t, conn)
	c := bindAndConsume(t, conn, b.Endpoint+".reminders", name+".route", "reminder", nil)

	same := amqp.Publishing{MessageId: "order-42", Body: []byte("remind"), Headers: amqp.Table{"x-delay": int32(1500)}}
	notBefore := []time.Time{time.Now().Add(1500 * time.Millisecond)}
	pub.PublishTo(name, "reminder", same)
	notBefore = append(notBefore, time.Now().Add(1500*time.Millisecond))
	pub.PublishTo(name, "reminder", same)
	notBefore = append(notBefore, time.Now().Add(2500*time.Millisecond))
	pub.PublishTo(name, "reminder", amqp.Publishing{MessageId: "order-42", Body: []byte("remind again"), Headers: amqp.Table{"x-delay": int32(2500)}})

	c.WaitFor(3, livenessBound)
	got := c.Quiet(quietPeriod)
	if len(got) != 3 || string(got[0].Body) != "remind" || string(got[1].Body) != "remind" || string(got[2].Body) != "remind again" {
		t.Fatalf("got %d deliveries (%s), want remind, remind, remind again", len(got), bodies(got))
	}
	for i, d := range got {
		if d.MessageId != "order-42" || d.At.Before(notBefore[i]) {
			t.Errorf("delivery %d: id %q at %s, not before %s", i+1, d.MessageId, d.At.Format(time.RFC3339Nano), notBefore[i].Format(time.RFC3339Nano))
		}
	}
	m := scrape(t, b)
	for _, reason := range []string{"duplicate", "cancelled", "replaced"} {
		if v := m[`delaybridge_messages_dropped_total{reason="`+reason+`"}`]; v != 0 {
			t.Errorf("dropped_total{reason=%q} = %v, want 0", reason, v)
		}
	}
}

// An exchange of the bridge's that exists in another form (the plugin's
// exchange not yet deleted, say: here a topic exchange, as the plugin is
// not installed on the test broker) stops the bridge at start with exit 1
// and a line naming the exchange, what it is, what the bridge needs and
// what to change. The exchange is left as it was.
func TestDelayedExchangeConflictStopsTheBridge(t *testing.T) {
	t.Parallel()
	requireBroker(t)
	cases := []struct {
		name     string
		existing func(name string) (exchange, kind string)
		want     []string
	}{
		{"exchange-of-another-type", func(name string) (string, string) { return name, amqp.ExchangeTopic },
			[]string{"current is 'topic'", "headers exchange with alternate-exchange"}},
		{"routing-exchange-of-another-type", func(name string) (string, string) { return name + ".route", amqp.ExchangeDirect },
			[]string{"current is 'direct'", "durable topic exchange"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			name := delayedExchange(t, "conflict")
			exchange, kind := c.existing(name)
			conn := dial(t)
			ch, err := conn.Channel()
			if err != nil {
				t.Fatal(err)
			}
			if err := ch.ExchangeDeclare(exchange, kind, true, false, false, false, nil); err != nil {
				t.Fatal(err)
			}
			env := bridgeEnv(t, map[string]string{"DELAYBRIDGE_DELAYED_EXCHANGES": name + ":topic"})
			ep := env["DELAYBRIDGE_ENDPOINT"]
			deleteQueuesOnCleanup(t, ep+".Timeouts", ep+".TimeoutsDispatcher", env["DELAYBRIDGE_ERROR_QUEUE"])
			p := execBridge(t, env)
			if code := p.Wait(30 * time.Second); code != 1 {
				t.Errorf("exit code %d, want 1", code)
			}
			var line string
			for _, l := range strings.Split(p.Stderr(), "\n") {
				if strings.Contains(l, `exchange \"`+exchange+`\"`) {
					line = l
				}
			}
			for _, w := range append(c.want, "DELAYBRIDGE_DELAYED_EXCHANGES", "delete the existing exchange", "pick another name") {
				if !strings.Contains(line, w) {
					t.Errorf("no stderr line names exchange %q and says %q:\n%s", exchange, w, p.Stderr())
				}
			}
			if strings.Contains(line, "could not connect") {
				t.Errorf("the conflict reads as a broker that could not be reached: %s", line)
			}
			if err := ch.ExchangeDeclarePassive(exchange, kind, true, false, false, false, nil); err != nil {
				t.Errorf("the existing exchange is gone or changed: %v", err)
			}
		})
	}
}

// Messages pending for a delayed exchange survive a restart of the bridge,
// and those published while it was down wait in E.Timeouts: after the
// restart every one arrives once, none early.
func TestDelayedExchangeRestartWithPendingMessages(t *testing.T) {
	t.Parallel()
	name := delayedExchange(t, "restart")
	b, conn, pub := startWithPublisher(t, map[string]string{"DELAYBRIDGE_DELAYED_EXCHANGES": name + ":topic", "DELAYBRIDGE_POLL_INTERVAL": "100ms"})
	c := bindAndConsume(t, conn, b.Endpoint+".orders", name+".route", "orders.#", nil)

	notBefore := map[string]time.Time{}
	publish := func(id string, delay any, ms int) {
		before := time.Now()
		pub.PublishTo(name, "orders."+id, amqp.Publishing{MessageId: id, Body: []byte("body of " + id), DeliveryMode: amqp.Persistent,
			Headers: amqp.Table{"x-delay": delay}})
		notBefore[id] = before.Add(time.Duration(ms) * time.Millisecond)
	}
	publish("before-1", int32(3000), 3000)
	publish("before-2", "3500", 3500)
	publish("before-3", float64(4000.5), 4000)
	publish("before-4", int64(2500), 2500)
	waitQueueEmpty(t, conn, b.TimeoutsQueue(), livenessBound) // all stored
	b.Stop()
	publish("during-1", int16(1000), 1000)
	publish("during-2", int32(0), 0)
	if n := c.Count(); n != 0 {
		t.Fatalf("%d deliveries before the restart", n)
	}

	b.Restart(nil)
	c.WaitFor(len(notBefore), 30*time.Second)
	got := c.Quiet(quietPeriod)
	if len(got) != len(notBefore) {
		t.Errorf("%d deliveries, want %d", len(got), len(notBefore))
	}
	seen := map[string]bool{}
	for _, d := range got {
		if seen[d.MessageId] {
			t.Errorf("%s delivered twice", d.MessageId)
		}
		seen[d.MessageId] = true
		if d.At.Before(notBefore[d.MessageId]) {
			t.Errorf("%s delivered %s EARLY", d.MessageId, notBefore[d.MessageId].Sub(d.At))
		}
		if d.RoutingKey != "orders."+d.MessageId || string(d.Body) != "body of "+d.MessageId || d.Exchange != name+".route" {
			t.Errorf("%s: key %q body %q exchange %q", d.MessageId, d.RoutingKey, d.Body, d.Exchange)
		}
	}
}
