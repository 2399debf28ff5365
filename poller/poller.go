// Package poller leases due timeouts from the store and hands their lease
// tokens to the dispatcher through E.TimeoutsDispatcher. It sleeps until the
// next due time (at most PollInterval) and wakes early when ingest stores
// something due sooner.
package poller

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/rs/zerolog"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/circuit"
	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/wire"
)

// Store is what the poller needs of the store.
type Store interface {
	Lease(ctx context.Context, owner string, dueBy time.Time, limit int, d time.Duration) ([]storage.Lease, error)
	Release(ctx context.Context, id, lock string, notBefore time.Time) error
	NextDue(ctx context.Context) (time.Time, bool, error)
	// LeasedBy counts the poller's leases, for MaxLeased.
	storage.LeaseCounter
}

// Publisher sends dispatcher messages with confirms (*broker.Publisher).
// The poller closes one whose connection failed before opening the next, and
// closes the rest when Run ends.
type Publisher interface {
	Publish(ctx context.Context, msgs []broker.Outgoing) []error
	// IsClosed reports whether its channel is closed (with its connection,
	// say): the poller then opens another instead of publishing on it.
	IsClosed() bool
	Close() error
}

// NewPublisher opens a publisher on the current publish connection, waiting
// while the broker is unreachable.
type NewPublisher func(ctx context.Context) (Publisher, error)

// Metrics is told how the poller fares (*metrics.Metrics implements it).
type Metrics interface {
	// ObservePollLease records the duration of a successful Lease.
	ObservePollLease(d time.Duration)
	// ObserveHandover records the time from publishing a batch of tokens
	// to the broker's confirm of it.
	ObserveHandover(d time.Duration)
}

type noMetrics struct{}

func (noMetrics) ObservePollLease(time.Duration) {}
func (noMetrics) ObserveHandover(time.Duration)  {}

// Options configure a Poller.
type Options struct {
	Owner           string // this instance's lock owner
	DispatcherQueue string
	BatchSize       int
	LeaseDuration   time.Duration
	PollInterval    time.Duration
	// Transient hands tokens over as transient messages, which the broker
	// never writes to disk: a persistent hand-over waits for the broker's
	// fsync, and a disk that stalls then holds up every forward behind it
	// (docs/performance.md, "Steady intake while messages fall due"). A broker restart loses them, so
	// only a store whose leases the bridge can free on reconnect may use it
	// (bbolt: dispatch.Options.Reconnected).
	Transient bool
	// TokensPerMessage caps the lease tokens carried by one dispatcher message.
	TokensPerMessage int
	// Lookahead leases timeouts this long before they are due, so the hand-
	// over to the dispatcher overlaps the wait and the dispatcher forwards
	// each exactly at its due time (it holds early ones; never early).
	Lookahead time.Duration
	// MaxLeased stops leasing while this many rows are leased by Owner and
	// not yet dispatched, so a backlog far larger
	// than the dispatcher's pace is not leased at once and left to expire.
	// Zero: no cap.
	MaxLeased int
	// Publishers is how many hand-overs may await the broker's confirm at
	// once, each on a publisher (a channel) of its own. The hand-over is
	// persistent, so its confirm waits for the broker's disk; leasing the
	// next batch only after it would put every slow broker fsync on the path
	// of the rows falling due meanwhile. Default 4.
	Publishers int
	// FetchBreaker watches store reads; while it is armed the poller backs
	// off, and when it triggers the bridge stops. Nil: never triggers.
	FetchBreaker *circuit.Breaker
	// Metrics, when set, is told how long leases take.
	Metrics Metrics
	Now     func() time.Time
	Logger  zerolog.Logger
}

// Poller moves due timeouts to the dispatcher queue.
type Poller struct {
	store  Store
	newPub NewPublisher
	opts   Options
	log    zerolog.Logger

	// slots holds the publishers not handing over right now; a nil one is
	// opened when taken (at first, and after its connection failed).
	slots    chan Publisher
	inflight sync.WaitGroup
	failed   chan error // a hand-over failed: back off before the next

	wake       chan struct{}
	sleepUntil atomic.Int64 // unix nanos the poller sleeps toward; MaxInt64 while busy

	// ownLeases bounds from above the rows leased by Owner: the last
	// count plus what Run leased since (only it leases as Owner, and the
	// count only falls otherwise). Run alone uses it.
	ownLeases struct {
		known bool
		most  int
	}
}

// New returns a Poller; it starts nothing.
func New(store Store, newPub NewPublisher, opts Options) *Poller {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.TokensPerMessage < 1 {
		opts.TokensPerMessage = 100
	}
	if opts.FetchBreaker == nil {
		opts.FetchBreaker = circuit.New("fetch", time.Duration(1<<62), circuit.Options{Now: opts.Now})
	}
	if opts.Metrics == nil {
		opts.Metrics = noMetrics{}
	}
	if opts.Publishers < 1 {
		opts.Publishers = 4
	}
	p := &Poller{store: store, newPub: newPub, opts: opts, log: opts.Logger, wake: make(chan struct{}, 1),
		slots: make(chan Publisher, opts.Publishers), failed: make(chan error, 1)}
	for range opts.Publishers {
		p.slots <- nil
	}
	p.sleepUntil.Store(math.MaxInt64)
	return p
}

// Wake tells the poller a timeout due at due was stored. It wakes the poller
// at once if it sleeps toward a later time, and never blocks.
func (p *Poller) Wake(due time.Time) {
	if due.Add(-p.opts.Lookahead).UnixNano() < p.sleepUntil.Load() {
		select {
		case p.wake <- struct{}{}:
		default:
		}
	}
}

// Run polls until ctx ends. Hand-overs in flight when ctx ends are still
// confirmed (or their leases released) before Run returns. While the broker
// is unreachable it leases nothing and waits for the connection.
func (p *Poller) Run(ctx context.Context) error {
	defer p.closePublishers()
	p.ownLeases.known = false // leases of an earlier Run are counted afresh
	for ctx.Err() == nil {
		p.sleepUntil.Store(math.MaxInt64) // busy: any wake counts
		select {
		case err := <-p.failed:
			// The publisher's connection failed; its leases were released.
			p.log.Warn().Err(err).Msg("handing over to the dispatcher failed; resuming on the next broker connection")
			broker.Sleep(ctx, 200*time.Millisecond+time.Duration(rand.Int64N(int64(300*time.Millisecond))))
			// The hand-overs in flight with the failed one fail with it,
			// during the pause: one lost connection, one pause.
			select {
			case <-p.failed:
			default:
			}
			continue
		default:
		}
		pub := p.takePublisher(ctx)
		if pub == nil {
			continue
		}
		if p.backlogged(ctx) {
			p.slots <- pub
			broker.Sleep(ctx, 20*time.Millisecond)
			continue
		}
		leases, n := p.lease(ctx)
		if n < 0 {
			p.ownLeases.known = false // it may have leased all the same
		}
		p.ownLeases.most += max(n, 0)
		if n <= 0 {
			p.slots <- pub
		} else {
			p.inflight.Add(1)
			go func() {
				defer p.inflight.Done()
				if err := p.handOver(ctx, pub, leases); err != nil {
					_ = pub.Close()
					pub = nil
					select {
					case p.failed <- err:
					default:
					}
					// Its leases were released: lease them again
					// (after the pause) rather than at the next poll.
					select {
					case p.wake <- struct{}{}:
					default:
					}
				}
				p.slots <- pub
			}()
		}
		if n < 0 {
			continue // Lease failed and the pause is done: try again
		}
		if n == p.opts.BatchSize {
			continue // a full batch: more may be due right now
		}
		wait, err := p.untilNext(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil // shutting down is not a fetch failure
			}
			wait = p.opts.FetchBreaker.Failure(err)
			p.log.Error().Err(err).Dur("retry_in", wait).Msg("reading the next due time failed")
		} else {
			// Only a whole pass that read the store fine disarms the
			// breaker: a NextDue success must not hide a failing Lease.
			p.opts.FetchBreaker.Success()
		}
		if spacing := p.opts.Lookahead / 4; wait < spacing && spacing > 0 {
			// Rows falling due one after another would otherwise be
			// leased one poll each (three statements per row on a shared
			// store). Leasing a lookahead ahead leaves room to wait a
			// little and take them in batches, still ahead of their due
			// time; a full batch (above) or a Wake for an earlier row does
			// not wait.
			wait = spacing
		} else if wait <= 0 {
			if n > 0 {
				continue
			}
			// Something is due yet nothing was leasable: do not spin if the
			// clocks of store and poller disagree by a hair.
			wait = time.Millisecond
		}
		p.sleepUntil.Store(p.opts.Now().Add(wait).UnixNano())
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
		case <-timer.C:
		case <-p.wake:
		}
		timer.Stop()
	}
	return nil
}

// takePublisher waits for a publisher that is not handing over, opening one
// if needed. It returns nil when ctx ended, or after a pause when opening
// failed.
func (p *Poller) takePublisher(ctx context.Context) Publisher {
	var pub Publisher
	select {
	case <-ctx.Done():
		return nil
	case pub = <-p.slots:
	}
	if pub != nil && !pub.IsClosed() {
		return pub
	}
	if pub != nil {
		// Its channel closed while it waited in its slot (the connection
		// was lost): a hand-over on it would fail, and its leases be
		// released, for nothing. The next one waits for the connection.
		_ = pub.Close()
	}
	pub, err := p.newPub(ctx)
	if err != nil {
		p.slots <- nil
		if ctx.Err() == nil {
			p.log.Warn().Err(err).Msg("cannot open a publisher; retrying")
			broker.Sleep(ctx, time.Second)
		}
		return nil
	}
	return pub
}

// closePublishers waits for the hand-overs in flight and closes every
// publisher.
func (p *Poller) closePublishers() {
	p.inflight.Wait()
	for range p.opts.Publishers {
		if pub := <-p.slots; pub != nil {
			_ = pub.Close()
		}
		defer func() { p.slots <- nil }() // Run may be called again
	}
}

func (p *Poller) untilNext(ctx context.Context) (time.Duration, error) {
	next, ok, err := p.store.NextDue(ctx)
	if err != nil {
		return 0, err
	}
	wait := p.opts.PollInterval
	if ok {
		wait = min(wait, next.Add(-p.opts.Lookahead).Sub(p.opts.Now()))
	}
	return wait, nil
}

// leaseCallTimeout bounds one Lease call, which shutdown does not cancel.
const leaseCallTimeout = 30 * time.Second

// lease leases one batch, returning it and its length, or -1 when leasing
// failed (after backing off).
func (p *Poller) lease(ctx context.Context) ([]storage.Lease, int) {
	if ctx.Err() != nil {
		return nil, 0 // the lease below outlives ctx: do not start one
	}
	began := time.Now()
	// Not cancelled by shutdown: a lease the store committed but whose
	// answer was abandoned would keep its rows from every instance for a
	// whole lease. A batch in hand is handed over or released.
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), leaseCallTimeout)
	leases, err := p.store.Lease(lctx, p.opts.Owner, p.opts.Now().Add(p.opts.Lookahead), p.opts.BatchSize, p.opts.LeaseDuration)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return nil, 0
		}
		pause := p.opts.FetchBreaker.Failure(err)
		p.log.Error().Err(err).Dur("retry_in", pause).Msg("leasing due timeouts failed")
		broker.Sleep(ctx, pause)
		return nil, -1
	}
	p.opts.Metrics.ObservePollLease(time.Since(began))
	return leases, len(leases)
}

// handOver publishes the tokens of leases to the dispatcher queue on pub and
// releases at once the leases whose message was not confirmed. It returns
// an error when any was not.
func (p *Poller) handOver(ctx context.Context, pub Publisher, leases []storage.Lease) error {
	var msgs []broker.Outgoing
	var groups [][]storage.Lease
	for start := 0; start < len(leases); start += p.opts.TokensPerMessage {
		group := leases[start:min(start+p.opts.TokensPerMessage, len(leases))]
		toks := make([]wire.Token, len(group))
		for i, l := range group {
			toks[i] = wire.Token{ID: l.ID, Lock: l.Lock}
		}
		body, err := wire.EncodeTokens(toks)
		if err != nil {
			return fmt.Errorf("poller: %w", err)
		}
		msgs = append(msgs, broker.Outgoing{
			RoutingKey: p.opts.DispatcherQueue,
			Mandatory:  true,
			Msg: amqp.Publishing{
				ContentType:  wire.TokenContentType,
				DeliveryMode: p.deliveryMode(),
				Timestamp:    p.opts.Now(),
				Body:         body,
			},
		})
		groups = append(groups, group)
	}
	// Confirms are awaited even during shutdown so the leases are settled.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	began := time.Now()
	results := pub.Publish(wctx, msgs)
	var failed error
	var unsent []storage.Ref
	for i, err := range results {
		if err == nil {
			continue
		}
		failed = err
		for _, l := range groups[i] {
			unsent = append(unsent, storage.Ref{ID: l.ID, Lock: l.Lock})
		}
	}
	// Together (storage.ReleaseEach): a lost connection fails the whole
	// batch, and one commit each would keep its rows from being leased
	// again for as many commits.
	for i, rerr := range storage.ReleaseEach(wctx, p.store, unsent, time.Time{}) {
		switch id := unsent[i].ID; {
		case rerr == nil:
		case errors.Is(rerr, storage.ErrConcurrency), errors.Is(rerr, storage.ErrNotFound):
			// The broker did take the hand-over (only its confirm was
			// lost) and the dispatcher has settled the row already.
			p.log.Debug().Str("id", id).Msg("unconfirmed hand-over was handled by the dispatcher anyway")
		default:
			p.log.Error().Err(rerr).Str("id", id).Msg("releasing an unpublished lease failed; it returns when the lease expires")
		}
	}
	p.log.Debug().Int("leased", len(leases)).Int("messages", len(msgs)).Msg("handed due timeouts to the dispatcher")
	if failed != nil {
		return fmt.Errorf("poller: publish to %s: %w", p.opts.DispatcherQueue, failed)
	}
	p.opts.Metrics.ObserveHandover(time.Since(began))
	return nil
}

// backlogged reports whether this instance already has MaxLeased rows
// leased. The store counts the owner's leases (storage.LeaseCounter), so on
// a shared store the cap is per instance. It counts only when ownLeases
// does not rule the cap out: on PostgreSQL the count walks every leased row
// of every instance, and the poller asks before each lease, many times a
// second in a burst. A store that fails to count is not backlogged: the cap
// is a brake, not a condition for leasing.
func (p *Poller) backlogged(ctx context.Context) bool {
	if p.opts.MaxLeased <= 0 || (p.ownLeases.known && p.ownLeases.most < p.opts.MaxLeased) {
		return false
	}
	leased, err := p.store.LeasedBy(ctx, p.opts.Owner, p.opts.MaxLeased)
	p.ownLeases.known, p.ownLeases.most = err == nil, leased
	return err == nil && leased >= p.opts.MaxLeased
}

// deliveryMode is the AMQP delivery mode of hand-overs (see Options.Transient).
func (p *Poller) deliveryMode() uint8 {
	if p.opts.Transient {
		return amqp.Transient
	}
	return amqp.Persistent
}
