package broker

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/rs/zerolog"

	"github.com/delaybridge/delaybridge/budget"
)

// Waiter hands out the current connection, waiting while the broker is
// unreachable (*Conn implements it).
type Waiter interface {
	Wait(ctx context.Context) (*amqp.Connection, error)
}

// ErrExclusiveConsumer means an exclusive consume was refused because the
// queue already has a consumer. Consume does not retry it.
var ErrExclusiveConsumer = errors.New("the queue already has a consumer")

// ConsumeOptions configure Consume.
type ConsumeOptions struct {
	Queue    string
	Prefetch int
	// Exclusive asks for the queue's only consumer; when another consumer
	// holds it, Consume returns ErrExclusiveConsumer.
	Exclusive bool
	// Name goes into the consumer tag and the log lines ("ingest").
	Name string
	// Setup, when set, runs on every new channel before consuming (for
	// declarations and bindings a source needs). An error ends the session.
	Setup func(*amqp.Channel) error
	// OnConsuming, when set, is called each time the consumer is in place.
	OnConsuming func()
	// MinBackoff and MaxBackoff bound the jittered, doubling pause before a
	// new session; defaults 200ms and 10s. A session that consumed for at
	// least MaxBackoff resets it.
	MinBackoff, MaxBackoff time.Duration
	// MustExist: the queue is someone else's, and the bridge declares
	// nothing for it. Before each session Consume checks that it exists
	// (AwaitQueue); while it does not, it checks again after a pause that
	// grows to MissingMaxBackoff (default 1m), which counts as no failure.
	MustExist         bool
	MissingMaxBackoff time.Duration
	// Budget, when set, bounds the body bytes of the deliveries handed over
	// and not yet settled, with the budget's other holders; the prefetch
	// then follows the size of the bodies, up to Prefetch (see flow). Not
	// with Exclusive: resizing takes a new consumer, and another instance
	// could take the queue in between.
	Budget *budget.Budget
	// ExpectedBytes sizes the first consumer's prefetch under a Budget: the
	// largest body to expect until the bodies seen tell (say, the largest
	// message the bridge accepts). 0: Prefetch.
	ExpectedBytes int
	Logger        zerolog.Logger
}

// Session is one consumer on one channel.
type Session struct {
	// Deliveries are the consumer's deliveries; closed when the broker
	// cancels the consumer or the channel closes.
	Deliveries <-chan amqp.Delivery
	// Closed receives the reason when the channel closes.
	Closed <-chan *amqp.Error
	// Channel is the session's channel; it is closed when the session ends,
	// which returns every unsettled delivery to the queue.
	Channel *amqp.Channel
	tag     string
	flow    *flow // a budgeted session's consumer, which may change
}

// Cancel stops the flow of deliveries. Those already received and not yet
// settled go back to the queue when the channel closes.
func (s *Session) Cancel() {
	if s.flow != nil {
		s.flow.cancel()
		return
	}
	_ = s.Channel.Cancel(s.tag, false)
}

// Consume consumes opts.Queue until ctx ends, calling handle once per
// session: a channel with its prefetch set and its consumer in place. When
// handle returns (a channel or connection failed, or the broker cancelled
// the consumer) it starts a new session on the current connection after a
// backoff. It returns nil when ctx ends and an error only for what retrying
// cannot fix (ErrExclusiveConsumer).
func Consume(ctx context.Context, conn Waiter, opts ConsumeOptions, handle func(context.Context, *Session) error) error {
	if opts.MinBackoff <= 0 {
		opts.MinBackoff = 200 * time.Millisecond
	}
	if opts.MaxBackoff <= 0 {
		opts.MaxBackoff = 10 * time.Second
	}
	if opts.MissingMaxBackoff <= 0 {
		opts.MissingMaxBackoff = time.Minute
	}
	attempt := 0
	var watch closeWatch
	for {
		if opts.MustExist && !AwaitQueue(ctx, conn, AwaitOptions{Queue: opts.Queue, Name: opts.Name,
			MinBackoff: opts.MinBackoff, MaxBackoff: opts.MissingMaxBackoff, Logger: opts.Logger}) {
			return nil
		}
		began := time.Now()
		consumed, unreadable, err := session(ctx, conn, &watch, opts, handle)
		// Only a session that lasted resets the backoff: one that consumed
		// and died at once (a message the client chokes on that no sweep
		// recognises) must not reconnect several times a second.
		consumed = consumed && time.Since(began) >= opts.MaxBackoff
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, ErrExclusiveConsumer) {
			return err
		}
		if sw, ok := conn.(unreadableSweeper); ok && unreadable {
			// The message comes back first on every new session: take it
			// off the queue before consuming again. A sweep that moved
			// nothing backs off as a failed session does.
			opts.Logger.Warn().Str("queue", opts.Queue).
				Msg(opts.Name + ": the AMQP client could not read a message and dropped the connection; sweeping the head of the queue")
			if sweepUnreadable(ctx, sw, opts) == 0 {
				consumed = false
			}
		}
		if consumed {
			attempt = 0
		}
		attempt++
		wait := Backoff(opts.MinBackoff, opts.MaxBackoff, attempt)
		opts.Logger.Warn().Err(err).Str("queue", opts.Queue).Dur("retry_in", wait).
			Msg(opts.Name + " interrupted; resuming on the next broker connection")
		if !Sleep(ctx, wait) {
			return nil
		}
	}
}

// unreadableSweeper is a Waiter that can move the messages the AMQP client
// cannot read from the head of a queue to the error queue (*Conn with a
// Sweeper).
type unreadableSweeper interface {
	SweepUnreadable(ctx context.Context, queue string) (moved int, err error)
}

// sweepAttempts bounds the sweeps after one unreadable message: a sweep
// that keeps failing, or finding nothing, leaves the queue to Consume's
// growing backoff.
const sweepAttempts = 3

// sweepUnreadable sweeps opts.Queue and returns how many messages it moved.
// A sweep that found nothing is tried again too: the broker requeues the
// dead consumer's messages after it notices the closed socket, which may be
// after the first basic.get.
func sweepUnreadable(ctx context.Context, sw unreadableSweeper, opts ConsumeOptions) int {
	for attempt := 1; attempt <= sweepAttempts; attempt++ {
		moved, err := sw.SweepUnreadable(ctx, opts.Queue)
		if errors.Is(err, errNoSweeper) {
			return 0
		}
		if moved > 0 {
			return moved
		}
		if err != nil {
			opts.Logger.Error().Err(err).Str("queue", opts.Queue).Int("attempt", attempt).Msg(opts.Name + ": sweeping unreadable messages failed")
		}
		if attempt < sweepAttempts && !Sleep(ctx, Backoff(opts.MinBackoff, opts.MaxBackoff, attempt)) {
			return 0
		}
	}
	opts.Logger.Warn().Str("queue", opts.Queue).Msg(opts.Name + ": the sweep moved no unreadable message")
	return 0
}

// unreadableFrame reports whether amqp091-go closed a connection because it
// refused to read a frame the broker sent: in practice a content header over
// its table limits (readable.go). Its reader closes the connection with
// FrameError and the reason of its ErrSyntax.
func unreadableFrame(e *amqp.Error) bool {
	return e != nil && !e.Server && e.Code == amqp.FrameError && e.Reason == amqp.ErrSyntax.Error()
}

// closeWatch is the close listener of the connection sessions run on. The
// library keeps a listener until its connection closes, so sessions on a
// connection that stays up share one rather than each adding its own.
type closeWatch struct {
	conn   *amqp.Connection
	closed chan *amqp.Error
}

// on returns c's listener, registering one when c is a new connection.
func (w *closeWatch) on(c *amqp.Connection) <-chan *amqp.Error {
	if w.conn != c {
		w.conn, w.closed = c, c.NotifyClose(make(chan *amqp.Error, 1))
	}
	return w.closed
}

// session runs one session; consumed reports whether the consumer got in
// place, unreadable whether the connection died on a frame the client could
// not read.
func session(ctx context.Context, conn Waiter, watch *closeWatch, opts ConsumeOptions, handle func(context.Context, *Session) error) (consumed, unreadable bool, err error) {
	c, err := conn.Wait(ctx)
	if err != nil {
		return false, false, err
	}
	// The library tells the connection's listeners before it closes the
	// channels, so the reason is here by the time handle returns.
	connClosed := watch.on(c)
	consumed, err = consumeOn(ctx, c, opts, handle)
	select {
	case e := <-connClosed:
		unreadable = unreadableFrame(e)
	default:
	}
	return consumed, unreadable, err
}

// consumeOn runs one session on c.
func consumeOn(ctx context.Context, c *amqp.Connection, opts ConsumeOptions, handle func(context.Context, *Session) error) (consumed bool, err error) {
	ch, err := c.Channel()
	if err != nil {
		return false, fmt.Errorf("%s: open channel: %w", opts.Name, err)
	}
	defer ch.Close()
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	if opts.Setup != nil {
		if err := opts.Setup(ch); err != nil {
			return false, fmt.Errorf("%s: set up channel: %w", opts.Name, err)
		}
	}
	prefetch, budgeted := opts.Prefetch, opts.Budget != nil && !opts.Exclusive
	if budgeted {
		prefetch = initialPrefetch(opts)
	}
	if err := ch.Qos(prefetch, 0, false); err != nil {
		return false, fmt.Errorf("%s: set prefetch: %w", opts.Name, err)
	}
	tag := "delaybridge-" + opts.Name + "-" + uuid.NewString()
	deliveries, err := ch.Consume(opts.Queue, tag, false, opts.Exclusive, false, false, nil)
	var amqpErr *amqp.Error
	if opts.Exclusive && errors.As(err, &amqpErr) && amqpErr.Code == amqp.AccessRefused {
		return false, fmt.Errorf("%w: %s", ErrExclusiveConsumer, opts.Queue)
	}
	if err != nil {
		return false, fmt.Errorf("%s: consume %s: %w", opts.Name, opts.Queue, err)
	}
	if opts.OnConsuming != nil {
		opts.OnConsuming()
	}
	opts.Logger.Info().Str("queue", opts.Queue).Msg(opts.Name + " consuming")
	s := &Session{Deliveries: deliveries, Closed: closed, Channel: ch, tag: tag}
	if budgeted {
		f := &flow{b: opts.Budget, ch: ch, opts: opts, held: map[uint64]int64{}, tag: tag, prefetch: prefetch}
		// Buffered, so that the hand-over costs no rendezvous per delivery
		// (a group commit gathers what arrives within a short linger): what
		// waits in it is counted already.
		out := make(chan amqp.Delivery, opts.Prefetch)
		fctx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			f.run(fctx, deliveries, out)
		}()
		// What the session holds is given back when it ends: the
		// channel's close returns the unsettled deliveries to the queue.
		defer func() {
			stop()
			<-done
			f.releaseAll()
		}()
		s.Deliveries, s.flow = out, f
	}
	return true, handle(ctx, s)
}

// Backoff doubles from lo to hi with full jitter over the upper half, so a
// fleet of bridges does not retry in lockstep.
func Backoff(lo, hi time.Duration, attempt int) time.Duration {
	d := min(lo<<min(attempt-1, 20), hi)
	return d/2 + time.Duration(rand.Int64N(int64(d/2)+1))
}

// UnreadableClose reports whether a connection's close reason (from
// NotifyClose) is amqp091-go refusing to read a frame the broker sent, in
// practice a message over its header limits (readable.go): a reader of the
// queue can then hold such messages aside with HoldUnreadable.
func UnreadableClose(e *amqp.Error) bool { return unreadableFrame(e) }

// AwaitOptions configure AwaitQueue.
type AwaitOptions struct {
	Queue string
	// Name goes into the log lines.
	Name string
	// MinBackoff and MaxBackoff bound the jittered, doubling pause between
	// checks; defaults 1s and 1m. A missing queue costs the broker a
	// channel error (and a line in its log) per check, so the pause grows.
	MinBackoff, MaxBackoff time.Duration
	Logger                 zerolog.Logger
}

// AwaitQueue returns true once opts.Queue exists, false when ctx ends first.
// It logs once when the queue is missing and once when it appears; each
// check in between is a debug line.
func AwaitQueue(ctx context.Context, conn Waiter, opts AwaitOptions) bool {
	if opts.MinBackoff <= 0 {
		opts.MinBackoff = time.Second
	}
	if opts.MaxBackoff <= 0 {
		opts.MaxBackoff = time.Minute
	}
	log := opts.Logger.With().Str("queue", opts.Queue).Logger()
	for attempt := 1; ; attempt++ {
		exists, err := queueExists(ctx, conn, opts.Queue)
		switch {
		case exists:
			if attempt > 1 {
				log.Info().Msg(opts.Name + ": queue found")
			}
			return true
		case ctx.Err() != nil:
			return false
		case err != nil:
			log.Warn().Err(err).Msg(opts.Name + ": cannot check whether the queue exists")
		case attempt == 1:
			log.Info().Msg(opts.Name + ": waiting for the queue to be declared (it is not the bridge's to declare)")
		default:
			log.Debug().Msg(opts.Name + ": queue still missing")
		}
		if !Sleep(ctx, Backoff(opts.MinBackoff, opts.MaxBackoff, attempt)) {
			return false
		}
	}
}

// queueExists checks queue with a passive declare on a channel of its own:
// the broker closes the channel a missing queue is named on (404).
func queueExists(ctx context.Context, conn Waiter, queue string) (bool, error) {
	c, err := conn.Wait(ctx)
	if err != nil {
		return false, err
	}
	ch, err := c.Channel()
	if err != nil {
		return false, fmt.Errorf("open channel: %w", err)
	}
	defer ch.Close()
	_, err = ch.QueueDeclarePassive(queue, false, false, false, false, nil)
	var ae *amqp.Error
	if errors.As(err, &ae) && ae.Code == amqp.NotFound {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("check queue %s: %w", queue, err)
	}
	return true, nil
}
