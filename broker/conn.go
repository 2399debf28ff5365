package broker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/rs/zerolog"
)

// ErrNeverConnected is returned by Run when the first connection attempt
// fails: a wrong URL, password or certificate should stop start-up loudly
// rather than retry forever in silence.
var ErrNeverConnected = errors.New("could not connect to the broker")

// ConnOptions configure a Conn.
type ConnOptions struct {
	// URLs are the brokers of one cluster, tried in order. A connection stays
	// with the broker that last answered; when it is lost, that broker is
	// tried first and the others in turn, so a node going down fails over
	// within one attempt. URL alone is the one-broker shorthand.
	URLs   []string
	URL    string
	Name   string // connection_name shown in the management UI
	Config amqp.Config
	// OnConnect runs on every new connection before it is handed out (the
	// bridge redeclares its queues here). An error closes the connection
	// and counts as a failed attempt.
	OnConnect func(*amqp.Connection) error
	// MinBackoff and MaxBackoff bound the jittered, doubling pause between
	// attempts; defaults 100ms and 10s.
	MinBackoff, MaxBackoff time.Duration
	// ProbeInterval: during a pause, how often the TCP port of each broker
	// that was down is checked, so that the next attempt comes as soon as
	// one is back (probe.go); default 250ms, negative: never.
	ProbeInterval time.Duration
	// Sweeper, when set, lets Consume move messages the client cannot read
	// off the queues it consumes on this connection (SweepUnreadable).
	Sweeper *Sweeper
	Logger  zerolog.Logger
}

// Conn keeps one AMQP connection up. It dials, and when the broker closes
// the connection or the network drops it, dials again with capped, jittered
// backoff; while it backs off it watches the ports of the brokers that were
// down and tries again as soon as one accepts connections (probe.go). Users
// take the current connection with Wait and open their own channels; when a
// channel dies they call Wait again.
type Conn struct {
	opts  ConnOptions
	addrs []string // each broker's host:port, once: what pause probes

	mu      sync.Mutex
	conn    *amqp.Connection
	up      chan struct{} // closed while conn is usable
	current int           // index in opts.URLs of the broker tried first
	blocked string        // the broker's reason while it blocks this connection's publishes
}

// NewConn returns a Conn; it connects only in Run.
func NewConn(opts ConnOptions) *Conn {
	if opts.MinBackoff <= 0 {
		opts.MinBackoff = 100 * time.Millisecond
	}
	if opts.MaxBackoff <= 0 {
		opts.MaxBackoff = 10 * time.Second
	}
	if len(opts.URLs) == 0 {
		opts.URLs = []string{opts.URL}
	}
	if opts.ProbeInterval == 0 {
		opts.ProbeInterval = defaultProbeInterval
	}
	c := &Conn{opts: opts, up: make(chan struct{})}
	for _, u := range opts.URLs {
		if a := probeAddr(u); a != "" && !slices.Contains(c.addrs, a) {
			c.addrs = append(c.addrs, a)
		}
	}
	return c
}

// Connect makes the first connection. It fails with ErrNeverConnected, or
// with ErrTopologyConflict when a broker answered but refused the bridge's
// exchanges as they exist in another form.
func (c *Conn) Connect() error {
	conn, _, err := c.dial()
	if err != nil {
		if errors.Is(err, ErrTopologyConflict) {
			// Connected, but the broker has an exchange of the bridge's in
			// another form: the error says what to change.
			return err
		}
		return fmt.Errorf("%w: %w", ErrNeverConnected, err)
	}
	c.set(conn)
	return nil
}

// Run keeps the connection up until ctx ends, then closes it. Connect must
// have succeeded first.
func (c *Conn) Run(ctx context.Context) error {
	for {
		c.mu.Lock()
		conn := c.conn
		c.mu.Unlock()
		if conn == nil {
			return errors.New("broker: Run before Connect")
		}
		closed := conn.NotifyClose(make(chan *amqp.Error, 1))
		select {
		case <-ctx.Done():
			c.unset()
			_ = conn.Close()
			return nil
		case e := <-closed:
			c.unset()
			c.opts.Logger.Warn().Str("connection", c.opts.Name).Str("reason", errString(e)).
				Msg("broker connection lost; reconnecting")
		}
		var refused map[string]bool // nil: no attempt yet, every port is watched
		for attempt := 1; ; attempt++ {
			if !c.pause(ctx, c.backoff(attempt), refused) {
				return nil
			}
			var next *amqp.Connection
			var err error
			next, refused, err = c.dial()
			if err == nil {
				c.opts.Logger.Info().Str("connection", c.opts.Name).Int("attempts", attempt).Msg("broker connection restored")
				c.set(next)
				break
			}
			c.opts.Logger.Warn().Err(err).Str("connection", c.opts.Name).Int("attempt", attempt).
				Msg("reconnecting to the broker failed")
		}
	}
}

// Wait returns the current connection, waiting while there is none.
func (c *Conn) Wait(ctx context.Context) (*amqp.Connection, error) {
	for {
		c.mu.Lock()
		conn, up := c.conn, c.up
		c.mu.Unlock()
		if conn != nil && !conn.IsClosed() {
			return conn, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-up:
		case <-time.After(50 * time.Millisecond): // closed but not yet noticed by Run
		}
	}
}

// Close closes the current connection without waiting for Run; for
// start-up failures before Run was started.
func (c *Conn) Close() {
	c.mu.Lock()
	conn := c.conn
	c.mu.Unlock()
	c.unset()
	if conn != nil {
		_ = conn.Close()
	}
}

// Connected reports whether the connection is up.
func (c *Conn) Connected() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.conn != nil && !c.conn.IsClosed()
}

// Publisher waits for the connection and opens a confirm-mode publisher on it.
func (c *Conn) Publisher(ctx context.Context, maxBatch int) (*Publisher, error) {
	conn, err := c.Wait(ctx)
	if err != nil {
		return nil, err
	}
	return NewPublisher(conn, maxBatch)
}

// errNoSweeper: the Conn was made without ConnOptions.Sweeper.
var errNoSweeper = errors.New("no sweeper configured")

// SweepUnreadable moves the messages the client cannot read from the head of
// queue to the error queue (Sweeper.Sweep), trying the broker that last
// answered first.
func (c *Conn) SweepUnreadable(ctx context.Context, queue string) (int, error) {
	if c.opts.Sweeper == nil {
		return 0, errNoSweeper
	}
	c.mu.Lock()
	first := c.current
	c.mu.Unlock()
	urls := make([]string, 0, len(c.opts.URLs))
	urls = append(urls, c.opts.URLs[first:]...)
	urls = append(urls, c.opts.URLs[:first]...)
	return c.opts.Sweeper.Sweep(ctx, urls, queue)
}

// Broker returns the URL (password redacted) of the broker the connection
// uses or, while down, will try first.
func (c *Conn) Broker() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return Redact(c.opts.URLs[c.current])
}

// dial tries each broker once, starting with the one that last answered.
// closed holds the host:port of each broker whose port refused the
// connection (for pause).
func (c *Conn) dial() (*amqp.Connection, map[string]bool, error) {
	c.mu.Lock()
	first := c.current
	c.mu.Unlock()
	var errs dialErrors
	closed := map[string]bool{}
	for i := range c.opts.URLs {
		idx := (first + i) % len(c.opts.URLs)
		conn, err := c.dialOne(c.opts.URLs[idx])
		if err != nil {
			errs = append(errs, err)
			var de *dialError
			if errors.As(err, &de) && de.portClosed {
				closed[probeAddr(c.opts.URLs[idx])] = true
			}
			continue
		}
		c.mu.Lock()
		c.current = idx
		c.mu.Unlock()
		if len(c.opts.URLs) > 1 {
			c.opts.Logger.Info().Str("connection", c.opts.Name).Str("broker", Redact(c.opts.URLs[idx])).
				Msg("connected to broker")
		}
		return conn, closed, nil
	}
	return nil, closed, errs
}

// dialErrors are the failures of one round of dial, one per broker. They
// print as one line for logs and the exit message (each names its broker)
// and unwrap to each.
type dialErrors []error

func (e dialErrors) Error() string {
	s := make([]string, len(e))
	for i, err := range e {
		s[i] = err.Error()
	}
	return strings.Join(s, "; ")
}

func (e dialErrors) Unwrap() []error { return e }

func (c *Conn) dialOne(url string) (*amqp.Connection, error) {
	conn, err := dial(url, c.opts.Name, c.opts.Config)
	if err != nil {
		return nil, err
	}
	if c.opts.OnConnect != nil {
		if err := c.opts.OnConnect(conn); err != nil {
			_ = conn.Close()
			return nil, fmt.Errorf("%s: %w", Redact(url), err)
		}
	}
	return conn, nil
}

func (c *Conn) set(conn *amqp.Connection) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.conn = conn
	c.blocked = ""
	// A broker under a resource alarm (memory or disk) stops reading from
	// publishing connections and says so with connection.blocked. The
	// watcher starts once conn is current, so it drops no early event;
	// amqp091 only sends to the buffered channel, never into c.mu.
	blocking := conn.NotifyBlocked(make(chan amqp.Blocking, 4))
	go c.watchBlocked(conn, blocking)
	close(c.up)
}

// watchBlocked follows one connection's blocked state until it closes
// (amqp091 closes the channel then).
func (c *Conn) watchBlocked(conn *amqp.Connection, blocking <-chan amqp.Blocking) {
	for b := range blocking {
		reason := ""
		if b.Active {
			reason = b.Reason
			if reason == "" {
				reason = "blocked"
			}
			c.opts.Logger.Warn().Str("connection", c.opts.Name).Str("reason", reason).
				Msg("the broker blocks this connection's publishes (resource alarm)")
		} else {
			c.opts.Logger.Info().Str("connection", c.opts.Name).Msg("the broker unblocked this connection")
		}
		c.mu.Lock()
		if c.conn == conn {
			c.blocked = reason
		}
		c.mu.Unlock()
	}
}

// Blocked returns the broker's reason while it blocks the current
// connection's publishes (a memory or disk alarm), "" otherwise.
func (c *Conn) Blocked() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.blocked
}

func (c *Conn) unset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn != nil {
		c.conn = nil
		c.blocked = ""
		c.up = make(chan struct{})
	}
}

// backoff is the pause before reconnect attempt attempt.
func (c *Conn) backoff(attempt int) time.Duration {
	return Backoff(c.opts.MinBackoff, c.opts.MaxBackoff, attempt)
}

func errString(e *amqp.Error) string {
	if e == nil {
		return "closed"
	}
	return e.Error()
}
