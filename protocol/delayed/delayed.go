// Package delayed serves the delayed exchanges (docs/contract.md §2.7), the
// replacement of delayed-message-exchange plugin exchanges: their topology,
// bound to E.Timeouts, and the reading of what is published to them.
package delayed

import (
	"errors"
	"fmt"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/wire"
)

// Exchange is one delayed exchange (docs/contract.md §2.7), the
// replacement of a delayed-message-exchange plugin exchange: publishers send
// to Name as before; a message without x-delay goes on at once through the
// routing exchange Route(), of Type, where consumers bind; one with x-delay
// goes to E.Timeouts, and the bridge forwards it to Route() when due.
type Exchange struct {
	Name string
	Type string // direct, topic, fanout or headers: the plugin's x-delayed-type
}

// Route is the routing exchange consumers bind to.
func (x Exchange) Route() string { return wire.DelayedRoute(x.Name) }

// Types are the routing exchange's types the bridge declares.
var Types = []string{amqp.ExchangeDirect, amqp.ExchangeTopic, amqp.ExchangeFanout, amqp.ExchangeHeaders}

// A headers binding whose x-match is any-with-x matches when any of its
// arguments matches, x- headers included (plain any ignores them); a void
// value matches on the header's presence alone. RabbitMQ 3.10 added it.
const (
	argAlternateExchange = "alternate-exchange"
	argMatch             = "x-match"
	matchAnyWithX        = "any-with-x"
)

// Protocol is the delayed exchanges of one endpoint, bound to its
// E.Timeouts, TimeoutsQueue.
type Protocol struct {
	TimeoutsQueue string
	Exchanges     []Exchange
}

// Declare declares the exchanges of every delayed exchange, durable, and
// binds each to E.Timeouts (the queues must exist: broker.Topology.Declare
// first). Each declaration has a channel of its own, because a refused one
// closes its channel. It never deletes anything; an existing exchange with
// other properties is an error wrapping broker.ErrTopologyConflict that says
// what to change.
func (p Protocol) Declare(conn *amqp.Connection) error {
	for _, x := range p.Exchanges {
		route := x.Route()
		err := broker.OnChannel(conn, func(ch *amqp.Channel) error {
			return ch.ExchangeDeclare(route, x.Type, true, false, false, false, nil)
		})
		if err != nil {
			return declareError(route, fmt.Sprintf("a durable %s exchange, the routing exchange of delayed exchange %q", x.Type, x.Name), err)
		}
		err = broker.OnChannel(conn, func(ch *amqp.Channel) error {
			return ch.ExchangeDeclare(x.Name, amqp.ExchangeHeaders, true, false, false, false, amqp.Table{argAlternateExchange: route})
		})
		if err != nil {
			return declareError(x.Name, fmt.Sprintf("a durable headers exchange with alternate-exchange %q", route), err)
		}
		err = broker.OnChannel(conn, func(ch *amqp.Channel) error {
			return ch.QueueBind(p.TimeoutsQueue, "", x.Name, false, amqp.Table{argMatch: matchAnyWithX, wire.HeaderDelay: nil})
		})
		if err != nil {
			return bindError(x.Name, p.TimeoutsQueue, err)
		}
	}
	return nil
}

// OwnBinding reports whether a binding of a delayed exchange, to a
// queue named destination (isQueue) with arguments args as the management
// API lists them, is the one Declare makes to timeoutsQueue. The API
// writes the void x-delay as the string "undefined" (RabbitMQ 3.10's
// rabbit_mgmt_format) or as null. Any other binding on a delayed exchange is foreign: on a
// headers exchange a binding without arguments matches every message, so
// its destination gets each message published to the exchange at once,
// delays ignored, and while it matches the broker skips the alternate
// exchange (docs/contract.md §2.7).
func OwnBinding(timeoutsQueue string, isQueue bool, destination string, args map[string]any) bool {
	return isQueue && destination == timeoutsQueue && BindingArgs(args)
}

// BindingArgs reports whether args, as the management API lists a
// binding's arguments, are those of the binding Declare makes: of
// this bridge's or of another endpoint's.
func BindingArgs(args map[string]any) bool {
	if len(args) != 2 || args[argMatch] != matchAnyWithX {
		return false
	}
	v, ok := args[wire.HeaderDelay]
	return ok && (v == nil || v == "undefined")
}

// bindError explains a refused binding; a broker older than 3.10 refuses
// its x-match.
func bindError(exchange, queue string, err error) error {
	var ae *amqp.Error
	if errors.As(err, &ae) && ae.Code == amqp.PreconditionFailed && strings.Contains(ae.Reason, "x-match") {
		return fmt.Errorf("bind exchange %q to queue %q: %w (x-match %s needs RabbitMQ 3.10 or later)", exchange, queue, err, matchAnyWithX)
	}
	return fmt.Errorf("bind exchange %q to queue %q: %w", exchange, queue, err)
}

// declareError explains a refused exchange declaration: on a conflict, what
// exists (in the broker's words), what the bridge needs and what to change.
func declareError(name, needs string, err error) error {
	var ae *amqp.Error
	if !errors.As(err, &ae) || ae.Code != amqp.PreconditionFailed {
		return fmt.Errorf("declare exchange %q: %w", name, err)
	}
	return fmt.Errorf("exchange %q %w (the broker says: %s); DELAYBRIDGE_DELAYED_EXCHANGES needs it as %s: "+
		"delete the existing exchange once nothing uses it (drain a delayed-message-exchange plugin exchange first), "+
		"or pick another name", name, broker.ErrTopologyConflict, ae.Reason, needs)
}
