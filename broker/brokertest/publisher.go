// Package brokertest holds a test double of the confirm publishers that
// ingest, the dispatcher and the error queue publish with.
package brokertest

import (
	"context"
	"sync"

	"github.com/delaybridge/delaybridge/broker"
)

// Publisher records every message published and answers each with
// Outcome: nil is the broker's confirm. It is safe for concurrent use.
type Publisher struct {
	// Outcome, when set, answers each message; nil confirms every one.
	Outcome func(broker.Outgoing) error

	mu    sync.Mutex
	sent  []broker.Outgoing
	calls []int
}

// Publish records msgs and answers each with Outcome.
func (p *Publisher) Publish(_ context.Context, msgs []broker.Outgoing) []error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls = append(p.calls, len(msgs))
	res := make([]error, len(msgs))
	for i, m := range msgs {
		p.sent = append(p.sent, m)
		if p.Outcome != nil {
			res[i] = p.Outcome(m)
		}
	}
	return res
}

// Close does nothing.
func (p *Publisher) Close() error { return nil }

// Sent is every message published so far, in order, refused ones too.
func (p *Publisher) Sent() []broker.Outgoing {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]broker.Outgoing(nil), p.sent...)
}

// To is the messages published so far with routing key key.
func (p *Publisher) To(key string) []broker.Outgoing {
	var out []broker.Outgoing
	for _, m := range p.Sent() {
		if m.RoutingKey == key {
			out = append(out, m)
		}
	}
	return out
}

// Calls is how many messages each Publish call carried, in order.
func (p *Publisher) Calls() []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]int(nil), p.calls...)
}

// Always answers every message with err.
func Always(err error) func(broker.Outgoing) error {
	return func(broker.Outgoing) error { return err }
}

// PublishFunc makes a function a publisher that closes without doing
// anything.
type PublishFunc func(ctx context.Context, msgs []broker.Outgoing) []error

// Publish calls f.
func (f PublishFunc) Publish(ctx context.Context, msgs []broker.Outgoing) []error {
	return f(ctx, msgs)
}

// Close does nothing.
func (PublishFunc) Close() error { return nil }
