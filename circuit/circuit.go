// Package circuit is a repeated-failures-over-time circuit breaker, as the
// NServiceBus delayed-delivery store uses: the first failure arms it, a
// success disarms it, and failures that persist for the time-to-trigger
// trigger it. Triggering is a critical error: the owner stops the process so
// a supervisor restarts it, rather than limping on against a broken store or
// broker.
package circuit

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"time"
)

// State of a breaker.
type State int

const (
	Disarmed State = iota
	Armed
	Triggered
)

func (s State) String() string {
	switch s {
	case Disarmed:
		return "disarmed"
	case Armed:
		return "armed"
	case Triggered:
		return "triggered"
	}
	return fmt.Sprintf("State(%d)", int(s))
}

// Options configure a Breaker.
type Options struct {
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// OnTrigger is called once, outside the breaker's lock, when the breaker
	// triggers, with an error saying which breaker and why.
	OnTrigger func(error)
	// OnChange, when set, is told every state change (for logs and metrics).
	OnChange func(name string, s State, cause error)
	// MaxBackoff caps the pause Failure asks for; zero means 5s or a quarter
	// of the time to trigger, whichever is shorter.
	MaxBackoff time.Duration
}

// Breaker is safe for concurrent use.
type Breaker struct {
	name          string
	timeToTrigger time.Duration
	opts          Options

	mu       sync.Mutex
	state    State
	armedAt  time.Time
	failures int
	lastErr  error
}

// New returns a disarmed breaker.
func New(name string, timeToTrigger time.Duration, opts Options) *Breaker {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.MaxBackoff <= 0 {
		opts.MaxBackoff = min(5*time.Second, max(timeToTrigger/4, 10*time.Millisecond))
	}
	return &Breaker{name: name, timeToTrigger: timeToTrigger, opts: opts}
}

// Name is the breaker's name (store, fetch, dispatch).
func (b *Breaker) Name() string { return b.name }

// State returns the current state.
func (b *Breaker) State() State {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.state
}

// Success disarms the breaker.
func (b *Breaker) Success() {
	b.mu.Lock()
	if b.state != Armed {
		b.mu.Unlock()
		return
	}
	b.state, b.armedAt, b.failures, b.lastErr = Disarmed, time.Time{}, 0, nil
	b.mu.Unlock()
	if b.opts.OnChange != nil {
		b.opts.OnChange(b.name, Disarmed, nil)
	}
}

// Failure records a failure. The first one arms the breaker; one at or after
// the time to trigger since arming triggers it. It returns how long the
// caller should pause before trying again (growing with consecutive
// failures, jittered), so a failing component backs off instead of spinning.
func (b *Breaker) Failure(err error) time.Duration {
	now := b.opts.Now()
	b.mu.Lock()
	var changed State = -1
	switch b.state {
	case Disarmed:
		b.state, b.armedAt = Armed, now
		changed = Armed
	case Armed:
		if now.Sub(b.armedAt) >= b.timeToTrigger {
			b.state = Triggered
			changed = Triggered
		}
	}
	b.failures++
	b.lastErr = err
	n := b.failures
	armedFor := now.Sub(b.armedAt)
	b.mu.Unlock()

	if changed >= 0 && b.opts.OnChange != nil {
		b.opts.OnChange(b.name, changed, err)
	}
	if changed == Triggered && b.opts.OnTrigger != nil {
		b.opts.OnTrigger(fmt.Errorf("%s circuit breaker triggered: failing for %s (%d failures), last error: %w",
			b.name, armedFor.Round(time.Millisecond), n, err))
	}
	return b.backoff(n)
}

// backoff is 50ms doubling per consecutive failure up to MaxBackoff, with
// ±20% jitter so several failing loops do not retry in lockstep.
func (b *Breaker) backoff(failures int) time.Duration {
	d := 50 * time.Millisecond << min(failures-1, 16)
	d = min(d, b.opts.MaxBackoff)
	jitter := time.Duration(rand.Int64N(int64(d)/5+1)) - d/10
	return max(d+jitter, time.Millisecond)
}
