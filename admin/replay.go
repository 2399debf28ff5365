package admin

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/errorqueue"
	"github.com/delaybridge/delaybridge/ingest"
	"github.com/delaybridge/delaybridge/intake"
	"github.com/delaybridge/delaybridge/message"
	"github.com/delaybridge/delaybridge/protocol/nsbtimeout"
	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/wire"
)

// Replayer moves dispatch failures from the error queue back into the store
// as timeouts due now.
type Replayer struct {
	// Conn returns an open connection; Replay opens its own channel on it.
	Conn func(ctx context.Context) (*amqp.Connection, error)
	// Release, when set, is called with Conn's connection after the pass:
	// the bridge gives each pass a connection of its own, so that a copy
	// the AMQP client cannot read drops that connection, not one that
	// consumes.
	Release    func(*amqp.Connection)
	ErrorQueue string
	// TimeoutsQueue is this endpoint's E.Timeouts. An error queue may be
	// shared: only copies whose NServiceBus.FailedQ names this queue are
	// this bridge's failures to replay.
	TimeoutsQueue string
	// Rules are ingest's (reserved queues, allowed destinations, size):
	// a replayed copy is checked exactly as an incoming message is.
	Rules ingest.Rules
	Store storage.Store
	Now   func() time.Time
	// Hold, when set, holds aside the copies the AMQP client cannot read
	// among the first limit messages of queue (broker.HoldUnreadable), so
	// that a pass that met one can be made again without it. Nil: such a
	// copy ends the pass with an error.
	Hold func(ctx context.Context, queue string, limit int) (*broker.Held, error)
}

// errUnreadableCopy: the AMQP client dropped the pass's connection on a copy
// it cannot read, before the pass stored or acknowledged anything.
var errUnreadableCopy = errors.New("a copy on the error queue cannot be read by the AMQP client")

// holdAttempts bounds the tries to find the copy that dropped a pass: the
// broker requeues what the dropped connection took once it notices the
// closed socket, which may be a moment later.
const holdAttempts = 5

// Replay takes up to limit messages from the error queue (basic.get, one
// pass: skipped messages are requeued only at the end, so none is seen
// twice). Each dispatch failure is stored again as a pending timeout due now,
// with its original headers, and acknowledged after the store commit.
// Ingest failures, other endpoints' failures and messages that cannot be
// replayed (read and checked as ingest reads and checks them) are requeued
// and counted as skipped, each with its reason; none fails the pass.
//
// A copy the AMQP client cannot read drops the pass's connection before
// anything is stored. With Hold set, the pass is then made again while
// such copies among the first limit messages are held aside, untouched,
// over the readable ones Hold took; the held copies are counted as skipped
// and go back to the error queue after the pass.
func (rp *Replayer) Replay(ctx context.Context, limit int) (ReplayResult, error) {
	res, err := rp.Errors(ctx, ErrorsRequest{Op: ErrorsReplay, Scan: limit, ReportForeign: true})
	return res.ReplayResult, err
}

// Errors makes one pass over the head of the error queue (errors.go): it
// reads up to Skip+Scan messages with basic.get, acts on this endpoint's
// copies that match the request, and requeues the rest at the end, so that
// none is seen twice. Copies the AMQP client cannot read are held aside as
// for Replay, and reported as skipped.
func (rp *Replayer) Errors(ctx context.Context, req ErrorsRequest) (ErrorsResult, error) {
	if rp.TimeoutsQueue == "" {
		// Without it every copy would look like another endpoint's.
		return ErrorsResult{}, errors.New("replayer: no TimeoutsQueue configured")
	}
	res, err := rp.pass(ctx, req)
	if !errors.Is(err, errUnreadableCopy) || rp.Hold == nil {
		return res, err
	}
	held, herr := rp.holdUnreadable(ctx, req.Skip+req.Scan)
	if herr != nil {
		return ErrorsResult{}, fmt.Errorf("%w; holding it aside failed: %w", err, herr)
	}
	defer held.Release() // after the pass: the held copies go back untouched
	var unreadable []ReplaySkipped
	for _, u := range held.Unreadable {
		unreadable = append(unreadable, ReplaySkipped{MessageID: u.MessageID,
			Reason: "the bridge's AMQP client cannot read it (" + u.Reason.Error() + "); left on the error queue as it is"})
	}
	res = ErrorsResult{}
	if held.Readable > 0 {
		// No further than the copies Hold checked: one behind them could be
		// unreadable too.
		req.Scan = max(0, min(req.Scan, held.Readable-req.Skip))
		res, err = rp.pass(ctx, req)
	}
	res.Skipped += len(unreadable)
	res.Details = append(unreadable, res.Details...)
	return res, err
}

// holdUnreadable holds the unreadable copies among the first limit messages
// of the error queue; it tries again, a little later, while it finds none.
func (rp *Replayer) holdUnreadable(ctx context.Context, limit int) (*broker.Held, error) {
	wait := 100 * time.Millisecond
	for attempt := 1; ; attempt++ {
		held, err := rp.Hold(ctx, rp.ErrorQueue, limit)
		if err != nil {
			return nil, err
		}
		if len(held.Unreadable) > 0 {
			return held, nil
		}
		_ = held.Release()
		if attempt == holdAttempts {
			return nil, fmt.Errorf("no unreadable copy among the first %d messages after %d attempts", limit, attempt)
		}
		if !broker.Sleep(ctx, wait) {
			return nil, ctx.Err()
		}
		wait *= 2
	}
}

// pass is one pass over the error queue, on a connection of its own. It
// fails with errUnreadableCopy, having done nothing, when that connection
// drops on a copy the client cannot read.
func (rp *Replayer) pass(ctx context.Context, req ErrorsRequest) (ErrorsResult, error) {
	now := time.Now
	if rp.Now != nil {
		now = rp.Now
	}
	conn, err := rp.Conn(ctx)
	if err != nil {
		return ErrorsResult{}, fmt.Errorf("broker connection: %w", err)
	}
	if rp.Release != nil {
		defer rp.Release(conn) // after the channel's close below
	}
	// The library tells the connection's listeners why it closed before it
	// fails the calls in progress.
	connClosed := conn.NotifyClose(make(chan *amqp.Error, 1))
	ch, err := conn.Channel()
	if err != nil {
		return ErrorsResult{}, fmt.Errorf("open channel: %w", err)
	}
	// Closing the channel requeues whatever is still unacknowledged, so an
	// error anywhere below loses nothing.
	defer ch.Close()

	var tr triage
	if err := rp.read(ctx, ch, connClosed, req, now, &tr); err != nil {
		return tr.res, err
	}
	if len(tr.todo) > 0 {
		ts := make([]storage.Timeout, len(tr.todo))
		for i, c := range tr.todo {
			ts[i] = c.t
		}
		outcomes, err := rp.Store.Insert(ctx, ts)
		if err != nil {
			return ErrorsResult{}, fmt.Errorf("store: %w", err)
		}
		if err := tr.ackStored(ch, outcomes); err != nil {
			return tr.res, err
		}
	}
	err = tr.settle(ch)
	return tr.res, err
}

// triage is what a pass decided for the copies it read, and its result.
type triage struct {
	res ErrorsResult
	// todo are the copies to store again, then acknowledge.
	todo []candidate
	// drop are the copies to acknowledge (deleted), keep those to requeue
	// at the end of the pass.
	drop, keep []uint64
}

// candidate is a copy to replay: its delivery tag and the timeout rebuilt
// from it.
type candidate struct {
	tag uint64
	t   storage.Timeout
}

// skip keeps d on the error queue, counted as skipped for reason.
func (tr *triage) skip(d *amqp.Delivery, reason string) {
	tr.keep = append(tr.keep, d.DeliveryTag)
	tr.res.Skipped++
	tr.res.Details = append(tr.res.Details, ReplaySkipped{MessageID: d.MessageId, Reason: reason})
}

// read gets up to req.Skip+req.Scan copies from the error queue, fewer when
// req.Limit copies matched first or the queue ends, and triages each.
func (rp *Replayer) read(ctx context.Context, ch *amqp.Channel, connClosed <-chan *amqp.Error, req ErrorsRequest, now func() time.Time, tr *triage) error {
	matched := 0
	for pos := 0; pos < req.Skip+req.Scan; pos++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		if req.Limit > 0 && matched == req.Limit {
			// Full: the next page starts here.
			tr.res.Next = pos
			break
		}
		d, ok, err := ch.Get(rp.ErrorQueue, false)
		if err != nil {
			select {
			case e := <-connClosed:
				if broker.UnreadableClose(e) {
					return fmt.Errorf("get from %q: %w (%v)", rp.ErrorQueue, errUnreadableCopy, e)
				}
			default:
			}
			return fmt.Errorf("get from %q: %w", rp.ErrorQueue, err)
		}
		if !ok {
			tr.res.End = true
			break
		}
		if rp.decide(&d, pos, req, now, tr) {
			matched++
		}
	}
	if req.Op == ErrorsList && tr.res.Next == 0 && !tr.res.End {
		tr.res.Next = req.Skip + req.Scan
	}
	return nil
}

// decide decides what becomes of copy d, read at pos, and reports whether
// it matched the request.
func (rp *Replayer) decide(d *amqp.Delivery, pos int, req ErrorsRequest, now func() time.Time, tr *triage) bool {
	if pos < req.Skip {
		tr.keep = append(tr.keep, d.DeliveryTag)
		return false
	}
	tr.res.Scanned++
	if why := rp.foreign(d); why != "" {
		tr.res.Foreign++
		if req.ReportForeign {
			tr.skip(d, why)
		} else {
			tr.keep = append(tr.keep, d.DeliveryTag)
		}
		return false
	}
	c := describe(d, pos, req.Detail)
	if !req.Filter.match(&c) {
		tr.keep = append(tr.keep, d.DeliveryTag)
		return false
	}
	switch req.Op {
	case ErrorsList:
		tr.res.Errors = append(tr.res.Errors, c)
		tr.keep = append(tr.keep, d.DeliveryTag)
		return true
	case ErrorsDelete:
		tr.drop = append(tr.drop, d.DeliveryTag)
		return true
	}
	// Copies with one message id are sends of their own, each stored
	// (docs/contract.md §2.4).
	t, why := rp.rebuild(d, now())
	if why != "" {
		tr.skip(d, why)
		return true
	}
	tr.todo = append(tr.todo, candidate{d.DeliveryTag, t})
	return true
}

// ackStored acknowledges the copies of tr.todo that the store holds now,
// given the outcome of each one's insert, and keeps the others.
func (tr *triage) ackStored(ch *amqp.Channel, outcomes []storage.Outcome) error {
	for i, c := range tr.todo {
		// Stored, or a Duplicate: this very copy, stored by an
		// earlier replay whose ack was lost, still pending. Either
		// way the store holds it and the copy can go.
		if outcomes[i] == storage.Cancelled {
			// A cancel of the id is recent: keep the error copy
			// rather than drop a message the operator may want.
			tr.keep = append(tr.keep, c.tag)
			tr.res.Skipped++
			tr.res.Details = append(tr.res.Details, ReplaySkipped{MessageID: c.t.ID,
				Reason: "not stored: its id was cancelled within the cancel window"})
			continue
		}
		if err := ch.Ack(c.tag, false); err != nil {
			// Stored but not acknowledged: the copy stays on the error
			// queue; replaying it again while the timeout is pending
			// finds it (a duplicate) and acknowledges the copy then.
			return fmt.Errorf("ack: %w", err)
		}
		tr.res.Replayed++
	}
	return nil
}

// settle acknowledges the deleted copies and requeues the kept ones.
func (tr *triage) settle(ch *amqp.Channel) error {
	for _, tag := range tr.drop {
		if err := ch.Ack(tag, false); err != nil {
			return fmt.Errorf("ack deleted copies: %w", err)
		}
		tr.res.Deleted++
	}
	for _, tag := range tr.keep {
		if err := ch.Nack(tag, false, true); err != nil {
			// Closing the channel requeues the rest anyway.
			return fmt.Errorf("requeue the messages kept: %w", err)
		}
	}
	return nil
}

// foreign says why a copy is not one of this endpoint's failures, or "".
func (rp *Replayer) foreign(d *amqp.Delivery) string {
	return errorqueue.Foreign(d.Headers, rp.TimeoutsQueue)
}

// rebuild turns an error-queue copy back into the timeout the bridge failed
// to dispatch, or says why it cannot. The destination and id are read, and
// the rules applied, as ingest does: a copy is only a message that comes
// back in, and nothing ingest would refuse may reach the store this way.
func (rp *Replayer) rebuild(d *amqp.Delivery, now time.Time) (storage.Timeout, string) {
	switch errorqueue.Stage(d.Headers) {
	case wire.StageDispatch:
	case wire.StageIngest:
		return storage.Timeout{}, "an ingest failure (invalid or rejected input), not a dispatch failure"
	default:
		return storage.Timeout{}, fmt.Sprintf("no %s header of a delaybridge dispatch failure", wire.HeaderStage)
	}
	it := nsbtimeout.ParseRetry(d, now)
	if it.Op == intake.OpReject {
		return storage.Timeout{}, it.Reason
	}
	if it.ID == "" {
		// A generated id would make every replay of the copy a new message.
		return storage.Timeout{}, "no message-id (nor " + wire.HeaderNSBMessageID + " header)"
	}
	if err := rp.Rules.Check(intake.Parsed{ID: it.ID, Destination: it.Dest(), DueAt: now}, len(d.Body), now); err != nil {
		return storage.Timeout{}, err.Error()
	}
	enc, err := message.Encode(nil, &it.Msg)
	if err != nil {
		return storage.Timeout{}, "headers cannot be stored: " + err.Error()
	}
	// The copy is the send: replaying it again (its ack was lost) finds
	// it still pending, a redelivery (docs/contract.md §2.4).
	fp, err := message.Fingerprint(d)
	if err != nil {
		return storage.Timeout{}, "headers cannot be stored: " + err.Error()
	}
	return storage.Timeout{ID: it.ID, Destination: it.Destination, Exchange: it.Exchange, DueAt: now, ReceivedAt: now, Message: enc,
		Fingerprint: fp}, ""
}
