// Package confirmed publishes for the tests and the bench as a careful
// client does: mandatory, on a channel in confirm mode, waiting for the
// broker's confirms.
package confirmed

import (
	"context"
	"fmt"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Publisher publishes on a channel of its own. It returns errors rather
// than failing a test, so any goroutine may use it; calls are serialised.
type Publisher struct {
	// Timeout bounds one Publish: the publishes and the wait for their
	// confirms.
	Timeout time.Duration
	mu      sync.Mutex
	ch      *amqp.Channel
	returns chan amqp.Return
}

// NewPublisher opens a channel on conn in confirm mode, with a Timeout of
// 30 s.
func NewPublisher(conn *amqp.Connection) (*Publisher, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("open channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		_ = ch.Close()
		return nil, fmt.Errorf("confirm mode: %w", err)
	}
	return &Publisher{Timeout: 30 * time.Second, ch: ch, returns: ch.NotifyReturn(make(chan amqp.Return, 10000))}, nil
}

// Close closes the channel.
func (p *Publisher) Close() error { return p.ch.Close() }

// Publish sends msgs to exchange ("": the default exchange) with routing
// key key and waits for every confirm. A publish that fails, a nack, a
// confirm that does not come within Timeout and a message the broker
// returned (unroutable) are errors.
func (p *Publisher) Publish(exchange, key string, msgs ...amqp.Publishing) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), p.Timeout)
	defer cancel()
	to := fmt.Sprintf("%q", key)
	if exchange != "" {
		to = fmt.Sprintf("exchange %q with key %q", exchange, key)
	}
	dcs := make([]*amqp.DeferredConfirmation, len(msgs))
	for i, m := range msgs {
		dc, err := p.ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, true, false, m)
		if err != nil {
			return fmt.Errorf("publish %d (%s) to %s: %w", i, m.MessageId, to, err)
		}
		dcs[i] = dc
	}
	for i, dc := range dcs {
		if ok, err := dc.WaitContext(ctx); err != nil || !ok {
			return fmt.Errorf("publish %d (%s) to %s not confirmed (acked=%v, err=%v)", i, msgs[i].MessageId, to, ok, err)
		}
	}
	select {
	case r := <-p.returns:
		return fmt.Errorf("publish to %s: %s returned by the broker: %d %s", to, r.MessageId, r.ReplyCode, r.ReplyText)
	default:
		return nil
	}
}
