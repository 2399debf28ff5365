package broker

import (
	"errors"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"
)

// ForeignQueue is an intake queue that a framework's senders publish to
// through an exchange of the framework's (Rebus's timeout manager queue
// behind RebusDirect). The framework's endpoints may have declared the queue
// or the exchange already; so the bridge declares each only when it is
// missing, and then exactly as the framework declares it (QueueArgs,
// ExchangeArgs), so that the framework's own declaration, made before or
// after, is never refused; an existing one is left as it is. Then it binds
// the queue to the exchange, as the senders themselves do.
type ForeignQueue struct {
	Queue string
	// QueueArgs are the arguments of a queue the bridge declares (durable).
	QueueArgs amqp.Table
	Exchange  string
	// ExchangeType and ExchangeArgs are the type and arguments of an
	// exchange the bridge declares (durable, not auto-delete).
	ExchangeType string
	ExchangeArgs amqp.Table
	RoutingKey   string
}

// ConventionalExchange is what NServiceBus's conventional routing topology,
// its default, declares for an address it sends to: a durable fanout
// exchange of the address's name, no arguments, bound to the queue of that
// name with an empty routing key. Its senders publish to that exchange,
// mandatory, so an address without it refuses every send with 404 and
// closes the sender's channel (Particular/NServiceBus.RabbitMQ,
// src/NServiceBus.Transport.RabbitMQ/Routing/ConventionalRoutingTopology.cs:
// Send, Initialize, CreateExchange; the same since the 1.x transport's
// src/NServiceBus.RabbitMQ/Routing/ConventionalRoutingTopology.cs). The
// queue must be declared before (docs/contract.md §1).
func ConventionalExchange(queue string) ForeignQueue {
	return ForeignQueue{Queue: queue, Exchange: queue, ExchangeType: amqp.ExchangeFanout}
}

// DeclareForeign declares every foreign queue fs, its exchange and its
// binding (ForeignQueue), each step on a channel of its own: a passive
// declaration of what is missing closes its channel.
func DeclareForeign(conn *amqp.Connection, fs ...ForeignQueue) error {
	for _, f := range fs {
		err := declareMissing(conn, func(ch *amqp.Channel) error {
			return ch.ExchangeDeclarePassive(f.Exchange, f.ExchangeType, true, false, false, false, nil)
		}, func(ch *amqp.Channel) error {
			return ch.ExchangeDeclare(f.Exchange, f.ExchangeType, true, false, false, false, f.ExchangeArgs)
		})
		if err != nil {
			return fmt.Errorf("declare exchange %q: %w", f.Exchange, err)
		}
		err = declareMissing(conn, func(ch *amqp.Channel) error {
			_, err := ch.QueueDeclarePassive(f.Queue, true, false, false, false, nil)
			return err
		}, func(ch *amqp.Channel) error {
			_, err := ch.QueueDeclare(f.Queue, true, false, false, false, f.QueueArgs)
			return err
		})
		if err != nil {
			return fmt.Errorf("declare queue %q: %w", f.Queue, err)
		}
		err = OnChannel(conn, func(ch *amqp.Channel) error { return ch.QueueBind(f.Queue, f.RoutingKey, f.Exchange, false, nil) })
		if err != nil {
			return fmt.Errorf("bind queue %q to exchange %q with routing key %q: %w", f.Queue, f.Exchange, f.RoutingKey, err)
		}
	}
	return nil
}

// declareMissing runs declare when exists fails with not-found, each on a
// channel of its own. Whatever exists is left as it is, whatever its
// properties: a passive declaration compares none of them.
func declareMissing(conn *amqp.Connection, exists, declare func(*amqp.Channel) error) error {
	err := OnChannel(conn, exists)
	var ae *amqp.Error
	if errors.As(err, &ae) && ae.Code == amqp.NotFound {
		return OnChannel(conn, declare)
	}
	return err
}

// OnChannel runs fn on a new channel of conn and closes it: for a
// declaration that, refused, closes its channel.
func OnChannel(conn *amqp.Connection, fn func(*amqp.Channel) error) error {
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	defer ch.Close()
	return fn(ch)
}
