package broker

import (
	"context"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// While Conn backs off between reconnect attempts it watches the TCP ports
// of the brokers that were down, so that it reconnects as soon as one is
// back rather than at the end of a pause of up to MaxBackoff
// (docs/contract.md §3.5 "Reconnecting"). A probe is a TCP connect and
// close, no AMQP: the broker sees no handshake and no login (RabbitMQ logs
// nothing for a connection closed before the AMQP header).
const (
	// defaultProbeInterval is the pause between probes of one port.
	defaultProbeInterval = 250 * time.Millisecond
	// probeTimeout bounds one probe: a host that does not answer at all
	// (a dropped packet, not a refusal) counts as down.
	probeTimeout = time.Second
)

// probeAddr is the host:port that rawURL connects to, "" when it does not
// parse (the dial then reports why).
func probeAddr(rawURL string) string {
	u, err := amqp.ParseURI(rawURL)
	if err != nil || u.Host == "" || u.Port == 0 {
		return ""
	}
	return net.JoinHostPort(u.Host, strconv.Itoa(u.Port))
}

// pause waits d before the next reconnect attempt and reports whether ctx
// is still alive. It returns early when a broker port that was closed
// accepts a connection again. closed holds the ports that refused the last
// attempt; only those are watched, so a broker that accepts the connection
// and then refuses the bridge (credentials, a failed declaration) sees one
// attempt per backoff and no probe. closed nil (no attempt yet since the
// connection was lost): every port is watched, and one found open before it
// was found closed is not probed again.
func (c *Conn) pause(ctx context.Context, d time.Duration, closed map[string]bool) bool {
	every := c.opts.ProbeInterval
	var watch []string
	for _, addr := range c.addrs {
		if closed == nil || closed[addr] {
			watch = append(watch, addr)
		}
	}
	if every < 0 || d <= every || len(watch) == 0 {
		return Sleep(ctx, d)
	}
	pctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	back := make(chan string, len(watch))
	var wg sync.WaitGroup
	for _, addr := range watch {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if watchPort(pctx, addr, closed[addr], every) {
				back <- addr
			}
		}()
	}
	defer wg.Wait() // after cancel: no probe outlives the pause
	select {
	case <-pctx.Done():
		return ctx.Err() == nil
	case addr := <-back:
		c.opts.Logger.Info().Str("connection", c.opts.Name).Str("address", addr).
			Msg("a broker accepts connections again; reconnecting without waiting for the backoff")
		return true
	}
}

// watchPort probes addr every interval until ctx ends. It reports true when
// addr accepts a connection after being seen closed (wasClosed, or a failed
// probe), false when ctx ended or addr accepted one without that.
func watchPort(ctx context.Context, addr string, wasClosed bool, every time.Duration) bool {
	dialer := net.Dialer{Timeout: probeTimeout}
	// The first probe comes after a random part of the interval: bridges
	// that lost the broker at the same moment do not probe, and come back,
	// in step.
	wait := time.Duration(rand.Int64N(int64(every))) + 1
	for {
		if !Sleep(ctx, wait) {
			return false
		}
		wait = every
		conn, err := dialer.DialContext(ctx, "tcp", addr)
		if err != nil {
			if ctx.Err() != nil {
				return false
			}
			wasClosed = true
			continue
		}
		_ = conn.Close()
		return wasClosed
	}
}
