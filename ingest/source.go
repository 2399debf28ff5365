package ingest

import (
	"fmt"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/message"
	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/wire"
)

// Source is one intake queue and the parser of its wire format. Adding a
// protocol means adding a Parser and a Source; ingest does the rest (rules,
// ids, group commit, the error queue, settling).
type Source struct {
	// Name identifies the source in logs and consumer tags ("timeouts").
	Name   string
	Queue  string
	Parser Parser
	// Setup, when set, runs on every new channel before consuming: for
	// the declarations and bindings the source needs.
	Setup func(*amqp.Channel) error
	// MustExist: Queue is someone else's; consume it once it exists
	// (broker.ConsumeOptions.MustExist).
	MustExist bool
	// Gate, when set, is a queue whose existence means Queue exists too
	// (say, the last one its owner's installer declares): the source
	// waits for it first. Sources naming the same gate share one check,
	// so a family of missing queues costs the broker one check per pause.
	Gate string
}

// Parser turns one delivery into what ingest should do with it. It must not
// keep d.
type Parser interface {
	Parse(d *amqp.Delivery, receivedAt time.Time) Intake
}

// ParserFunc makes a function a Parser.
type ParserFunc func(d *amqp.Delivery, receivedAt time.Time) Intake

// Parse calls f.
func (f ParserFunc) Parse(d *amqp.Delivery, receivedAt time.Time) Intake { return f(d, receivedAt) }

// Op is what a delivery asks for.
type Op uint8

// What a delivery may ask for.
const (
	// OpReject: the delivery is invalid; it goes to the error queue with Reason.
	OpReject Op = iota
	// OpSchedule: store Msg for Destination at DueAt.
	OpSchedule
	// OpCancel: cancel the pending message CancelID. A cancel ends its
	// batch, so it applies to everything received before it.
	OpCancel
	// OpCancelSaga: cancel every pending timeout of saga SagaID. It ends
	// its batch as OpCancel does.
	OpCancelSaga
	// OpReplace: cancel every pending timeout of saga SagaID, then store
	// Msg as OpSchedule does, with that saga id: the message replaces the
	// group's earlier ones (MassTransit's schedule token). The removed rows
	// get tombstones, the saga id none, so ID must be new to the store (a
	// redelivery that reuses an id would find it cancelled). The replaces
	// of a batch, of distinct groups, are one commit with its other
	// messages (storage.GroupReplacer); a replace of a group that an
	// earlier message of the batch belongs to starts the next batch.
	OpReplace
)

// endsBatch reports whether op ends its batch: a cancel applies to
// everything received before it and to nothing after it.
func (op Op) endsBatch() bool { return op == OpCancel || op == OpCancelSaga }

// stores reports whether op stores a message.
func (op Op) stores() bool { return op == OpSchedule || op == OpReplace }

// Intake is a parser's reading of one delivery.
type Intake struct {
	Op Op

	// OpSchedule. An empty ID has the bridge assign one, which it also
	// sets as Msg's message-id. Msg is the message exactly as it is to be
	// forwarded (the parser drops its protocol's delay headers).
	// Destination is the queue, or with Exchange set, the routing key to
	// publish with to that exchange (as storage.Timeout).
	ID          string
	Destination string
	Exchange    string
	DueAt       time.Time
	Msg         amqp.Publishing
	// SagaID: for OpSchedule the saga the message belongs to, if any
	// (storage.Timeout.SagaID); for OpCancelSaga the saga to cancel; for
	// OpReplace the group to replace, which the message then belongs to.
	SagaID string
	// NewSend: the delivery is never a redelivery of a pending send, even
	// when it matches one (docs/contract.md §2.4); otherwise a delivery
	// matching a pending send of its id that is not being dispatched is
	// taken for a redelivery of it (message.Fingerprint).
	NewSend bool

	// OpCancel.
	CancelID string

	// OpReject: why, in words; it lands in the error copy's headers.
	Reason string
}

// Validate applies the rules every id and destination that reaches a store
// obeys (wire.ValidateID, wire.ValidateDestination) to what a parser
// produced, so that a parser that forgot them cannot hand the store a value
// it refuses. An empty ID of OpSchedule is fine: the bridge assigns one.
func (it *Intake) Validate() error {
	switch it.Op {
	case OpSchedule, OpReplace:
		if it.Op == OpReplace {
			if err := wire.ValidateID("replaced group", it.SagaID); err != nil {
				return err
			}
		}
		if err := it.Dest().Validate("destination"); err != nil {
			return err
		}
		if it.ID != "" {
			if err := wire.ValidateID("message id", it.ID); err != nil {
				return err
			}
		}
		if it.SagaID != "" {
			if err := wire.ValidateID("saga id", it.SagaID); err != nil {
				return err
			}
		}
		return storage.CheckDueAt(it.DueAt)
	case OpCancel:
		return wire.ValidateID("cancelled id", it.CancelID)
	case OpCancelSaga:
		return wire.ValidateID("saga id", it.SagaID)
	case OpReject:
		return nil
	}
	// A parser's bug: such an entry would be neither stored nor moved, and
	// requeued forever.
	return fmt.Errorf("parser returned an unknown operation %d", it.Op)
}

// Dest is where an OpSchedule or OpReplace intake goes.
func (it *Intake) Dest() wire.Destination {
	return wire.Destination{Exchange: it.Exchange, Key: it.Destination}
}

// Reject is the Intake of an invalid delivery.
func Reject(err error) Intake { return Intake{Op: OpReject, Reason: err.Error()} }

// TimeoutsSource is E.Timeouts (docs/contract.md §2): messages with the
// bridge's own headers, and those published to the delayed exchanges bound
// to it (§2.7), told apart by the exchange a delivery was published to.
func TimeoutsSource(queue string, delayed ...broker.DelayedExchange) Source {
	if len(delayed) == 0 {
		return Source{Name: "ingest", Queue: queue, Parser: ParserFunc(ParseHeaders)}
	}
	routes := make(map[string]string, len(delayed))
	for _, x := range delayed {
		routes[x.Name] = x.Route()
	}
	return Source{Name: "ingest", Queue: queue, Parser: ParserFunc(func(d *amqp.Delivery, receivedAt time.Time) Intake {
		// The default exchange ("") is never a delayed one (config).
		if route, ok := routes[d.Exchange]; ok {
			return parseDelayed(d, receivedAt, route)
		}
		return ParseHeaders(d, receivedAt)
	})}
}

// parseDelayed reads a delivery published to a delayed exchange as the
// delayed-message-exchange plugin would, whatever the bridge's own headers
// say: it goes to route with its routing key, x-delay milliseconds after
// receivedAt (zero, negative or void: now). Unlike the plugin, an x-delay it
// cannot read is refused rather than routed at once, and a delay too long
// for the plugin's timer is honoured.
func parseDelayed(d *amqp.Delivery, receivedAt time.Time, route string) Intake {
	var ms int64
	if v := d.Headers[wire.HeaderDelay]; v != nil {
		var err error
		if ms, err = parseDelay(v); err != nil {
			return Reject(err)
		}
	}
	due := receivedAt
	if ms > 0 {
		var err error
		if due, err = inRange(wire.HeaderDelay, receivedAt.Add(time.Duration(ms)*time.Millisecond)); err != nil {
			return Reject(err)
		}
	}
	id, err := messageID(d)
	if err != nil {
		return Reject(err)
	}
	msg := broker.Forwardable(message.FromDelivery(d), nil) // a copy of the headers
	if ms > 0 {
		// The plugin's mark of a delayed message, which Spring AMQP reads
		// as the received delay: x-delay negated, whatever its type was.
		msg.Headers[wire.HeaderDelay] = -ms
	}
	// Every publish is a send of its own, as the plugin delivers each:
	// never taken for a redelivery (docs/contract.md §2.7).
	return Intake{Op: OpSchedule, ID: id, Exchange: route, Destination: d.RoutingKey, DueAt: due, Msg: msg, NewSend: true}
}

// ParseHeaders reads a delivery to E.Timeouts: a cancel (x-delaybridge-cancel),
// NServiceBus's request to clear a saga's timeouts (NServiceBus.ClearTimeouts)
// or a message to schedule (destination, due time and id headers, and the
// saga it belongs to).
func ParseHeaders(d *amqp.Delivery, receivedAt time.Time) Intake {
	if _, ok := d.Headers[wire.HeaderCancel]; ok {
		id, err := cancelID(d)
		if err != nil {
			return Reject(err)
		}
		return Intake{Op: OpCancel, CancelID: id}
	}
	if v, ok := d.Headers[wire.HeaderNSBClearTimeouts]; ok && v != nil {
		saga, err := clearTimeoutsSaga(d.Headers)
		if err != nil {
			return Reject(err)
		}
		return Intake{Op: OpCancelSaga, SagaID: saga}
	}
	var it Intake
	if IsRetry(d.Headers) {
		// A dispatch failure retried from ServicePulse: due now, to where
		// it was going (docs/contract.md §4.6).
		it = ParseRetry(d, receivedAt)
	} else {
		p, err := Parse(d, receivedAt)
		if err != nil {
			return Reject(err)
		}
		it = Intake{Op: OpSchedule, ID: p.ID, Destination: p.Destination.Key, Exchange: p.Destination.Exchange, DueAt: p.DueAt,
			Msg: broker.Forwardable(message.FromDelivery(d), wire.DueTimeHeaders)}
		if isNSBTimeout(d.Headers) {
			it.Msg = markNSBTimeout(it.Msg)
		}
	}
	if it.Op == OpReject {
		return it
	}
	saga, _, err := headerString(d.Headers, wire.HeaderNSBSagaID)
	if err != nil {
		return Reject(err)
	}
	it.SagaID = strings.TrimSpace(saga)
	return it
}

// noSaga is Guid.Empty as .NET writes it: no saga instance.
const noSaga = "00000000-0000-0000-0000-000000000000"

// clearTimeoutsSaga reads the saga whose timeouts a ClearTimeouts message
// cancels. NServiceBus's timeout manager (3.x to 7.x: TimeoutMessageProcessor,
// later StoreTimeoutBehavior) acts on the header's presence, whatever its
// value and body, and refuses a missing or empty saga id: "clear timeouts is
// only supported for saga instances". Saga ids are compared as the text the
// sender wrote (Guid.ToString(), lower-case "D" form, in every version).
func clearTimeoutsSaga(h amqp.Table) (string, error) {
	saga, _, err := headerString(h, wire.HeaderNSBSagaID)
	if err != nil {
		return "", err
	}
	saga = strings.TrimSpace(saga)
	if saga == "" || saga == noSaga {
		return "", fmt.Errorf("header %s needs header %s naming the saga whose timeouts to cancel (clearing is for saga instances only)",
			wire.HeaderNSBClearTimeouts, wire.HeaderNSBSagaID)
	}
	if err := wire.ValidateID("header "+wire.HeaderNSBSagaID, saga); err != nil {
		return "", err
	}
	return saga, nil
}

// cancelID validates a cancel message and returns the id it names.
func cancelID(d *amqp.Delivery) (string, error) {
	id, _, err := headerString(d.Headers, wire.HeaderCancel)
	switch {
	case err != nil:
		return "", err
	case strings.TrimSpace(id) == "":
		return "", fmt.Errorf("header %s is empty: it must name the message-id to cancel", wire.HeaderCancel)
	case len(d.Body) > 0:
		return "", fmt.Errorf("a message with header %s cancels and must have no body (this one has %d bytes)", wire.HeaderCancel, len(d.Body))
	}
	// The same rules as every stored id: an id no message can have (NUL,
	// invalid UTF-8) is this message's error, never a store call that
	// PostgreSQL refuses and the store breaker counts as an outage.
	if err := wire.ValidateID("header "+wire.HeaderCancel, id); err != nil {
		return "", err
	}
	return id, nil
}
