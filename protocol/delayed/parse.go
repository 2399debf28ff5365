package delayed

import (
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/intake"
	"github.com/delaybridge/delaybridge/message"
	"github.com/delaybridge/delaybridge/wire"
)

// Sources reads what is published to the delayed exchanges: a source of
// E.Timeouts for the deliveries that came through them, told apart by the
// exchange a delivery was published to (intake.MergeSources). None without
// delayed exchanges.
func (p Protocol) Sources() []intake.Source {
	if len(p.Exchanges) == 0 {
		return nil
	}
	routes := make(map[string]string, len(p.Exchanges))
	names := make([]string, len(p.Exchanges))
	for i, x := range p.Exchanges {
		routes[x.Name], names[i] = x.Route(), x.Name
	}
	return []intake.Source{{Name: "delayed", Queue: p.TimeoutsQueue, Exchanges: names,
		Parser: intake.ParserFunc(func(d *amqp.Delivery, receivedAt time.Time) intake.Intake {
			return parse(d, receivedAt, routes[d.Exchange])
		})}}
}

// Reserved: none; E.Timeouts is the bridge's own.
func (Protocol) Reserved() []string { return nil }

// Routes are the routing exchanges, where the bridge forwards: the operator
// named them already, so the allowed destinations need not.
func (p Protocol) Routes() []string {
	routes := make([]string, len(p.Exchanges))
	for i, x := range p.Exchanges {
		routes[i] = x.Route()
	}
	return routes
}

// parse reads a delivery published to a delayed exchange as the
// delayed-message-exchange plugin would, whatever the bridge's own headers
// say: it goes to route with its routing key, x-delay milliseconds after
// receivedAt (zero, negative or void: now). Unlike the plugin, an x-delay it
// cannot read is refused rather than routed at once, and a delay too long
// for the plugin's timer is honoured.
func parse(d *amqp.Delivery, receivedAt time.Time, route string) intake.Intake {
	var ms int64
	if v := d.Headers[wire.HeaderDelay]; v != nil {
		var err error
		if ms, err = intake.ParseDelay(v); err != nil {
			return intake.Reject(err)
		}
	}
	due := receivedAt
	if ms > 0 {
		var err error
		if due, err = intake.InRange(wire.HeaderDelay, receivedAt.Add(time.Duration(ms)*time.Millisecond)); err != nil {
			return intake.Reject(err)
		}
	}
	id, err := intake.ParseID(d)
	if err != nil {
		return intake.Reject(err)
	}
	msg := broker.Forwardable(message.FromDelivery(d), nil) // a copy of the headers
	if ms > 0 {
		// The plugin's mark of a delayed message, which Spring AMQP reads
		// as the received delay: x-delay negated, whatever its type was.
		msg.Headers[wire.HeaderDelay] = -ms
	}
	// Every publish is a send of its own, as the plugin delivers each:
	// never taken for a redelivery (docs/contract.md §2.7).
	return intake.Intake{Op: intake.OpSchedule, ID: id, Exchange: route, Destination: d.RoutingKey, DueAt: due, Msg: msg, NewSend: true}
}
