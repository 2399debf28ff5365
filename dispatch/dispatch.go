// Package dispatch consumes lease tokens from E.TimeoutsDispatcher, forwards
// each still-leased timeout to its destination and removes it from the store
// after the broker confirmed the forward. Every failed attempt is counted and
// the message released for a later retry, and after NumberOfRetries retries
// it goes to the error queue. A destination that refuses forwards is probed
// with one forward per interval while the others count their attempt
// without a publish, and failure warnings are summarised per destination.
package dispatch

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/rs/zerolog"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/budget"
	"github.com/delaybridge/delaybridge/circuit"
	"github.com/delaybridge/delaybridge/errorqueue"
	"github.com/delaybridge/delaybridge/message"
	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/wire"
)

// Store is what the dispatcher needs of the store.
type Store interface {
	Get(ctx context.Context, id string) (storage.Timeout, error)
	Remove(ctx context.Context, refs []storage.Ref) ([]error, error)
	Release(ctx context.Context, id, lock string, notBefore time.Time) error
	IncrementFailureCount(ctx context.Context, id, lock, reason string) (int, error)
	// GetMany reads the rows of a dispatcher message's tokens at once.
	storage.MultiGetter
}

// Publisher forwards with confirms. Each worker gets its own.
type Publisher interface {
	Publish(ctx context.Context, msgs []broker.Outgoing) []error
	Close() error
}

// NewPublisher opens a publisher on the current publish connection.
type NewPublisher func(ctx context.Context) (Publisher, error)

// Metrics is told what the dispatcher did (*metrics.Metrics implements it).
type Metrics interface {
	// Dispatched counts forwards confirmed and removed from the store.
	Dispatched(n int)
	// DispatchFailed counts one counted dispatch failure: a forward returned,
	// nacked or unpublishable, or held back because its destination refused
	// a forward within the probe interval.
	DispatchFailed()
	// ErrorQueued counts error-queue copies the broker confirmed.
	ErrorQueued(stage string, n int)
	// StaleToken counts one dispatcher token skipped as stale.
	StaleToken()
	// ObserveLateness records due time → confirm of one forward.
	ObserveLateness(d time.Duration)
	// ObserveDispatchConfirm records publish → confirm of one forward.
	ObserveDispatchConfirm(d time.Duration)
}

// DestinationMetrics, when the Metrics given have it too, is told the
// destination of each forward and failure (*metrics.Metrics has it).
type DestinationMetrics interface {
	// DestinationDispatched counts n forwards to d confirmed and removed.
	DestinationDispatched(d wire.Destination, n int)
	// DestinationDispatchFailed counts one failure of a forward to d.
	DestinationDispatchFailed(d wire.Destination)
}

type noMetrics struct{}

func (noMetrics) Dispatched(int)                       {}
func (noMetrics) DispatchFailed()                      {}
func (noMetrics) ErrorQueued(string, int)              {}
func (noMetrics) StaleToken()                          {}
func (noMetrics) ObserveLateness(time.Duration)        {}
func (noMetrics) ObserveDispatchConfirm(time.Duration) {}

// Options configure a Dispatcher.
type Options struct {
	Queue         string // E.TimeoutsDispatcher
	TimeoutsQueue string // E.Timeouts, named in NServiceBus.FailedQ
	// ErrorQueue is the queue of the dispatcher's own Errors, when none
	// is given.
	ErrorQueue string
	Prefetch   int
	// Workers process dispatcher messages in parallel, each with its own
	// publisher, so confirms of one batch overlap the next.
	Workers         int
	NumberOfRetries int
	// Allowed is checked again at dispatch: the operator may have narrowed
	// it since the message was stored. Nil allows all.
	Allowed interface{ Allows(wire.Destination) bool }
	// Exclusive consumes the dispatcher queue exclusively (a bbolt store
	// serves one instance); another instance's consumer makes Run fail with
	// ErrAnotherInstance.
	Exclusive bool
	// OnConsuming, when set, is called each time the consumer is in place.
	OnConsuming func()
	// Reconnected, when set, is called at the start of every consuming
	// session but the first, before any worker takes a message: the bridge
	// frees its bbolt leases there, whose transient tokens a broker restart
	// may have lost (poller.Options.Transient). It returns how many it freed.
	Reconnected func() int
	// LeaseDuration is the poller's lease; the confirm wait and the lease a
	// token must have left scale down with a short one. Default 5m.
	LeaseDuration time.Duration
	// MaxHold is how early a forward may arrive and still be held until its
	// due time rather than released; default 1s.
	MaxHold time.Duration
	// RetryBackoff returns how long to hold a message back after its n-th
	// failure. Nil: 1s doubling to 5m.
	RetryBackoff func(failures int) time.Duration
	// RecoveryFailuresPerSecond is MAXIMUM_RECOVERY_FAILURES_PER_SECOND:
	// failure handling (recording a failure, moving a message to the error
	// queue) that itself fails more often than this, over 30 s, calls
	// OnCritical. It never holds back the counting of a failure. 0: never.
	RecoveryFailuresPerSecond int
	// OnCritical is told a critical error (the recovery breaker above).
	OnCritical func(error)
	// ProbeInterval is how often a destination that refused a forward
	// (returned or nacked) is probed with one forward; meanwhile its other
	// forwards count a failure each without a publish. Default 1s.
	ProbeInterval time.Duration
	// WarnInterval is how often retried failures to one destination are
	// summarised in one warning, after the first one; default 10s.
	WarnInterval time.Duration
	// Errors puts the failed messages' copies on the error queue and paces
	// them while it refuses them (the bridge shares one with ingest). Nil:
	// one of the dispatcher's own on ErrorQueue, which does not declare the
	// queue again.
	Errors *errorqueue.Sender
	// Breaker watches forwarding: store errors and confirms that time out
	// arm it, a confirmed forward disarms it. A lost connection does not
	// count: reconnecting handles that. Nil: never triggers.
	Breaker *circuit.Breaker
	// Budget, when set, bounds the bytes of the stored messages the workers
	// hold at once: the tokens of a dispatcher message are forwarded in
	// groups whose rows fit it (a row larger than the budget alone). Nil:
	// all of a message's tokens at once.
	Budget *budget.Budget
	// ExpectedRowBytes is the row size the first group is sized for, until
	// the rows read tell (say, the largest message the bridge stores).
	ExpectedRowBytes int
	// RemoveHold is how long the removals of forwarded rows wait to share a
	// commit with the ones that follow (at most maxRemovalBatch dispatcher
	// messages, and never into the last removeSlack of a lease): a few
	// large commits write far fewer store pages than many small ones (see
	// ingest.Options.Hold). A crash meanwhile forwards those rows again
	// (docs/contract.md §3.3). 0: each removal commits as soon as the
	// previous one is done.
	RemoveHold time.Duration
	// Metrics, when set, is told what the dispatcher did.
	Metrics Metrics
	// Stamp, when set, finishes each forward as it is built, with the time
	// it is sent: a protocol whose scheduler stamps its fire time on what it
	// sends (MassTransit's Quartz) does so there. Nil: sent as stored.
	Stamp  Stamper
	Now    func() time.Time
	Logger zerolog.Logger
}

// Stamper finishes a forward at the time it is sent; id is the id it is
// stored under. It returns msg unchanged when msg is not its protocol's,
// and must not change where msg goes.
type Stamper interface {
	Stamp(msg amqp.Publishing, id string, sentAt time.Time) amqp.Publishing
}

// Stampers is a Stamper that has each of its own finish the forward, in
// order.
type Stampers []Stamper

// Stamp implements Stamper.
func (ss Stampers) Stamp(msg amqp.Publishing, id string, sentAt time.Time) amqp.Publishing {
	for _, s := range ss {
		msg = s.Stamp(msg, id, sentAt)
	}
	return msg
}

// Dispatcher forwards due timeouts.
type Dispatcher struct {
	conn   broker.Waiter
	newPub NewPublisher
	store  Store
	opts   Options
	log    zerolog.Logger

	dests    *destinations
	failures *failureLog
	recovery *recoveryBreaker
	// removeWait is the first pause before a failed removal is tried again.
	removeWait time.Duration
	// rowBytes is the largest row of the last group read: the size the
	// next group is planned for (Options.Budget).
	rowBytes atomic.Int64
	// sessions counts consuming sessions (Options.Reconnected).
	sessions atomic.Int64
	// commitTook is how long removal commits take (holdEnd).
	commitTook commitTime
	// claims are the tokens this instance is forwarding, from their read
	// until their dispatcher message is settled.
	claims claims
}

// New returns a Dispatcher consuming on conn, with opts.Workers workers that
// each forward through their own publisher from newPub; it starts nothing.
func New(conn broker.Waiter, newPub NewPublisher, store Store, opts Options) *Dispatcher {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.RetryBackoff == nil {
		opts.RetryBackoff = DefaultBackoff
	}
	if opts.Workers < 1 {
		opts.Workers = 1
	}
	if opts.MaxHold <= 0 {
		opts.MaxHold = time.Second
	}
	if opts.LeaseDuration <= 0 {
		opts.LeaseDuration = 5 * time.Minute
	}
	if opts.Breaker == nil {
		opts.Breaker = circuit.New("dispatch", time.Duration(1<<62), circuit.Options{Now: opts.Now})
	}
	if opts.Metrics == nil {
		opts.Metrics = noMetrics{}
	}
	if opts.ProbeInterval <= 0 {
		opts.ProbeInterval = time.Second
	}
	if opts.WarnInterval <= 0 {
		opts.WarnInterval = 10 * time.Second
	}
	if opts.Errors == nil {
		opts.Errors = errorqueue.New(errorqueue.Options{Queue: opts.ErrorQueue, WarnInterval: opts.WarnInterval,
			Metrics: opts.Metrics, Now: opts.Now, Logger: opts.Logger})
	}
	d := &Dispatcher{conn: conn, newPub: newPub, store: store, opts: opts, log: opts.Logger,
		failures:   newFailureLog(opts.WarnInterval, opts.Logger),
		recovery:   &recoveryBreaker{perSecond: opts.RecoveryFailuresPerSecond, now: opts.Now, onTrigger: opts.OnCritical},
		removeWait: 100 * time.Millisecond}
	d.rowBytes.Store(int64(opts.ExpectedRowBytes))
	d.dests = newDestinations(opts.ProbeInterval, d.confirmWait()+opts.MaxHold,
		func(it item) bool { return it.row.Attempts >= opts.NumberOfRetries })
	return d
}

// ErrAnotherInstance means another instance holds the dispatcher queue.
var ErrAnotherInstance = errors.New("another instance holds the dispatcher queue")

// confirmTimeout bounds the wait for a forward window's confirms.
const confirmTimeout = 30 * time.Second

// confirmWait is confirmTimeout, or a quarter of a shorter lease.
func (d *Dispatcher) confirmWait() time.Duration {
	return min(confirmTimeout, d.opts.LeaseDuration/4)
}

// leaseMargin is the lease a token must have left to be forwarded: enough
// for the hold, the confirms and the removal, so the removal never finds
// the lease expired (which would mean a second delivery later).
func (d *Dispatcher) leaseMargin() time.Duration {
	return min(d.confirmWait()+d.opts.MaxHold+5*time.Second, d.opts.LeaseDuration/2)
}

func latest(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// effectiveDue is when t could first be forwarded: its due time, or later
// when it was stored after it (published with a past due time, replayed) or
// held back for a retry (NotBefore). Lateness counts from there, so a
// message that was due an hour before it became leasable does not read as an
// hour late (docs/contract.md §6.2). A store keeps no time of an operator's reschedule:
// one into the past still counts from the due time it was given.
func effectiveDue(t *storage.Timeout) time.Time {
	return latest(latest(t.DueAt, t.NotBefore), t.ReceivedAt)
}

// DefaultBackoff waits 1s after the first failure, doubling up to 5 minutes.
func DefaultBackoff(failures int) time.Duration {
	if failures < 1 {
		failures = 1
	}
	d := time.Second << min(failures-1, 20)
	return min(d, 5*time.Minute)
}

// Run consumes until ctx ends, then stops consuming and lets every worker
// finish the message in hand (drain) before returning. When the broker
// connection fails it resumes on the next one; dispatcher messages not yet
// acknowledged return to the queue with the old channel.
func (d *Dispatcher) Run(ctx context.Context) error {
	// The failure summaries are written on time even when no failure
	// follows to flush them.
	sctx, stopSummaries := context.WithCancel(ctx)
	summaries := make(chan struct{})
	go func() {
		defer close(summaries)
		t := time.NewTicker(d.opts.WarnInterval)
		defer t.Stop()
		for {
			select {
			case <-sctx.Done():
				return
			case <-t.C:
				d.failures.flush(d.opts.Now(), false)
			}
		}
	}()
	defer func() {
		stopSummaries()
		<-summaries
		d.failures.flush(d.opts.Now(), true) // no count left unlogged
	}()
	err := broker.Consume(ctx, d.conn, broker.ConsumeOptions{
		Queue: d.opts.Queue, Prefetch: d.opts.Prefetch, Exclusive: d.opts.Exclusive, Name: "dispatch",
		OnConsuming: d.opts.OnConsuming, Logger: d.log,
	}, d.session)
	if errors.Is(err, broker.ErrExclusiveConsumer) {
		return fmt.Errorf("%w: %s already has an exclusive consumer: another delaybridge instance with a bbolt store serves this endpoint. "+
			"A bbolt file serves one instance; run several with DELAYBRIDGE_STORE=postgres", ErrAnotherInstance, d.opts.Queue)
	}
	return err
}

// session runs the workers, each with its own publisher, on one consumer
// until something fails or ctx ends.
func (d *Dispatcher) session(ctx context.Context, s *broker.Session) error {
	if d.sessions.Add(1) > 1 && d.opts.Reconnected != nil {
		if n := d.opts.Reconnected(); n > 0 {
			d.log.Info().Int("leases", n).Msg("consuming again: freed the leases whose tokens the broker may have lost; their rows are leased again")
		}
	}
	pubs := make([]Publisher, 0, d.opts.Workers)
	defer func() {
		for _, p := range pubs {
			_ = p.Close()
		}
	}()
	for range d.opts.Workers {
		p, err := d.newPub(ctx)
		if err != nil {
			return fmt.Errorf("dispatch: open publisher: %w", err)
		}
		pubs = append(pubs, p)
	}

	// Workers stop taking new messages when stop closes; the message in hand
	// is finished with a context that shutdown does not cancel.
	stop := make(chan struct{})
	errs := make(chan error, len(pubs)+1)
	// The removals, and so the acks, of the workers' messages; it outlives
	// the workers, so every message they forwarded is settled.
	removals := make(chan owed, max(d.opts.Prefetch, 1))
	removed := make(chan struct{})
	go func() {
		defer close(removed)
		if err := d.removeLoop(context.WithoutCancel(ctx), removals); err != nil {
			errs <- err
		}
	}()
	var wg sync.WaitGroup
	for _, pub := range pubs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- d.work(ctx, stop, s.Deliveries, pub, removals)
		}()
	}
	var runErr error
	select {
	case <-ctx.Done():
	case e := <-s.Closed:
		runErr = fmt.Errorf("dispatch: channel closed: %v", e)
	case runErr = <-errs:
	}
	s.Cancel()
	close(stop)
	wg.Wait()
	close(removals)
	<-removed
	close(errs)
	for err := range errs {
		if runErr == nil {
			runErr = err
		}
	}
	return runErr
}

func (d *Dispatcher) work(ctx context.Context, stop <-chan struct{}, deliveries <-chan amqp.Delivery, pub Publisher, removals chan<- owed) error {
	for {
		select {
		case <-stop:
			return nil
		case del, ok := <-deliveries:
			if !ok {
				return nil
			}
			settled, rm, err := d.forwardAll(context.WithoutCancel(ctx), &del, pub)
			if rm != nil {
				removals <- owed{del: del, rm: rm} // settled by removeLoop
				continue
			}
			if serr := settle(&del, settled); serr != nil && err == nil {
				err = serr
			}
			if err != nil {
				return err
			}
		}
	}
}

// outcome is what becomes of one dispatcher message.
type outcome uint8

const (
	// requeue: the broker failed under it; its tokens were released, and the
	// message goes back to the queue for whoever consumes next.
	requeue outcome = iota
	// ack: every token is settled (forwarded, released, failed or stale).
	ack
)

// settle carries out a dispatcher message's outcome, once.
func settle(del *amqp.Delivery, o outcome) error {
	var err error
	if o == ack {
		err = del.Ack(false)
	} else {
		err = del.Nack(false, true)
	}
	if err != nil {
		return fmt.Errorf("dispatch: settle: %w", err)
	}
	return nil
}

// item is one token on its way through a dispatcher message.
type item struct {
	tok wire.Lease
	row storage.Timeout
	msg amqp.Publishing
	// probe: the one forward testing a destination that refused (see
	// destinations).
	probe bool
}

// removal is what a dispatcher message still owes once its forwards are
// confirmed: the removal of their rows, after which it is acked.
type removal struct {
	refs     []storage.Ref
	dests    []wire.Destination // refs' destinations, index for index
	leaseEnd time.Time          // the earliest lease among refs
	// since is when the earliest of refs was confirmed: a crash from then
	// on forwards it again.
	since time.Time
	// claimed are the dispatcher message's claimed tokens (claims).
	claimed []wire.Lease
}

// forwardAll forwards the tokens of one dispatcher message and decides its
// outcome. When every forward was confirmed and nothing else is owed, it
// leaves the removal to the caller (rm); otherwise it removes, and rm is
// nil. The tokens are forwarded in groups that fit the byte budget; each
// group but the last removes its rows itself, while their leases are fresh.
// When the broker fails under a group, the message is requeued, and the
// tokens of the groups done by then are stale when it comes back.
func (d *Dispatcher) forwardAll(ctx context.Context, del *amqp.Delivery, pub Publisher) (_ outcome, rm *removal, _ error) {
	toks, err := wire.DecodeLeases(del.Body)
	if err != nil {
		// Not ours or corrupt: nobody else can read it either.
		d.log.Error().Err(err).Msg("unreadable dispatcher message dropped")
		return ack, nil, nil
	}
	claimed := d.claim(toks)
	toks = claimed
	defer func() {
		if rm != nil {
			rm.claimed = claimed // given up once the removal is committed
		} else {
			d.claims.release(claimed)
		}
	}()
	for len(toks) > 0 {
		n := d.groupSize(len(toks))
		o, rm, err := d.handleGroup(ctx, toks[:n], pub)
		toks = toks[n:]
		if err != nil || len(toks) == 0 {
			return o, rm, err
		}
		if rm != nil {
			d.removeAll(ctx, []*removal{rm})
		}
	}
	return ack, nil, nil
}

// claims are the tokens this instance is forwarding. The broker may deliver
// one dispatcher message twice at once: a quorum queue whose leader fails
// over, or a requeue racing a new consuming session. The row's lock
// cannot tell the two copies apart (both carry the lease), and its removal
// waits up to RemoveHold after the forward, so without a claim the second
// copy would forward the row again. A token is claimed from its read until
// its dispatcher message is settled; a copy of it meanwhile is stale.
type claims struct {
	mu   sync.Mutex
	held map[wire.Token]struct{}
}

// take claims tok; false when it is claimed already.
func (c *claims) take(tok wire.Token) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.held[tok]; ok {
		return false
	}
	if c.held == nil {
		c.held = make(map[wire.Token]struct{})
	}
	c.held[tok] = struct{}{}
	return true
}

// release gives toks up.
func (c *claims) release(toks []wire.Lease) {
	if len(toks) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, tok := range toks {
		delete(c.held, tok.Token)
	}
}

// claim claims toks and returns those it could; the others are stale: a
// copy of their message is being forwarded.
func (d *Dispatcher) claim(toks []wire.Lease) []wire.Lease {
	out := toks[:0:0]
	for _, tok := range toks {
		if d.claims.take(tok.Token) {
			out = append(out, tok)
		} else {
			d.stale(tok, "being forwarded from another copy of its dispatcher message")
		}
	}
	return out
}

// groupSize is how many of n tokens the next group takes: as many rows of
// the size last seen as fill half the budget (two workers overlap), at
// least one.
func (d *Dispatcher) groupSize(n int) int {
	total, size := d.opts.Budget.Total(), d.rowBytes.Load()
	if total == 0 || size <= 0 {
		return n
	}
	return int(max(1, min(total/2/size, int64(n))))
}

// handleGroup forwards one group of a dispatcher message's tokens. Their
// rows' bytes are acquired, at the size planned, before they are read, so a
// worker never waits for the budget while holding any; the estimate is then
// corrected to the rows read (given back, or taken if they fit).
func (d *Dispatcher) handleGroup(ctx context.Context, toks []wire.Lease, pub Publisher) (_ outcome, rm *removal, _ error) {
	b := d.opts.Budget
	planned := min(d.rowBytes.Load()*int64(len(toks)), b.Total())
	_ = b.Acquire(ctx, planned) // ctx is not cancelled: handle runs to the end
	acquired := []int64{planned}
	defer func() {
		for _, n := range acquired {
			b.Release(n)
		}
	}()
	items := make([]item, 0, len(toks))
	rows := d.prefetch(ctx, toks)
	var read, largest int64
	for _, r := range rows {
		read += int64(len(r.Message))
		largest = max(largest, int64(len(r.Message)))
	}
	for _, tok := range toks {
		// Judged after the read: the lease left must be measured from now,
		// not from before a slow store call.
		it, ok := d.load(ctx, pub, tok, rows, d.opts.Now())
		if ok {
			items = append(items, it)
			if rows == nil {
				read += int64(len(it.row.Message))
				largest = max(largest, int64(len(it.row.Message)))
			}
		}
	}
	if largest > 0 {
		d.rowBytes.Store(largest)
	}
	switch {
	case read < planned:
		acquired[0] = read
		b.Release(planned - read)
	case read > planned && b.TryAcquire(min(read-planned, b.Total()-planned)):
		// Not Acquire: waiting while holding could wait for another worker
		// that waits for this one. Rows larger than planned that do not fit
		// are forwarded anyway (they are read), and the next group is
		// planned for their size.
		acquired = append(acquired, min(read-planned, b.Total()-planned))
	}
	if len(items) == 0 {
		return ack, nil, nil
	}

	// A destination that refused a forward within the probe interval gets
	// no publish; one of its forwards probes it once the interval is over,
	// and the rest of them in this window wait for that probe's answer.
	send, held, blocked := d.dests.plan(items, d.opts.Now())
	wctx, cancel := context.WithTimeout(ctx, d.confirmWait()+d.opts.MaxHold)
	defer cancel()
	var r forwarded
	d.forward(wctx, ctx, pub, send, &r)
	if len(held) > 0 {
		var again, lost []item
		for _, it := range held {
			switch reason, refused := d.dests.refused(it.row.Dest(), d.opts.Now()); {
			case r.brokerErr != nil:
				lost = append(lost, it) // the probe's answer was lost with the connection
			case refused:
				blocked = append(blocked, blockedItem{it: it, reason: reason})
			default:
				again = append(again, it)
			}
		}
		d.releaseUnsent(ctx, lost)
		// A deadline of its own: the first round may have used up most of
		// wctx waiting for its due times and confirms. It still ends while
		// every lease of the window leaves time for the removal.
		end := d.opts.Now().Add(d.confirmWait() + d.opts.MaxHold)
		for _, it := range items {
			if le := it.row.LockExpiresAt.Add(-removeSlack); le.Before(end) {
				end = le
			}
		}
		actx, acancel := context.WithTimeout(ctx, end.Sub(d.opts.Now()))
		d.forward(actx, ctx, pub, again, &r)
		acancel()
	}
	rm = &removal{refs: r.done, dests: r.dests, leaseEnd: r.leaseEnd, since: r.since}
	if r.brokerErr == nil && len(blocked) == 0 {
		return ack, rm, nil
	}
	// Remove what was forwarded first, while its lease is fresh; then count
	// the blocked ones: two store commits each must not eat the lease the
	// removals need (a removal refused after the forward is a duplicate).
	d.removeAll(ctx, []*removal{rm})
	for _, b := range blocked {
		d.fail(ctx, pub, b.it, b.reason)
	}
	if r.brokerErr != nil {
		if errors.Is(r.brokerErr, context.DeadlineExceeded) {
			// Connected but not confirming (flow control, alarms): this
			// is what the dispatch breaker is for. A lost connection is
			// not; reconnecting handles it.
			d.opts.Breaker.Failure(r.brokerErr)
		}
		return requeue, nil, fmt.Errorf("dispatch: forward: %w", r.brokerErr)
	}
	return ack, nil, nil
}

// removeAll removes the rows of several dispatcher messages' forwards in
// one commit and counts them as dispatched.
func (d *Dispatcher) removeAll(ctx context.Context, rms []*removal) {
	var refs []storage.Ref
	var dests []wire.Destination
	var leaseEnd time.Time
	for _, rm := range rms {
		refs = append(refs, rm.refs...)
		dests = append(dests, rm.dests...)
		if !rm.leaseEnd.IsZero() && (leaseEnd.IsZero() || rm.leaseEnd.Before(leaseEnd)) {
			leaseEnd = rm.leaseEnd
		}
	}
	removed, err := d.removeEach(ctx, refs, leaseEnd)
	dm, perDest := d.opts.Metrics.(DestinationMetrics)
	n := 0
	for i, ok := range removed {
		if ok {
			n++
			if perDest && i < len(dests) {
				dm.DestinationDispatched(dests[i], 1)
			}
		}
	}
	d.opts.Metrics.Dispatched(n)
	if err == nil && len(refs) > 0 {
		d.opts.Breaker.Success()
	}
}

// owed is a dispatcher message whose removal is still to be done; it is
// acked after it.
type owed struct {
	del amqp.Delivery
	rm  *removal
}

// maxRemovalBatch bounds the dispatcher messages whose removals share one
// commit.
const maxRemovalBatch = 64

// removeLoop removes and then acks what the workers leave it, until in is
// closed: the removals of whatever queued meanwhile share a commit. A
// worker moves on to its next message as soon as its forwards are
// confirmed, so a slow commit (an fsync behind the store's other writes)
// does not hold up forwards that fall due meanwhile. It
// returns the first error settling a message.
func (d *Dispatcher) removeLoop(ctx context.Context, in <-chan owed) error {
	var firstErr error
	batch := make([]owed, 0, maxRemovalBatch)
	rms := make([]*removal, 0, maxRemovalBatch)
	hold := time.NewTimer(time.Hour)
	hold.Stop()
	defer hold.Stop()
	for o := range in {
		batch = append(batch[:0], o)
		until := d.holdUntil(o.rm, d.holdEnd(o.rm))
		hold.Reset(until.Sub(d.opts.Now()))
	more:
		for len(batch) < maxRemovalBatch {
			// What has queued joins first; only then is the hold waited for.
			var o owed
			var ok bool
			select {
			case o, ok = <-in:
			default:
				select {
				case o, ok = <-in:
				case <-hold.C:
					break more
				}
			}
			if !ok {
				break more
			}
			batch = append(batch, o)
			if u := d.holdUntil(o.rm, d.holdEnd(o.rm)); u.Before(until) {
				until = u
				hold.Reset(until.Sub(d.opts.Now()))
			}
		}
		hold.Stop()
		rms = rms[:0]
		for _, o := range batch {
			rms = append(rms, o.rm)
		}
		began := d.opts.Now()
		d.removeAll(ctx, rms)
		d.commitTook.observe(d.opts.Now().Sub(began))
		for _, rm := range rms {
			d.claims.release(rm.claimed)
		}
		for i := range batch {
			if err := settle(&batch[i].del, ack); err != nil && firstErr == nil {
				firstErr = err
			}
		}
		clear(batch)
	}
	return firstErr
}

// holdEnd is when the removal of rm must start for its rows to be removed
// RemoveHold after the first of them was confirmed: the hold counts from
// that confirm, and leaves the time recent removals took to commit. So a
// crash forwards again about RemoveHold of forwards (docs/contract.md
// §3.3), however long the confirm or the commit took.
func (d *Dispatcher) holdEnd(rm *removal) time.Time {
	since := d.opts.Now()
	if rm != nil && !rm.since.IsZero() && rm.since.Before(since) {
		since = rm.since
	}
	return since.Add(d.opts.RemoveHold - d.commitTook.estimate())
}

// commitTime estimates how long a removal commit takes: an exponentially
// weighted mean of the recent ones, which a slow one raises at once.
type commitTime struct{ ns atomic.Int64 }

func (c *commitTime) observe(d time.Duration) {
	old := time.Duration(c.ns.Load())
	switch {
	case d > old:
		c.ns.Store(int64(d)) // a slow commit counts at once
	default:
		c.ns.Store(int64(old - (old-d)/8))
	}
}

func (c *commitTime) estimate() time.Duration { return time.Duration(c.ns.Load()) }

// holdUntil is until, or earlier when rm's lease would otherwise leave less
// than removeSlack for its removal.
func (d *Dispatcher) holdUntil(rm *removal, until time.Time) time.Time {
	if rm == nil || rm.leaseEnd.IsZero() {
		return until
	}
	if latest := rm.leaseEnd.Add(-removeSlack); latest.Before(until) {
		return latest
	}
	return until
}

// forwarded gathers the outcome of a window's publishes.
type forwarded struct {
	done []storage.Ref
	// dests are the destinations of done's rows, index for index.
	dests []wire.Destination
	// leaseEnd is the earliest lease expiry among done: the removal must
	// happen before it.
	leaseEnd time.Time
	// since is the earliest confirm among done.
	since time.Time
	// brokerErr is set when the broker failed under a publish.
	brokerErr error
}

// forward publishes items (in due order) and deals with each outcome:
// confirmed ones join r.done for removal, failed ones are counted, and ones
// the broker failed under are released uncounted. wctx bounds the publish.
func (d *Dispatcher) forward(wctx, ctx context.Context, pub Publisher, items []item, r *forwarded) {
	if len(items) == 0 {
		return
	}
	// Never early: the poller leases a little ahead, and each forward waits
	// for its due time. Tokens arrive in due order.
	out := make([]broker.Outgoing, len(items))
	// When each forward was confirmed, for its lateness: a window's confirms
	// arrive while later forwards of it are still held for their due time.
	confirmedAt := make([]time.Time, len(items))
	_, unmeasured := d.opts.Metrics.(noMetrics)
	now := d.opts.Now()
	for i, it := range items {
		notBefore := latest(it.row.DueAt, it.row.NotBefore) // a retry waits out its hold too
		msg := it.msg
		if d.opts.Stamp != nil {
			// The publisher holds it until notBefore at the latest.
			msg = d.opts.Stamp.Stamp(msg, it.row.ID, latest(now, notBefore))
		}
		out[i] = broker.Outgoing{Exchange: it.row.Exchange, RoutingKey: it.row.Destination, Mandatory: true, Msg: msg,
			NotBefore: notBefore}
		out[i].Confirmed = func(latency time.Duration) {
			confirmedAt[i] = d.opts.Now()
			if !unmeasured {
				d.opts.Metrics.ObserveDispatchConfirm(latency)
			}
		}
	}
	if e := d.log.Debug(); e.Enabled() {
		// With the "removed" line below, a debug log tells exactly which
		// forwards a crash left unsettled; with ingest's "stored" lines,
		// which messages a redelivery stored a second time (the two
		// sources of duplicates after a crash, docs/contract.md §3.3).
		e.Strs("ids", itemIDs(items)).Msg("forwarding")
	}
	results := pub.Publish(wctx, out)
	returnedAt := d.opts.Now()
	// Learnt before any failure is handled: that takes store commits, and
	// other workers must know the destination refuses meanwhile.
	for i, it := range items {
		d.dests.record(it.row.Dest(), results[i], returnedAt, it.probe)
	}
	var unsent []item // the broker failed under them
	for i, it := range items {
		err := results[i]
		switch {
		case err == nil:
			r.done = append(r.done, storage.Ref{ID: it.tok.ID, Lock: it.tok.Lock})
			r.dests = append(r.dests, it.row.Dest())
			if r.leaseEnd.IsZero() || it.row.LockExpiresAt.Before(r.leaseEnd) {
				r.leaseEnd = it.row.LockExpiresAt
			}
			at := confirmedAt[i]
			if at.IsZero() { // a Publisher that does not report confirms
				at = returnedAt
			}
			if r.since.IsZero() || at.Before(r.since) {
				r.since = at
			}
			d.opts.Metrics.ObserveLateness(at.Sub(effectiveDue(&it.row)))
		case errors.Is(err, broker.ErrNotConfirmed):
			// The broker failed, not the message: release without
			// counting a retry.
			r.brokerErr = err
			unsent = append(unsent, it)
		default:
			// Returned, nacked, or unpublishable (a routing key or header
			// AMQP cannot carry): the message's own failure, counted.
			d.fail(ctx, pub, it, err.Error())
		}
	}
	d.releaseUnsent(ctx, unsent)
}

// prefetch reads the rows of a batch of tokens in one read (on a shared
// store over the network, one read per token halved the burst rate). Nil
// means read each with Get.
func (d *Dispatcher) prefetch(ctx context.Context, toks []wire.Lease) map[string]storage.Timeout {
	if len(toks) < 2 {
		return nil
	}
	ids := make([]string, len(toks))
	for i, t := range toks {
		ids[i] = t.ID
	}
	rows, err := d.store.GetMany(ctx, ids)
	if err != nil {
		// Each token is read on its own instead, and fails on its own.
		d.log.Warn().Err(err).Int("tokens", len(toks)).Msg("reading a batch of leased timeouts failed; reading them one by one")
		return nil
	}
	return rows
}

// load fetches the row behind a token and decides whether it may be
// forwarded now. Stale tokens (row gone, released, leased again or lease
// expired) are skipped: whoever holds the row now forwards it.
func (d *Dispatcher) load(ctx context.Context, pub Publisher, tok wire.Lease, rows map[string]storage.Timeout, now time.Time) (item, bool) {
	it := item{tok: tok}
	var row storage.Timeout
	var err error
	if rows != nil {
		var ok bool
		if row, ok = rows[tok.ID]; !ok {
			err = storage.ErrNotFound
		}
	} else {
		row, err = d.store.Get(ctx, tok.ID)
	}
	switch {
	case errors.Is(err, storage.ErrNotFound):
		d.stale(tok, "timeout no longer pending")
		return it, false
	case err != nil:
		// The lease expires and the poller hands the row out again.
		d.opts.Breaker.Failure(err)
		d.log.Error().Err(err).Str("id", tok.ID).Msg("reading a leased timeout failed; it is retried after its lease expires")
		return it, false
	case row.Lock != tok.Lock:
		d.stale(tok, "lease released or taken again")
		return it, false
	case !now.Before(row.LockExpiresAt):
		d.stale(tok, "lease expired")
		return it, false
	case row.LockExpiresAt.Sub(now) < d.leaseMargin():
		// Too little lease left to forward and then remove with it: a
		// removal refused after the forward would mean a second delivery.
		// Give it back; the poller leases it again with a full lease.
		d.log.Debug().Str("id", tok.ID).Msg("lease nearly expired; released for a fresh one")
		d.release(ctx, item{tok: tok}, time.Time{})
		return it, false
	}
	it.row = row
	if row.Paused {
		// Its destination was paused after the poller leased it: give it
		// back, held with the others, rather than forward it. Only a row
		// already past this point when the pause lands still goes out.
		d.log.Debug().Str("id", tok.ID).Msg("destination paused; released")
		d.release(ctx, it, time.Time{})
		return it, false
	}
	if row.DueAt.Sub(now) > d.opts.MaxHold {
		// Handed over far too early (clocks of another instance?): give it
		// back rather than tie up a worker.
		d.release(ctx, it, row.DueAt)
		return it, false
	}
	msg, err := message.Decode(row.Message)
	if err != nil {
		// No retry can fix this; keep the raw record so nothing is lost.
		it.msg = amqp.Publishing{MessageId: tok.MessageID, Body: row.Message}
		d.moveToErrorQueue(ctx, pub, it, "stored message is corrupt: "+err.Error())
		return it, false
	}
	it.msg = msg
	if d.opts.Allowed != nil && !d.opts.Allowed.Allows(row.Dest()) {
		d.moveToErrorQueue(ctx, pub, it, fmt.Sprintf("destination %s is not allowed by DELAYBRIDGE_ALLOWED_DESTINATIONS", row.Dest().Quoted()))
		return it, false
	}
	return it, true
}

func (d *Dispatcher) stale(tok wire.Lease, why string) {
	d.opts.Metrics.StaleToken()
	d.log.Debug().Str("id", tok.ID).Str("why", why).Msg("stale dispatcher token skipped")
}

// releaseUnsent releases, without counting a retry, the leases of items
// whose forwards the broker failed under, all together
// (storage.ReleaseEach): a lost connection fails a whole window at once, and
// one commit each would hold the worker, and the rows, for as many commits.
func (d *Dispatcher) releaseUnsent(ctx context.Context, items []item) {
	if len(items) == 0 {
		return
	}
	refs := make([]storage.Ref, len(items))
	for i, it := range items {
		refs[i] = storage.Ref{ID: it.tok.ID, Lock: it.tok.Lock}
	}
	for i, err := range storage.ReleaseEach(ctx, d.store, refs, time.Time{}) {
		d.releaseFailed(refs[i].ID, err)
	}
}

func (d *Dispatcher) release(ctx context.Context, it item, notBefore time.Time) error {
	err := d.store.Release(ctx, it.tok.ID, it.tok.Lock, notBefore)
	d.releaseFailed(it.tok.ID, err)
	return err
}

// releaseFailed logs a release of id that failed (err not nil).
func (d *Dispatcher) releaseFailed(id string, err error) {
	if err != nil {
		d.log.Error().Err(err).Str("id", id).Msg("release failed; the timeout returns when its lease expires")
	}
}

// storeFault reports whether err is the store failing, rather than a lost
// lease or a cancelled row.
func storeFault(err error) bool {
	return err != nil && !errors.Is(err, storage.ErrConcurrency) && !errors.Is(err, storage.ErrNotFound)
}

// fail records a per-message dispatch failure: every one is counted, then
// retried after the backoff, or after the last retry the message moves to
// the error queue.
func (d *Dispatcher) fail(ctx context.Context, pub Publisher, it item, reason string) {
	d.opts.Metrics.DispatchFailed()
	if dm, ok := d.opts.Metrics.(DestinationMetrics); ok {
		dm.DestinationDispatchFailed(it.row.Dest())
	}
	attempts, err := d.store.IncrementFailureCount(ctx, it.tok.ID, it.tok.Lock, reason)
	if err != nil {
		if storeFault(err) {
			d.opts.Breaker.Failure(err)
			d.recovery.failure(fmt.Errorf("record a dispatch failure: %w", err))
		}
		d.log.Error().Err(err).Str("id", it.tok.ID).Msg("recording a dispatch failure failed; the timeout returns when its lease expires")
		return
	}
	if attempts <= d.opts.NumberOfRetries {
		now := d.opts.Now()
		retryAt := now.Add(d.opts.RetryBackoff(attempts))
		d.failures.note(it.row.Dest().String(), it.tok.ID, reason, attempts, retryAt, now)
		if err := d.release(ctx, it, retryAt); storeFault(err) {
			// Counted already; it comes back when its lease expires.
			d.recovery.failure(fmt.Errorf("release a failed message for retry: %w", err))
		}
		return
	}
	it.row.Attempts = attempts
	d.moveToErrorQueue(ctx, pub, it, fmt.Sprintf("dispatch to %s failed %d times: %s", it.row.Dest().Quoted(), attempts, reason))
}

// moveToErrorQueue copies a failed message to the error queue and removes
// it from the store once the copy is confirmed; a copy not confirmed leaves
// it released for a later retry.
func (d *Dispatcher) moveToErrorQueue(ctx context.Context, pub Publisher, it item, reason string) {
	f := errorqueue.Failure{Msg: it.msg, ID: it.tok.MessageID, Record: it.row.Message, Facts: errorqueue.Facts{
		Reason: reason, Stage: wire.StageDispatch, Attempts: it.row.Attempts, FailedQ: d.opts.TimeoutsQueue,
	}}
	if dest := it.row.Dest(); dest.Key != "" || !dest.IsQueue() {
		f.Facts.Forward = &dest // a corrupt row may not know its destination
	}
	// While the error queue refuses copies, only the gate's probes are
	// published, and it logs the refusals summed up.
	fs := []errorqueue.Failure{f}
	if err := d.opts.Errors.Send(ctx, pub, fs)[0]; err != nil {
		// A copy the gate held back was not an attempt: it does not count.
		if !errors.Is(err, errorqueue.ErrRefusing) && (!errors.Is(err, broker.ErrNotConfirmed) || errors.Is(err, context.DeadlineExceeded)) {
			d.recovery.failure(fmt.Errorf("move a message to the error queue: %w", err))
		}
		if !errorqueue.Refusal(err) {
			d.log.Error().Err(err).Str("id", it.tok.ID).Msg("could not move a failed message to the error queue; it is retried")
		}
		d.release(ctx, it, d.opts.Now().Add(d.opts.RetryBackoff(it.row.Attempts)))
		return
	}
	d.log.Error().Str("id", it.tok.ID).Stringer("destination", it.row.Dest()).Str("reason", fs[0].Facts.Reason).
		Str("error_queue", d.opts.Errors.Queue()).Msg("message moved to the error queue")
	_, err := d.remove(ctx, []storage.Ref{{ID: it.tok.ID, Lock: it.tok.Lock}}, it.row.LockExpiresAt)
	if err != nil {
		d.recovery.failure(fmt.Errorf("remove a message moved to the error queue: %w", err))
	}
}

// removeAttempts bounds the tries of one removal; removeSlack is the lease
// a retry must leave for its own commit.
const (
	removeAttempts = 5
	removeSlack    = time.Second
)

// remove deletes forwarded rows in one commit and returns how many it
// removed. A failed commit is tried again with backoff while the leases
// (the earliest ends at leaseEnd) still hold: once one expires, the row is
// leased and forwarded again, a duplicate. What still fails is logged;
// it can only cause a duplicate, never a loss.
func (d *Dispatcher) remove(ctx context.Context, refs []storage.Ref, leaseEnd time.Time) (int, error) {
	ok, err := d.removeEach(ctx, refs, leaseEnd)
	n := 0
	for _, removed := range ok {
		if removed {
			n++
		}
	}
	return n, err
}

// removeEach is remove, reporting which refs it removed.
func (d *Dispatcher) removeEach(ctx context.Context, refs []storage.Ref, leaseEnd time.Time) ([]bool, error) {
	ok := make([]bool, len(refs))
	if len(refs) == 0 {
		return ok, nil
	}
	wait := d.removeWait
	var results []error
	attempt := 1
	for ; ; attempt++ {
		var err error
		results, err = d.store.Remove(ctx, refs)
		if err == nil {
			break
		}
		d.opts.Breaker.Failure(err)
		if attempt == removeAttempts || !d.opts.Now().Add(wait+removeSlack).Before(leaseEnd) || !broker.Sleep(ctx, wait) {
			d.log.Error().Err(err).Int("timeouts", len(refs)).Int("attempts", attempt).
				Msg("removing forwarded timeouts failed; they may be delivered again")
			return ok, fmt.Errorf("dispatch: remove: %w", err)
		}
		d.log.Warn().Err(err).Int("timeouts", len(refs)).Int("attempt", attempt).
			Msg("removing forwarded timeouts failed; trying again while their lease holds")
		wait *= 2
	}
	var removed []string
	debug := d.log.Debug().Enabled()
	for i, rerr := range results {
		if rerr != nil && attempt > 1 && errors.Is(rerr, storage.ErrNotFound) {
			// Only the lease holder removes a leased row: an earlier
			// attempt's commit went through and its answer was lost.
			rerr = nil
		}
		ok[i] = rerr == nil
		if rerr != nil {
			d.log.Warn().Err(rerr).Str("id", refs[i].ID).Msg("forwarded timeout could not be removed with its lease; a duplicate is possible")
		} else if debug {
			removed = append(removed, refs[i].ID)
		}
	}
	if debug {
		d.log.Debug().Strs("ids", removed).Msg("removed")
	}
	return ok, nil
}

func itemIDs(items []item) []string {
	ids := make([]string, len(items))
	for i, it := range items {
		ids[i] = it.tok.ID
	}
	return ids
}
