package broker

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/internal/testenv"
)

// foreignTopology is a foreign queue of its own on the test broker, with
// the bridge's quorum arguments; the queue and exchange go when the test
// ends. Nothing is declared yet.
func foreignTopology(t *testing.T) ([]ForeignQueue, ForeignQueue, *amqp.Connection) {
	t.Helper()
	conn := testConn(t)
	prefix := "broker-foreign-" + uuid.NewString()[:8]
	f := ForeignQueue{Queue: prefix + ".timeouts", QueueArgs: amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum},
		Exchange: prefix + ".Direct", ExchangeType: amqp.ExchangeDirect, RoutingKey: prefix + ".timeouts"}
	t.Cleanup(func() {
		c, err := amqp.Dial(testURL())
		if err != nil {
			t.Logf("cleanup: %v", err)
			return
		}
		defer c.Close()
		if ch, err := c.Channel(); err == nil {
			_, _ = ch.QueueDelete(f.Queue, false, false, false)
			_ = ch.ExchangeDelete(f.Exchange, false, false)
		}
	})
	return []ForeignQueue{f}, f, conn
}

// routes checks that a message published to f's exchange with its
// routing key lands on f's queue, and nothing else is there.
func routes(t *testing.T, conn *amqp.Connection, f ForeignQueue) {
	t.Helper()
	ch := testenv.ConfirmChannel(t, conn)
	returns := ch.NotifyReturn(make(chan amqp.Return, 1))
	id := uuid.NewString()
	testenv.PublishConfirmed(t, ch, f.Exchange, f.RoutingKey, amqp.Publishing{MessageId: id})
	select {
	case r := <-returns:
		t.Fatalf("returned: %s", r.ReplyText)
	default:
	}
	if got := testenv.GetN(t, ch, f.Queue, 1); got[0].MessageId != id {
		t.Fatalf("%s got %s, want %s", f.Queue, got[0].MessageId, id)
	}
}

// With nothing there, the bridge declares the exchange, the queue with its
// arguments and the binding; declaring again, as every reconnect does,
// changes nothing.
func TestDeclareForeignCreatesWhatIsMissing(t *testing.T) {
	topo, f, conn := foreignTopology(t)
	for i := range 2 {
		if err := DeclareForeign(conn, topo...); err != nil {
			t.Fatalf("declaration %d: %v", i+1, err)
		}
	}
	routes(t, conn, f)
	// The queue is the bridge's quorum queue: declaring it as a classic
	// one is refused.
	err := OnChannel(conn, func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclare(f.Queue, true, false, false, false, amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeClassic})
		return err
	})
	var ae *amqp.Error
	if !errors.As(err, &ae) || ae.Code != amqp.PreconditionFailed {
		t.Fatalf("redeclared as classic: %v, want PRECONDITION_FAILED", err)
	}
}

// A queue and an exchange the framework declared first, with arguments
// that differ from the bridge's (a Rebus endpoint's classic input queue
// with x-ha-policy, a direct exchange with an alternate exchange), are left
// as they are: declaring them the bridge's way would be refused.
func TestDeclareForeignLeavesExistingOnesAlone(t *testing.T) {
	topo, f, conn := foreignTopology(t)
	theirs := amqp.Table{"x-ha-policy": "all"}
	xArgs := amqp.Table{"alternate-exchange": f.Exchange + ".unrouted"}
	err := OnChannel(conn, func(ch *amqp.Channel) error {
		if err := ch.ExchangeDeclare(f.Exchange, amqp.ExchangeDirect, true, false, false, false, xArgs); err != nil {
			return err
		}
		_, err := ch.QueueDeclare(f.Queue, true, false, false, false, theirs)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	// What a plain declaration would meet.
	for what, declare := range map[string]func(*amqp.Channel) error{
		"queue": func(ch *amqp.Channel) error {
			_, err := ch.QueueDeclare(f.Queue, true, false, false, false, f.QueueArgs)
			return err
		},
		"exchange": func(ch *amqp.Channel) error {
			return ch.ExchangeDeclare(f.Exchange, f.ExchangeType, true, false, false, false, nil)
		},
	} {
		var ae *amqp.Error
		if err := OnChannel(conn, declare); !errors.As(err, &ae) || ae.Code != amqp.PreconditionFailed {
			t.Fatalf("declaring the %s the bridge's way: %v, want PRECONDITION_FAILED", what, err)
		}
	}
	if err := DeclareForeign(conn, topo...); err != nil {
		t.Fatal(err)
	}
	routes(t, conn, f)
	// Still theirs: their own declarations are still accepted.
	err = OnChannel(conn, func(ch *amqp.Channel) error {
		if err := ch.ExchangeDeclare(f.Exchange, amqp.ExchangeDirect, true, false, false, false, xArgs); err != nil {
			return err
		}
		_, err := ch.QueueDeclare(f.Queue, true, false, false, false, theirs)
		return err
	})
	if err != nil {
		t.Fatalf("the framework's declarations now fail: %v", err)
	}
}

// A failure other than a missing queue or exchange, at each step, is an
// error naming what failed.
func TestDeclareForeignReportsOtherFailures(t *testing.T) {
	topo, f, conn := foreignTopology(t)
	// The exchange: a reserved name, refused.
	topo[0].Exchange = "amq.reserved-" + uuid.NewString()[:8]
	err := DeclareForeign(conn, topo...)
	var ae *amqp.Error
	if !errors.As(err, &ae) || ae.Code != amqp.AccessRefused || !strings.Contains(err.Error(), "declare exchange") {
		t.Fatalf("declaring exchange %q: %v, want ACCESS_REFUSED", topo[0].Exchange, err)
	}
	// The queue: another connection's exclusive queue, locked.
	other := testConn(t)
	och := testenv.Channel(t, other)
	if _, err := och.QueueDeclare(f.Queue, false, false, true, false, nil); err != nil {
		t.Fatal(err)
	}
	topo[0] = f
	if err := DeclareForeign(conn, topo...); !errors.As(err, &ae) || ae.Code != amqp.ResourceLocked || !strings.Contains(err.Error(), "declare queue") {
		t.Fatalf("declaring another connection's exclusive queue: %v, want RESOURCE_LOCKED", err)
	}
	// The binding: a routing key AMQP cannot carry (the client drops the
	// connection over it; the bridge validates its names before).
	_ = other.Close()
	topo[0].RoutingKey = strings.Repeat("k", 256)
	if err := DeclareForeign(conn, topo...); err == nil || !strings.Contains(err.Error(), "bind queue") {
		t.Fatalf("binding with a 256-byte routing key: %v, want an error", err)
	}
}

// An exchange the bridge declares has the framework's arguments, so the
// framework's own declaration, made after it, is accepted (Rebus declares
// its direct exchange with AddArgumentToDirectExchange's arguments, and
// RabbitMQ compares alternate-exchange): without them it would be refused.
func TestDeclareForeignUsesTheFrameworksArguments(t *testing.T) {
	topo, f, conn := foreignTopology(t)
	theirs := amqp.Table{"alternate-exchange": f.Exchange + ".unrouted"}
	topo[0].ExchangeArgs = theirs
	if err := DeclareForeign(conn, topo...); err != nil {
		t.Fatal(err)
	}
	routes(t, conn, f)
	err := OnChannel(conn, func(ch *amqp.Channel) error {
		return ch.ExchangeDeclare(f.Exchange, amqp.ExchangeDirect, true, false, false, false, theirs)
	})
	if err != nil {
		t.Fatalf("the framework's declaration after the bridge's: %v", err)
	}
}

// ConventionalExchange is NServiceBus's conventional topology for a queue:
// a message its senders publish to the exchange of the queue's name,
// mandatory, lands on the queue, and their own declaration of that exchange
// (ConventionalRoutingTopology.CreateExchange: durable fanout, no
// arguments) is accepted.
func TestConventionalExchange(t *testing.T) {
	conn := testConn(t)
	q := "broker-conventional-" + uuid.NewString()[:8] + ".Timeouts"
	t.Cleanup(func() {
		c, err := amqp.Dial(testURL())
		if err != nil {
			return
		}
		defer c.Close()
		if ch, err := c.Channel(); err == nil {
			_, _ = ch.QueueDelete(q, false, false, false)
			_ = ch.ExchangeDelete(q, false, false)
		}
	})
	if err := OnChannel(conn, func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclare(q, true, false, false, false, amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	f := ConventionalExchange(q)
	if f.Exchange != q || f.ExchangeType != amqp.ExchangeFanout || f.RoutingKey != "" || f.ExchangeArgs != nil {
		t.Fatalf("%+v", f)
	}
	topo := []ForeignQueue{f}
	for i := range 2 { // every connection declares it again
		if err := DeclareForeign(conn, topo...); err != nil {
			t.Fatalf("declaration %d: %v", i+1, err)
		}
	}
	routes(t, conn, f)
	if err := OnChannel(conn, func(ch *amqp.Channel) error {
		return ch.ExchangeDeclare(q, amqp.ExchangeFanout, true, false, false, false, nil)
	}); err != nil {
		t.Fatalf("NServiceBus's declaration of the exchange: %v", err)
	}
}
