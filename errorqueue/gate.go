package errorqueue

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/internal/logsum"
)

// ErrRefusing means an error copy was not published because the
// error queue refused the last ones: the gate waits before trying again.
var ErrRefusing = errors.New("the error queue refuses copies")

// Refusal reports whether err, a copy's result, is the error queue refusing
// it (returned as unroutable, or nacked) or the gate holding it back while
// the queue refuses (ErrRefusing). The gate logs those, summed up: the
// sender holds the message for a later try and logs no error of its own.
func Refusal(err error) bool {
	return errors.Is(err, ErrRefusing) || refused(err)
}

// refused reports whether the broker refused a copy: what makes the gate
// pace the copies.
func refused(err error) bool {
	return errors.Is(err, broker.ErrReturned) || errors.Is(err, broker.ErrNacked)
}

// GateOptions configure an Gate.
type GateOptions struct {
	Queue string
	// Declare, when set, declares the error queue again, as at start-up: a
	// copy returned as unroutable means the queue was deleted.
	Declare func(ctx context.Context) error
	// MinBackoff and MaxBackoff bound the jittered, doubling pause between
	// two tries while the queue refuses; defaults 1s and 30s.
	MinBackoff, MaxBackoff time.Duration
	// WarnInterval is how often refusals are summarised in one warning,
	// after the first one; default 10s.
	WarnInterval time.Duration
	Now          func() time.Time
	Logger       zerolog.Logger
}

// Publisher is what copies are published with (*broker.Publisher
// implements it).
type Publisher interface {
	Publish(ctx context.Context, msgs []broker.Outgoing) []error
}

// Gate paces the copies to the error queue, for every stage that
// sends them. While the queue refuses copies (returned as unroutable, or
// nacked: full with x-overflow reject-publish, say) nothing is published
// but one probe per backoff, so a stage that holds its failures and tries
// again does not turn a refusing queue into a publish per message, and the
// refusals are logged as one summary per interval. A copy returned because
// the queue is gone makes it declare the queue again and publish once more.
// It is safe for concurrent use.
type Gate struct {
	opts GateOptions
	sum  *logsum.Log

	mu       sync.Mutex
	refusing bool
	cause    string
	since    time.Time
	attempt  int
	nextTry  time.Time
	probing  bool
}

// NewGate returns an Gate.
func NewGate(opts GateOptions) *Gate {
	if opts.MinBackoff <= 0 {
		opts.MinBackoff = time.Second
	}
	if opts.MaxBackoff <= 0 {
		opts.MaxBackoff = 30 * time.Second
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Gate{opts: opts, sum: logsum.New(logsum.Options{
		Interval: opts.WarnInterval, KeyField: "error_queue", CountField: "copies",
		First:   "the error queue refuses copies; the messages stay where they are and are tried again with backoff (further refusals are summarised once per interval)",
		Summary: "the error queue still refuses copies; the messages stay where they are",
	}, opts.Logger)}
}

// Publish publishes msgs, error copies to the gate's queue, with pub, and
// returns their results as pub does. While the queue refuses copies, it
// publishes only when a try is due, and then only the first message: the
// others follow if the broker takes it. A copy not published fails with
// ErrRefusing.
func (g *Gate) Publish(ctx context.Context, pub Publisher, msgs []broker.Outgoing) []error {
	if len(msgs) == 0 {
		return nil
	}
	now := g.opts.Now()
	g.mu.Lock()
	probe := false
	if g.refusing {
		if g.probing || now.Before(g.nextTry) {
			err := g.refusedLocked(now)
			g.mu.Unlock()
			g.note(len(msgs), now, err.Error())
			return fill(make([]error, len(msgs)), err)
		}
		probe, g.probing = true, true
		// Another caller meanwhile waits for the probe's answer.
		g.nextTry = now.Add(g.opts.MaxBackoff)
	}
	g.mu.Unlock()

	if !probe {
		results := g.send(ctx, pub, msgs)
		g.record(results, false)
		return results
	}
	results := g.send(ctx, pub, msgs[:1])
	if len(msgs) > 1 {
		if results[0] == nil {
			// The queue took the probe: the others go now, and the
			// outcome of all tells whether it takes copies again.
			results = append(results, g.send(ctx, pub, msgs[1:])...)
		} else {
			// Refused, or no answer: the others wait for the next try.
			err := fmt.Errorf("%w (not published): the probe failed: %v", ErrRefusing, results[0])
			results = append(results, fill(make([]error, len(msgs)-1), err)...)
		}
	}
	g.record(results, true)
	return results
}

// send publishes msgs; the ones returned as unroutable go again, once,
// after the queue is declared again.
func (g *Gate) send(ctx context.Context, pub Publisher, msgs []broker.Outgoing) []error {
	results := pub.Publish(ctx, msgs)
	if g.opts.Declare == nil {
		return results
	}
	var again []broker.Outgoing
	var at []int
	for i, err := range results {
		if errors.Is(err, broker.ErrReturned) {
			again = append(again, msgs[i])
			at = append(at, i)
		}
	}
	if len(again) == 0 {
		return results
	}
	if err := g.opts.Declare(ctx); err != nil {
		for _, i := range at {
			results[i] = fmt.Errorf("%w; declaring the error queue again failed: %v", results[i], err)
		}
		return results
	}
	g.opts.Logger.Warn().Str("error_queue", g.opts.Queue).
		Msg("the error queue was missing (a copy came back as unroutable); declared it again")
	for k, err := range pub.Publish(ctx, again) {
		results[at[k]] = err
	}
	return results
}

// record learns from the results of one publish.
func (g *Gate) record(results []error, probe bool) {
	now := g.opts.Now()
	var cause error
	took := 0
	for _, err := range results {
		switch {
		case err == nil:
			took++
		case refused(err):
			cause = err
		}
	}
	g.mu.Lock()
	if probe {
		g.probing = false
	}
	switch {
	case cause != nil:
		if !g.refusing {
			g.refusing, g.since, g.attempt = true, now, 0
		}
		g.attempt++
		if took > 0 {
			// It took some: room is coming back, keep trying often.
			g.attempt = 1
		}
		g.cause = cause.Error()
		g.nextTry = now.Add(broker.Backoff(g.opts.MinBackoff, g.opts.MaxBackoff, g.attempt))
		retryAt := g.nextTry
		g.mu.Unlock()
		g.note(len(results)-took, now, fmt.Sprintf("%s (tried again at %s)", cause, retryAt.UTC().Format(time.RFC3339)))
		return
	case took > 0 && g.refusing:
		// Every copy published was taken.
		since := g.since
		g.refusing, g.probing, g.attempt, g.cause = false, false, 0, ""
		g.mu.Unlock()
		g.sum.Flush(now, true)
		g.opts.Logger.Info().Str("error_queue", g.opts.Queue).Dur("refused_for", now.Sub(since)).
			Msg("the error queue takes copies again")
		return
	case probe && took == 0:
		// No answer about the queue (a lost connection, a copy AMQP cannot
		// carry): the next publish probes at once.
		g.nextTry = now
	}
	g.mu.Unlock()
}

func (g *Gate) note(n int, now time.Time, reason string) {
	if n < 1 {
		return
	}
	g.sum.Note(g.opts.Queue, n, now, func(e *zerolog.Event, p string) *zerolog.Event { return e.Str(p+"reason", reason) })
}

// Refused returns ErrRefusing with the last refusal and when the
// next try is due, or nil while the queue takes copies.
func (g *Gate) Refused(now time.Time) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.refusing {
		return nil
	}
	return g.refusedLocked(now)
}

func (g *Gate) refusedLocked(now time.Time) error {
	return fmt.Errorf("%w (not published): %s, %s ago; next try in %s", ErrRefusing, g.cause,
		now.Sub(g.since).Round(time.Millisecond), max(g.nextTry.Sub(now), 0).Round(time.Millisecond))
}

// RetryIn is how long until the gate publishes again: 0 while the queue
// takes copies.
func (g *Gate) RetryIn(now time.Time) time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.refusing {
		return 0
	}
	return max(g.nextTry.Sub(now), 0)
}

// Refusing reports whether the queue refuses copies, and since when and
// why; for readiness and metrics.
func (g *Gate) Refusing() (refusing bool, since time.Time, cause string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.refusing, g.since, g.cause
}

// Flush writes what the refusal summary holds (when the bridge stops).
func (g *Gate) Flush() { g.sum.Flush(g.opts.Now(), true) }

func fill(errs []error, err error) []error {
	for i := range errs {
		errs[i] = err
	}
	return errs
}
