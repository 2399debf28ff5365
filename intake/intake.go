// Package intake is what every intake protocol and ingest share: a Source
// (a queue and the Parser of its wire format), the Intake a parser makes of
// one delivery, and the readers of header values every parser reads by the
// same rules (header.go). The protocols under protocol/ produce Intakes;
// ingest stores them.
package intake

import (
	"fmt"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/cron"
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
	// OpCancel: cancel the pending message CancelID. A cancel is committed
	// with its batch, in order (storage.InsertCanceller): it applies to
	// everything received before it and to nothing after it.
	OpCancel
	// OpCancelSaga: cancel every pending timeout of saga SagaID. It ends
	// its batch, and so applies to everything received before it.
	OpCancelSaga
	// OpReplace: cancel every pending timeout of saga SagaID, then store
	// Msg as OpSchedule does, with that saga id: the message replaces the
	// group's earlier ones (MassTransit's schedule token). The removed rows
	// get tombstones, the saga id none, so ID must be new to the store (a
	// redelivery that reuses an id would find it cancelled). The replaces
	// of a batch, of distinct groups, are one commit with its other
	// messages (storage.GroupReplacer); a replace of a group that an
	// earlier message of the batch belongs to starts the next batch, and
	// so does a replace after a cancel, or a cancel after a replace.
	OpReplace
	// OpRecur: create or replace the recurring schedule named by ID
	// (Recur says when it fires; Msg, Destination and Exchange what each
	// fire forwards). It ends its batch as OpCancelSaga does.
	OpRecur
	// OpScheduleControl: cancel, pause or resume (Control) the recurring
	// schedule ScheduleKey; a missing one is no error. It ends its batch
	// as OpCancelSaga does.
	OpScheduleControl
)

// EndsBatch reports whether op ends its batch, applied after the batch's
// commit, so that it applies to everything received before it and to
// nothing after it. OpCancel does not: its batch commits it in order.
func (op Op) EndsBatch() bool {
	return op == OpCancelSaga || op == OpRecur || op == OpScheduleControl
}

// Stores reports whether op stores a message.
func (op Op) Stores() bool { return op == OpSchedule || op == OpReplace }

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

// Recurrence is what a recurring schedule's headers (or a protocol's
// schedule message) say.
type Recurrence struct {
	// Source names the way it came in (storage.Schedule.Source): the
	// schedule's key is storage.ScheduleKey(Source, Intake.ID).
	// wire.ScheduleSourceAMQP when empty.
	Source     string
	Expr, Zone string
	Start, End time.Time
	Misfire    cron.MisfirePolicy
	// Description and Token as storage.Schedule's.
	Description, Token string
	// First is the first fire time, from the time the message was taken in.
	First time.Time
}

// NewRecurrence checks a schedule given by expr (cron.Parse) in zone
// (cron.LoadLocation; UTC when empty) between start and end (zero:
// unbounded) and finds its first fire time from receivedAt on.
func NewRecurrence(expr, zone string, start, end time.Time, misfire cron.MisfirePolicy, receivedAt time.Time) (*Recurrence, error) {
	spec, err := cron.Parse(expr)
	if err != nil {
		return nil, fmt.Errorf("cron expression %q: %w", wire.Clip(expr), err)
	}
	r := &Recurrence{Expr: expr, Zone: strings.TrimSpace(zone), Start: start, End: end, Misfire: misfire}
	if r.Zone == "" {
		r.Zone = "UTC"
	}
	loc, err := cron.LoadLocation(r.Zone)
	if err != nil {
		return nil, fmt.Errorf("time zone: %w", err)
	}
	// A fire time at the moment of intake still fires (as Quartz, which
	// starts a new trigger's search a second back).
	r.First = spec.NextIn(receivedAt.Add(-time.Second), loc, cron.Window{Start: r.Start, End: r.End})
	if r.First.IsZero() {
		return nil, fmt.Errorf("cron expression %q in %s has no fire time left (after the end time, or a date that never comes)",
			wire.Clip(expr), r.Zone)
	}
	r.First = r.First.UTC()
	return r, nil
}

// ScheduleControl is what an OpScheduleControl does to a schedule.
type ScheduleControl int

// The controls of a schedule (storage.Scheduler).
const (
	ScheduleCancel ScheduleControl = iota + 1
	SchedulePause
	ScheduleResume
)

func (c ScheduleControl) String() string {
	switch c {
	case ScheduleCancel:
		return "cancel"
	case SchedulePause:
		return "pause"
	case ScheduleResume:
		return "resume"
	}
	return fmt.Sprintf("control %d", int(c))
}
