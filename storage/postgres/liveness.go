package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// Liveness (docs/contract.md §7.1). A store opened with Options.Owner
// keeps one connection of its own, outside the pool, whose session holds
// an advisory lock on (livenessClass, the instance's lock_key in
// <schema>.instances) for as long as the store is open. PostgreSQL frees
// that lock the moment the session ends: the process exited or was killed
// (its socket closes), or its host vanished (the session's TCP keepalives,
// below, give up). A process that is stopped or stalled (SIGSTOP, a long
// GC) keeps its session, since its kernel still answers for the socket,
// and so keeps its leases until they expire, as before.
//
// TakeOver, run by every live instance on a short timer, frees the leases
// of every registered instance whose lock no session holds, but only of
// rows visible for at least Options.TakeoverGrace: a lease token the dead
// instance handed over is forwarded at the row's due time by whichever
// dispatcher holds it, under the same lease, and the row is gone by then;
// what is left past the grace lost its token with the instance. Freeing a
// lease that a dispatcher is still forwarding under would forward the row
// twice, so the grace keeps a take-over away from forwards on time.

// ErrNotLive means the store's liveness session is down: Lease refuses
// until it is back, since other instances may take this one's leases
// meanwhile.
var ErrNotLive = errors.New("the liveness session with the database is down")

// DefaultTakeoverGrace is Options.TakeoverGrace's default.
const DefaultTakeoverGrace = time.Second

// livePing is how often the liveness session is checked, and
// livePingTimeout how long a check may take: a session found dead stops
// Lease within livePing + livePingTimeout, well before another instance
// can free a lease (TakeoverGrace after the row's due time, and only once
// it sees the lock free).
const (
	livePing        = 250 * time.Millisecond
	livePingTimeout = 2 * time.Second
)

// liveKeepalive are the session settings of the liveness connection: the
// server gives the session up (and frees the lock) about 25 s after the
// client's host stops answering, instead of the system's default of hours.
// A stopped process's kernel still answers, so a stall is never taken for
// a death.
var liveKeepalive = map[string]string{
	"tcp_keepalives_idle":     "10",
	"tcp_keepalives_interval": "5",
	"tcp_keepalives_count":    "3",
}

// liveness is the store's liveness session.
type liveness struct {
	owner string
	class int32
	cfg   *pgx.ConnConfig
	grace time.Duration

	live atomic.Bool
	mu   sync.Mutex // guards conn and key
	conn *pgx.Conn
	key  int32

	stop chan struct{}
	done chan struct{}
	once sync.Once
}

// startLiveness opens the liveness session and registers the instance; it
// fails Open when it cannot. It then keeps the session until Close.
func (s *Store) startLiveness(ctx context.Context, cfg *pgx.ConnConfig, owner string, grace time.Duration) error {
	if strings.ContainsRune(owner, ':') {
		// ':' ends the owner part of a lock token: such an owner's
		// leases could not be told from another's. They only expire.
		s.log.Warn().Str("owner", owner).Msg("the owner holds ':': no liveness session, so this instance's leases are only freed when they expire")
		return nil
	}
	cfg = cfg.Copy()
	for k, v := range liveKeepalive {
		cfg.RuntimeParams[k] = v
	}
	if app := cfg.RuntimeParams["application_name"]; app != "" {
		cfg.RuntimeParams["application_name"] = app + " liveness"
	}
	l := &liveness{owner: owner, class: livenessClass(s.schema), cfg: cfg, grace: grace,
		stop: make(chan struct{}), done: make(chan struct{})}
	if err := s.register(ctx, l); err != nil {
		return fmt.Errorf("liveness session: %w", err)
	}
	s.live = l
	go s.keepAlive(l)
	return nil
}

// register opens a session, records the instance (or finds its row) and
// takes its lock, in one transaction: another instance sees the row only
// once the lock is held, so it never takes a new instance for a dead one.
// A session-level lock outlives the transaction.
func (s *Store) register(ctx context.Context, l *liveness) error {
	conn, err := pgx.ConnectConfig(ctx, l.cfg)
	if err != nil {
		return err
	}
	var key int32
	var got bool
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, `INSERT INTO `+s.qs+`.instances (owner) VALUES ($1)
ON CONFLICT (owner) DO UPDATE SET since = now() RETURNING lock_key`, l.owner).Scan(&key); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `SELECT pg_try_advisory_lock($1, $2)`, l.class, key).Scan(&got)
	})
	if err == nil && !got {
		err = fmt.Errorf("another session holds the liveness lock of owner %q", l.owner)
	}
	if err != nil {
		closeConn(conn)
		return err
	}
	l.mu.Lock()
	l.conn, l.key = conn, key
	l.mu.Unlock()
	l.live.Store(true)
	return nil
}

// keepAlive checks the session every livePing; when it is lost it marks
// the store not live at once and opens a new one.
func (s *Store) keepAlive(l *liveness) {
	defer close(l.done)
	t := time.NewTicker(livePing)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
		}
		l.mu.Lock()
		conn := l.conn
		l.mu.Unlock()
		if conn != nil {
			ctx, cancel := context.WithTimeout(context.Background(), livePingTimeout)
			err := conn.Ping(ctx)
			cancel()
			if err == nil {
				continue
			}
			l.live.Store(false)
			s.log.Error().Err(err).Msg("the liveness session with the database was lost: leasing stops until it is back (other instances may take this one's leases)")
			l.mu.Lock()
			l.conn = nil
			l.mu.Unlock()
			closeConn(conn)
		}
		ctx, cancel := context.WithTimeout(context.Background(), livePingTimeout)
		err := s.register(ctx, l)
		cancel()
		if err != nil {
			s.log.Debug().Err(err).Msg("reopening the liveness session failed; retrying")
			continue
		}
		s.log.Warn().Msg("liveness session with the database restored; leasing resumes")
	}
}

// closeConn closes a liveness connection without waiting long for a
// server that went silent.
func closeConn(c *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = c.Close(ctx)
}

// Live reports whether the liveness session is up; a store opened without
// an owner is always live.
func (s *Store) Live() bool { return s.live == nil || s.live.live.Load() }

// TakeOver frees the leases of dead instances (see the top of this file)
// and forgets the dead instances that hold none any more; it returns how
// many leases it freed. It does nothing while this store's own liveness
// session is down: this instance may be the one cut off.
func (s *Store) TakeOver(ctx context.Context) (int, error) {
	if !s.Live() {
		return 0, nil
	}
	self, grace := "", DefaultTakeoverGrace
	if s.live != nil {
		self, grace = s.live.owner, s.live.grace
	}
	var freed, forgotten int64
	err := s.run(ctx, "take over", func(ctx context.Context) error {
		// Almost always every registered instance is alive: a cheap look
		// at the instances and the held locks says so, and the take-over
		// statement, whose plans over the timeouts table cost far more
		// (replanned on most calls, as its generic plan's estimate is
		// high), runs only when one is not.
		var dead bool
		if err := s.pool.QueryRow(ctx, s.q.anyDead, self, livenessClass(s.schema)).Scan(&dead); err != nil || !dead {
			return err
		}
		cutoff := ts(s.now().Add(-grace))
		return s.pool.QueryRow(ctx, s.q.takeOver, cutoff, livenessClass(s.schema), self).Scan(&freed, &forgotten)
	})
	if err != nil {
		return 0, err
	}
	if freed > 0 || forgotten > 0 {
		s.log.Info().Int64("freed", freed).Int64("instances_forgotten", forgotten).Msg("took over the leases of instances that stopped")
	}
	return int(freed), nil
}

// heldSQL is the liveness locks held now, in the schema whose
// livenessClass is $2 (pg_locks shows the present, not a snapshot).
const heldSQL = `
	SELECT l.objid FROM pg_locks l
	WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
	AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
	AND l.classid = $2::integer::oid`

// anyDeadSQL tells whether a registered instance other than $1 (this
// one's owner) holds no liveness lock ($2 livenessClass): whether
// TakeOver has anything to do. It reads the instances table (a row an
// instance) and the lock table, nothing else.
const anyDeadSQL = `
SELECT EXISTS (SELECT 1 FROM {{i}} i WHERE i.owner <> $1 AND i.lock_key::oid NOT IN (` + heldSQL + `))`

// takeOverSQL is TakeOver's statement: $1 the latest visible_at a dead
// instance's row may have to be freed, $2 livenessClass, $3 this
// instance's owner (empty for none). held: the liveness locks held now
// (pg_locks shows the present, not a snapshot; it is read once, as reading
// it briefly takes every lock partition of the server). dead: the
// registered instances whose lock no session holds. Their leases are found in timeouts_leased (what is in flight)
// by the owner part of the token (owner:call.n; owners hold no ':').
// An instance is forgotten once it holds no lease; rows freed by this
// statement still count, so that happens on a later call.
const takeOverSQL = `
WITH held AS MATERIALIZED (` + heldSQL + `
), dead AS (
	SELECT i.owner FROM {{i}} i
	WHERE i.owner <> $3 AND NOT EXISTS (SELECT 1 FROM held WHERE held.objid = i.lock_key::oid)
), gone AS (
	SELECT t.id FROM {{t}} t JOIN dead d
		ON starts_with(t.lock_token, d.owner || ':') AND strpos(substr(t.lock_token, length(d.owner) + 2), ':') = 0
	WHERE t.lock_token IS NOT NULL AND t.visible_at <= $1
	FOR UPDATE OF t SKIP LOCKED
), freed AS (
	UPDATE {{t}} t SET lock_token = NULL, lock_expires_at = NULL
	FROM gone WHERE t.id = gone.id
	RETURNING t.id
), forgotten AS (
	DELETE FROM {{i}} i USING dead d
	WHERE i.owner = d.owner AND NOT EXISTS (
		SELECT 1 FROM {{t}} t WHERE t.lock_token IS NOT NULL AND starts_with(t.lock_token, d.owner || ':')
		AND strpos(substr(t.lock_token, length(d.owner) + 2), ':') = 0)
	RETURNING i.owner
)
SELECT (SELECT count(*) FROM freed), (SELECT count(*) FROM forgotten)`

// handBackSQL frees this instance's own leases of rows visible for at
// least the grace ($2 the latest visible_at, $1 the owner prefix), and
// forgets the instance when it then holds no lease ($3 the owner): what a
// graceful stop hands back at once. Leases of rows due later may have
// their tokens in the dispatcher queue, forwarded on time by another
// instance under the lease; freeing them would forward them twice. They
// are taken over once past the grace if still there.
const handBackSQL = `
WITH freed AS (
	UPDATE {{t}} SET lock_token = NULL, lock_expires_at = NULL
	WHERE lock_token IS NOT NULL AND starts_with(lock_token, $1) AND visible_at <= $2
	RETURNING id
), forgotten AS (
	DELETE FROM {{i}} WHERE owner = $3 AND NOT EXISTS (
		SELECT 1 FROM {{t}} WHERE lock_token IS NOT NULL AND starts_with(lock_token, $1) AND visible_at > $2)
)
SELECT count(*) FROM freed`

// stopLiveness hands back what this instance can at once and ends its
// liveness session, which frees its lock: other instances take over what
// is left. Called by Close with the pool still open.
func (s *Store) stopLiveness() {
	l := s.live
	if l == nil {
		return
	}
	l.once.Do(func() { close(l.stop) })
	<-l.done
	ctx, cancel := context.WithTimeout(context.Background(), closeWait)
	defer cancel()
	var n int64
	if err := s.pool.QueryRow(ctx, s.q.handBack, l.owner+":", ts(s.now().Add(-l.grace)), l.owner).Scan(&n); err != nil {
		s.log.Warn().Err(err).Msg("handing back leases on stop failed; other instances take them over")
	} else if n > 0 {
		s.log.Info().Int64("freed", n).Msg("handed back leases on stop")
	}
	l.live.Store(false)
	l.mu.Lock()
	conn := l.conn
	l.conn = nil
	l.mu.Unlock()
	if conn != nil {
		closeConn(conn)
	}
}
