// Package ingest consumes E.Timeouts, validates each message, stores the good
// ones and moves the bad ones to the error queue. A delivery is acknowledged
// only after the store committed it, or the error queue confirmed its copy.
package ingest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/rs/zerolog"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/circuit"
	"github.com/delaybridge/delaybridge/message"
	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/wire"
)

// Store is what ingest needs of the store.
type Store interface {
	Insert(ctx context.Context, ts []storage.Timeout) ([]bool, error)
	Cancel(ctx context.Context, id string) error
}

// Publisher sends error-queue copies with confirms.
type Publisher interface {
	Publish(ctx context.Context, msgs []broker.Outgoing) []error
}

// Connection hands out the current consume connection, waiting while the
// broker is unreachable (broker.Conn).
type Connection interface {
	Wait(ctx context.Context) (*amqp.Connection, error)
}

// NewPublisher opens a publisher on the current publish connection.
type NewPublisher func(ctx context.Context) (Publisher, error)

// Metrics is told what ingest did (*metrics.Metrics implements it).
type Metrics interface {
	// Ingested counts messages committed to the store.
	Ingested(n int)
	// DuplicatesSuppressed counts messages whose id was already pending.
	DuplicatesSuppressed(n int)
	// ErrorQueued counts error-queue copies the broker confirmed.
	ErrorQueued(stage string, n int)
	// ObserveIngestCommit records the duration of a successful commit.
	ObserveIngestCommit(d time.Duration)
}

type noMetrics struct{}

func (noMetrics) Ingested(int)                      {}
func (noMetrics) DuplicatesSuppressed(int)          {}
func (noMetrics) ErrorQueued(string, int)           {}
func (noMetrics) ObserveIngestCommit(time.Duration) {}

// Options configure an Ingester.
type Options struct {
	Queue      string // E.Timeouts
	ErrorQueue string
	Prefetch   int
	// MaxBatch caps deliveries stored in one commit (group commit), and
	// Linger is how long a batch waits for more deliveries before its commit.
	MaxBatch int
	Linger   time.Duration
	Rules    Rules
	// Wake is told the earliest due time of every committed batch, so the
	// poller can wake early. Optional.
	Wake func(due time.Time)
	// RetryDelay is the pause after the error queue refused copies.
	RetryDelay time.Duration
	// StoreBreaker watches commits; while it is armed ingest backs off, and
	// when it triggers the bridge stops. Nil: a breaker that never triggers.
	StoreBreaker *circuit.Breaker
	// Metrics, when set, is told what ingest did.
	Metrics Metrics
	Now     func() time.Time
	Logger  zerolog.Logger
}

// Ingester moves messages from E.Timeouts into the store.
type Ingester struct {
	conn   Connection
	newPub NewPublisher
	store  Store
	opts   Options
	log    zerolog.Logger
}

// New returns an Ingester that consumes on conn and publishes error-queue
// copies through newPub; it starts nothing.
func New(conn Connection, newPub NewPublisher, store Store, opts Options) *Ingester {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.MaxBatch < 1 {
		opts.MaxBatch = 1
	}
	if opts.RetryDelay <= 0 {
		opts.RetryDelay = time.Second
	}
	if opts.Linger <= 0 {
		opts.Linger = 2 * time.Millisecond
	}
	if opts.StoreBreaker == nil {
		opts.StoreBreaker = circuit.New("store", time.Duration(1<<62), circuit.Options{Now: opts.Now})
	}
	if opts.Metrics == nil {
		opts.Metrics = noMetrics{}
	}
	return &Ingester{conn: conn, newPub: newPub, store: store, opts: opts, log: opts.Logger}
}

// Run consumes until ctx ends, then cancels the consumer, finishes the batch
// in hand and returns nil. When the broker connection or channel fails it
// resumes on the next connection; unacknowledged deliveries go back to the
// queue with the old channel.
func (in *Ingester) Run(ctx context.Context) error {
	for {
		err := in.session(ctx)
		if ctx.Err() != nil {
			return nil
		}
		in.log.Warn().Err(err).Msg("ingest interrupted; resuming on the next broker connection")
		if !broker.Sleep(ctx, 100*time.Millisecond+time.Duration(rand.Int64N(int64(400*time.Millisecond)))) {
			return nil
		}
	}
}

// session consumes on one channel until it fails or ctx ends.
func (in *Ingester) session(ctx context.Context) error {
	conn, err := in.conn.Wait(ctx)
	if err != nil {
		return err
	}
	pub, err := in.newPub(ctx)
	if err != nil {
		return fmt.Errorf("ingest: open error-queue publisher: %w", err)
	}
	if c, ok := pub.(interface{ Close() error }); ok {
		defer c.Close()
	}
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("ingest: open channel: %w", err)
	}
	defer ch.Close()
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	if err := ch.Qos(in.opts.Prefetch, 0, false); err != nil {
		return fmt.Errorf("ingest: set prefetch: %w", err)
	}
	tag := "delaybridge-ingest-" + uuid.NewString()
	deliveries, err := ch.Consume(in.opts.Queue, tag, false, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("ingest: consume %s: %w", in.opts.Queue, err)
	}
	in.log.Info().Str("queue", in.opts.Queue).Msg("ingest consuming")

	batch := make([]amqp.Delivery, 0, in.opts.MaxBatch)
	linger := time.NewTimer(time.Hour)
	linger.Stop()
	for {
		batch = batch[:0]
		// Stopping wins over a ready delivery: select picks at random, and
		// after a critical error nacked messages come straight back.
		if ctx.Err() != nil {
			_ = ch.Cancel(tag, false)
			return nil
		}
		select {
		case <-ctx.Done():
			// Stop the flow first; deliveries already in the buffer stay
			// unacked and are requeued when the channel closes.
			_ = ch.Cancel(tag, false)
			return nil
		case e := <-closed:
			return fmt.Errorf("ingest: channel closed: %v", e)
		case d, ok := <-deliveries:
			if !ok {
				return fmt.Errorf("ingest: consumer cancelled by the broker")
			}
			batch = append(batch, d)
		}
		if isCancel(&batch[0]) {
			// A cancel ends its batch, so everything published before it is
			// committed first and nothing published after it is affected.
			if err := in.handle(ctx, pub, batch); err != nil {
				return err
			}
			continue
		}
		// Group commit: gather what arrives within a short linger. The
		// library hands deliveries over one at a time, so a non-blocking
		// drain alone yields batches of one and an fsync per message.
		linger.Reset(in.opts.Linger)
	fill:
		for len(batch) < in.opts.MaxBatch {
			select {
			case d, ok := <-deliveries:
				if !ok {
					break fill
				}
				batch = append(batch, d)
				if isCancel(&d) {
					break fill
				}
			case <-linger.C:
				break fill
			}
		}
		linger.Stop()
		if ctx.Err() != nil {
			// Not taken in: requeued when the channel closes.
			_ = ch.Cancel(tag, false)
			return nil
		}
		if err := in.handle(ctx, pub, batch); err != nil {
			return err
		}
	}
}

type rejected struct {
	d      *amqp.Delivery
	reason string
}

// handle stores the valid deliveries of a batch in one commit and sends the
// invalid ones to the error queue, then settles every delivery.
func (in *Ingester) handle(ctx context.Context, pub Publisher, batch []amqp.Delivery) error {
	now := in.opts.Now()
	var (
		rows    = make([]storage.Timeout, 0, len(batch))
		stored  = make([]*amqp.Delivery, 0, len(batch))
		invalid []rejected
	)
	var cancels []*amqp.Delivery
	for i := range batch {
		d := &batch[i]
		if isCancel(d) {
			if _, err := cancelID(d); err != nil {
				invalid = append(invalid, rejected{d: d, reason: err.Error()})
			} else {
				cancels = append(cancels, d)
			}
			continue
		}
		row, err := in.prepare(d, now)
		if err != nil {
			invalid = append(invalid, rejected{d: d, reason: err.Error()})
			continue
		}
		rows = append(rows, row)
		stored = append(stored, d)
	}

	if len(rows) > 0 {
		// Store failures are not the message's fault: requeue and retry.
		// The commit must not be abandoned half-way by shutdown, so it does
		// not take ctx.
		began := time.Now()
		inserted, err := in.store.Insert(context.WithoutCancel(ctx), rows)
		if err != nil {
			pause := in.opts.StoreBreaker.Failure(err)
			in.log.Error().Err(err).Int("messages", len(rows)).Dur("retry_in", pause).Msg("store failed; messages requeued")
			for _, d := range stored {
				_ = d.Nack(false, true)
			}
			for _, r := range invalid {
				_ = r.d.Nack(false, true)
			}
			broker.Sleep(ctx, pause)
			return nil
		}
		in.opts.StoreBreaker.Success()
		in.opts.Metrics.ObserveIngestCommit(time.Since(began))
		// Wake for every row, duplicates too: a store that repeated its
		// insert after a lost connection reports its own rows as
		// duplicates, and a wake too many costs one poll.
		earliest := rows[0].DueAt
		for _, r := range rows[1:] {
			if r.DueAt.Before(earliest) {
				earliest = r.DueAt
			}
		}
		duplicates := 0
		for i, ok := range inserted {
			if !ok {
				duplicates++
				in.log.Info().Str("id", rows[i].ID).Msg("duplicate: id already pending, not stored again")
				continue
			}
			in.log.Debug().Str("id", rows[i].ID).Str("destination", rows[i].Destination).
				Time("due_at", rows[i].DueAt).Msg("stored")
		}
		in.opts.Metrics.Ingested(len(inserted) - duplicates)
		in.opts.Metrics.DuplicatesSuppressed(duplicates)
		if in.opts.Wake != nil {
			in.opts.Wake(earliest)
		}
	}

	// Cancels come last in a batch (see Run): after the inserts before them.
	nacked := false
	for _, d := range cancels {
		if in.cancel(ctx, d) {
			stored = append(stored, d)
		} else {
			_ = d.Nack(false, true)
			nacked = true
		}
	}

	if len(invalid) == 0 && !nacked {
		// Everything before this tag on the channel is settled: one frame.
		if err := batch[len(batch)-1].Ack(true); err != nil {
			return fmt.Errorf("ingest: ack: %w", err)
		}
		return nil
	}
	// Ack what is committed first: whatever happens to the rejects, stored
	// messages must not be redelivered (an id-less one would be stored twice).
	for _, d := range stored {
		if err := d.Ack(false); err != nil {
			return fmt.Errorf("ingest: ack: %w", err)
		}
	}
	if len(invalid) == 0 {
		return nil
	}
	moved, err := in.reject(ctx, pub, invalid, now)
	if err != nil {
		return err // the connection failed: resume on a new one
	}
	if !moved {
		// The error queue is not taking copies; do not spin on redeliveries.
		broker.Sleep(ctx, in.opts.RetryDelay)
	}
	return nil
}

// prepare validates a delivery and builds its store row.
func (in *Ingester) prepare(d *amqp.Delivery, now time.Time) (storage.Timeout, error) {
	p, err := Parse(d, now)
	if err != nil {
		return storage.Timeout{}, err
	}
	if err := in.opts.Rules.Check(p, len(d.Body), now); err != nil {
		return storage.Timeout{}, err
	}
	pub := broker.Forwardable(message.FromDelivery(d), wire.DueTimeHeaders)
	if p.ID == "" {
		p.ID = uuid.NewString()
		pub.MessageId = p.ID
	}
	enc, err := message.Encode(nil, &pub)
	if err != nil {
		return storage.Timeout{}, fmt.Errorf("headers cannot be stored: %w", err)
	}
	return storage.Timeout{
		ID:          p.ID,
		Destination: p.Destination,
		DueAt:       p.DueAt,
		ReceivedAt:  now,
		Message:     enc,
	}, nil
}

// reject copies invalid deliveries to the error queue and acks each one whose
// copy the broker confirmed; the others are requeued. It reports whether all
// moved, and an error when the publish connection failed.
func (in *Ingester) reject(ctx context.Context, pub Publisher, invalid []rejected, now time.Time) (bool, error) {
	out := make([]broker.Outgoing, len(invalid))
	for i, r := range invalid {
		out[i] = broker.Outgoing{
			RoutingKey: in.opts.ErrorQueue,
			Mandatory:  true,
			Msg: broker.ErrorCopy(message.FromDelivery(r.d), broker.ErrorFacts{
				Reason: r.reason, Stage: wire.StageIngest, FailedAt: now, FailedQ: in.opts.Queue,
			}),
		}
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	results := pub.Publish(wctx, out)
	all := true
	var connErr error
	moved := 0
	for i, r := range invalid {
		if results[i] != nil {
			all = false
			if errors.Is(results[i], broker.ErrNotConfirmed) {
				connErr = results[i]
			}
			in.log.Error().Err(results[i]).Str("reason", r.reason).Msg("could not move invalid message to the error queue; requeued")
			_ = r.d.Nack(false, true)
			continue
		}
		in.log.Warn().Str("message_id", r.d.MessageId).Str("reason", r.reason).
			Str("error_queue", in.opts.ErrorQueue).Msg("invalid message moved to the error queue")
		moved++
		_ = r.d.Ack(false)
	}
	in.opts.Metrics.ErrorQueued(wire.StageIngest, moved)
	return all, connErr
}

// isCancel reports whether d asks to cancel a pending message.
func isCancel(d *amqp.Delivery) bool {
	_, ok := d.Headers[wire.HeaderCancel]
	return ok
}

// cancelID validates a cancel message and returns the id it names.
func cancelID(d *amqp.Delivery) (string, error) {
	id, _, err := headerString(d.Headers, wire.HeaderCancel)
	switch {
	case err != nil:
		return "", err
	case strings.TrimSpace(id) == "":
		return "", fmt.Errorf("header %s is empty: it must name the message-id to cancel", wire.HeaderCancel)
	case len(id) > maxIDBytes:
		return "", fmt.Errorf("header %s is %d bytes; a message id is at most %d", wire.HeaderCancel, len(id), maxIDBytes)
	case len(d.Body) > 0:
		return "", fmt.Errorf("a message with header %s cancels and must have no body (this one has %d bytes)", wire.HeaderCancel, len(d.Body))
	}
	return id, nil
}

// cancel removes the pending message a cancel names. It reports whether the
// cancel is settled (done, nothing pending with that id, or too late: being
// dispatched); false means a store failure, to retry.
func (in *Ingester) cancel(ctx context.Context, d *amqp.Delivery) bool {
	id, _ := cancelID(d) // validated by the caller
	err := in.store.Cancel(context.WithoutCancel(ctx), id)
	switch {
	case err == nil:
		in.log.Info().Str("id", id).Msg("cancelled over AMQP")
	case errors.Is(err, storage.ErrNotFound):
		in.log.Info().Str("id", id).Msg("cancel: nothing pending with this id (already delivered, or never scheduled)")
	case errors.Is(err, storage.ErrLeased):
		in.log.Warn().Str("id", id).Msg("cancel: too late, the message is being dispatched")
	default:
		pause := in.opts.StoreBreaker.Failure(err)
		in.log.Error().Err(err).Str("id", id).Dur("retry_in", pause).Msg("cancel failed; requeued")
		broker.Sleep(ctx, pause)
		return false
	}
	in.opts.StoreBreaker.Success()
	return true
}
