package nsbtimeout

import (
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/intake"
)

// Protocol is E.Timeouts, Queue.
type Protocol struct {
	Queue string
}

// Sources is the intake of Queue.
func (p Protocol) Sources() []intake.Source { return []intake.Source{TimeoutsSource(p.Queue)} }

// Topology is NServiceBus's conventional exchange of Queue: NServiceBus
// endpoints send timeouts to E.Timeouts, and ServiceControl sends back the
// error copies that name it in NServiceBus.FailedQ, the way their routing
// topology sends to any address; the default one publishes to an exchange
// of its name (docs/contract.md §1).
func (p Protocol) Topology() []broker.ForeignQueue {
	return []broker.ForeignQueue{broker.ConventionalExchange(p.Queue)}
}

// Declare declares Topology.
func (p Protocol) Declare(conn *amqp.Connection) error {
	return broker.DeclareForeign(conn, p.Topology()...)
}

// Reserved: none of its own; E.Timeouts is the bridge's.
func (Protocol) Reserved() []string { return nil }

// Routes: none; destinations are what the headers name.
func (Protocol) Routes() []string { return nil }

// Stamp is Stamper's.
func (Protocol) Stamp(msg amqp.Publishing, id string, sentAt time.Time) amqp.Publishing {
	return Stamper{}.Stamp(msg, id, sentAt)
}
