package postgres

import (
	"bytes"
	"crypto/rand"
	"crypto/tls"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/storage/postgres/pgtest"
	"github.com/delaybridge/delaybridge/storage/storetest"
)

// throttle is a TCP proxy to the test database that passes at most rate
// bytes a second each way, and nothing at all while stalled: a slow
// network, then a database gone silent in the middle of a transfer.
type throttle struct {
	ln      net.Listener
	target  string
	rate    int
	stalled atomic.Bool
	up      atomic.Int64 // bytes passed to the database
	down    atomic.Int64 // bytes passed from it
	upAt    atomic.Int64 // clock() when it last passed bytes to the database
	downAt  atomic.Int64 // and from it

	mu     sync.Mutex
	closed bool
	conns  []net.Conn
}

// startThrottle starts a throttle to the test database and returns it with
// the database's URL through it. It is closed when the test ends.
func startThrottle(t *testing.T, rate int) (*throttle, string) {
	t.Helper()
	u, target := dbAddr(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &throttle{ln: ln, target: target, rate: rate}
	go p.serve()
	t.Cleanup(p.close)
	u.Host = ln.Addr().String()
	return p, u.String()
}

// dbAddr returns the test database's URL and its host:port.
func dbAddr(t *testing.T) (*url.URL, string) {
	t.Helper()
	u, err := url.Parse(pgtest.Require(t))
	if err != nil {
		t.Fatal(err)
	}
	host := u.Host
	if !strings.Contains(host, ":") {
		host += ":5432"
	}
	return u, host
}

func (p *throttle) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		db, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, db)
		if p.closed {
			_, _ = c.Close(), db.Close()
		}
		p.mu.Unlock()
		go p.pipe(db, c, &p.up, &p.upAt)
		go p.pipe(c, db, &p.down, &p.downAt)
	}
}

// pipe copies src to dst, a tenth of rate at a time, each followed by a
// tenth of a second's pause, so never faster than rate however long the
// connection idled before; while stalled it holds what it read. It counts
// the bytes it passed in count, and records when in at.
func (p *throttle) pipe(dst, src net.Conn, count, at *atomic.Int64) {
	defer func() { _, _ = dst.Close(), src.Close() }()
	buf := make([]byte, p.rate/10)
	for {
		n, err := src.Read(buf)
		for p.stalled.Load() && !p.isClosed() {
			time.Sleep(10 * time.Millisecond)
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
			count.Add(int64(n))
			at.Store(clock())
			time.Sleep(time.Duration(n) * time.Second / time.Duration(p.rate))
		}
		if err != nil {
			return
		}
	}
}

func (p *throttle) isClosed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed
}

func (p *throttle) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	_ = p.ln.Close()
	for _, c := range p.conns {
		_ = c.Close()
	}
}

// openVia opens a store on url with this CallTimeout; it is closed when
// the test ends, after everything the test started.
func openVia(t *testing.T, url, schema string, callTimeout time.Duration) *Store {
	t.Helper()
	s, err := Open(ctx, url, Options{Schema: schema, CallTimeout: callTimeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// randomTimeout is a timeout with size random (incompressible) message bytes.
func randomTimeout(t *testing.T, id string, size int) storage.Timeout {
	tm := newTimeout(id, time.Now().Add(time.Hour))
	tm.Message = make([]byte, size)
	if _, err := rand.Read(tm.Message); err != nil {
		t.Fatal(err)
	}
	return tm
}

// A large message that keeps moving is not cut off by CallTimeout, however
// long it takes: Insert, Get and GetMany each move 8 MiB through the
// throttle at 2 MiB/s, over twice CallTimeout, and no attempt may be cut
// while its bytes move. Were CallTimeout a deadline on the whole call, as
// it was before quietWatch, each would be cut mid-transfer.
//
// What happens after the last byte is the database's own work (commit the
// insert, read the row before sending it): there the quiet limit is meant
// to end a call whose database stays silent for CallTimeout plus the
// allowance for the bytes (3.5 s here), and a PostgreSQL on a loaded
// machine can take that long, so the verdict does not depend on it. An
// attempt cut in that quiet stretch shows the same thing if its message
// had all passed: it outlasted CallTimeout while moving. One cut before its
// message moved (a read the database was slow to start) shows nothing and
// is tried again. Each call must have an attempt that moved its whole
// message; it is tried until one succeeds, which checks the bytes, or
// attempts times.
func TestMovingCallsOutlastCallTimeout(t *testing.T) {
	const (
		callTimeout = 1500 * time.Millisecond
		size        = 8 << 20
		rate        = 2 << 20 // 4 s for the message, each way
		attempts    = 4
		started     = 1 << 20 // bytes: the message is moving
	)
	p, url := startThrottle(t, rate)
	schema := pgtest.Schema(t)
	s := openVia(t, url, schema, callTimeout)
	// The rows the reads read, stored without the throttle, with time
	// to spare: what is tested is the reads.
	big, small := randomTimeout(t, "big", size), newTimeout("small", time.Now())
	direct := openVia(t, pgtest.Require(t), schema, time.Minute)
	if got, err := direct.Insert(ctx, []storage.Timeout{big, small}); err != nil || got[0] != storage.Stored || got[1] != storage.Stored {
		t.Fatalf("storing the rows to read: %v %v", got, err)
	}
	// moving runs call until an attempt succeeds, or attempts times;
	// moved, at are the throttle's count and time of the message's way.
	moving := func(what string, moved, at *atomic.Int64, call func(attempt int) error) {
		t.Helper()
		outlasted := false
		for attempt := 1; attempt <= attempts; attempt++ {
			from, began := moved.Load(), clock()
			err := call(attempt)
			end := clock()
			n, last := moved.Load()-from, max(at.Load(), began)
			transfer, after := time.Duration(last-began), time.Duration(end-last)
			if err == nil {
				if took := time.Duration(end - began); took < 2*callTimeout {
					t.Fatalf("%s took %s: the throttle did not slow it, the test shows nothing", what, took)
				}
				t.Logf("%s: attempt %d succeeded: %d bytes through the throttle in %s, the call returned %s after the last",
					what, attempt, n, transfer.Round(time.Millisecond), after.Round(time.Millisecond))
				return
			}
			// The bytes tell when the cut came: in the message's transfer,
			// whose connection is never quiet for long, or before it began
			// or after it ended, in the database's own work.
			switch {
			case n >= size:
				if transfer < 2*callTimeout {
					t.Fatalf("%s moved its message in %s: the throttle did not slow it, the test shows nothing", what, transfer)
				}
				outlasted = true
			case n >= started:
				t.Fatalf("%s of an 8 MiB message at 2 MiB/s was cut while its bytes moved: %d of %d bytes had passed: %v", what, n, size, err)
			}
			if !strings.Contains(err.Error(), "no answer within") {
				t.Fatalf("%s of an 8 MiB message at 2 MiB/s: %v", what, err)
			}
			t.Logf("%s: attempt %d was cut after %d bytes had passed, the last %s after the call began and %s before it returned: %v",
				what, attempt, n, transfer.Round(time.Millisecond), after.Round(time.Millisecond), err)
		}
		if !outlasted {
			t.Fatalf("%s: no attempt of %d moved its message before the database went silent: the test shows nothing", what, attempts)
		}
	}
	moving("Insert", &p.up, &p.upAt, func(attempt int) error {
		// Ids of its own per attempt: a cut one may have committed.
		big, small := randomTimeout(t, fmt.Sprintf("big-%d", attempt), size), newTimeout(fmt.Sprintf("small-%d", attempt), time.Now())
		inserted, err := s.Insert(ctx, []storage.Timeout{big, small})
		if err == nil && (inserted[0] != storage.Stored || inserted[1] != storage.Stored) {
			t.Fatalf("inserted = %v", inserted)
		}
		return err
	})
	moving("Get", &p.down, &p.downAt, func(int) error {
		got, err := s.Get(ctx, "big")
		if err == nil && !bytes.Equal(got.Message, big.Message) {
			t.Fatal("Get: the message came back changed")
		}
		return err
	})
	moving("GetMany", &p.down, &p.downAt, func(int) error {
		got, err := s.GetMany(ctx, []string{"big", "small", "missing"})
		if err == nil && (len(got) != 2 || !bytes.Equal(got["big"].Message, big.Message) ||
			!bytes.Equal(got["small"].Message, small.Message)) {
			t.Fatalf("GetMany returned %d rows, messages intact: %v", len(got),
				bytes.Equal(got["big"].Message, big.Message) && bytes.Equal(got["small"].Message, small.Message))
		}
		return err
	})
}

// A database that goes silent in the middle of a large transfer fails the
// call once the connection stayed quiet too long, not at the call's upper
// bound (the cause in the error tells which ended it).
func TestMovingCallsFailWhenTheTransferStops(t *testing.T) {
	const callTimeout = 200 * time.Millisecond
	schema := pgtest.Schema(t)
	big := randomTimeout(t, "big", 8<<20) // upper bound 8.2 s, quiet limit 2.2 s
	storetest.MustInsert(t, openSchema(t, schema, nil), big)
	again := randomTimeout(t, "again", 8<<20)
	for _, tc := range []struct {
		name  string
		call  func(s *Store) error
		moved func(p *throttle) int64
	}{
		{"Insert", func(s *Store) error {
			_, err := s.Insert(ctx, []storage.Timeout{again})
			return err
		}, func(p *throttle) int64 { return p.up.Load() }},
		{"Get", func(s *Store) error { _, err := s.Get(ctx, "big"); return err },
			func(p *throttle) int64 { return p.down.Load() }},
		{"GetMany", func(s *Store) error { _, err := s.GetMany(ctx, []string{"big"}); return err },
			func(p *throttle) int64 { return p.down.Load() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, url := startThrottle(t, 4<<20)
			s := openVia(t, url, schema, callTimeout)
			t.Cleanup(p.close) // before Close: a silent database would hold it up
			failed := make(chan error, 1)
			go func() { failed <- tc.call(s) }()
			from := tc.moved(p)
			testenv.WaitFor(t, 30*time.Second, "1 MiB to pass", func() bool { return tc.moved(p)-from > 1<<20 })
			p.stalled.Store(true)
			select {
			case err := <-failed:
				if err == nil || !strings.Contains(err.Error(), "no answer within") {
					t.Fatalf("%s against a database silent mid-transfer: %v; want no answer", tc.name, err)
				}
				t.Log(err)
			case <-time.After(time.Minute):
				t.Fatalf("%s hangs on a database silent mid-transfer", tc.name)
			}
		})
	}
}

// Over TLS pgx holds a *tls.Conn; the watch finds the connection's byte
// counts under it.
func TestMeteredUnderTLS(t *testing.T) {
	u, _ := dbAddr(t)
	q := u.Query()
	q.Set("sslmode", "require")
	u.RawQuery = q.Encode()
	s, err := Open(ctx, u.String(), Options{Schema: pgtest.Schema(t)})
	if err != nil {
		// Debian's PostgreSQL takes TLS out of the box (snakeoil certificate).
		testenv.Unavailable(t, "the test database does not take TLS: %v", err)
	}
	defer s.Close()
	c, err := s.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	if _, ok := c.Conn().PgConn().Conn().(*tls.Conn); !ok {
		t.Fatalf("sslmode=require, yet pgx holds a %T", c.Conn().PgConn().Conn())
	}
	m := metered(c)
	if m == nil {
		t.Fatal("no meteredConn found under the *tls.Conn")
	}
	before := m.moved.Load()
	if _, err := c.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	if m.moved.Load() == before {
		t.Fatal("a statement moved no bytes on the meteredConn")
	}
}
