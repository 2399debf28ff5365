// Package budget bounds the bytes of message data the bridge holds at once
// (DELAYBRIDGE_MAX_INFLIGHT_BYTES). AMQP prefetch counts messages, not
// bytes, so a count alone lets large messages pin memory without bound; a
// Budget is a semaphore weighted by message size that a component acquires
// before it keeps a message's bytes and releases once it settled them.
//
// A message larger than the whole budget is admitted alone, once everything
// else has been released: it still makes progress, and never deadlocks.
package budget

import (
	"context"
	"sync/atomic"

	"golang.org/x/sync/semaphore"
)

// Budget is a byte budget. A nil *Budget is unlimited: every call succeeds
// at once and holds nothing.
type Budget struct {
	sem   *semaphore.Weighted
	total int64
	held  atomic.Int64
}

// New returns a budget of total bytes; total ≤ 0 returns nil (unlimited).
func New(total int64) *Budget {
	if total <= 0 {
		return nil
	}
	return &Budget{sem: semaphore.NewWeighted(total), total: total}
}

// Total is the budget's size in bytes; 0 for an unlimited one.
func (b *Budget) Total() int64 {
	if b == nil {
		return 0
	}
	return b.total
}

// Held is how many bytes are acquired now (a message larger than the budget
// counts as the whole budget).
func (b *Budget) Held() int64 {
	if b == nil {
		return 0
	}
	return b.held.Load()
}

// weight is what n bytes take of the budget: an oversized message takes
// all of it, so it waits until it is alone rather than forever.
func (b *Budget) weight(n int64) int64 { return max(0, min(n, b.total)) }

// Acquire waits until n bytes fit in the budget, or ctx ends (then it
// returns ctx's error and holds nothing). Waiters are served in order, so a
// large message is not starved by a stream of small ones.
func (b *Budget) Acquire(ctx context.Context, n int64) error {
	if b == nil {
		return nil
	}
	w := b.weight(n)
	if w == 0 {
		return nil
	}
	if err := b.sem.Acquire(ctx, w); err != nil {
		return err
	}
	b.held.Add(w)
	return nil
}

// TryAcquire acquires n bytes if they fit now and nobody waits before it.
// A holder that wants more must use it, never Acquire: waiting while
// holding could wait for itself.
func (b *Budget) TryAcquire(n int64) bool {
	if b == nil {
		return true
	}
	w := b.weight(n)
	if w == 0 {
		return true
	}
	if !b.sem.TryAcquire(w) {
		return false
	}
	b.held.Add(w)
	return true
}

// Release gives back n bytes acquired with Acquire or TryAcquire (the same
// n: an oversized message releases the whole budget it took).
func (b *Budget) Release(n int64) {
	if b == nil {
		return
	}
	w := b.weight(n)
	if w == 0 {
		return
	}
	b.held.Add(-w)
	b.sem.Release(w)
}
