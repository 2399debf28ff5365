package integration

import (
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// declareExchange declares a non-durable exchange, deleted at cleanup.
func declareExchange(t *testing.T, conn *amqp.Connection, name, kind string) {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if err := ch.ExchangeDeclare(name, kind, false, false, false, false, nil); err != nil {
		t.Fatalf("declare exchange %q: %v", name, err)
	}
	t.Cleanup(func() {
		c, err := amqp.Dial(amqpURL)
		if err != nil {
			return
		}
		defer c.Close()
		if ch, err := c.Channel(); err == nil {
			_ = ch.ExchangeDelete(name, false, false)
		}
	})
}

func bindQueue(t *testing.T, conn *amqp.Connection, queue, key, exchange string) {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if err := ch.QueueBind(queue, key, exchange, false, nil); err != nil {
		t.Fatalf("bind %q to %q with %q: %v", queue, exchange, key, err)
	}
}

// A message on E.Timeouts naming an exchange and routing key is published
// there at its due time, never early, and routed by the exchange's
// bindings; a forward no binding routes and one to a missing exchange are
// retried, then go to the error queue saying where they were going; a
// message naming both a queue and an exchange is refused at once. Pending
// exchange-routed messages survive a restart.
func TestExchangeDestinations(t *testing.T) {
	t.Parallel()
	b, conn, pub := startWithPublisher(t, map[string]string{"DELAYBRIDGE_NUMBER_OF_RETRIES": "1", "DELAYBRIDGE_POLL_INTERVAL": "100ms"})
	errs := consume(t, conn, b.ErrorQ)
	x := b.Endpoint + ".events"
	declareExchange(t, conn, x, "topic")
	eu, all := b.Endpoint+".eu", b.Endpoint+".all"
	declareQueue(t, conn, eu)
	declareQueue(t, conn, all)
	bindQueue(t, conn, eu, "orders.eu", x)
	bindQueue(t, conn, all, "orders.#", x)
	euC, allC := consume(t, conn, eu), consume(t, conn, all)

	due := time.Now().Add(1500 * time.Millisecond).UTC()
	at := func(id string, h amqp.Table) amqp.Publishing {
		h["x-due-at"] = due.Format(time.RFC3339Nano)
		return amqp.Publishing{MessageId: id, Body: []byte("body of " + id), Headers: h}
	}
	pub.PublishAll(b.TimeoutsQueue(), []amqp.Publishing{
		at("routed", amqp.Table{"x-destination-exchange": x, "x-destination-routing-key": "orders.eu", "custom": "kept"}),
		at("unbound", amqp.Table{"x-destination-exchange": x, "x-destination-routing-key": "billing"}),
		at("missing", amqp.Table{"x-destination-exchange": x + ".missing", "x-destination-routing-key": "orders.eu"}),
		at("both", amqp.Table{"x-destination-exchange": x, "x-destination": eu}),
	})

	for _, c := range []*consumer{euC, allC} {
		got := c.WaitFor(1, livenessBound)
		d := got[0]
		if d.MessageId != "routed" || d.Exchange != x || d.RoutingKey != "orders.eu" || string(d.Body) != "body of routed" {
			t.Errorf("%s got %q through %q %q: %q", c.queue, d.MessageId, d.Exchange, d.RoutingKey, d.Body)
		}
		if d.At.Before(due) {
			t.Errorf("%s: delivered %s early", c.queue, due.Sub(d.At))
		}
		if headerString(d.Headers, "custom") != "kept" {
			t.Errorf("headers not kept: %v", d.Headers)
		}
	}

	// "both" at once; "unbound" and "missing" after one retry (1 s).
	copies := errs.WaitFor(3, livenessBound+5*time.Second)
	byID := map[string]arrival{}
	for _, c := range copies {
		byID[c.MessageId] = c
	}
	checkErrorHeaders(t, byID["both"].Headers, "ingest", 0, b.TimeoutsQueue(), []string{"both name a destination"}, due.Add(-2*time.Second))
	checkErrorHeaders(t, byID["unbound"].Headers, "dispatch", 2, b.TimeoutsQueue(), []string{"NO_ROUTE"}, due)
	checkErrorHeaders(t, byID["missing"].Headers, "dispatch", 2, b.TimeoutsQueue(), []string{"exchange does not exist"}, due)
	for id, want := range map[string][2]string{"unbound": {x, "billing"}, "missing": {x + ".missing", "orders.eu"}} {
		h := byID[id].Headers
		if headerString(h, "x-delaybridge-exchange") != want[0] || headerString(h, "x-delaybridge-routing-key") != want[1] {
			t.Errorf("%s: error copy names exchange %v routing key %v, want %q %q", id, h["x-delaybridge-exchange"], h["x-delaybridge-routing-key"], want[0], want[1])
		}
		if r := headerString(h, hError); !strings.Contains(r, want[0]) {
			t.Errorf("%s: reason %q does not name the exchange", id, r)
		}
	}
	if n := len(errs.Quiet(quietPeriod)); n != 3 {
		t.Errorf("%d copies on the error queue, want 3", n)
	}
	if !b.Running() {
		t.Fatalf("bridge exited with code %d", b.Wait(0))
	}

	// Pending exchange destinations survive a restart.
	b.Stop()
	later := time.Now().Add(4 * time.Second).UTC()
	for _, id := range []string{"r1", "r2"} {
		pub.Publish(b.TimeoutsQueue(), amqp.Publishing{MessageId: id, Headers: amqp.Table{
			"x-destination-exchange": x, "x-destination-routing-key": "orders.eu", "x-due-at": later.Format(time.RFC3339Nano)}})
	}
	b2 := b.Restart(nil)
	// Stored (counted once committed), then restarted again before due.
	waitMetrics(t, b2, livenessBound, "both stored", func(m map[string]float64) bool {
		return m["delaybridge_messages_ingested_total"] == 2
	})
	b2.Stop()
	b3 := b2.Restart(nil)
	got := euC.WaitFor(3, livenessBound+4*time.Second)
	for _, d := range got[1:] {
		if d.At.Before(later) || d.Exchange != x || d.RoutingKey != "orders.eu" {
			t.Errorf("%s after restart: at %s (due %s) through %q %q", d.MessageId, d.At.Format(time.RFC3339Nano), later.Format(time.RFC3339Nano), d.Exchange, d.RoutingKey)
		}
	}
	if n := len(euC.Quiet(quietPeriod)); n != 3 {
		t.Errorf("%d deliveries to %s, want 3 (no duplicates)", n, eu)
	}
	if !b3.Running() {
		t.Fatalf("bridge exited with code %d", b3.Wait(0))
	}
}
