package nsbnative

import (
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/intake"
	"github.com/delaybridge/delaybridge/wire/nsbdelay"
)

// Protocol is what DELAYBRIDGE_NSB_NATIVE_DELAYS adds when On
// (docs/contract.md §2.9): a source per delay-level queue of the
// NServiceBus transport's v2 and v1 chains; their delivery exchanges, where
// the bridge forwards, pass the allow-list; and their level queues are no
// destination (a forward there would come straight back).
type Protocol struct {
	On bool
}

func (p Protocol) chains() []nsbdelay.Chain {
	if !p.On {
		return nil
	}
	return []nsbdelay.Chain{nsbdelay.V2, nsbdelay.V1}
}

// Sources are the chains' level queues (Sources).
func (p Protocol) Sources() []intake.Source { return Sources(p.chains()...) }

// Declare declares nothing: the endpoints' installers declare the chains,
// and each source waits for its queue.
func (Protocol) Declare(*amqp.Connection) error { return nil }

// Reserved are the chains' level queues.
func (p Protocol) Reserved() []string {
	var reserved []string
	for _, c := range p.chains() {
		for k := range nsbdelay.Levels {
			reserved = append(reserved, c.Level(k))
		}
	}
	return reserved
}

// Routes are the chains' delivery exchanges.
func (p Protocol) Routes() []string {
	var exchanges []string
	for _, c := range p.chains() {
		exchanges = append(exchanges, c.Delivery)
	}
	return exchanges
}
