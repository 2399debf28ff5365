package integration

import (
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/internal/testenv"
)

// The queues and exchanges the bridge shares with a framework are declared
// by the framework too, on every start or every channel, and RabbitMQ
// refuses (406, closing the channel) a declaration whose x-queue-type or
// alternate-exchange differs from the entity's (docs/contract.md §1, §2.8,
// §2.10). The functions below make exactly the declarations each framework
// makes, taken from its source at the commit named.

// mtDeclare is what a MassTransit endpoint declares on every channel it
// sends a ScheduleMessage on, to queue:quartz and through its publish
// topology, in the order ConfigureRabbitMqTopologyFilter.ConfigureTopology
// runs them (queues, exchanges, queue bindings): the send endpoint's
// exchange and queue, durable, not auto-delete, not exclusive, with empty
// arguments (RabbitMqEndpointAddress for "queue:quartz", RabbitMqSendSettings
// .GetBrokerTopology), and the contract's fanout exchange, durable, without
// arguments (RabbitMqMessagePublishTopology.Apply). MassTransit/MassTransit
// at c1e5caa9a49ba4e56dbad6ed1b9c8f7843a9dba5,
// src/Transports/MassTransit.RabbitMqTransport/RabbitMqTransport/.
func mtDeclare(ch *amqp.Channel, q string) error {
	if _, err := ch.QueueDeclare(q, true, false, false, false, amqp.Table{}); err != nil {
		return fmt.Errorf("MassTransit's declaration of queue %s: %w", q, err)
	}
	if err := ch.ExchangeDeclare(q, amqp.ExchangeFanout, true, false, false, false, amqp.Table{}); err != nil {
		return fmt.Errorf("MassTransit's declaration of exchange %s: %w", q, err)
	}
	for _, x := range []string{mtScheduleX, mtCancelX} {
		if err := ch.ExchangeDeclare(x, amqp.ExchangeFanout, true, false, false, false, amqp.Table{}); err != nil {
			return fmt.Errorf("MassTransit's declaration of exchange %s: %w", x, err)
		}
	}
	if err := ch.QueueBind(q, "", q, false, amqp.Table{}); err != nil {
		return fmt.Errorf("MassTransit's binding of %s: %w", q, err)
	}
	return nil
}

// rebusUnrouted is the alternate exchange the Rebus endpoints of these
// tests give their direct exchange (AddArgumentToDirectExchange).
const rebusUnrouted = "RebusUnrouted"

// rebusStart is what a Rebus endpoint whose input queue is input declares
// when it starts, configured with
// .ExchangeOptions(o => o.AddArgumentToDirectExchange("alternate-exchange", "RebusUnrouted")):
// its direct and topic exchanges, durable, with those arguments
// (DeclareExchanges), its input queue with the default queue options,
// durable with x-ha-policy=all (DeclareQueue, RabbitMqQueueOptionsBuilder),
// bound to the direct exchange (BindInputQueue). rebusCheck is what its
// sender does before its first deferral to the timeout manager's queue tm:
// passive declarations of the queue and the exchange, and the binding
// (CheckQueueExistence). rebus-org/Rebus.RabbitMq at
// 47590dfddee688f9d3c788b0bdb6bf22f7115c21, Rebus.RabbitMq/RabbitMq/RabbitMqTransport.cs,
// Rebus.RabbitMq/Config/RabbitMqExchangeOptionsBuilder.cs and
// Rebus.RabbitMq/Config/RabbitMqQueueOptionsBuilder.cs.
func rebusStart(ch *amqp.Channel, input string) error {
	if err := ch.ExchangeDeclare("RebusDirect", amqp.ExchangeDirect, true, false, false, false, amqp.Table{"alternate-exchange": rebusUnrouted}); err != nil {
		return fmt.Errorf("Rebus's declaration of RebusDirect: %w", err)
	}
	if err := ch.ExchangeDeclare("RebusTopics", amqp.ExchangeTopic, true, false, false, false, amqp.Table{}); err != nil {
		return fmt.Errorf("Rebus's declaration of RebusTopics: %w", err)
	}
	if _, err := ch.QueueDeclare(input, true, false, false, false, amqp.Table{"x-ha-policy": "all"}); err != nil {
		return fmt.Errorf("Rebus's declaration of its input queue: %w", err)
	}
	if err := ch.QueueBind(input, input, "RebusDirect", false, nil); err != nil {
		return fmt.Errorf("Rebus's binding of its input queue: %w", err)
	}
	return nil
}

func rebusCheck(ch *amqp.Channel, tm string) error {
	if _, err := ch.QueueDeclarePassive(tm, true, false, false, false, nil); err != nil {
		return fmt.Errorf("a Rebus sender's check of queue %s: %w", tm, err)
	}
	if err := ch.ExchangeDeclarePassive("RebusDirect", amqp.ExchangeDirect, true, false, false, false, nil); err != nil {
		return fmt.Errorf("a Rebus sender's check of RebusDirect: %w", err)
	}
	if err := ch.QueueBind(tm, tm, "RebusDirect", false, nil); err != nil {
		return fmt.Errorf("a Rebus sender's binding of %s: %w", tm, err)
	}
	return nil
}

// nsbDeclare is what an NServiceBus endpoint's installer declares for its
// own queue and its error queue in the conventional routing topology of
// queue type queueType: each queue durable, with x-queue-type quorum in the
// quorum topology and no arguments in the classic one, then the fanout
// exchange of its name, durable, not auto-delete, and the binding
// (ConventionalRoutingTopology.Initialize, CreateExchange).
// Particular/NServiceBus.RabbitMQ at ec745bf83639fcd7bd569c205a257a5ed6e7a391,
// src/NServiceBus.Transport.RabbitMQ/Routing/ConventionalRoutingTopology.cs.
func nsbDeclare(ch *amqp.Channel, queueType string, addresses ...string) error {
	var args amqp.Table
	if queueType == "quorum" {
		args = amqp.Table{"x-queue-type": "quorum"}
	}
	for _, a := range addresses {
		if _, err := ch.QueueDeclare(a, true, false, false, false, args); err != nil {
			return fmt.Errorf("NServiceBus's declaration of queue %s: %w", a, err)
		}
		if err := ch.ExchangeDeclare(a, amqp.ExchangeFanout, true, false, false, false, nil); err != nil {
			return fmt.Errorf("NServiceBus's declaration of exchange %s: %w", a, err)
		}
		if err := ch.QueueBind(a, "", a, false, nil); err != nil {
			return fmt.Errorf("NServiceBus's binding of %s: %w", a, err)
		}
	}
	return nil
}

// TestFrameworksDeclarationsAndTheBridges: with DELAYBRIDGE_QUEUE_TYPE
// classic and quorum, the frameworks' own declarations of what they share
// with the bridge (MassTransit's scheduler queue and exchanges, Rebus's
// direct exchange with an alternate exchange and the timeout manager queue,
// an NServiceBus endpoint's error queue, shared with the bridge's) succeed
// on one channel, none refused and the channel never closed, whether they
// ran before the bridge started or only after; and each framework's
// schedule still works: MassTransit's ScheduleSend, Rebus's Defer,
// NServiceBus's RequestTimeout through the conventional topology. Each case
// has a vhost of its own: the names are every endpoint's on a vhost.
func TestFrameworksDeclarationsAndTheBridges(t *testing.T) {
	t.Parallel()
	for _, queueType := range []string{"classic", "quorum"} {
		for _, frameworksFirst := range []bool{true, false} {
			name := queueType + "/bridge-first"
			if frameworksFirst {
				name = queueType + "/frameworks-first"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				frameworksAndBridge(t, queueType, frameworksFirst)
			})
		}
	}
}

func frameworksAndBridge(t *testing.T, queueType string, frameworksFirst bool) {
	vhostURL, _ := testenv.Vhost(t)
	conn, err := amqp.Dial(vhostURL)
	if err != nil {
		t.Fatalf("dial the test's vhost: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	const ep, quartz, tm, billing, shop = "bridge", "quartz", "timeouts", "billing", "Shop"
	const errorQ = "error"
	declareAll := func(when string) {
		t.Helper()
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		defer ch.Close()
		declarations := []func() error{
			func() error { return mtDeclare(ch, quartz) },
			func() error { return rebusStart(ch, billing) },
			func() error { return nsbDeclare(ch, queueType, shop, errorQ) },
		}
		if when == "after" {
			// A Rebus sender needs the timeout manager's queue: the bridge.
			declarations = append(declarations, func() error { return rebusCheck(ch, tm) })
		}
		for _, declare := range declarations {
			if err := declare(); err != nil {
				t.Fatalf("%s the bridge started: %v", when, err)
			}
		}
		if ch.IsClosed() {
			t.Fatalf("%s the bridge started: the channel was closed", when)
		}
	}
	if frameworksFirst {
		declareAll("before")
	}
	b := startBridge(t, map[string]string{
		"DELAYBRIDGE_AMQP_URL": vhostURL, "DELAYBRIDGE_ENDPOINT": ep, "DELAYBRIDGE_ERROR_QUEUE": errorQ,
		"DELAYBRIDGE_QUEUE_TYPE": queueType, "DELAYBRIDGE_POLL_INTERVAL": "100ms",
		"DELAYBRIDGE_MASSTRANSIT_QUEUE": quartz,
		"DELAYBRIDGE_REBUS_QUEUE":       tm, "DELAYBRIDGE_REBUS_DIRECT_EXCHANGE_ARGUMENTS": "alternate-exchange=" + rebusUnrouted,
	})
	declareAll("after")
	// And again on a new channel, as a restarted endpoint would.
	declareAll("after")

	// MassTransit: the destination as a receive endpoint declares it, and
	// a ScheduleSend through the scheduler queue's exchange.
	declareExchange(t, conn, billing+".mt", amqp.ExchangeFanout)
	mtC := bindAndConsume(t, conn, billing+".mt", billing+".mt", "", nil)
	// Rebus: its input queue, which rebusDeclare bound to RebusDirect.
	rebusC := consume(t, conn, billing)
	// NServiceBus: the endpoint's queue.
	nsbC := consume(t, conn, shop)
	pub := newPublisher(t, conn)
	start := time.Now()
	mtMsg, mtFwd, mtH := mtSchedule("3c0b0000-5d3f-0015-2b1e-000000000001", "9f1c2a7e-4b3d-4e8f-a1c2-000000000001",
		"queue:"+billing+".mt", start.Add(time.Second), `{"invoiceId":1}`)
	pub.PublishTo(quartz, "", mtMsg)
	rebusMsg, rebusDue := rebusDeferred("rebus-1", billing, start.Add(time.Second), "1")
	pub.PublishTo("RebusDirect", tm, rebusMsg)
	nsbMsg, nsbDue := nsbSagaTimeout("nsb-1", "5e6f7a8b-0000-4c1d-9e2f-000000000003", shop, shop, start.Add(time.Second))
	pub.PublishTo(b.TimeoutsQueue(), "", nsbMsg)

	mtScheduled(t, mtC.WaitFor(1, livenessBound)[0], mtMsg, mtFwd, mtH, start.Add(time.Second).Truncate(100), billing+".mt")
	forwardedAs(t, rebusC.WaitFor(1, livenessBound)[0], rebusMsg, rebusDue, "RebusDirect", billing)
	nsbForwardedAs(t, nsbC.WaitFor(1, livenessBound)[0], nsbMsg, nsbDue, shop)
	if !b.Running() {
		t.Fatalf("the bridge exited with code %d", b.Wait(0))
	}
}
