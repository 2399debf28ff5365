package bench

import (
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/internal/nsbendpoint"
	"github.com/delaybridge/delaybridge/wire/nsbdelay"
)

// The TTL + dead-letter delay topology that transports build when the broker
// has no delay plugin: NServiceBus's RabbitMQ transport's chain of 28 levels
// (package wire/nsbdelay), declared as its installer does
// (internal/nsbendpoint), under names of the bench's own so that it never
// meets a real one. Senders publish with nsbdelay.RoutingKey to the level of
// the delay's highest set bit; the delivery exchange routes #.<destination>
// to the destination queue.

// ttlTopology is one instance of the chain.
type ttlTopology struct {
	chain     nsbdelay.Chain
	queueType string // quorum (NServiceBus v2) or classic (v1)
}

func newTTLTopology(prefix, queueType string) ttlTopology {
	return ttlTopology{queueType: queueType, chain: nsbdelay.Chain{
		Version: queueType, LevelPrefix: prefix + "-L", Delivery: prefix + "-deliver", Quorum: queueType == "quorum"}}
}

// declare builds the chain, registering everything with reg first for the
// teardown.
func (t ttlTopology) declare(ch *amqp.Channel, reg *registry) error {
	reg.exchange(t.chain.Delivery)
	for k := 0; k < nsbdelay.Levels; k++ {
		reg.exchange(t.chain.Level(k))
		reg.queue(t.chain.Level(k))
	}
	return nsbendpoint.Install(ch, t.chain)
}
