package admin

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/message"
	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/wire"
)

// Replayer moves dispatch failures from the error queue back into the store
// as timeouts due now.
type Replayer struct {
	// Conn returns an open connection; Replay opens its own channel on it.
	Conn       func(ctx context.Context) (*amqp.Connection, error)
	ErrorQueue string
	Store      storage.Store
	Now        func() time.Time
}

// Replay takes up to limit messages from the error queue (basic.get, one
// pass: skipped messages are requeued only at the end, so none is seen
// twice). Each dispatch failure is stored again as a pending timeout due now,
// with its original headers, and acknowledged after the store commit.
// Ingest failures and messages that cannot be replayed are requeued and
// counted as skipped.
func (rp *Replayer) Replay(ctx context.Context, limit int) (res ReplayResult, err error) {
	now := time.Now
	if rp.Now != nil {
		now = rp.Now
	}
	conn, err := rp.Conn(ctx)
	if err != nil {
		return res, fmt.Errorf("broker connection: %w", err)
	}
	ch, err := conn.Channel()
	if err != nil {
		return res, fmt.Errorf("open channel: %w", err)
	}
	// Closing the channel requeues whatever is still unacknowledged, so an
	// error anywhere below loses nothing.
	defer ch.Close()

	type candidate struct {
		tag uint64
		t   storage.Timeout
	}
	var todo []candidate
	var skipped []uint64
	skip := func(d *amqp.Delivery, reason string) {
		skipped = append(skipped, d.DeliveryTag)
		res.Skipped++
		res.Details = append(res.Details, ReplaySkipped{MessageID: d.MessageId, Reason: reason})
	}
	seen := map[string]bool{}
	for len(todo)+len(skipped) < limit {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		d, ok, err := ch.Get(rp.ErrorQueue, false)
		if err != nil {
			return res, fmt.Errorf("get from %q: %w", rp.ErrorQueue, err)
		}
		if !ok {
			break
		}
		t, why := rebuild(&d, now())
		if why == "" && seen[t.ID] {
			why = "another message with the same message-id is replayed in this pass"
		}
		if why != "" {
			skip(&d, why)
			continue
		}
		seen[t.ID] = true
		todo = append(todo, candidate{d.DeliveryTag, t})
	}

	if len(todo) > 0 {
		ts := make([]storage.Timeout, len(todo))
		for i, c := range todo {
			ts[i] = c.t
		}
		inserted, err := rp.Store.Insert(ctx, ts)
		if err != nil {
			return ReplayResult{}, fmt.Errorf("store: %w", err)
		}
		for i, c := range todo {
			if !inserted[i] {
				// A timeout with this id is pending again already: keep the
				// error copy rather than drop a message that may differ.
				skipped = append(skipped, c.tag)
				res.Skipped++
				res.Details = append(res.Details, ReplaySkipped{MessageID: c.t.ID, Reason: "a timeout with this id is already pending"})
				continue
			}
			if err := ch.Ack(c.tag, false); err != nil {
				// Stored but not acknowledged: the copy stays on the error
				// queue; replaying it again is refused as a duplicate while
				// the timeout is pending.
				return res, fmt.Errorf("ack: %w", err)
			}
			res.Replayed++
		}
	}
	for _, tag := range skipped {
		if err := ch.Nack(tag, false, true); err != nil {
			// Closing the channel requeues the rest anyway.
			return res, fmt.Errorf("requeue skipped messages: %w", err)
		}
	}
	return res, nil
}

// rebuild turns an error-queue copy back into the timeout the bridge failed
// to dispatch, or says why it cannot.
func rebuild(d *amqp.Delivery, now time.Time) (storage.Timeout, string) {
	stage, _ := d.Headers[wire.HeaderStage].(string)
	switch stage {
	case wire.StageDispatch:
	case wire.StageIngest:
		return storage.Timeout{}, "an ingest failure (invalid or rejected input), not a dispatch failure"
	default:
		return storage.Timeout{}, fmt.Sprintf("no %s header of a delaybridge dispatch failure", wire.HeaderStage)
	}
	if d.MessageId == "" {
		return storage.Timeout{}, "no message-id"
	}
	dest, _ := d.Headers[wire.HeaderDestination].(string)
	if dest == "" {
		dest, _ = d.Headers[wire.HeaderNSBDestination].(string)
	}
	if dest == "" {
		return storage.Timeout{}, "no destination header (" + wire.HeaderDestination + " or " + wire.HeaderNSBDestination + ")"
	}
	p := message.FromDelivery(d)
	h := make(amqp.Table, len(p.Headers))
	maps.Copy(h, p.Headers)
	for k := range h {
		if strings.HasPrefix(k, wire.HeaderPrefix) || k == wire.HeaderNSBException || k == wire.HeaderNSBFailedQ {
			delete(h, k)
		}
	}
	p.Headers = h
	p.UserId = ""
	enc, err := message.Encode(nil, &p)
	if err != nil {
		return storage.Timeout{}, "headers cannot be stored: " + err.Error()
	}
	return storage.Timeout{ID: d.MessageId, Destination: dest, DueAt: now, ReceivedAt: now, Message: enc}, ""
}
