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
	// Exchanges, when set, make the source the reader of the deliveries
	// published to Queue through these exchanges, a queue another source
	// consumes (MergeSources): a protocol whose exchanges are bound to
	// another's queue (delayed exchanges, docs/contract.md §2.7).
	Exchanges []string
}

// MergeSources makes the sources of one queue one source: that of the
// source naming no Exchanges (the queue's own), reading a delivery published
// through an exchange another source names with that source's parser. The
// order of first appearance is kept. A queue only sources with Exchanges
// read takes the first of them as its own.
func MergeSources(srcs []Source) []Source {
	var out []Source
	at := map[string]int{}                   // queue → index in out
	routes := map[string]map[string]Parser{} // queue → exchange → parser
	for _, s := range srcs {
		i, seen := at[s.Queue]
		if !seen {
			at[s.Queue], i = len(out), len(out)
			out = append(out, s)
		} else if len(out[i].Exchanges) > 0 && len(s.Exchanges) == 0 {
			out[i], s = s, out[i]
		}
		for _, x := range s.Exchanges {
			if routes[s.Queue] == nil {
				routes[s.Queue] = map[string]Parser{}
			}
			routes[s.Queue][x] = s.Parser
		}
	}
	for q, byExchange := range routes {
		own := out[at[q]]
		own.Exchanges = nil
		base := own.Parser
		own.Parser = ParserFunc(func(d *amqp.Delivery, receivedAt time.Time) Intake {
			if p, ok := byExchange[d.Exchange]; ok {
				return p.Parse(d, receivedAt)
			}
			return base.Parse(d, receivedAt)
		})
		out[at[q]] = own
	}
	return out
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
	// OpRecur: create or replace the recurring schedule named by ID
	// (Recur says when it fires; Msg, Destination and Exchange what each
	// fire forwards). It ends its batch as OpCancel does.
	OpRecur
	// OpScheduleControl: cancel, pause or resume (Control) the recurring
	// schedule ScheduleKey; a missing one is no error. It ends its batch
	// as OpCancel does.
	OpScheduleControl
)

// endsBatch reports whether op ends its batch: a cancel applies to
// everything received before it and to nothing after it.
func (op Op) endsBatch() bool {
	return op == OpCancel || op == OpCancelSaga || op == OpRecur || op == OpScheduleControl
}

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

	// OpRecur: the schedule (DueAt is its first fire time).
	Recur *Recurrence

	// OpScheduleControl: the schedule's store key and what to do.
	ScheduleKey string
	Control     ScheduleControl

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
	case OpRecur:
		if it.Recur == nil {
			return fmt.Errorf("parser returned a recurring schedule without its recurrence")
		}
		if err := it.Dest().Validate("destination"); err != nil {
			return err
		}
		if err := wire.ValidateID("schedule id", it.ID); err != nil {
			return err
		}
		return storage.CheckDueAt(it.DueAt)
	case OpScheduleControl:
		if it.Control < ScheduleCancel || it.Control > ScheduleResume {
			return fmt.Errorf("parser returned an unknown schedule control %d", it.Control)
		}
		return wire.ValidateID("schedule key", it.ScheduleKey)
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
// bridge's own headers. The delayed exchanges bound to it read theirs
// with sources of their own (Source.Exchanges).
func TimeoutsSource(queue string) Source {
	return Source{Name: "ingest", Queue: queue, Parser: ParserFunc(ParseHeaders)}
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
	if v, ok := d.Headers[wire.HeaderCron]; ok && v != nil {
		return parseRecurring(d, receivedAt)
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

// isNSBTimeout reports whether a message parsed from its headers is an
// NServiceBus timeout: its due time is NServiceBus.Timeout.Expire (no
// x-due-at, which would win).
func isNSBTimeout(h amqp.Table) bool {
	if v, ok := h[wire.HeaderDueAt]; ok && v != nil {
		return false
	}
	v, ok := h[wire.HeaderNSBExpire]
	return ok && v != nil
}

// markNSBTimeout marks msg, a stored NServiceBus timeout, for the stamper
// of protocol/nsbtimeout. msg's headers are a copy of the delivery's.
func markNSBTimeout(msg amqp.Publishing) amqp.Publishing {
	if msg.Headers == nil {
		msg.Headers = amqp.Table{}
	}
	msg.Headers[wire.HeaderNSBTimeoutStamp] = "timeout-manager"
	return msg
}
