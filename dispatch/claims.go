package dispatch

import (
	"sync"

	"github.com/delaybridge/delaybridge/wire"
)

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
