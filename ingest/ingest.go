// Package ingest consumes the intake queues (E.Timeouts, and one per protocol
// adapter), validates each message, stores the good ones and moves the bad
// ones to the error queue. A delivery is acknowledged only after the store
// committed it, or the error queue confirmed its copy.
package ingest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/rs/zerolog"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/budget"
	"github.com/delaybridge/delaybridge/circuit"
	"github.com/delaybridge/delaybridge/errorqueue"
	"github.com/delaybridge/delaybridge/intake"
	"github.com/delaybridge/delaybridge/message"
	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/wire"
)

// Store is what ingest needs of the store.
type Store interface {
	Insert(ctx context.Context, ts []storage.Timeout) ([]storage.Outcome, error)
	// InsertAndCancel commits a batch holding intake.OpCancel.
	storage.InsertCanceller
	// CancelSaga applies intake.OpCancelSaga.
	storage.SagaCanceller
	// ReplaceGroups commits a batch holding intake.OpReplace.
	storage.GroupReplacer
}

// Publisher sends error-queue copies with confirms.
type Publisher interface {
	errorqueue.Publisher
	Close() error
}

// NewPublisher opens a publisher on the current publish connection.
type NewPublisher func(ctx context.Context) (Publisher, error)

// Metrics is told what ingest did (*metrics.Metrics implements it).
type Metrics interface {
	// Ingested counts messages committed to the store.
	Ingested(n int)
	// DuplicatesSuppressed counts messages not stored: redeliveries of a
	// pending send, and sends of a cancelled id.
	DuplicatesSuppressed(n int)
	// Dropped counts messages taken in that will not be delivered, by
	// reason (Drop*).
	Dropped(reason string, n int)
	// ErrorQueued counts error-queue copies the broker confirmed.
	ErrorQueued(stage string, n int)
	// ObserveIngestCommit records the duration of a successful commit.
	ObserveIngestCommit(d time.Duration)
}

type noMetrics struct{}

func (noMetrics) Ingested(int)                      {}
func (noMetrics) DuplicatesSuppressed(int)          {}
func (noMetrics) Dropped(string, int)               {}
func (noMetrics) ErrorQueued(string, int)           {}
func (noMetrics) ObserveIngestCommit(time.Duration) {}

// Options configure an Ingester.
type Options struct {
	// Sources are the queues to consume, each with its parser; sources of
	// one queue share its consumer (intake.MergeSources).
	Sources []intake.Source
	// ErrorQueue is the queue of ingest's own Errors, when none is given.
	ErrorQueue string
	Prefetch   int
	// MaxBatch caps deliveries stored in one commit (group commit), and
	// Linger is how long a batch waits for more deliveries before its commit.
	MaxBatch int
	Linger   time.Duration
	// Hold, when longer than Linger, is how long a batch waits instead while
	// nothing in it falls due within Urgent of its arrival. Under steady
	// intake each commit rewrites the store pages its rows land on, wherever
	// they are, so fewer, larger commits write less: with bbolt at 2,000
	// msg/s, about half (docs/performance.md, "Steady intake while messages fall due"). A row due sooner
	// ends the wait, so holding never makes a message late; so does a batch
	// of half MaxBatch (holdBatch).
	Hold   time.Duration
	Urgent time.Duration
	// Rules apply to what every source schedules.
	Rules Rules
	// Wake is told the earliest due time of every committed batch, so the
	// poller can wake early. Optional.
	Wake func(due time.Time)
	// ScheduleWake is called after a recurring schedule was stored, so the
	// firer reads the next fire time again. Optional.
	ScheduleWake func()
	// Errors puts the invalid messages' copies on the error queue and paces
	// them while it refuses them (the bridge shares one with dispatch).
	// Nil: one of ingest's own on ErrorQueue, which does not declare the
	// queue again.
	Errors *errorqueue.Sender
	// StoreBreaker watches commits; while it is armed ingest backs off, and
	// when it triggers the bridge stops. Nil: a breaker that never triggers.
	StoreBreaker *circuit.Breaker
	// Budget, when set, bounds the body bytes of the deliveries the
	// sources hold (handed over and not yet settled), all sources together;
	// each source's prefetch follows the size of its messages, up to
	// Prefetch (broker.ConsumeOptions.Budget). ExpectedBytes sizes the
	// first prefetch: the largest body to expect (MaxMessageBytes).
	Budget        *budget.Budget
	ExpectedBytes int
	// Metrics, when set, is told what ingest did.
	Metrics Metrics
	Now     func() time.Time
	Logger  zerolog.Logger
}

// Reasons of Metrics.Dropped (docs/contract.md §6.2): what ingest took in
// and will not deliver.
const (
	// DropDuplicate: a redelivery of a send pending and not being
	// dispatched (storage.Duplicate).
	DropDuplicate = "duplicate"
	// DropCancelled: a send of an id cancelled within the cancel window
	// (storage.Cancelled).
	DropCancelled = "cancelled"
	// DropReplaced: a pending message removed by a message that replaces
	// its group (intake.OpReplace: a MassTransit token scheduled again).
	DropReplaced = "replaced"
)

// Ingester moves messages from the intake queues into the store.
type Ingester struct {
	conn   broker.Waiter
	newPub NewPublisher
	store  Store
	opts   Options
	log    zerolog.Logger
	// drops logs what was taken in and not stored, at warn, one line per
	// reason per interval after the first (drops.go).
	drops *dropLog
}

// New returns an Ingester that consumes on conn and publishes error-queue
// copies through newPub; it starts nothing.
func New(conn broker.Waiter, newPub NewPublisher, store Store, opts Options) *Ingester {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	opts.Sources = intake.MergeSources(opts.Sources)
	if opts.MaxBatch < 1 {
		opts.MaxBatch = 1
	}
	if opts.Metrics == nil {
		opts.Metrics = noMetrics{}
	}
	if opts.Errors == nil {
		opts.Errors = errorqueue.New(errorqueue.Options{Queue: opts.ErrorQueue, Metrics: opts.Metrics,
			Now: opts.Now, Logger: opts.Logger})
	}
	if opts.Linger <= 0 {
		opts.Linger = 2 * time.Millisecond
	}
	if opts.StoreBreaker == nil {
		opts.StoreBreaker = circuit.New("store", time.Duration(1<<62), circuit.Options{Now: opts.Now})
	}
	return &Ingester{conn: conn, newPub: newPub, store: store, opts: opts, log: opts.Logger, drops: newDropLog(opts.Logger)}
}

// holdBatch is the size at which a held batch commits without waiting out
// the hold: half of MaxBatch, so that in a burst the broker delivers the
// next half while this one commits (a batch holding the whole prefetch
// would leave nothing to deliver meanwhile).
func (in *Ingester) holdBatch() int { return max(1, in.opts.MaxBatch/2) }

// patient reports whether e lets its batch wait Hold: a message to store
// that is due later than Urgent from now, or one that will not be stored.
func (in *Ingester) patient(e *entry) bool {
	if in.opts.Hold <= in.opts.Linger {
		return false
	}
	if !e.intake.Op.Stores() {
		return e.intake.Op == intake.OpReject
	}
	return e.row.DueAt.After(in.opts.Now().Add(in.opts.Urgent))
}

// fits reports whether e may join batch. A batch's replaces are applied
// before its inserts (cancel the groups, then insert every row), so a
// replace of a group that an earlier message of the batch belongs to must
// wait for the next batch: it would otherwise spare that message, which
// it replaces. Messages after a replace, of its group or not, fit. A
// batch's cancels are committed in order with its inserts
// (InsertAndCancel), which has no replaces: a cancel and a replace wait
// for each other's next batch.
func (in *Ingester) fits(batch []entry, e *entry) bool {
	switch e.intake.Op {
	case intake.OpReplace:
		for i := range batch {
			if batch[i].intake.Op == intake.OpCancel || (batch[i].intake.Op.Stores() && batch[i].intake.SagaID == e.intake.SagaID) {
				return false
			}
		}
	case intake.OpCancel:
		for i := range batch {
			if batch[i].intake.Op == intake.OpReplace {
				return false
			}
		}
	}
	return true
}

// Run consumes every source until ctx ends, then cancels the consumers,
// requeues the batches in hand and returns nil. When the broker connection
// or a channel fails it resumes on the next connection; unacknowledged
// deliveries go back to their queue with the old channel.
func (in *Ingester) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	gates := map[string]chan struct{}{} // closed once the gate queue exists
	for _, src := range in.opts.Sources {
		if src.Gate == "" || gates[src.Gate] != nil {
			continue
		}
		open := make(chan struct{})
		gates[src.Gate] = open
		wg.Add(1)
		go func() {
			defer wg.Done()
			if broker.AwaitQueue(ctx, in.conn, broker.AwaitOptions{Queue: src.Gate, Name: "ingest", Logger: in.log}) {
				close(open)
			}
		}()
	}
	errs := make([]error, len(in.opts.Sources))
	for i, src := range in.opts.Sources {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if gate := gates[src.Gate]; gate != nil {
				select {
				case <-gate:
				case <-ctx.Done():
					return
				}
			}
			errs[i] = broker.Consume(ctx, in.conn, broker.ConsumeOptions{
				Queue: src.Queue, Prefetch: in.opts.Prefetch, Name: src.Name, Setup: src.Setup, MustExist: src.MustExist, Logger: in.log,
				Budget: in.opts.Budget, ExpectedBytes: in.opts.ExpectedBytes,
			}, func(ctx context.Context, s *broker.Session) error { return in.session(ctx, src, s) })
		}()
	}
	stop, flushed := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(flushed)
		in.drops.run(stop, in.opts.Now)
	}()
	wg.Wait()
	close(stop) // after the sessions' last commits
	<-flushed
	return errors.Join(errs...)
}

// session takes in one source's deliveries on one channel until it fails or
// ctx ends.
func (in *Ingester) session(ctx context.Context, src intake.Source, s *broker.Session) error {
	pub, err := in.newPub(ctx)
	if err != nil {
		return fmt.Errorf("%s: open error-queue publisher: %w", src.Name, err)
	}
	defer pub.Close()

	batch := make([]entry, 0, in.opts.MaxBatch)
	linger := time.NewTimer(time.Hour)
	linger.Stop()
	// Invalid deliveries whose error copies the error queue refused are
	// held, unacknowledged, and tried again when the gate allows: requeued,
	// they would come straight back first. Each holds a prefetch slot; the
	// others carry on meanwhile. They go back to the queue with the channel.
	var held []entry
	defer func() { _ = requeueHeld(held) }()
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	// carry is a delivery that did not fit its batch (see fits): it starts
	// the next one.
	var carry *entry
	defer func() {
		if carry != nil {
			_ = carry.d.Nack(false, true)
		}
	}()
	for {
		batch = batch[:0]
		// Stopping wins over a ready delivery: select picks at random, and
		// after a critical error requeued messages come straight back.
		if ctx.Err() != nil {
			s.Cancel()
			return nil
		}
		if carry != nil {
			batch = append(batch, *carry)
			carry = nil
		} else {
			select {
			case <-ctx.Done():
				// Stop the flow first; deliveries already in the buffer stay
				// unacked and are requeued when the channel closes.
				s.Cancel()
				return nil
			case e := <-s.Closed:
				return fmt.Errorf("%s: channel closed: %v", src.Name, e)
			case <-retry.C:
				var err error
				if held, err = in.retryHeld(ctx, src, pub, held); err != nil {
					return err
				}
				in.armRetry(retry, held)
				continue
			case d, ok := <-s.Deliveries:
				if !ok {
					return fmt.Errorf("%s: consumer cancelled by the broker", src.Name)
				}
				batch = append(batch, in.classify(src, d))
			}
		}
		if !batch[0].intake.Op.EndsBatch() {
			batch, carry = in.gather(src, s, batch, linger)
		}
		if ctx.Err() != nil {
			// Not taken in: back to the queue.
			s.Cancel()
			return settle(batch, len(held) > 0)
		}
		var err error
		if held, err = in.handle(ctx, src, pub, batch, held); err != nil {
			return err
		}
		in.armRetry(retry, held)
	}
}

// gather fills batch, which holds its first delivery, with what arrives
// within the linger: a group commit. The library hands deliveries over one
// at a time, so a non-blocking drain alone yields batches of one and an
// fsync per message. A cancel is committed in the batch, in order
// (commit); a saga's cancel or a schedule's message or control ends it,
// applied after everything received before it. carry is a delivery that
// did not fit (see fits): it starts the next batch.
func (in *Ingester) gather(src intake.Source, s *broker.Session, batch []entry, linger *time.Timer) (_ []entry, carry *entry) {
	held := in.patient(&batch[0]) // then Hold is longer than Linger
	wait := in.opts.Linger
	if held {
		wait = in.opts.Hold
	}
	linger.Reset(wait)
fill:
	for len(batch) < in.opts.MaxBatch {
		select {
		case d, ok := <-s.Deliveries:
			if !ok {
				break fill
			}
			e := in.classify(src, d)
			if !in.fits(batch, &e) {
				carry = &e
				break fill
			}
			batch = append(batch, e)
			if e.intake.Op.EndsBatch() || (held && len(batch) >= in.holdBatch()) {
				break fill
			}
			if held && !in.patient(&e) {
				if e.intake.Op != intake.OpCancel {
					break fill
				}
				// A cancel ends the hold, not the batch: it takes
				// what arrives within Linger, as a batch never
				// held, so that a stream of messages and their
				// cancels still commits in batches.
				held = false
				linger.Reset(in.opts.Linger)
			}
		case <-linger.C:
			break fill
		}
	}
	linger.Stop()
	return batch, carry
}

// heldCheck is how often held deliveries look whether the error gate
// publishes again: dispatch's copies may find the queue taking copies
// before the gate's own next try.
const heldCheck = time.Second

// armRetry sets the timer for the next try of the held deliveries: when the
// error gate publishes again (at once if it does already), or the next check.
func (in *Ingester) armRetry(retry *time.Timer, held []entry) {
	retry.Stop()
	if len(held) > 0 {
		retry.Reset(min(in.opts.Errors.RetryIn(in.opts.Now()), heldCheck))
	}
}

// retryHeld tries the held deliveries' error copies again, if the error gate
// publishes now, and acks each one the broker confirmed; it returns those
// still held.
func (in *Ingester) retryHeld(ctx context.Context, src intake.Source, pub Publisher, held []entry) ([]entry, error) {
	if in.opts.Errors.RetryIn(in.opts.Now()) > 0 {
		return held, nil
	}
	for i := range held {
		held[i].outcome = requeue
	}
	connErr := in.reject(ctx, src, pub, held)
	// Earlier deliveries of the channel may be held too: no multiple ack.
	still, err := keepHeld(held, nil, true)
	if err != nil {
		return still, err
	}
	return still, connErr
}

// keepHeld settles batch, except its deliveries to hold, which it appends to
// held and returns.
func keepHeld(batch, held []entry, heldBefore bool) ([]entry, error) {
	if err := settle(batch, heldBefore); err != nil {
		return held, err
	}
	for i := range batch {
		if batch[i].outcome == hold {
			held = append(held, batch[i])
		}
	}
	return held, nil
}

// requeueHeld puts the held deliveries back (what the channel's close would
// do anyway; an error means the channel is gone, and did).
func requeueHeld(held []entry) error {
	for i := range held {
		if err := held[i].d.Nack(false, true); err != nil {
			return err
		}
	}
	return nil
}

// outcome is what becomes of one delivery. Every delivery starts as requeue:
// whatever is not decided otherwise goes back to the queue.
type outcome uint8

const (
	requeue outcome = iota
	ack
	// hold leaves the delivery unsettled: an invalid one whose error copy
	// the error queue refused, tried again later.
	hold
)

// entry is one delivery on its way through a batch.
type entry struct {
	d       amqp.Delivery
	intake  intake.Intake
	row     storage.Timeout  // intake.OpSchedule and intake.OpReplace, once accepted
	sched   storage.Schedule // intake.OpRecur, once accepted (acceptRecurring)
	outcome outcome
}

// classify parses a delivery and, for a message to schedule, applies the
// rules and builds its store row; a message that fails either becomes a
// rejection.
func (in *Ingester) classify(src intake.Source, d amqp.Delivery) entry {
	now := in.opts.Now()
	e := entry{d: d, intake: src.Parser.Parse(&d, now)}
	if err := e.intake.Validate(); err != nil {
		// Whatever the parser, no store or broker sees a value it refuses.
		e.intake = intake.Reject(err)
		return e
	}
	if e.intake.Op == intake.OpRecur {
		sched, err := in.acceptRecurring(&e.intake, &d, now)
		if err != nil {
			e.intake = intake.Reject(err)
		}
		e.sched = sched
		return e
	}
	if e.intake.Op == intake.OpScheduleControl {
		if _, ok := in.store.(storage.Scheduler); !ok {
			e.intake = intake.Reject(errors.New("this store cannot keep recurring schedules"))
		}
		return e
	}
	if !e.intake.Op.Stores() {
		return e
	}
	row, err := in.accept(&e.intake, &d, now)
	if err != nil {
		e.intake = intake.Reject(err)
		return e
	}
	e.row = row
	return e
}

// accept checks a message to schedule against the rules and builds its row,
// with the fingerprint of the send it is (docs/contract.md §2.4): taken
// from the delivery as it arrived, so that a redelivery has the same one.
func (in *Ingester) accept(it *intake.Intake, d *amqp.Delivery, now time.Time) (storage.Timeout, error) {
	if err := in.opts.Rules.Check(intake.Parsed{ID: it.ID, Destination: it.Dest(), DueAt: it.DueAt}, len(d.Body), now); err != nil {
		return storage.Timeout{}, err
	}
	if it.ID == "" {
		it.ID = uuid.NewString()
		it.Msg.MessageId = it.ID
	}
	enc, err := message.Encode(nil, &it.Msg)
	if err != nil {
		return storage.Timeout{}, fmt.Errorf("headers cannot be stored: %w", err)
	}
	fp := storage.NewSendFingerprint()
	if !it.NewSend {
		if fp, err = message.Fingerprint(d); err != nil {
			return storage.Timeout{}, fmt.Errorf("headers cannot be stored: %w", err)
		}
	}
	return storage.Timeout{ID: it.ID, Destination: it.Destination, Exchange: it.Exchange, DueAt: it.DueAt, ReceivedAt: now, Message: enc,
		SagaID: it.SagaID, Fingerprint: fp}, nil
}

// acceptRecurring checks a recurring schedule (docs/contract.md §2.11)
// against the rules, its first fire time as the due time, and builds it.
func (in *Ingester) acceptRecurring(it *intake.Intake, d *amqp.Delivery, now time.Time) (storage.Schedule, error) {
	if _, ok := in.store.(storage.Scheduler); !ok {
		return storage.Schedule{}, errors.New("this store cannot keep recurring schedules")
	}
	if err := in.opts.Rules.Check(intake.Parsed{ID: it.ID, Destination: it.Dest(), DueAt: it.DueAt}, len(d.Body), now); err != nil {
		return storage.Schedule{}, err
	}
	enc, err := message.Encode(nil, &it.Msg)
	if err != nil {
		return storage.Schedule{}, fmt.Errorf("headers cannot be stored: %w", err)
	}
	r := it.Recur
	src := r.Source
	if src == "" {
		src = wire.ScheduleSourceAMQP
	}
	sched := storage.Schedule{Key: storage.ScheduleKey(src, it.ID), Source: src,
		Expr: r.Expr, Zone: r.Zone, Start: r.Start, End: r.End, Misfire: int(r.Misfire), Description: r.Description, Token: r.Token,
		Destination: it.Destination, Exchange: it.Exchange, Message: enc, NextFireAt: r.First}
	return sched, storage.CheckSchedule(&sched)
}

// handle decides the outcome of every delivery of a batch, then settles each
// exactly once, except the invalid ones whose error copies were refused: it
// adds those to held, the session's deliveries held for another try, and
// returns it. Rejections go to the error queue first: they do not depend on
// the store. Then the messages to schedule and the cancels are committed
// together, in order, and what ends the batch (intake.Op.EndsBatch, last
// in it) is applied after them.
func (in *Ingester) handle(ctx context.Context, src intake.Source, pub Publisher, batch, held []entry) ([]entry, error) {
	connErr := in.reject(ctx, src, pub, batch)
	var pause time.Duration
	if committed, p := in.commit(ctx, batch); !committed {
		pause = p
	} else if p := in.endBatch(ctx, batch); p > 0 {
		pause = p
	}
	held, err := keepHeld(batch, held, len(held) > 0)
	if err != nil {
		return held, err
	}
	if connErr != nil {
		return held, connErr // the publish connection failed: resume on a new one
	}
	if pause > 0 {
		broker.Sleep(ctx, pause)
	}
	return held, nil
}

// settle carries out the outcome of every delivery of a batch, each exactly
// once, and leaves the ones to hold unsettled. When all are acks and no
// delivery is held (heldBefore: none from earlier batches either), one
// multiple ack settles them: every delivery before the batch on this
// channel is settled already.
func settle(batch []entry, heldBefore bool) error {
	if len(batch) == 0 {
		return nil
	}
	all := !heldBefore
	for i := range batch {
		all = all && batch[i].outcome == ack
	}
	if all {
		if err := batch[len(batch)-1].d.Ack(true); err != nil {
			return fmt.Errorf("ingest: ack: %w", err)
		}
		return nil
	}
	for i := range batch {
		var err error
		switch batch[i].outcome {
		case ack:
			err = batch[i].d.Ack(false)
		case hold:
			continue
		default:
			err = batch[i].d.Nack(false, true)
		}
		if err != nil {
			// The channel is gone: what is unsettled returns to the queue.
			return fmt.Errorf("ingest: settle: %w", err)
		}
	}
	return nil
}

// commit stores the batch's messages to schedule, its replaces and its
// cancels in one commit and marks them acked. The replaces' groups are
// cancelled in that commit (ReplaceGroups), before the inserts (fits keeps
// a group's earlier messages out of the batch); the cancels are applied
// among the inserts, each after the messages received before it
// (InsertAndCancel; fits keeps replaces out of such a batch). It reports
// false, and the pause before the next attempt, when the store failed:
// they are then requeued, and so is what ends the batch.
func (in *Ingester) commit(ctx context.Context, batch []entry) (bool, time.Duration) {
	c := in.collect(batch)
	if len(c.rows) == 0 && len(c.cancels) == 0 {
		return true, 0
	}
	// Store failures are not the message's fault: requeue and retry. The
	// commit must not be abandoned half-way by shutdown, so it does not
	// take ctx.
	began := time.Now()
	var outcomes []storage.Outcome
	var results []storage.CancelResult
	var replaced, leased int
	var err error
	switch {
	case len(c.cancels) > 0:
		outcomes, results, err = in.store.InsertAndCancel(context.WithoutCancel(ctx), c.rows, c.cancels)
	case len(c.groups) > 0:
		outcomes, replaced, leased, err = in.store.ReplaceGroups(context.WithoutCancel(ctx), c.groups, c.rows)
	default:
		outcomes, err = in.store.Insert(context.WithoutCancel(ctx), c.rows)
	}
	if err != nil {
		pause := in.opts.StoreBreaker.Failure(err)
		in.log.Error().Err(err).Int("messages", len(c.rows)).Int("replaced_groups", len(c.groups)).Int("cancels", len(c.cancels)).
			Dur("retry_in", pause).Msg("store failed; messages requeued")
		return false, pause // they, and what ends the batch, stay requeue
	}
	in.opts.StoreBreaker.Success()
	in.opts.Metrics.ObserveIngestCommit(time.Since(began))
	if replaced > 0 || leased > 0 {
		// leased: too late to replace, being dispatched; both are delivered.
		in.log.Info().Strs("groups", c.groups).Int("replaced", replaced).Int("leased", leased).Msg("replace: earlier messages of the groups cancelled")
	}
	in.dropped(DropReplaced, replaced, "", strings.Join(c.groups, ","))
	for j, i := range c.cidx {
		in.cancelled(&batch[i], results[j])
	}
	if len(c.rows) > 0 {
		in.settleRows(batch, &c, outcomes)
	}
	return true, 0
}

// commitSet is what one commit of a batch stores: its rows, its replaced
// groups and its cancels, each with the index of its entry in the batch.
type commitSet struct {
	rows    []storage.Timeout
	idx     []int
	groups  []string
	cancels []storage.OrderedCancel
	cidx    []int
}

// collect picks out of batch what its commit stores, in batch order.
func (in *Ingester) collect(batch []entry) commitSet {
	var c commitSet
	_, schedules := in.store.(storage.Scheduler)
	for i := range batch {
		switch it := &batch[i].intake; {
		case it.Op == intake.OpSchedule:
		case it.Op == intake.OpReplace:
			if !slices.Contains(c.groups, it.SagaID) {
				c.groups = append(c.groups, it.SagaID)
			}
		case it.Op == intake.OpCancel:
			oc := storage.OrderedCancel{At: len(c.rows), ID: it.CancelID}
			if schedules {
				// The AMQP cancel also ends the AMQP schedule of its id
				// (docs/contract.md §2.11).
				oc.Schedule = storage.ScheduleKey(wire.ScheduleSourceAMQP, it.CancelID)
			}
			c.cancels = append(c.cancels, oc)
			c.cidx = append(c.cidx, i)
			continue
		default:
			continue
		}
		c.rows = append(c.rows, batch[i].row)
		c.idx = append(c.idx, i)
	}
	return c
}

// settleRows marks the rows of c for acknowledgement, counts and logs those
// not stored, and wakes the poller for the earliest.
func (in *Ingester) settleRows(batch []entry, c *commitSet, outcomes []storage.Outcome) {
	// Wake for every row, duplicates too: a store that repeated its insert
	// after a lost connection reports its own rows as duplicates, and a
	// wake too many costs one poll.
	earliest := c.rows[0].DueAt
	var dup, cancelled int
	for j := range c.rows {
		r := &c.rows[j]
		batch[c.idx[j]].outcome = ack
		if r.DueAt.Before(earliest) {
			earliest = r.DueAt
		}
		id, send := wire.SplitKey(r.ID)
		switch outcomes[j] {
		case storage.Stored:
		case storage.Duplicate:
			dup++
			in.dropped(DropDuplicate, 1, id, r.Dest().String())
			in.log.Debug().Str("id", id).Bool("redelivered", batch[c.idx[j]].d.Redelivered).Msg("not stored: " + dropWhy[DropDuplicate])
			continue
		default:
			cancelled++
			in.dropped(DropCancelled, 1, id, r.Dest().String())
			in.log.Debug().Str("id", id).Bool("redelivered", batch[c.idx[j]].d.Redelivered).Msg("not stored: " + dropWhy[DropCancelled])
			continue
		}
		// redelivered: taken in again after a crash or a lost connection.
		// If an earlier commit of it was already delivered, this is a
		// second copy (docs/contract.md §3.3); the debug log shows it. send
		// above 1: another send of the id was pending (§2.4).
		in.log.Debug().Str("id", id).Int("send", send).Stringer("destination", r.Dest()).Time("due_at", r.DueAt).
			Bool("redelivered", batch[c.idx[j]].d.Redelivered).Msg("stored")
	}
	in.opts.Metrics.Ingested(len(c.rows) - dup - cancelled)
	in.opts.Metrics.DuplicatesSuppressed(dup + cancelled)
	if in.opts.Wake != nil {
		in.opts.Wake(earliest)
	}
}

// dropped counts n messages of reason taken in and not to be delivered,
// and logs them (dropLog); id and dest name the last of them.
func (in *Ingester) dropped(reason string, n int, id, dest string) {
	if n <= 0 {
		return
	}
	in.opts.Metrics.Dropped(reason, n)
	in.drops.note(reason, n, id, dest, in.opts.Now())
}

// cancelled logs what the cancel e did (res), committed with its batch,
// and marks it acked.
func (in *Ingester) cancelled(e *entry, res storage.CancelResult) {
	id := e.intake.CancelID
	if res.ScheduleFound {
		in.log.Info().Str("id", id).Msg("recurring schedule cancelled over AMQP")
	}
	switch err := res.Err; {
	case err == nil:
		in.log.Info().Str("id", id).Msg("cancelled over AMQP")
	case errors.Is(err, storage.ErrNotFound) && res.ScheduleFound:
	case errors.Is(err, storage.ErrNotFound):
		in.log.Info().Str("id", id).Msg("cancel: nothing pending with this id (already delivered, or never scheduled)")
	case errors.Is(err, storage.ErrLeased):
		in.log.Warn().Str("id", id).Msg("cancel: too late, the message is being dispatched (every pending send of the id)")
	}
	e.outcome = ack
}

// endBatch applies what ended the batch (intake.Op.EndsBatch), after its
// commit. It returns the pause to take when the store failed (that
// delivery stays requeued).
func (in *Ingester) endBatch(ctx context.Context, batch []entry) time.Duration {
	var pause time.Duration
	for i := range batch {
		e := &batch[i]
		var p time.Duration
		switch e.intake.Op {
		case intake.OpCancelSaga:
			p = in.cancelSaga(ctx, e)
		case intake.OpScheduleControl:
			p = in.controlSchedule(ctx, e)
		case intake.OpRecur:
			p = in.putSchedule(ctx, e)
		}
		pause = max(pause, p)
	}
	return pause
}

// cancelSaga applies a ClearTimeouts: it cancels the saga's pending
// timeouts and acks e, or returns the pause to take when the store failed (e
// stays requeued). Timeouts being dispatched are counted and logged: too late.
func (in *Ingester) cancelSaga(ctx context.Context, e *entry) time.Duration {
	saga := e.intake.SagaID
	n, leased, err := in.store.CancelSaga(context.WithoutCancel(ctx), saga)
	if err != nil {
		pause := in.opts.StoreBreaker.Failure(err)
		in.log.Error().Err(err).Str("saga_id", saga).Dur("retry_in", pause).Msg("saga cancel failed; requeued")
		return pause
	}
	in.opts.StoreBreaker.Success()
	e.outcome = ack
	if leased > 0 {
		in.log.Warn().Str("saga_id", saga).Int("cancelled", n).Int("leased", leased).
			Msg("saga's timeouts cancelled over AMQP, except those being dispatched (too late)")
		return 0
	}
	in.log.Info().Str("saga_id", saga).Int("cancelled", n).Msg("saga's timeouts cancelled over AMQP")
	return 0
}

// putSchedule stores e's recurring schedule and acks e, or returns the pause to take
// when the store failed (e stays requeued).
func (in *Ingester) putSchedule(ctx context.Context, e *entry) time.Duration {
	sc := in.store.(storage.Scheduler) // acceptRecurring refused the message otherwise
	got, err := sc.PutSchedule(context.WithoutCancel(ctx), e.sched)
	if errors.Is(err, storage.ErrScheduleCancelled) {
		// Published before a cancel of its id, stored after it: dropped as
		// a cancelled one-shot is (docs/contract.md §2.5, §2.11).
		in.opts.StoreBreaker.Success()
		e.outcome = ack
		in.dropped(DropCancelled, 1, e.intake.ID, e.sched.Dest().String())
		in.log.Debug().Str("id", e.intake.ID).Bool("redelivered", e.d.Redelivered).Msg("not stored: " + dropWhy[DropCancelled])
		return 0
	}
	if err != nil {
		pause := in.opts.StoreBreaker.Failure(err)
		in.log.Error().Err(err).Str("schedule", e.sched.Key).Dur("retry_in", pause).Msg("storing a recurring schedule failed; requeued")
		return pause
	}
	in.opts.StoreBreaker.Success()
	e.outcome = ack
	in.log.Info().Str("schedule", got.Key).Int64("generation", got.Generation).Str("cron", got.Expr).Str("zone", got.Zone).
		Time("first_fire", got.NextFireAt).Msg("recurring schedule stored")
	if in.opts.ScheduleWake != nil {
		in.opts.ScheduleWake()
	}
	return 0
}

// reject copies the batch's invalid deliveries to the error queue, and
// marks acked each one whose copy the broker confirmed, and held each one
// the error queue refused (the Sender logs those, summed up); the others
// stay requeued. It returns an error when the publish connection failed.
func (in *Ingester) reject(ctx context.Context, src intake.Source, pub Publisher, batch []entry) error {
	var fs []errorqueue.Failure
	var idx []int
	for i := range batch {
		e := &batch[i]
		if e.intake.Op != intake.OpReject {
			continue
		}
		fs = append(fs, errorqueue.Failure{Msg: message.FromDelivery(&e.d),
			Facts: errorqueue.Facts{Reason: e.intake.Reason, Stage: wire.StageIngest, FailedQ: src.Queue}})
		idx = append(idx, i)
	}
	if len(fs) == 0 {
		return nil
	}
	results := in.opts.Errors.Send(context.WithoutCancel(ctx), pub, fs)
	var connErr error
	for j, i := range idx {
		e := &batch[i]
		switch err := results[j]; {
		case err == nil:
		case errorqueue.Refusal(err):
			e.outcome = hold
			continue
		default:
			if errors.Is(err, broker.ErrNotConfirmed) {
				connErr = err
			}
			in.log.Error().Err(err).Str("reason", e.intake.Reason).Msg("could not move invalid message to the error queue; requeued")
			continue
		}
		in.log.Warn().Str("message_id", e.d.MessageId).Str("reason", e.intake.Reason).
			Str("error_queue", in.opts.Errors.Queue()).Msg("invalid message moved to the error queue")
		e.outcome = ack
	}
	return connErr
}

// controlSchedule applies e's control to its schedule and acks e, or
// returns the pause to take when the store failed (e stays requeued). A
// schedule that does not exist is no error: the control is acked and
// logged (as Quartz's unschedule or pause of a missing trigger).
func (in *Ingester) controlSchedule(ctx context.Context, e *entry) time.Duration {
	key, c := e.intake.ScheduleKey, e.intake.Control
	sc, ok := in.store.(storage.Scheduler)
	if !ok {
		// classify refused it already: a store without schedules never
		// gets here. Should one, the control stays requeued, said so.
		in.log.Error().Str("schedule", key).Stringer("control", c).Msg("schedule control on a store without schedules; requeued")
		return time.Second
	}
	var changed bool
	var err error
	ctx = context.WithoutCancel(ctx)
	switch c {
	case intake.ScheduleCancel:
		changed, err = sc.CancelSchedule(ctx, key)
	case intake.SchedulePause:
		changed, err = sc.PauseSchedule(ctx, key)
	case intake.ScheduleResume:
		changed, err = sc.ResumeSchedule(ctx, key)
	}
	if errors.Is(err, storage.ErrScheduleNotFound) {
		err = nil
	}
	if err != nil {
		pause := in.opts.StoreBreaker.Failure(err)
		in.log.Error().Err(err).Str("schedule", key).Stringer("control", c).Dur("retry_in", pause).Msg("schedule control failed; requeued")
		return pause
	}
	in.opts.StoreBreaker.Success()
	e.outcome = ack
	in.log.Info().Str("schedule", key).Stringer("control", c).Bool("changed", changed).Msg("recurring schedule control applied")
	if changed && c == intake.ScheduleResume && in.opts.ScheduleWake != nil {
		in.opts.ScheduleWake()
	}
	return 0
}
