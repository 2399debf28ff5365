package broker

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/rs/zerolog"
)

// SweepOptions configure a Sweeper.
type SweepOptions struct {
	// Name is the sweep connection's connection_name.
	Name string
	// TLS is the bridge's TLS config for amqps:// URLs; nil: the URL's own
	// TLS parameters, as amqp091-go reads them.
	TLS *tls.Config
	// ErrorQueue is named in the log line of each message moved.
	ErrorQueue string
	// Move puts the error-queue copy of an unreadable message on the error
	// queue and returns nil only once the broker confirmed it (the bridge
	// gives errorqueue.Sender.SendUnreadable).
	Move func(ctx context.Context, m Unreadable) error
	// Limit is the most messages one sweep looks at; a consumer that died
	// on an unreadable message had it among its prefetch, which the broker
	// puts back at the head of the queue. Default 1000.
	Limit int
	// Timeout bounds each exchange with the broker; default 30s.
	Timeout time.Duration
	Logger  zerolog.Logger
}

// Sweeper moves the messages amqp091-go cannot read (ErrUnreadable) from
// the head of a queue to the error queue, reading them with its own
// minimal client (rawconn.go).
type Sweeper struct{ opts SweepOptions }

// NewSweeper returns a Sweeper.
func NewSweeper(opts SweepOptions) *Sweeper {
	if opts.Limit < 1 {
		opts.Limit = 1000
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 30 * time.Second
	}
	return &Sweeper{opts: opts}
}

// Sweep takes up to Limit messages from the head of queue with basic.get
// on the first of urls that answers. Each unreadable one is copied to the
// error queue, with the reason and what of it can be read, and acked once
// the copy is confirmed; the readable ones are all requeued at the end, in
// their places. It returns how many it moved. On an error, what it took and
// did not move goes back to the queue.
func (s *Sweeper) Sweep(ctx context.Context, urls []string, queue string) (moved int, err error) {
	rc, err := dialFirst(ctx, urls, s.opts.TLS, s.opts.Name, s.opts.Timeout)
	if err != nil {
		return 0, fmt.Errorf("sweep %s: %w", queue, err)
	}
	defer func() {
		if cerr := rc.close(); err == nil && cerr != nil {
			err = fmt.Errorf("sweep %s: close: %w", queue, cerr)
		}
	}()
	kept, err := scan(ctx, rc, queue, s.opts.Limit, true, func(m rawMessage, unreadable error) error {
		if err := s.move(ctx, rc, queue, m, unreadable); err != nil {
			return err
		}
		moved++
		return nil
	})
	if err != nil {
		return moved, fmt.Errorf("sweep %s: %w", queue, err)
	}
	if len(kept) > 0 {
		// Every message taken before the last readable one is settled or
		// readable: one multiple nack puts them all back.
		if err := rc.requeueUpTo(kept[len(kept)-1]); err != nil {
			return moved, fmt.Errorf("sweep %s: requeue: %w", queue, err)
		}
	}
	return moved, nil
}

// dialFirst connects to the first of urls that answers.
func dialFirst(ctx context.Context, urls []string, tlsCfg *tls.Config, name string, timeout time.Duration) (*rawConn, error) {
	var errs []error
	for _, u := range urls {
		rc, err := dialRaw(ctx, u, tlsCfg, name, timeout)
		if err == nil {
			return rc, nil
		}
		errs = append(errs, err)
	}
	return nil, errors.Join(errs...)
}

// scan takes up to limit messages from the head of queue on rc and calls
// unreadable for each one amqp091-go could not read (ErrUnreadable), with
// its body when withBody is set. It returns the tags of the readable ones,
// left unsettled, in the order taken.
func scan(ctx context.Context, rc *rawConn, queue string, limit int, withBody bool, unreadable func(rawMessage, error) error) (readable []uint64, err error) {
	for range limit {
		if err := ctx.Err(); err != nil {
			return readable, err
		}
		var why error
		m, ok, err := rc.get(queue, func(props []byte) bool {
			_, why = decodeProperties(props)
			return withBody && why != nil
		})
		if err != nil {
			return readable, fmt.Errorf("basic.get: %w", err)
		}
		if !ok {
			break
		}
		if why == nil {
			readable = append(readable, m.tag)
			continue
		}
		if err := unreadable(m, why); err != nil {
			return readable, err
		}
	}
	return readable, nil
}

// Unreadable is a message the AMQP client cannot read, as a sweep took it
// off its queue with its own client.
type Unreadable struct {
	// Queue is the queue it was taken from.
	Queue string
	// Msg holds the properties that could be read, and the body.
	Msg amqp.Publishing
	// Props are the original content header's property flags and list,
	// byte for byte, headers included.
	Props []byte
	// Reason is why the AMQP client cannot read it (ErrUnreadable).
	Reason error
}

// move has one unreadable message copied to the error queue (Move) and acks
// it once the copy is confirmed.
func (s *Sweeper) move(ctx context.Context, rc *rawConn, queue string, m rawMessage, unreadable error) error {
	p, _ := decodeProperties(m.props)
	p.Body = m.body
	if err := s.opts.Move(ctx, Unreadable{Queue: queue, Msg: p, Props: m.props, Reason: unreadable}); err != nil {
		return fmt.Errorf("copy an unreadable message to the error queue: %w", err)
	}
	if err := rc.ack(m.tag); err != nil {
		return fmt.Errorf("ack a moved message: %w", err)
	}
	s.opts.Logger.Warn().Str("queue", queue).Str("message_id", p.MessageId).Str("reason", unreadable.Error()).
		Str("error_queue", s.opts.ErrorQueue).Msg("unreadable message moved to the error queue")
	return nil
}

// PublishOne publishes msg to queue (default exchange, mandatory) on a
// publisher of its own on conn and waits up to 30 s for the broker's confirm.
func PublishOne(ctx context.Context, conn *Conn, queue string, msg amqp.Publishing) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	p, err := conn.Publisher(ctx, 1)
	if err != nil {
		return err
	}
	defer p.Close()
	return p.Publish(ctx, []Outgoing{{RoutingKey: queue, Mandatory: true, Msg: msg}})[0]
}
