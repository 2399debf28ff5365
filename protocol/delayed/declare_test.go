package delayed

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/rs/zerolog"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/wire"
)

// delayedTopology is a topology of its own on the test broker with one
// delayed exchange of type typ; its queues and exchanges go when the test
// ends. Nothing is declared yet.
func delayedTopology(t *testing.T, typ string) (*topology, *amqp.Connection) {
	t.Helper()
	conn := testenv.DialAMQP(t)
	prefix := "broker-delayed-" + uuid.NewString()[:8]
	topo := &topology{Topology: broker.Topology{Endpoint: prefix, ErrorQueue: prefix + ".error", QueueType: "classic"},
		Protocol: Protocol{TimeoutsQueue: wire.TimeoutsQueue(prefix), Exchanges: []Exchange{{Name: prefix + ".x", Type: typ}}}}
	t.Cleanup(func() {
		c, err := amqp.Dial(testenv.AMQPURL(t))
		if err != nil {
			t.Logf("cleanup: %v", err)
			return
		}
		defer c.Close()
		ch, err := c.Channel()
		if err != nil {
			t.Logf("cleanup: %v", err)
			return
		}
		for _, x := range topo.Exchanges {
			_ = ch.ExchangeDelete(x.Name, false, false)
			_ = ch.ExchangeDelete(x.Route(), false, false)
		}
		for _, q := range []string{topo.Topology.TimeoutsQueue(), topo.DispatcherQueue(), topo.ErrorQueue} {
			_, _ = ch.QueueDelete(q, false, false, false)
		}
	})
	return topo, conn
}

// topology is the bridge's queues and its delayed exchanges.
type topology struct {
	broker.Topology
	Protocol
}

func declareAll(t *testing.T, topo *topology, conn *amqp.Connection) error {
	t.Helper()
	ch := testenv.Channel(t, conn)
	if err := topo.Topology.Declare(ch); err != nil {
		t.Fatal(err)
	}
	return topo.Protocol.Declare(conn)
}

// The broker routes as the bridge relies on: a message with x-delay, of any
// type, void too, goes to E.Timeouts with its exchange and routing key; one
// without goes at once through the routing exchange's own bindings (a
// topic exchange here). Declaring again, as every reconnect does, changes
// nothing.
func TestDelayedExchangeRoutesByXDelay(t *testing.T) {
	topo, conn := delayedTopology(t, amqp.ExchangeTopic)
	for i := 0; i < 2; i++ {
		if err := declareAll(t, topo, conn); err != nil {
			t.Fatalf("declaration %d: %v", i+1, err)
		}
	}
	x := topo.Exchanges[0]
	ch := testenv.Channel(t, conn)
	direct, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(direct.Name, "orders.*", x.Route(), false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	returns := ch.NotifyReturn(make(chan amqp.Return, 10))
	delays := []any{int32(5000), "5000", 1.5, nil, int64(-1), int8(0)}
	for i, d := range delays {
		testenv.PublishConfirmed(t, ch, x.Name, "orders.created", amqp.Publishing{MessageId: "delayed-" + string(rune('a'+i)), Headers: amqp.Table{wire.HeaderDelay: d}})
	}
	testenv.PublishConfirmed(t, ch, x.Name, "orders.created", amqp.Publishing{MessageId: "now", Headers: amqp.Table{"x-other": "1"}})
	testenv.PublishConfirmed(t, ch, x.Name, "orders.created", amqp.Publishing{MessageId: "now-no-headers"})
	testenv.PublishConfirmed(t, ch, x.Name, "billing.created", amqp.Publishing{MessageId: "unbound"}) // no binding matches: returned
	select {
	case r := <-returns:
		if r.MessageId != "unbound" {
			t.Fatalf("%s returned: %s", r.MessageId, r.ReplyText)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a message no binding of the routing exchange matches was not returned")
	}

	got := testenv.GetN(t, ch, topo.Topology.TimeoutsQueue(), len(delays))
	for i, d := range got {
		if d.Exchange != x.Name || d.RoutingKey != "orders.created" || d.MessageId != "delayed-"+string(rune('a'+i)) {
			t.Errorf("E.Timeouts got %s through %q with key %q", d.MessageId, d.Exchange, d.RoutingKey)
		}
	}
	for _, d := range testenv.GetN(t, ch, direct.Name, 2) {
		if d.Exchange != x.Name || d.RoutingKey != "orders.created" || !strings.HasPrefix(d.MessageId, "now") {
			t.Errorf("the routing exchange's queue got %s through %q with key %q", d.MessageId, d.Exchange, d.RoutingKey)
		}
	}
}

// An exchange of the bridge's that exists in another form stops the
// declaration with an error that names it, quotes the broker and says
// what to change; nothing is deleted.
func TestDelayedExchangeConflicts(t *testing.T) {
	cases := []struct {
		name     string
		existing func(topo *topology) (name, kind string, args amqp.Table)
		want     []string
	}{
		{"name of another type", func(topo *topology) (string, string, amqp.Table) {
			return topo.Exchanges[0].Name, amqp.ExchangeTopic, nil
		}, []string{"current is 'topic'", "durable headers exchange with alternate-exchange", "delete the existing exchange", "pick another name"}},
		{"name without its alternate exchange", func(topo *topology) (string, string, amqp.Table) {
			return topo.Exchanges[0].Name, amqp.ExchangeHeaders, nil
		}, []string{"alternate-exchange", "durable headers exchange with alternate-exchange"}},
		{"routing exchange of another type", func(topo *topology) (string, string, amqp.Table) {
			return topo.Exchanges[0].Route(), amqp.ExchangeDirect, nil
		}, []string{"current is 'direct'", "durable topic exchange, the routing exchange of delayed exchange"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			topo, conn := delayedTopology(t, amqp.ExchangeTopic)
			name, kind, args := c.existing(topo)
			ch := testenv.Channel(t, conn)
			if err := ch.ExchangeDeclare(name, kind, true, false, false, false, args); err != nil {
				t.Fatal(err)
			}
			err := declareAll(t, topo, conn)
			if !errors.Is(err, broker.ErrTopologyConflict) {
				t.Fatalf("got %v, want broker.ErrTopologyConflict", err)
			}
			msg := err.Error()
			for _, w := range append(c.want, `exchange "`+name+`"`, "DELAYBRIDGE_DELAYED_EXCHANGES") {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q does not say %q", msg, w)
				}
			}
			if strings.Contains(msg, "\n") {
				t.Errorf("error %q is more than one line", msg)
			}
			// Still there, as it was.
			if err := ch.ExchangeDeclarePassive(name, kind, true, false, false, false, args); err != nil {
				t.Fatalf("the existing exchange is gone or changed: %v", err)
			}
		})
	}
}

// A start-up connection whose declarations conflict fails with the
// conflict itself, not as a broker that could not be reached.
func TestConnectReportsATopologyConflict(t *testing.T) {
	topo, conn := delayedTopology(t, amqp.ExchangeFanout)
	ch := testenv.Channel(t, conn)
	if err := ch.ExchangeDeclare(topo.Exchanges[0].Name, amqp.ExchangeDirect, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	c := broker.NewConn(broker.ConnOptions{URL: testenv.AMQPURL(t), Name: t.Name(), Logger: zerolog.Nop(),
		OnConnect: func(conn *amqp.Connection) error { return declareAll(t, topo, conn) }})
	err := c.Connect()
	if err == nil {
		c.Close()
		t.Fatal("Connect succeeded")
	}
	if !errors.Is(err, broker.ErrTopologyConflict) || errors.Is(err, broker.ErrNeverConnected) || strings.Contains(err.Error(), broker.ErrNeverConnected.Error()) {
		t.Fatalf("got %q, want the conflict and not %q", err, broker.ErrNeverConnected)
	}
	if !strings.Contains(err.Error(), broker.Redact(testenv.AMQPURL(t))) {
		t.Fatalf("error %q does not name the broker", err)
	}
}

// A broker refusal that is no conflict (here a reserved name) is reported
// as it is, not as something to delete; a broker that refuses x-match
// any-with-x (before 3.10) is named as too old.
func TestDelayedExchangeOtherRefusals(t *testing.T) {
	topo, conn := delayedTopology(t, amqp.ExchangeTopic)
	topo.Exchanges = []Exchange{{Name: "amq." + topo.Endpoint, Type: amqp.ExchangeTopic}}
	err := declareAll(t, topo, conn)
	if err == nil || errors.Is(err, broker.ErrTopologyConflict) || !strings.Contains(err.Error(), "ACCESS_REFUSED") ||
		!strings.Contains(err.Error(), `declare exchange "amq.`+topo.Endpoint+`.route"`) {
		t.Fatalf("got %v, want the broker's refusal of a reserved name, no conflict", err)
	}

	// 3.10 knows any-with-x; an x-match it does not know draws the refusal
	// an older broker gives any-with-x.
	topo.Exchanges = []Exchange{{Name: topo.Endpoint + ".x", Type: amqp.ExchangeTopic}}
	if err := declareAll(t, topo, conn); err != nil {
		t.Fatal(err)
	}
	ch := testenv.Channel(t, conn)
	refused := ch.QueueBind(topo.Topology.TimeoutsQueue(), "", topo.Exchanges[0].Name, false, amqp.Table{argMatch: "any-with-y", wire.HeaderDelay: nil})
	if refused == nil {
		t.Fatal("the broker accepted x-match any-with-y")
	}
	msg := bindError(topo.Exchanges[0].Name, topo.Topology.TimeoutsQueue(), refused).Error()
	if !strings.Contains(msg, "needs RabbitMQ 3.10 or later") || !strings.Contains(msg, "PRECONDITION_FAILED") {
		t.Fatalf("error %q must quote the broker and name the version needed", msg)
	}
	other := bindError("x", "q", &amqp.Error{Code: amqp.NotFound, Reason: "NOT_FOUND - no queue 'q'"}).Error()
	if strings.Contains(other, "3.10") || !strings.Contains(other, "NOT_FOUND") {
		t.Fatalf("error %q: only an x-match refusal names the version", other)
	}
}

// The bridge's own binding of a delayed exchange, as the management API
// lists it (void as "undefined" on RabbitMQ 3.10, or null), and nothing
// else.
func TestOwnBinding(t *testing.T) {
	own := map[string]any{"x-match": "any-with-x", "x-delay": "undefined"}
	for _, c := range []struct {
		isQueue bool
		dest    string
		args    map[string]any
		want    bool
	}{
		{true, "E.Timeouts", own, true},
		{true, "E.Timeouts", map[string]any{"x-match": "any-with-x", "x-delay": nil}, true},
		{false, "E.Timeouts", own, false},
		{true, "F.Timeouts", own, false},
		{true, "E.Timeouts", nil, false},
		{true, "E.Timeouts", map[string]any{"x-match": "any", "x-delay": nil}, false},
		{true, "E.Timeouts", map[string]any{"x-match": "any-with-x", "x-delay": "5000"}, false},
		{true, "E.Timeouts", map[string]any{"x-match": "any-with-x", "x-delay": nil, "x-other": 1.0}, false},
	} {
		if got := OwnBinding("E.Timeouts", c.isQueue, c.dest, c.args); got != c.want {
			t.Errorf("%v %q %v: %v, want %v", c.isQueue, c.dest, c.args, got, c.want)
		}
	}
}
