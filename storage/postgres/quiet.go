package postgres

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// The calls that move message bytes (Insert, Get, GetMany) cannot have a
// flat time limit: a large message takes as long as the wire and both
// machines need, and on a loaded machine healthy inserts and reads of
// 30 MiB messages ran out of theirs. CallTimeout is there to catch a
// database that does not answer, so these calls fail when their connection
// stays quiet too long, however long they take as a whole (see
// quietWatch). To tell, every connection of the pool is a meteredConn.

// epoch is the origin of clock.
var epoch = time.Now()

// clock is monotonic time in ns since epoch.
func clock() int64 { return int64(time.Since(epoch)) }

// meteredConn is a connection to the database that records when it last
// moved a byte, either way, and how many it moved.
type meteredConn struct {
	net.Conn
	last  atomic.Int64 // clock() after the last Read or Write that moved bytes
	moved atomic.Int64
}

// writeChunk is the most one Write passes down at once: a net.Conn returns
// from a Write only when all of it went out, so a statement of 60 MiB
// written in one piece would look quiet until it was sent.
const writeChunk = 64 << 10

func (c *meteredConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.record(n)
	return n, err
}

func (c *meteredConn) Write(b []byte) (int, error) {
	done := 0
	for done < len(b) {
		n, err := c.Conn.Write(b[done:min(len(b), done+writeChunk)])
		done += n
		c.record(n)
		if err != nil {
			return done, err
		}
	}
	return done, nil
}

func (c *meteredConn) record(n int) {
	if n > 0 {
		c.moved.Add(int64(n))
		c.last.Store(clock())
	}
}

// metered finds the meteredConn under a pool connection: pgx holds the
// dialled connection itself, or a *tls.Conn over it. Nil if neither (a
// later pgx might wrap it otherwise); the call then runs as if its
// connection never moved a byte: it has its whole quiet limit, no more.
func metered(c *pgxpool.Conn) *meteredConn {
	nc := c.Conn().PgConn().Conn()
	for range 4 {
		switch v := nc.(type) {
		case *meteredConn:
			return v
		case interface{ NetConn() net.Conn }: // *tls.Conn
			nc = v.NetConn()
		default:
			return nil
		}
	}
	return nil
}

// timeLimit is the cause of an attempt ended by one of the store's time
// limits. errors.Is finds context.DeadlineExceeded in it, as in the plain
// deadline it stands for.
type timeLimit struct{ msg string }

func (e timeLimit) Error() string      { return e.msg }
func (timeLimit) Is(target error) bool { return target == context.DeadlineExceeded }

func noAnswer(d time.Duration) timeLimit { return timeLimit{fmt.Sprintf("no answer within %s", d)} }

// Both sides of a call that moves message bytes also work without moving
// any: pgx encodes a statement's parameters before it writes them, the
// server takes a large statement in before it answers, and it reads and
// decompresses a large value before it sends it. Each such quiet stretch
// grows with the bytes of the call, so the quiet limit of a call grows by
// one second per thinkRate bytes it is known to handle. Measured with
// 30 MiB messages on a loaded 2-core machine under -race: 20 MiB/s at the
// slowest stretch.
const thinkRate = 4 << 20 // bytes per second

// minRate bounds a call moving message bytes as a whole: it fails once it
// took longer than CallTimeout plus one second per minRate bytes it moved
// or is known to handle, so that a database that trickles bytes, never
// quiet for long, still fails calls. Far below a loaded machine's pace
// (13 MiB/s for the 90 MiB batch above), so that it never ends a transfer
// that is merely slow.
const minRate = 1 << 20 // bytes per second

// quietWatch ends one attempt of a call that moves message bytes by
// cancelling its context: once its connection has moved no byte for the
// quiet limit (CallTimeout, plus the allowance for the bytes expected;
// before it has a connection: once it waited that long for one), or once
// it took longer than minRate allows.
type quietWatch struct {
	ctx     context.Context
	cancel  context.CancelCauseFunc
	timeout int64 // CallTimeout, ns
	began   int64 // clock() at the attempt's start
	timer   *time.Timer

	conn     atomic.Pointer[meteredConn]
	since    atomic.Int64 // clock() when conn was attached
	base     atomic.Int64 // conn.moved then
	expected atomic.Int64 // bytes the call is known to handle
}

// watchQuiet starts the watch of one attempt, whose context it returns.
// Call stop when the attempt ends.
func watchQuiet(ctx context.Context, timeout time.Duration) (context.Context, *quietWatch) {
	w := &quietWatch{timeout: int64(timeout), began: clock()}
	w.ctx, w.cancel = context.WithCancelCause(ctx)
	w.timer = time.AfterFunc(timeout, w.check)
	return w.ctx, w
}

// attach watches the connection the attempt runs on from now on.
func (w *quietWatch) attach(c *pgxpool.Conn) {
	if m := metered(c); m != nil {
		w.base.Store(m.moved.Load())
		w.since.Store(clock())
		w.conn.Store(m)
	}
}

// expect adds n to the bytes the call is known to handle.
func (w *quietWatch) expect(n int64) { w.expected.Add(n) }

func (w *quietWatch) stop() {
	w.timer.Stop()
	w.cancel(nil)
}

// check runs when a limit may have passed: it ends the attempt, or looks
// again when the nearer limit will have passed.
func (w *quietWatch) check() {
	if w.ctx.Err() != nil {
		return // stopped
	}
	now, from, moved := clock(), w.began, int64(0)
	if c := w.conn.Load(); c != nil {
		from = max(w.since.Load(), c.last.Load())
		moved = c.moved.Load() - w.base.Load()
	}
	expected := w.expected.Load()
	quiet := w.timeout + expected*int64(time.Second/thinkRate)
	most := w.timeout + max(expected, moved)*int64(time.Second/minRate)
	switch {
	case now-from >= quiet:
		w.cancel(noAnswer(time.Duration(quiet)))
	case now-w.began >= most:
		w.cancel(timeLimit{fmt.Sprintf("not done within %s (%d bytes moved)", time.Duration(most), moved)})
	default:
		w.timer.Reset(time.Duration(min(from+quiet, w.began+most) - now))
	}
}
