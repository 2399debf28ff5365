package dispatch

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/internal/logsum"
	"github.com/delaybridge/delaybridge/wire"
)

// destinations remembers which destinations the broker refused lately
// (returned as unroutable, or nacked), so that while one is refusing, its
// due messages cost one probe per interval instead of one publish each: a
// missing queue with thousands of messages due must not become thousands of
// publishes a second. Every message still counts a failure at each of its
// attempts, so it reaches the error queue on its own backoff; but its last
// attempt is always published, so that no message goes to the error queue
// on the strength of another message's refusal.
type destinations struct {
	interval time.Duration
	// lastTry tells a message's last attempt before the error queue.
	lastTry func(item) bool
	// probeTimeout is how long a probe may be in flight before another
	// may go (a worker's whole forward window).
	probeTimeout time.Duration

	mu sync.Mutex
	m  map[wire.Destination]*refusal
}

// refusal is a destination's last refusal and its probe.
type refusal struct {
	cause     string    // the broker's answer, e.g. returned … 312 NO_ROUTE
	at        time.Time // when it came
	probeAt   time.Time // when the next probe may go
	probing   bool
	probeSent time.Time
}

// maxRefusals bounds the map of refusing destinations, and the failure
// log's summaries; beyond it, long-settled entries are dropped, and then new
// destinations are not tracked (refusals) or share one summary (log).
const maxRefusals = 1024

// otherDestinations is the summary of the failures to destinations past
// maxRefusals.
const otherDestinations = "(other destinations)"

func newDestinations(interval, probeTimeout time.Duration, lastTry func(item) bool) *destinations {
	return &destinations{interval: interval, probeTimeout: probeTimeout, lastTry: lastTry, m: map[wire.Destination]*refusal{}}
}

// blockedItem is a forward not published because its destination refused
// one within the interval: it counts as a failure with reason.
type blockedItem struct {
	it     item
	reason string
}

// plan splits a window's forwards: send (destinations not known to refuse,
// last attempts, and one probe per refusing destination whose interval is
// over), held (the rest of a probed destination's forwards: they wait for
// the probe) and blocked (a destination that refused within the interval,
// or whose probe another worker has in flight).
func (s *destinations) plan(items []item, now time.Time) (send, held []item, blocked []blockedItem) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var probing map[wire.Destination]bool // destinations probed in this window
	for _, it := range items {
		dest := it.row.Dest()
		// Judged at the time it would go out: the poller hands forwards
		// over a little early, and a retry held until just after the probe
		// interval must probe, not fail without a publish.
		at := latest(now, latest(it.row.DueAt, it.row.NotBefore))
		r, known := s.m[dest]
		switch {
		case !known || s.lastTry(it):
			send = append(send, it)
		case probing[dest]:
			held = append(held, it)
		case at.Before(r.probeAt) || (r.probing && now.Sub(r.probeSent) < s.probeTimeout):
			blocked = append(blocked, blockedItem{it: it, reason: r.reason(dest, at, s.interval)})
		default:
			r.probing, r.probeSent = true, now
			if probing == nil {
				probing = map[wire.Destination]bool{}
			}
			probing[dest] = true
			it.probe = true
			send = append(send, it)
		}
	}
	return send, held, blocked
}

// record learns from the outcome of one published forward to dest,
// answered at now; probe says whether it was the destination's probe.
func (s *destinations) record(dest wire.Destination, err error, now time.Time, probe bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, known := s.m[dest]
	switch {
	case err == nil:
		delete(s.m, dest) // it takes messages (again)
	case errors.Is(err, broker.ErrReturned), errors.Is(err, broker.ErrNacked), errors.Is(err, broker.ErrNoExchange):
		if known && now.Before(r.at) {
			return // older news than what is known: another worker's probe answered since
		}
		if len(s.m) >= maxRefusals && !known {
			s.prune(now)
			if len(s.m) >= maxRefusals {
				// More destinations refusing at once than the map keeps
				// (hostile, or a mass outage): this one is published as
				// before, each failure still counted.
				return
			}
		}
		s.m[dest] = &refusal{cause: err.Error(), at: now, probeAt: now.Add(s.interval)}
	case known && probe:
		// Not an answer about the destination (a lost connection, a
		// message that cannot be encoded): the next forward probes.
		r.probing = false
	}
}

// refused returns why dest is refusing, if it refused within the interval.
func (s *destinations) refused(dest wire.Destination, now time.Time) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r, ok := s.m[dest]; ok && now.Before(r.probeAt) {
		return r.reason(dest, now, s.interval), true
	}
	return "", false
}

func (s *destinations) prune(now time.Time) {
	for dest, r := range s.m {
		if !r.probing && now.Sub(r.probeAt) > time.Minute {
			delete(s.m, dest)
		}
	}
}

func (r *refusal) reason(dest wire.Destination, now time.Time, interval time.Duration) string {
	return fmt.Sprintf("%s (not published: a forward to %s was refused %s ago; one forward every %s probes it until it takes one)",
		r.cause, dest.Quoted(), now.Sub(r.at).Round(time.Millisecond), interval)
}

// failureLog aggregates the warnings of retried dispatch failures: the
// first failure to a destination is logged at once, and later ones as one
// line per destination per interval with their count, so a destination
// that fails for thousands of messages does not write thousands of lines.
type failureLog struct{ *logsum.Log }

func newFailureLog(interval time.Duration, log zerolog.Logger) *failureLog {
	return &failureLog{logsum.New(logsum.Options{
		Interval: interval, KeyField: "destination", CountField: "failures",
		First:   "dispatch failed; will retry (further failures to this destination are summarised once per interval)",
		Summary: "dispatch failures to this destination; each will be retried",
		MaxKeys: maxRefusals, OtherKey: otherDestinations,
	}, log)}
}

// note records one retried failure.
func (l *failureLog) note(dest, id, reason string, attempts int, retryAt, now time.Time) {
	l.Note(dest, 1, now, func(e *zerolog.Event, p string) *zerolog.Event {
		return e.Str(p+"id", id).Str(p+"reason", reason).Int(p+"attempts", attempts).Time(p+"retry_at", retryAt)
	})
}

// flush writes the summaries whose interval is over, or all with all set
// (when the dispatcher stops: no count is left unlogged).
func (l *failureLog) flush(now time.Time, all bool) { l.Flush(now, all) }

// recoveryBreaker is DELAYBRIDGE_MAXIMUM_RECOVERY_FAILURES_PER_SECOND, as
// NServiceBus's delayed-delivery failure-handling breaker: failure handling
// (recording a dispatch failure, moving a message to the error queue) that
// itself fails more than perSecond times a second, counted over 30 s, is a
// critical error. It never skips or delays counting a failure.
type recoveryBreaker struct {
	perSecond int
	now       func() time.Time
	onTrigger func(error)

	mu        sync.Mutex
	start     time.Time
	n         int
	triggered bool
}

const recoveryWindow = 30 * time.Second

func (b *recoveryBreaker) failure(err error) {
	if b == nil || b.perSecond <= 0 {
		return
	}
	now := b.now()
	b.mu.Lock()
	if b.start.IsZero() || now.Sub(b.start) >= recoveryWindow {
		b.start, b.n = now, 0
	}
	b.n++
	n := b.n
	trigger := !b.triggered && n > b.perSecond*int(recoveryWindow/time.Second)
	if trigger {
		b.triggered = true
	}
	b.mu.Unlock()
	if trigger && b.onTrigger != nil {
		b.onTrigger(fmt.Errorf("dispatch failure handling failed %d times within %s, more than DELAYBRIDGE_MAXIMUM_RECOVERY_FAILURES_PER_SECOND=%d a second; last error: %w",
			n, recoveryWindow, b.perSecond, err))
	}
}
