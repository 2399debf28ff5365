// Package broker holds the AMQP plumbing shared by ingest, poller and
// dispatch: dialing without leaking credentials, declaring the bridge's
// queues, and a confirm-mode publisher that tells confirmed, returned and
// nacked publishes apart.
package broker

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/wire"
)

// Dial connects once, for short-lived clients like the schedule command.
func Dial(rawURL, name string, cfg amqp.Config) (*amqp.Connection, error) {
	return dial(rawURL, name, cfg)
}

// dial connects and names the connection so operators can tell the bridge's
// connections apart in the management UI. Errors never contain the password.
func dial(rawURL, name string, cfg amqp.Config) (*amqp.Connection, error) {
	cfg.Properties = amqp.NewConnectionProperties()
	if cfg.TLSClientConfig != nil {
		// amqp091-go writes the URL host into an empty ServerName: never
		// share one *tls.Config between dials.
		cfg.TLSClientConfig = cfg.TLSClientConfig.Clone()
	}
	cfg.Properties.SetClientConnectionName(name)
	if cfg.Heartbeat == 0 {
		cfg.Heartbeat = 10 * time.Second
	}
	if cfg.Locale == "" {
		cfg.Locale = "en_US"
	}
	if cfg.Dial == nil {
		cfg.Dial = amqp.DefaultDial(10 * time.Second)
	}
	conn, err := amqp.DialConfig(rawURL, cfg)
	if err != nil {
		// Not wrapped: the error's text may carry the password.
		var op *net.OpError
		unreachable := errors.As(err, &op)
		return nil, &dialError{
			msg:         fmt.Sprintf("connect to %s: %s", Redact(rawURL), RedactText(err.Error(), rawURL)),
			unreachable: unreachable,
			portClosed:  unreachable && op.Op == "dial",
		}
	}
	return conn, nil
}

// ErrUnreachable matches a connection error where no broker accepted a TCP
// connection at the URL (refused, no route, unknown host), as opposed to a
// broker that answered and refused the bridge (credentials, TLS, vhost).
var ErrUnreachable = errors.New("no broker accepted a connection")

// dialError is a failed dial, its text redacted.
type dialError struct {
	msg         string
	unreachable bool
	// portClosed: the TCP connect itself failed (refused, timed out, no
	// route), not a read or write after it; Conn probes such a port while
	// it backs off (probe.go).
	portClosed bool
}

func (e *dialError) Error() string { return e.msg }

func (e *dialError) Is(target error) bool { return target == ErrUnreachable && e.unreachable }

// Topology names the queues the bridge owns (docs/contract.md §1).
type Topology struct {
	Endpoint   string
	ErrorQueue string
	QueueType  string // classic or quorum
}

// TimeoutsQueue is where clients publish messages to delay.
func (t Topology) TimeoutsQueue() string { return wire.TimeoutsQueue(t.Endpoint) }

// DispatcherQueue carries lease tokens from the poller to the dispatcher.
func (t Topology) DispatcherQueue() string { return wire.DispatcherQueue(t.Endpoint) }

// Declare declares the three durable queues. It never deletes or purges.
func (t Topology) Declare(ch *amqp.Channel) error {
	for _, q := range []string{t.TimeoutsQueue(), t.DispatcherQueue(), t.ErrorQueue} {
		if err := t.declare(ch, q); err != nil {
			return err
		}
	}
	return nil
}

// DeclareErrorQueue declares the error queue alone, as Declare does: again
// after it was deleted while the bridge runs.
func (t Topology) DeclareErrorQueue(ch *amqp.Channel) error { return t.declare(ch, t.ErrorQueue) }

func (t Topology) declare(ch *amqp.Channel, q string) error {
	if _, err := ch.QueueDeclare(q, true, false, false, false, amqp.Table{amqp.QueueTypeArg: t.QueueType}); err != nil {
		return fmt.Errorf("declare queue %q: %w", q, err)
	}
	return nil
}

// ErrTopologyConflict marks a declaration the broker refused because an
// exchange of that name exists with other properties: no retry can help, the
// operator must change the broker or the configuration.
var ErrTopologyConflict = errors.New("conflicts with an existing exchange")

// Outcomes of one publish. ErrReturned and ErrNacked are about the message
// (retrying it may not help); ErrNotConfirmed is about the connection.
var (
	ErrReturned = errors.New("returned by the broker as unroutable")
	ErrNacked   = errors.New("rejected by the broker (nack)")
	// ErrNoExchange means the message was not published because its
	// exchange does not exist (publishing to it would close the channel
	// under every other publish in flight).
	ErrNoExchange   = errors.New("exchange does not exist")
	ErrNotConfirmed = errors.New("not confirmed: channel or connection failed")
	// ErrChannelClosed comes with ErrNotConfirmed when the publish's
	// channel (or its connection) closed while the publish was held for
	// its NotBefore or waited for its confirm: it ends then, not when its
	// context does, so the caller can go on on another channel.
	ErrChannelClosed = errors.New("channel closed")
)

// Outgoing is one message to publish.
type Outgoing struct {
	Exchange   string
	RoutingKey string
	Mandatory  bool
	Msg        amqp.Publishing
	// NotBefore holds the publish until this time (by the wall clock), so a
	// timeout handed over early still leaves exactly when due. Messages of one
	// call should be in NotBefore order; zero: at once.
	NotBefore time.Time
	// Confirmed, when set, is called by Publish when the broker acked this
	// message, with the time since it was published. While Publish holds a
	// later message of the window for its NotBefore it watches the confirms
	// of those before, so the call comes when the ack arrives, not when the
	// window ends. An ack does not rule out a return: Publish's result is
	// the outcome.
	Confirmed func(latency time.Duration)
}

// Publisher publishes on one confirm-mode channel. Publish calls are
// serialized: returns are matched to publishes by order, which is only sound
// while one batch at a time is in flight on the channel.
type Publisher struct {
	conn *amqp.Connection
	ch   *amqp.Channel
	// exchanges holds when each exchange published to was last seen to
	// exist (see checkExchange).
	exchanges map[string]time.Time
	returns   chan amqp.Return
	closed    chan *amqp.Error
	// gone is closed once the channel is: every wait of Publish watches it.
	gone     chan struct{}
	maxBatch int
	frameMax int // the connection's negotiated frame_max; ≤ 0: none
}

// NewPublisher opens a channel in confirm mode. maxBatch caps the publishes
// in flight at once (and sizes the return buffer so the connection's reader
// never blocks on it).
func NewPublisher(conn *amqp.Connection, maxBatch int) (*Publisher, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("open publish channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		_ = ch.Close()
		return nil, fmt.Errorf("enable publisher confirms: %w", err)
	}
	if maxBatch < 1 {
		maxBatch = 1
	}
	p := &Publisher{
		conn:     conn,
		ch:       ch,
		returns:  ch.NotifyReturn(make(chan amqp.Return, maxBatch)),
		closed:   ch.NotifyClose(make(chan *amqp.Error, 1)),
		gone:     make(chan struct{}),
		maxBatch: maxBatch,
		frameMax: conn.Config.FrameSize,
	}
	// amqp091-go closes a NotifyClose channel once the channel is closed,
	// by either side or with its connection.
	notify := ch.NotifyClose(make(chan *amqp.Error, 1))
	go func() {
		for range notify {
		}
		close(p.gone)
	}()
	return p, nil
}

// Channel exposes the underlying channel (for declarations).
func (p *Publisher) Channel() *amqp.Channel { return p.ch }

// Closed is notified when the channel closes.
func (p *Publisher) Closed() <-chan *amqp.Error { return p.closed }

// IsClosed reports whether the channel is closed: a publisher that is will
// never publish again.
func (p *Publisher) IsClosed() bool { return p.ch.IsClosed() }

// Close closes the channel; safe to call twice.
func (p *Publisher) Close() error {
	if p.ch.IsClosed() {
		return nil
	}
	return p.ch.Close()
}

// Publish sends msgs and waits for every confirm. results[i] is nil when the
// broker confirmed msgs[i] and did not return it; otherwise it wraps
// ErrReturned, ErrNacked, ErrUnpublishable (never sent: see Publishable) or
// ErrNotConfirmed. ctx bounds the wait; a message whose confirm did not
// arrive in time counts as not confirmed. When the channel closes, Publish
// returns at once: the messages not yet confirmed, those still held for
// their NotBefore included, are not confirmed (ErrChannelClosed).
func (p *Publisher) Publish(ctx context.Context, msgs []Outgoing) []error {
	results := make([]error, len(msgs))
	for start := 0; start < len(msgs); start += p.maxBatch {
		end := min(start+p.maxBatch, len(msgs))
		p.publishWindow(ctx, msgs[start:end], results[start:end])
	}
	return results
}

func (p *Publisher) publishWindow(ctx context.Context, msgs []Outgoing, results []error) {
	confirms := make([]*amqp.DeferredConfirmation, len(msgs))
	track := newConfirmTracker(msgs, confirms) // nil when nobody asked
	for i := range msgs {
		m := &msgs[i]
		if p.isGone() {
			results[i] = errChannelClosed
			continue
		}
		if wait := time.Until(m.NotBefore); wait > 0 {
			if err := track.hold(ctx, p.gone, wait, i); err != nil {
				results[i] = err
				continue
			}
		}
		// Checked here, not left to the library: its encoding error would
		// close the connection under every other publish in flight.
		if err := Publishable(m.Exchange, m.RoutingKey, &m.Msg, p.frameMax); err != nil {
			results[i] = err
			continue
		}
		if err := p.checkExchange(m.Exchange); err != nil {
			results[i] = err
			continue
		}
		track.publishing(i)
		dc, err := p.ch.PublishWithDeferredConfirmWithContext(ctx, m.Exchange, m.RoutingKey, m.Mandatory, false, m.Msg)
		if err != nil {
			results[i] = fmt.Errorf("%w: %w", ErrNotConfirmed, err)
			continue
		}
		confirms[i] = dc
	}
	for i, dc := range confirms {
		if dc == nil {
			continue
		}
		acked, err := p.waitConfirm(ctx, dc)
		if err == nil {
			track.report(i)
		}
		switch {
		case err != nil: // wraps context.DeadlineExceeded when the broker is slow
			results[i] = err
		case !acked && p.ch.IsClosed():
			// The library nacks outstanding confirms when the channel dies.
			results[i] = errChannelClosed
		case !acked:
			results[i] = ErrNacked
		}
	}
	// The broker sends basic.return before the basic.ack of the same message,
	// and the library queues it before resolving the confirm, so every return
	// for this window is buffered by now.
	for {
		select {
		case r, ok := <-p.returns:
			if !ok { // the library closes it with the channel
				return
			}
			p.matchReturn(msgs, results, r)
		default:
			return
		}
	}
}

// errChannelClosed is the result of a publish whose channel closed under it.
var errChannelClosed = fmt.Errorf("%w: %w", ErrNotConfirmed, ErrChannelClosed)

// isGone reports whether the channel is closed.
func (p *Publisher) isGone() bool {
	select {
	case <-p.gone:
		return true
	default:
		return false
	}
}

// waitConfirm waits for dc until ctx ends or the channel closes. A confirm
// that came before the close counts: amqp091-go settles the confirms it
// read before it closes the channel (and nacks the rest).
func (p *Publisher) waitConfirm(ctx context.Context, dc *amqp.DeferredConfirmation) (bool, error) {
	select {
	case <-dc.Done():
		return dc.Acked(), nil
	case <-ctx.Done():
		return false, fmt.Errorf("%w: %w", ErrNotConfirmed, ctx.Err())
	case <-p.gone:
		if dc.Acked() {
			return true, nil
		}
		return false, errChannelClosed
	}
}

// exchangeCheckTTL is how long an exchange seen to exist is published to
// without checking again. An exchange deleted meanwhile closes the channel
// once (its forwards are released uncounted), and the next publisher checks.
const exchangeCheckTTL = 10 * time.Second

// checkExchange returns an error wrapping ErrNoExchange when x is not the
// default exchange and does not exist, and ErrNotConfirmed when it cannot
// tell. A publish to a missing exchange is a channel error, which would fail
// every publish in flight with it; a passive declare on a channel of its
// own costs that channel only.
func (p *Publisher) checkExchange(x string) error {
	if x == "" || p.conn == nil {
		return nil
	}
	if at, ok := p.exchanges[x]; ok && time.Since(at) < exchangeCheckTTL {
		return nil
	}
	ch, err := p.conn.Channel()
	if err != nil {
		return fmt.Errorf("%w: open a channel to check exchange %q: %w", ErrNotConfirmed, x, err)
	}
	err = ch.ExchangeDeclarePassive(x, "", false, false, false, false, nil)
	var ae *amqp.Error
	switch {
	case err == nil:
		_ = ch.Close()
		if p.exchanges == nil {
			p.exchanges = map[string]time.Time{}
		}
		p.exchanges[x] = time.Now()
		return nil
	case errors.As(err, &ae) && ae.Code == amqp.NotFound:
		return fmt.Errorf("%w: %q", ErrNoExchange, x)
	}
	_ = ch.Close()
	return fmt.Errorf("%w: check exchange %q: %w", ErrNotConfirmed, x, err)
}

// confirmTracker calls the Confirmed callbacks of one window. A nil tracker
// (no message has a callback) reports nothing.
type confirmTracker struct {
	msgs     []Outgoing
	confirms []*amqp.DeferredConfirmation
	sent     []time.Time
	next     int // messages before next are reported
}

func newConfirmTracker(msgs []Outgoing, confirms []*amqp.DeferredConfirmation) *confirmTracker {
	for i := range msgs {
		if msgs[i].Confirmed != nil {
			return &confirmTracker{msgs: msgs, confirms: confirms, sent: make([]time.Time, len(msgs))}
		}
	}
	return nil
}

// publishing notes when message i is published.
func (t *confirmTracker) publishing(i int) {
	if t != nil {
		t.sent[i] = time.Now()
	}
}

// hold waits d before message i is published, reporting the confirms of the
// messages before it as they arrive (in publish order, as the broker sends
// them). It returns nil when d passed, and an error wrapping ErrNotConfirmed
// when ctx ended or gone closed (the channel did) first.
func (t *confirmTracker) hold(ctx context.Context, gone <-chan struct{}, d time.Duration, i int) error {
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		var confirmed <-chan struct{} // nil: nothing to watch
		if t != nil {
			for t.next < i && t.confirms[t.next] == nil { // never published
				t.next++
			}
			if t.next < i {
				confirmed = t.confirms[t.next].Done()
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: %w", ErrNotConfirmed, ctx.Err())
		case <-gone:
			return errChannelClosed
		case <-timer.C:
			return nil
		case <-confirmed:
			t.report(t.next)
		}
	}
}

// report calls message i's Confirmed, once, if the broker acked it.
func (t *confirmTracker) report(i int) {
	if t == nil || i < t.next {
		return
	}
	t.next = i + 1
	if f := t.msgs[i].Confirmed; f != nil && t.confirms[i].Acked() {
		f(time.Since(t.sent[i]))
	}
}

// matchReturn marks the publish a return belongs to: one confirmed publish
// with the same exchange, routing key and message id. When several match
// (an empty message id, say) it cannot tell which was returned, so it marks
// them all: a retry of one that was routed is a duplicate, while taking a
// returned one for delivered would be a loss.
func (p *Publisher) matchReturn(msgs []Outgoing, results []error, r amqp.Return) {
	var candidates []int
	for i := range msgs {
		m := &msgs[i]
		if results[i] == nil && m.Exchange == r.Exchange && m.RoutingKey == r.RoutingKey && m.Msg.MessageId == r.MessageId {
			candidates = append(candidates, i)
		}
	}
	for _, i := range candidates {
		results[i] = fmt.Errorf("%w: %d %s", ErrReturned, r.ReplyCode, r.ReplyText)
	}
}

// Sleep waits for d unless ctx ends first; it reports whether d passed.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
