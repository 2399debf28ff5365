package bridge

import (
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/config"
	"github.com/delaybridge/delaybridge/dispatch"
	"github.com/delaybridge/delaybridge/intake"
	"github.com/delaybridge/delaybridge/protocol/delayed"
	"github.com/delaybridge/delaybridge/protocol/masstransit"
	"github.com/delaybridge/delaybridge/protocol/nsbnative"
	"github.com/delaybridge/delaybridge/protocol/nsbtimeout"
	"github.com/delaybridge/delaybridge/protocol/rebus"
	"github.com/delaybridge/delaybridge/recurring"
	"github.com/delaybridge/delaybridge/wire"
)

// protocol is one intake protocol, a package under protocol/
// (docs/contract.md §2). One the configuration leaves off has nothing of
// any. A protocol that adds something to a forward is a dispatch.Stamper
// too, stamping whether it is on or not: rows stored while it was on are
// forwarded after it is turned off.
type protocol interface {
	// Sources are the queues it consumes, each with its parser; sources
	// of one queue share its consumer (intake.MergeSources).
	Sources() []intake.Source
	// Declare declares what it needs on the broker, on every new
	// connection, after the bridge's own queues.
	Declare(*amqp.Connection) error
	// Reserved are queues no message may be forwarded to: its intake
	// queues, where a forward would come straight back.
	Reserved() []string
	// Routes are the exchanges it forwards to, allowed whatever
	// DELAYBRIDGE_ALLOWED_DESTINATIONS says: the configuration named them.
	Routes() []string
}

// fireStamper is a protocol that makes recurring schedules of its own and
// writes their fires (recurring.FireStamper), whether it is on or not: its
// schedules stored while it was on fire after it is turned off.
type fireStamper interface {
	recurring.FireStamper
	// ScheduleSource is the storage.Schedule.Source of its schedules.
	ScheduleSource() string
}

// protocols are every intake protocol, as cfg configures it.
func protocols(cfg config.Config) []protocol {
	timeouts := wire.TimeoutsQueue(cfg.Endpoint)
	return []protocol{
		nsbtimeout.Protocol{Queue: timeouts},
		delayed.Protocol{TimeoutsQueue: timeouts, Exchanges: cfg.DelayedExchangeList()},
		// Rebus's external timeout manager (docs/contract.md §2.8).
		rebus.Options{Queue: cfg.RebusQueue, DirectExchange: cfg.RebusDirectExchange, QueueType: cfg.QueueType,
			DirectExchangeArgs: cfg.RebusDirectExchangeArguments()},
		// MassTransit's message scheduler (docs/contract.md §2.10).
		masstransit.Options{Queue: cfg.MassTransitQueue},
		nsbnative.Protocol{On: cfg.NSBNativeDelays},
	}
}

// intakes is what the protocols add up to.
type intakes struct {
	sources  []intake.Source
	reserved []string // besides the bridge's own queues
	routes   []string
	stamp    dispatch.Stampers
	// fires are the protocols' own fire formats of recurring schedules,
	// by schedule source (recurring.Options.Stampers).
	fires   map[string]recurring.FireStamper
	declare func(*amqp.Connection) error
}

// intakeOf adds up ps.
func intakeOf(ps []protocol) intakes {
	var in intakes
	for _, p := range ps {
		in.sources = append(in.sources, p.Sources()...)
		in.reserved = append(in.reserved, p.Reserved()...)
		in.routes = append(in.routes, p.Routes()...)
		if s, ok := p.(dispatch.Stamper); ok {
			in.stamp = append(in.stamp, s)
		}
		if f, ok := p.(fireStamper); ok {
			if in.fires == nil {
				in.fires = map[string]recurring.FireStamper{}
			}
			in.fires[f.ScheduleSource()] = f
		}
	}
	in.declare = func(conn *amqp.Connection) error {
		for _, p := range ps {
			if err := p.Declare(conn); err != nil {
				return err
			}
		}
		return nil
	}
	return in
}
