package storage

import (
	"context"
	"sync"
)

// Gate is a store's open state, as Store's Close asks: every call enters it
// and exits when done; Close waits for the calls in flight, and the calls
// after it are refused with ErrClosed. The zero Gate is open.
type Gate struct {
	mu     sync.RWMutex // read-held by every call, write-held by Close
	closed bool
}

// Enter starts a call: ErrClosed after Close, ctx's error when ctx has
// ended; otherwise the caller runs exit when the call ends.
func (g *Gate) Enter(ctx context.Context) (exit func(), err error) {
	g.mu.RLock()
	if g.closed {
		g.mu.RUnlock()
		return nil, ErrClosed
	}
	if err := ctx.Err(); err != nil {
		g.mu.RUnlock()
		return nil, err
	}
	return g.mu.RUnlock, nil
}

// Close waits for the calls in flight, shuts the gate and runs shut (the
// store's own closing) with no call in flight. Closing again returns nil
// and runs nothing.
func (g *Gate) Close(shut func() error) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return nil
	}
	g.closed = true
	return shut()
}
