package broker

import (
	"context"
	"crypto/tls"
	"fmt"
	"time"
)

// HoldOptions configure HoldUnreadable's connection.
type HoldOptions struct {
	// URLs are tried in order; the first that answers is used.
	URLs []string
	// TLS is the bridge's TLS config for amqps:// URLs, as for a Sweeper.
	TLS *tls.Config
	// Name is the connection's connection_name.
	Name string
	// Timeout bounds each exchange with the broker; default 30s.
	Timeout time.Duration
}

// UnreadableMessage is one message HoldUnreadable holds.
type UnreadableMessage struct {
	MessageID string
	// Reason wraps ErrUnreadable and says which limit the headers exceed.
	Reason error
}

// Held is the outcome of HoldUnreadable: its connection holds the
// unreadable messages until Release.
type Held struct {
	// Unreadable are the messages held, in the order taken.
	Unreadable []UnreadableMessage
	// Readable is how many readable messages were taken and requeued. They
	// are back at the head of the queue, ahead of every message not taken,
	// so a reader that takes no more than Readable messages meets none that
	// HoldUnreadable did not check.
	Readable int

	rc *rawConn
}

// HoldUnreadable takes up to limit messages from the head of queue with
// basic.get, reading them as bytes (rawconn.go), and requeues the readable
// ones in their places. The ones amqp091-go cannot read (ErrUnreadable) it
// leaves unacknowledged on its connection, so that no consumer or basic.get
// meets them, until Release puts them back. Nothing is copied or published:
// a held message cannot be lost or duplicated, and it goes back byte for
// byte. Unlike Sweep, which moves such messages off a queue, this is for
// the error queue itself, where they stay for an operator.
func HoldUnreadable(ctx context.Context, opts HoldOptions, queue string, limit int) (_ *Held, err error) {
	if opts.Timeout <= 0 {
		opts.Timeout = 30 * time.Second
	}
	rc, err := dialFirst(ctx, opts.URLs, opts.TLS, opts.Name, opts.Timeout)
	if err != nil {
		return nil, fmt.Errorf("hold unreadable messages of %s: %w", queue, err)
	}
	h := &Held{rc: rc}
	defer func() {
		if err != nil {
			// Closing returns everything taken to the queue.
			_ = rc.close()
		}
	}()
	readable, err := scan(ctx, rc, queue, limit, false, func(m rawMessage, why error) error {
		p, _ := decodeProperties(m.props)
		h.Unreadable = append(h.Unreadable, UnreadableMessage{MessageID: p.MessageId, Reason: why})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("hold unreadable messages of %s: %w", queue, err)
	}
	if err := rc.requeue(readable); err != nil {
		return nil, fmt.Errorf("hold unreadable messages of %s: requeue the readable ones: %w", queue, err)
	}
	h.Readable = len(readable)
	return h, nil
}

// Release closes the connection, which returns the held messages to the
// queue untouched (a classic queue puts them back in their places; a quorum
// queue delivers returned messages first). It is safe to call twice. An
// error only says the close was not polite: the broker requeues what the
// connection held either way.
func (h *Held) Release() error {
	if h == nil || h.rc == nil {
		return nil
	}
	rc := h.rc
	h.rc = nil
	return rc.close()
}
