// Package postgres is the shared storage.Store on PostgreSQL
// (DELAYBRIDGE_STORE=postgres): any number of bridge instances may use one
// schema at once.
//
// The table and its indexes are described with the migrations in schema.go.
// In short: every pending timeout is one row of <schema>.timeouts; a row
// waiting to be leased is in the partial index timeouts_unpaused_ready
// (rows of a paused destination are left out), ordered by visible_at
// = greatest(due_at, not_before); a leased row is in the partial
// index timeouts_leased, ordered by lock_expires_at. Lease and NextDue read
// the head of those two indexes and never scan the pending rows.
//
// Rules shared by all instances:
//
//   - Every time comparison uses the store's clock (Options.Now), passed as a
//     query parameter, never the server's now(): instances and tests agree on
//     one rule, and a test can move time. Times are truncated to whole
//     microseconds (timestamptz precision) before they are sent, and come back
//     in UTC.
//   - Lease picks rows with SELECT ... FOR UPDATE SKIP LOCKED and leases them
//     in the same statement, so two callers never get one row, and callers
//     never wait on each other's rows.
//   - Every statement that checks a lock reads the row under FOR UPDATE in the
//     same statement as the change it makes, so the check and the change see
//     the same row version.
//   - Open does not free leases: other live instances may hold them. Expired
//     leases are taken over by Lease directly and freed by Reap, which the
//     bridge calls on a timer; the leases of an instance that is gone are
//     freed sooner by TakeOver (liveness.go).
//   - Writers lock rows in id order (Insert inserts in id order, Remove locks
//     in id order), so concurrent batches with overlapping ids do not
//     deadlock; should PostgreSQL still report a deadlock or serialization
//     failure, the statement (always a whole transaction) is retried.
//   - A Cancel and an Insert are ordered by an advisory lock per schema
//     (Insert shared, Cancel exclusive), so a cancel tombstone is never
//     missed by an insert committing at the same time.
package postgres

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/wire"
)

// DefaultSchema is the schema used when Options.Schema is empty.
const DefaultSchema = "delaybridge"

// DefaultCallTimeout is Options.CallTimeout's default: well under the
// bridge's 30 s breaker times, far above any healthy statement.
const DefaultCallTimeout = 10 * time.Second

// DefaultConnectTimeout is Options.ConnectTimeout's default.
const DefaultConnectTimeout = 30 * time.Second

// Options configure Open.
type Options struct {
	// Now is the store's clock; nil means time.Now. All time comparisons use
	// it (see the package comment).
	Now func() time.Time
	// Schema is the PostgreSQL schema holding the tables; "" means
	// DefaultSchema. It is created if missing.
	Schema string
	// MaxConns is the size of the connection pool. Zero keeps pgxpool's
	// choice: pool_max_conns from the URL if given, else the greater of 4 and
	// the number of CPUs. Every store call holds one connection for one
	// statement, so a handful is plenty for one bridge.
	MaxConns int32
	// Logger receives migration and retry messages; the zero value logs
	// nothing.
	Logger zerolog.Logger
	// CallTimeout is how long a store call waits for the database to
	// answer; zero means DefaultCallTimeout. A database that stops
	// answering without closing the connection (a failover to an address
	// that drops packets) then fails calls, which the bridge's breakers
	// count, instead of hanging them until TCP gives up many minutes later.
	// It bounds each attempt of a call as a whole, except for the calls
	// that move message bytes (Insert, Get, GetMany): an attempt of those
	// fails when its connection moves no byte for CallTimeout plus a second
	// per 4 MiB of messages it handles (the time either end works on them
	// without sending), or when it takes longer than CallTimeout plus a
	// second per MiB, so that a large message that keeps moving is not cut
	// off. See quietWatch.
	CallTimeout time.Duration
	// ApplicationName is shown in pg_stat_activity when the URL sets no
	// application_name.
	ApplicationName string
	// Endpoint, when set, claims the schema for this bridge endpoint on
	// first use; Open then fails with ErrOtherEndpoint for any other one.
	Endpoint string
	// CancelWindow is how long a Cancel that was not too late keeps its id
	// cancelled; zero or negative means storage.DefaultCancelWindow.
	CancelWindow time.Duration
	// ConnectTimeout bounds Open's connecting and its claim of the schema;
	// zero means DefaultConnectTimeout. The schema's migration is bounded
	// only by Open's context: it takes what the database needs (building
	// an index over 10 million rows took about 10 s on the test machine,
	// and waiting for another instance's migration takes as long as that
	// one), and a limit cut short would roll the migration back at every
	// start, so that the schema could never be upgraded. It logs every
	// 10 s that it is still running instead.
	ConnectTimeout time.Duration
	// Owner, when set, is the lock owner of this instance's poller: Open
	// registers it and keeps a liveness session for it (liveness.go), so
	// that other instances take over its leases as soon as it is gone.
	// Empty (the CLI, tests): no session; the store's leases only expire.
	// It must not hold ':'.
	Owner string
	// TakeoverGrace is how long after a row became visible a dead
	// instance's lease on it is left alone by TakeOver (liveness.go); zero
	// or negative means DefaultTakeoverGrace.
	TakeoverGrace time.Duration
}

// Store is a storage.Store on PostgreSQL. It is safe for concurrent use, by
// several goroutines and several processes.
type Store struct {
	gate storage.Gate

	pool        *pgxpool.Pool
	callTimeout time.Duration
	now         func() time.Time
	log         zerolog.Logger
	schema      string // as given
	qs          string // quoted, for SQL
	q           queries
	window      time.Duration // cancel window
	cancelKey   int64         // see cancelLockKey
	live        *liveness     // nil without Options.Owner

	stats statsCache

	// testLeaseAnswerLost, set by tests, makes a Lease attempt fail after
	// its statement committed, as a connection lost before the answer.
	testLeaseAnswerLost func(attempt int) error
}

var _ storage.Store = (*Store)(nil)

// Open connects to the database at url (a PostgreSQL URL or key=value
// connection string), checks that it answers, and creates or migrates the
// schema (see schema.go). It does not touch existing leases. ctx bounds
// the whole of Open, Options.ConnectTimeout all but the migration.
func Open(ctx context.Context, url string, opts Options) (*Store, error) {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	schema := opts.Schema
	if schema == "" {
		schema = DefaultSchema
	}
	if len(schema) > 63 || strings.ContainsRune(schema, 0) {
		return nil, fmt.Errorf("postgres: schema name %q: must be 1 to 63 bytes without NUL", schema)
	}
	if opts.CallTimeout <= 0 {
		opts.CallTimeout = DefaultCallTimeout
	}
	if opts.CancelWindow <= 0 {
		opts.CancelWindow = storage.DefaultCancelWindow
	}
	if opts.ConnectTimeout <= 0 {
		opts.ConnectTimeout = DefaultConnectTimeout
	}
	if opts.MaxConns < 0 {
		return nil, fmt.Errorf("postgres: MaxConns must not be negative, got %d", opts.MaxConns)
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("postgres: connect: %w", err)
	}
	if opts.MaxConns > 0 {
		cfg.MaxConns = opts.MaxConns
	}
	if _, set := cfg.ConnConfig.RuntimeParams["application_name"]; !set && opts.ApplicationName != "" {
		cfg.ConnConfig.RuntimeParams["application_name"] = opts.ApplicationName
	}
	// JIT compilation off for the store's sessions, unless the URL sets
	// it: every statement here is short, and a plan whose estimate passes
	// jit_above_cost (the take-over statement's, with the instances table
	// not yet analysed, estimated near a million) compiled each run for
	// about 0.4 s of server CPU; every 500 ms on every instance, that was
	// most of the database's CPU during ingest (docs/performance.md,
	// "Scale-out with one, two and three instances").
	if _, set := cfg.ConnConfig.RuntimeParams["jit"]; !set {
		cfg.ConnConfig.RuntimeParams["jit"] = "off"
	}
	dial := cfg.ConnConfig.DialFunc
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &meteredConn{Conn: c}, nil // see runMoving
	}
	where := fmt.Sprintf("%s:%d/%s", cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Database)
	cctx, cancel := context.WithTimeout(ctx, opts.ConnectTimeout)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(cctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres: connect: %s: %w", where, err)
	}
	if err := pool.Ping(cctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("postgres: connect: %s: %w", where, err)
	}
	s := &Store{
		pool:        pool,
		callTimeout: opts.CallTimeout,
		now:         opts.Now,
		log:         opts.Logger,
		schema:      schema,
		qs:          quoteIdent(schema),
		window:      opts.CancelWindow,
		cancelKey:   cancelLockKey(schema),
	}
	s.q = newQueries(s.qs)
	if err := s.migrate(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("postgres: migrate: %s schema %q: %w", where, schema, err)
	}
	if opts.Endpoint != "" {
		cctx, cancel := context.WithTimeout(ctx, opts.ConnectTimeout)
		defer cancel()
		if err := s.claimEndpoint(cctx, opts.Endpoint); err != nil {
			pool.Close()
			return nil, fmt.Errorf("postgres: %s: %w", where, err)
		}
	}
	if opts.Owner != "" {
		if opts.TakeoverGrace <= 0 {
			opts.TakeoverGrace = DefaultTakeoverGrace
		}
		cctx, cancel := context.WithTimeout(ctx, opts.ConnectTimeout)
		defer cancel()
		if err := s.startLiveness(cctx, cfg.ConnConfig, opts.Owner, opts.TakeoverGrace); err != nil {
			pool.Close()
			return nil, fmt.Errorf("postgres: %s: %w", where, err)
		}
	}
	s.log.Debug().Str("db", where).Str("schema", schema).Int32("max_conns", cfg.MaxConns).Msg("postgres store open")
	return s, nil
}

// Schema is the schema the store works in.
func (s *Store) Schema() string { return s.schema }

// Properties: several instances share the database.
func (s *Store) Properties() storage.Properties { return storage.Properties{Shared: true} }

// Close closes the connection pool. It waits for calls in flight; later
// calls return storage.ErrClosed. Closing twice is not an error.
func (s *Store) Close() error {
	return s.gate.Close(func() error {
		s.stopLiveness()
		// pgx says goodbye to the server on each connection and waits for
		// it to hang up, up to 15 s each when the server has gone silent:
		// do not hold up the bridge's exit that long.
		done := make(chan struct{})
		go func() {
			s.pool.Close()
			close(done)
		}()
		select {
		case <-done:
			return nil
		case <-time.After(closeWait):
			return fmt.Errorf("postgres: close: the database did not answer within %s; connections are dropped", closeWait)
		}
	})
}

// cancelLockWait bounds a cancel's wait for the exclusive cancel lock.
const cancelLockWait = "250ms"

// closeWait bounds Close.
const closeWait = 3 * time.Second

// maxAttempts bounds the attempts of a statement failing retryably.
const maxAttempts = 3

// run runs fn, a call of the store named op, unless the store is closed or
// ctx is done; it retries fn on deadlock and serialization failures (each fn
// is a whole transaction, rolled back when it fails) and wraps its error.
// Each attempt has CallTimeout.
func (s *Store) run(ctx context.Context, op string, fn func(ctx context.Context) error) error {
	return s.retry(ctx, op, func(ctx context.Context) (context.Context, func()) {
		ctx, cancel := context.WithTimeoutCause(ctx, s.callTimeout, noAnswer(s.callTimeout))
		return ctx, cancel
	}, fn)
}

// runMoving is run for a call that moves message bytes, on a connection
// it holds for the attempt. The attempt fails when that connection stays
// quiet for CallTimeout (more when the call expects many bytes), not when
// the call takes longer; see quietWatch. Getting the connection has
// CallTimeout. fn tells expect how many message bytes it handles.
func (s *Store) runMoving(ctx context.Context, op string, fn func(ctx context.Context, c *pgxpool.Conn, expect func(bytes int64)) error) error {
	var w *quietWatch // of the attempt under way
	return s.retry(ctx, op, func(ctx context.Context) (context.Context, func()) {
		ctx, w = watchQuiet(ctx, s.callTimeout)
		return ctx, w.stop
	}, func(ctx context.Context) error {
		c, err := s.pool.Acquire(ctx)
		if err != nil {
			return err
		}
		defer c.Release()
		w.attach(c)
		return fn(ctx, c, w.expect)
	})
}

// retry runs the attempts of run and runMoving, each under the context
// limit makes of ctx.
func (s *Store) retry(ctx context.Context, op string, limit func(context.Context) (context.Context, func()), fn func(ctx context.Context) error) error {
	exit, err := s.gate.Enter(ctx)
	if err != nil {
		return fmt.Errorf("postgres: %s: %w", op, err)
	}
	defer exit()
	for attempt := 1; ; attempt++ {
		cctx, cancel := limit(ctx)
		err = fn(cctx)
		timedOut := err != nil && cctx.Err() != nil && ctx.Err() == nil
		if timedOut {
			if cause := context.Cause(cctx); errors.Is(err, context.Canceled) {
				err = cause // a quietWatch's doing, not the caller's
			} else {
				err = fmt.Errorf("%w: %w", cause, err)
			}
		}
		cancel()
		if err == nil {
			return nil
		}
		if attempt == maxAttempts || timedOut || !retryable(err) || ctx.Err() != nil {
			break
		}
		s.log.Debug().Err(err).Str("op", op).Int("attempt", attempt).Msg("retrying a store statement")
		select {
		case <-ctx.Done():
		case <-time.After(time.Duration(attempt) * 50 * time.Millisecond):
		}
	}
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		// The driver may report a cancelled statement as a server error
		// (57014): keep ctx.Err() visible to errors.Is as well.
		return fmt.Errorf("postgres: %s: %w: %w", op, cerr, err)
	}
	return fmt.Errorf("postgres: %s: %w", op, err)
}

// noReconnectRetry marks an error of a statement that must not be repeated
// after a lost connection (it is not idempotent); deadlocks and
// serialization failures, which roll back for sure, are still retried.
type noReconnectRetry struct{ err error }

func (e noReconnectRetry) Error() string { return e.err.Error() }
func (e noReconnectRetry) Unwrap() error { return e.err }

// retryable tells the failures worth another attempt on another
// connection: deadlocks and serialization failures, and a connection lost
// under the statement (a terminated backend, a failover, a reset). Each
// store call is one transaction and safe to repeat: a repeated Insert finds
// its rows there (reported as not inserted, which ingest acks as stored), or
// a cancelled row's tombstone, or stores again a row delivered meanwhile (a
// duplicate, docs/contract.md §3.3); a repeated Remove or Release finds the
// lock gone (a conflict, never a second delivery), a repeated Lease leaves
// the first lease to expire. A call that timed out is not repeated: the
// database is not answering.
func retryable(err error) bool {
	var pgErr *pgconn.PgError
	var once noReconnectRetry
	if errors.As(err, &once) {
		return errors.As(err, &pgErr) && (pgErr.Code == "40P01" || pgErr.Code == "40001")
	}
	if errors.As(err, &pgErr) {
		switch {
		case pgErr.Code == "40P01", pgErr.Code == "40001": // deadlock, serialization
			return true
		case pgErr.Code == "55P03": // lock_not_available: a cancel's lock_timeout
			return true
		case strings.HasPrefix(pgErr.Code, "08"): // connection exception
			return true
		case pgErr.Code == "57P01", pgErr.Code == "57P02", pgErr.Code == "57P03": // shutdown, crash, starting up
			return true
		}
		return false
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return false
	}
	var netErr net.Error
	return pgconn.SafeToRetry(err) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		(errors.As(err, &netErr) && !netErr.Timeout())
}

// ts converts a time for a timestamptz parameter: whole microseconds,
// rounded down (what the column would keep anyway, made explicit so that
// comparisons in SQL and in Go agree).
func ts(t time.Time) time.Time { return t.Truncate(time.Microsecond) }

// tsUp converts a time a row must not be leased before (a due time or a
// retry hold) to whole microseconds, rounded UP: rounding down would make a
// row due at T+900ns leasable, and forwarded, at T.
func tsUp(t time.Time) time.Time {
	if d := t.Truncate(time.Microsecond); !d.Equal(t) {
		return d.Add(time.Microsecond)
	}
	return t
}

// nullTS is t as a nullable timestamptz parameter: the zero time is NULL.
func nullTS(t time.Time) pgtype.Timestamptz {
	if t.IsZero() {
		return pgtype.Timestamptz{}
	}
	return pgtype.Timestamptz{Time: ts(t), Valid: true}
}

// nullTSUp is nullTS rounding up, like tsUp.
func nullTSUp(t time.Time) pgtype.Timestamptz {
	if t.IsZero() {
		return pgtype.Timestamptz{}
	}
	return pgtype.Timestamptz{Time: tsUp(t), Valid: true}
}

// fromTS is a nullable timestamptz read back: NULL is the zero time.
func fromTS(v pgtype.Timestamptz) time.Time {
	if !v.Valid {
		return time.Time{}
	}
	return v.Time.UTC()
}

// Insert stores the timeouts in one transaction; see storage.Store. Lock
// and LockExpiresAt of the input are ignored: a new row is never leased.
func (s *Store) Insert(ctx context.Context, in []storage.Timeout) ([]storage.Outcome, error) {
	if err := storage.CheckInsert(in); err != nil {
		return nil, fmt.Errorf("postgres: insert: %w", err)
	}
	outcomes, keys := make([]storage.Outcome, len(in)), make([]string, len(in))
	bytes := messageBytes(in)
	err := s.runMoving(ctx, "insert", func(ctx context.Context, c *pgxpool.Conn, expect func(int64)) error {
		clear(outcomes)
		if len(in) == 0 {
			return nil
		}
		expect(bytes)
		now := ts(s.now())
		count, rest, err := s.insertFirst(ctx, c, in, outcomes, keys, now)
		s.stats.addPending(count) // committed, whatever follows
		if err != nil || len(rest) == 0 {
			return err
		}
		// Rows whose id is pending already, or repeated in the call (a
		// redelivery, another send of the id): placed in a transaction of
		// their own, under the shared cancel lock, after the first
		// commit, whose rows they see.
		tx, err := c.Begin(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock_shared($1)`, s.cancelKey); err != nil {
			return err
		}
		n, err := s.placeAll(ctx, tx, in, rest, keys, outcomes, now)
		if err != nil {
			return err
		}
		if err := tx.Commit(ctx); err != nil {
			return err
		}
		s.stats.addPending(n)
		return nil
	})
	if err != nil {
		return nil, err
	}
	setKeys(in, outcomes, keys)
	return outcomes, nil
}

func messageBytes(in []storage.Timeout) int64 {
	var n int64
	for i := range in {
		n += int64(len(in[i].Message))
	}
	return n
}

// placeRounds bounds the rounds of insertRows' second step: a round is
// lost only to another instance storing a send of the same id between
// this one's read and its insert.
const placeRounds = 5

// insertFirst stores the first row of each id of in that nothing of its id
// holds a key of (the common case, see the insertNew statement) in ONE
// round trip: the shared cancel lock and the insert statements go as one
// pipeline, which PostgreSQL runs as one implicit transaction, committed
// at its end. The lock is taken by a statement of its own so that the
// inserts' snapshots follow it: a Cancel that records a tombstone holds
// the lock exclusively, so either it committed first and the inserts see
// its tombstone, or it waits for this commit and then finds the rows (see
// Cancel). The lock is shared: inserts never wait for each other. When
// another instance stored one of the ids meanwhile (unique_violation),
// nothing was committed and the pipeline runs again with the insert
// statement, which skips what is there. It returns how many rows it
// stored and the rows left for placeAll, in call order.
func (s *Store) insertFirst(ctx context.Context, c *pgxpool.Conn, in []storage.Timeout, outcomes []storage.Outcome, keys []string, now time.Time) (count int, rest []int, err error) {
	clear(outcomes)
	clear(keys)
	first, rest := splitFirst(in, keys)
	chunks := chunkKeyed(in, keys, first)
	count, err = s.insertPipeline(ctx, c, s.q.insertNew, in, keys, chunks, outcomes, now)
	if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == "23505" { // unique_violation
		count, err = s.insertPipeline(ctx, c, s.q.insert, in, keys, chunks, outcomes, now)
	}
	if err != nil {
		return 0, nil, err
	}
	for _, i := range first {
		if outcomes[i] == 0 {
			rest = append(rest, i)
		}
	}
	slices.Sort(rest) // the call's order: a later row may repeat an earlier one
	return count, rest, nil
}

// insertPipeline sends the shared cancel lock and one statement stmt per
// chunk as one pipeline (see insertFirst), marks the rows stored and
// returns how many. On an error nothing is marked.
func (s *Store) insertPipeline(ctx context.Context, c *pgxpool.Conn, stmt string, in []storage.Timeout, keys []string, chunks [][]int, outcomes []storage.Outcome, now time.Time) (count int, err error) {
	b := &pgx.Batch{}
	b.Queue(`SELECT pg_advisory_xact_lock_shared($1)`, s.cancelKey)
	byKeys := make([]map[string]int, len(chunks))
	for i, chunk := range chunks {
		var args []any
		args, byKeys[i] = insertArgs(in, keys, chunk, now)
		b.Queue(stmt, args...)
	}
	err = func() (err error) {
		br := c.SendBatch(ctx, b)
		defer func() {
			if cerr := br.Close(); err == nil {
				err = cerr
			}
		}()
		if _, err := br.Exec(); err != nil {
			return err
		}
		for i := range chunks {
			rows, err := br.Query()
			if err != nil {
				return err
			}
			n, err := scanStored(rows, byKeys[i], outcomes)
			if err != nil {
				return err
			}
			count += n
		}
		return nil
	}()
	if err != nil {
		clear(outcomes)
		return 0, err
	}
	return count, nil
}

// splitFirst splits the rows of in into the first of each id, whose key
// it sets to the id, and the others.
func splitFirst(in []storage.Timeout, keys []string) (first, rest []int) {
	seen := make(map[string]bool, len(in))
	for i := range in {
		if seen[in[i].ID] {
			rest = append(rest, i)
			continue
		}
		seen[in[i].ID] = true
		first = append(first, i)
		keys[i] = in[i].ID
	}
	return first, rest
}

// insertRows inserts in within tx, whose caller holds the cancel lock,
// sets the outcome of each, and returns how many it stored. First, one
// statement stores the first row of each id that nothing of its id holds
// a key of (the common case). The others are placed as storage.PlaceSend
// says, from their ids' tombstones and pending sends read in one round
// trip, earlier rows of the call included, and stored under the keys it
// chose with ON CONFLICT DO NOTHING; a key that another instance took
// meanwhile sends its row round again.
func (s *Store) insertRows(ctx context.Context, tx pgx.Tx, in []storage.Timeout, outcomes []storage.Outcome, keys []string, now time.Time) (int, error) {
	clear(outcomes)
	clear(keys)
	first, rest := splitFirst(in, keys)
	count, err := s.insertKeyed(ctx, tx, s.q.insert, in, keys, first, outcomes, now)
	if err != nil {
		return 0, err
	}
	for _, i := range first {
		if outcomes[i] == 0 {
			rest = append(rest, i)
		}
	}
	slices.Sort(rest) // the call's order: a later row may repeat an earlier one
	n, err := s.placeAll(ctx, tx, in, rest, keys, outcomes, now)
	return count + n, err
}

// placeAll places rows rest of in (in call order) within tx, whose caller
// holds the cancel lock, in rounds of place, and returns how many it
// stored.
func (s *Store) placeAll(ctx context.Context, tx pgx.Tx, in []storage.Timeout, rest []int, keys []string, outcomes []storage.Outcome, now time.Time) (int, error) {
	count := 0
	for round := 0; len(rest) > 0; round++ {
		if round == placeRounds {
			return 0, fmt.Errorf("insert: %d rows found their keys taken by concurrent inserts %d times", len(rest), placeRounds)
		}
		n, left, err := s.place(ctx, tx, in, rest, keys, outcomes, now)
		if err != nil {
			return 0, err
		}
		count += n
		rest = left
	}
	return count, nil
}

// place decides the outcome of rows rest of in (in order), stores those to
// be stored, and returns how many it stored and the rows whose key another
// insert took meanwhile.
func (s *Store) place(ctx context.Context, tx pgx.Tx, in []storage.Timeout, rest []int, keys []string, outcomes []storage.Outcome, now time.Time) (int, []int, error) {
	ids := make([]string, 0, len(rest))
	for _, i := range rest {
		if !slices.Contains(ids, in[i].ID) {
			ids = append(ids, in[i].ID)
		}
	}
	b := &pgx.Batch{}
	b.Queue(s.q.tombstoned, ids, now)
	b.Queue(s.q.family, ids, now)
	dead := make(map[string]bool)
	pending := make(map[string][]storage.PendingSend)
	err := sendBatch(ctx, tx, b, func(br pgx.BatchResults) error {
		if err := readTombstoned(br, dead); err != nil {
			return err
		}
		rows, err := br.Query()
		if err != nil {
			return err
		}
		var id string
		var p storage.PendingSend
		_, err = pgx.ForEachRow(rows, []any{&id, &p.Key, &p.Fingerprint, &p.Leased}, func() error {
			pending[id] = append(pending[id], p)
			p = storage.PendingSend{}
			return nil
		})
		return err
	})
	if err != nil {
		return 0, nil, err
	}
	var store []int
	for _, i := range rest {
		id := in[i].ID
		if dead[id] {
			outcomes[i] = storage.Cancelled
			continue
		}
		key, o := storage.PlaceSend(id, in[i].Fingerprint, pending[id])
		outcomes[i] = o
		if o != storage.Stored {
			continue
		}
		keys[i] = key
		// Later rows of the call see this one as pending.
		pending[id] = append(pending[id], storage.PendingSend{Key: key, Fingerprint: in[i].Fingerprint})
		store = append(store, i)
	}
	for _, i := range store {
		outcomes[i] = 0 // until its insert says
	}
	n, err := s.insertKeyed(ctx, tx, s.q.insertAt, in, keys, store, outcomes, now)
	if err != nil {
		return 0, nil, err
	}
	var left []int
	for _, i := range store {
		if outcomes[i] == 0 {
			left = append(left, i)
		}
	}
	return n, left, nil
}

// insertKeyed inserts in[i] under keys[i] for i in idx with the statement
// stmt (insert or insertAt), rows in key order across statements too (see
// the insert statement), a batch of large messages split so that no
// statement exceeds what the protocol carries; the statements share tx,
// so the batch is still one commit. It sets outcomes[i] to Stored for
// each row stored and returns how many.
func (s *Store) insertKeyed(ctx context.Context, tx pgx.Tx, stmt string, in []storage.Timeout, keys []string, idx []int, outcomes []storage.Outcome, now time.Time) (int, error) {
	count := 0
	for _, chunk := range chunkKeyed(in, keys, idx) {
		n, err := s.insertChunk(ctx, tx, stmt, in, keys, chunk, outcomes, now)
		if err != nil {
			return 0, err
		}
		count += n
	}
	return count, nil
}

// chunkKeyed orders rows idx of in by key and cuts them into the chunks of
// one insert statement each (see insertKeyed).
func chunkKeyed(in []storage.Timeout, keys []string, idx []int) [][]int {
	order := slices.Clone(idx)
	slices.SortFunc(order, func(a, b int) int { return strings.Compare(keys[a], keys[b]) })
	var chunks [][]int
	for lo := 0; lo < len(order); {
		hi, bytes := lo, 0
		for hi < len(order) && (hi == lo || bytes+len(in[order[hi]].Message) <= maxInsertBytes) {
			bytes += len(in[order[hi]].Message)
			hi++
		}
		chunks = append(chunks, order[lo:hi])
		lo = hi
	}
	return chunks
}

// maxInsertBytes bounds the message bytes of one insert statement: a
// PostgreSQL protocol message carries at most 1 GiB, and smaller statements
// keep the server's memory per statement in check.
const maxInsertBytes = 64 << 20

// insertChunk inserts in[i] under keys[i] for i in chunk (keys ascending)
// with one statement and marks what it stored.
func (s *Store) insertChunk(ctx context.Context, q interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}, stmt string, in []storage.Timeout, keys []string, chunk []int, outcomes []storage.Outcome, now time.Time) (int, error) {
	args, byKey := insertArgs(in, keys, chunk, now)
	rows, err := q.Query(ctx, stmt, args...)
	if err != nil {
		return 0, err
	}
	return scanStored(rows, byKey, outcomes)
}

// insertArgs are the parameters of an insert statement storing in[i]
// under keys[i] for i in chunk, and the index of each key.
func insertArgs(in []storage.Timeout, keys []string, chunk []int, now time.Time) ([]any, map[string]int) {
	n := len(chunk)
	var (
		ids, dests, lastErrs = make([]string, 0, n), make([]string, 0, n), make([]string, 0, n)
		exchanges            = make([]string, 0, n)
		sagas                = make([]*string, 0, n) // nil: no saga (NULL)
		dues                 = make([]time.Time, 0, n)
		recvs, notBefores    = make([]pgtype.Timestamptz, 0, n), make([]pgtype.Timestamptz, 0, n)
		msgs, fingerprints   = make([][]byte, 0, n), make([][]byte, 0, n)
		attempts             = make([]int64, 0, n)
		byKey                = make(map[string]int, n)
	)
	for _, i := range chunk {
		t := &in[i]
		msg := t.Message
		if msg == nil {
			msg = []byte{}
		}
		byKey[keys[i]] = i
		ids, dests, lastErrs = append(ids, keys[i]), append(dests, t.Destination), append(lastErrs, t.LastError)
		exchanges = append(exchanges, t.Exchange)
		if t.SagaID != "" {
			sagas = append(sagas, &t.SagaID)
		} else {
			sagas = append(sagas, nil)
		}
		dues = append(dues, tsUp(t.DueAt))
		recvs, notBefores = append(recvs, nullTS(t.ReceivedAt)), append(notBefores, nullTSUp(t.NotBefore))
		msgs, fingerprints = append(msgs, msg), append(fingerprints, t.Fingerprint) // nil: NULL
		attempts = append(attempts, int64(t.Attempts))
	}
	return []any{ids, dests, exchanges, dues, recvs, msgs, attempts, lastErrs, notBefores, now, sagas, fingerprints}, byKey
}

// scanStored reads the keys an insert statement stored and marks their
// rows Stored.
func scanStored(rows pgx.Rows, byKey map[string]int, outcomes []storage.Outcome) (int, error) {
	var key string
	count := 0
	_, err := pgx.ForEachRow(rows, []any{&key}, func() error {
		i, ok := byKey[key]
		if !ok {
			return fmt.Errorf("inserted unknown key %q", key)
		}
		outcomes[i] = storage.Stored
		count++
		return nil
	})
	return count, err
}

// Lease leases up to limit rows to owner for d; see storage.Store and the
// lease statement in newQueries. Leases come in order of the time the rows
// became visible (greatest of DueAt and NotBefore), ties by id.
func (s *Store) Lease(ctx context.Context, owner string, dueBy time.Time, limit int, d time.Duration) ([]storage.Lease, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("postgres: lease: limit must be positive, got %d", limit)
	}
	if d <= 0 {
		return nil, fmt.Errorf("postgres: lease: duration must be positive, got %s", d)
	}
	// Every token of this call starts with owner:call. so that a repeat
	// after a lost connection can first free what the lost attempt leased
	// (it may have committed; nobody got its tokens): otherwise those rows
	// would wait out a whole lease.
	var nonce [6]byte
	_, _ = rand.Read(nonce[:])
	prefix := owner + ":" + hex.EncodeToString(nonce[:]) + "."
	var leases []storage.Lease
	attempt := 0
	err := s.run(ctx, "lease", func(ctx context.Context) error {
		if !s.Live() {
			return ErrNotLive
		}
		attempt++
		if attempt > 1 {
			if _, err := s.pool.Exec(ctx, s.q.unlease, prefix); err != nil {
				return err
			}
		}
		now := s.now()
		by := dueBy
		if by.IsZero() {
			by = now
		}
		rows, err := s.pool.Query(ctx, s.q.lease, ts(by), ts(now), limit, prefix, ts(now.Add(d)))
		if err != nil {
			return err
		}
		if s.testLeaseAnswerLost != nil {
			if err := s.testLeaseAnswerLost(attempt); err != nil {
				rows.Close() // the statement completes and commits; its answer is dropped
				return err
			}
		}
		leases = make([]storage.Lease, 0, min(limit, 256))
		var l storage.Lease
		_, err = pgx.ForEachRow(rows, []any{&l.ID, &l.Lock, &l.DueAt}, func() error {
			l.DueAt = l.DueAt.UTC()
			leases = append(leases, l)
			return nil
		})
		return err
	})
	if err != nil {
		return nil, err
	}
	return leases, nil
}

// rowScan reads one row of the getMany statement.
type rowScan struct {
	t                        storage.Timeout
	size                     int32 // of the message, read or not
	lock                     *string
	recv, expires, notBefore pgtype.Timestamptz
	attempts                 int64
}

func (r *rowScan) dest() []any {
	return []any{&r.t.ID, &r.t.Destination, &r.t.Exchange, &r.t.DueAt, &r.recv, &r.t.Message, &r.size,
		&r.attempts, &r.t.LastError, &r.lock, &r.expires, &r.notBefore, &r.t.SagaID, &r.t.Paused, &r.t.Fingerprint}
}

func (r *rowScan) timeout() storage.Timeout {
	t := r.t
	t.DueAt = t.DueAt.UTC()
	t.ReceivedAt, t.LockExpiresAt, t.NotBefore = fromTS(r.recv), fromTS(r.expires), fromTS(r.notBefore)
	t.Attempts = int(r.attempts)
	if r.lock != nil {
		t.Lock = *r.lock
	}
	return t
}

// inlineBytes is the largest message that Get and GetMany read along with
// the rest of its row. The server reads and decompresses a message before
// it sends a byte of it, so a larger one is read by a second statement,
// which then knows how long to let the server work quietly (see
// thinkRate).
const inlineBytes = 1 << 20

// read reads the pending rows with these ids, for Get and GetMany.
func (s *Store) read(ctx context.Context, c *pgxpool.Conn, expect func(int64), ids []string) (map[string]storage.Timeout, error) {
	out := make(map[string]storage.Timeout, len(ids))
	var (
		large []string
		bytes int64
	)
	scan := func(ids []string, inline int32) error {
		rows, err := c.Query(ctx, s.q.getMany, ids, inline)
		if err != nil {
			return err
		}
		var r rowScan
		_, err = pgx.ForEachRow(rows, r.dest(), func() error {
			if r.size > inline {
				large = append(large, r.t.ID)
				bytes += int64(r.size)
			} else {
				out[r.t.ID] = r.timeout()
			}
			r = rowScan{} // the next row scans into fresh slices
			return nil
		})
		return err
	}
	if err := scan(ids, inlineBytes); err != nil || len(large) == 0 {
		return out, err
	}
	// Each large row is read again, whole, as it is now: one removed
	// meanwhile is missing, as if the call had come a moment later.
	expect(bytes)
	return out, scan(large, math.MaxInt32)
}

// GetMany returns the pending timeouts with these ids in one round trip
// (two when one has a message over inlineBytes); ids with no pending
// timeout are missing from the map. The dispatcher reads a dispatcher
// message's whole batch of tokens with it.
func (s *Store) GetMany(ctx context.Context, ids []string) (map[string]storage.Timeout, error) {
	var out map[string]storage.Timeout
	err := s.runMoving(ctx, "get many", func(ctx context.Context, c *pgxpool.Conn, expect func(int64)) (err error) {
		out, err = s.read(ctx, c, expect, ids)
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Get returns a copy of the row with this id.
func (s *Store) Get(ctx context.Context, id string) (storage.Timeout, error) {
	var t storage.Timeout
	err := s.runMoving(ctx, fmt.Sprintf("get %q", id), func(ctx context.Context, c *pgxpool.Conn, expect func(int64)) error {
		out, err := s.read(ctx, c, expect, []string{id})
		if err != nil {
			return err
		}
		var ok bool
		if t, ok = out[id]; !ok {
			return storage.ErrNotFound
		}
		return nil
	})
	if err != nil {
		return storage.Timeout{}, err
	}
	return t, nil
}

// Remove deletes rows in one statement; see storage.Store. Refs are judged
// in order against the rows as the statement found them, so a batch naming
// one row twice behaves as if removed one ref at a time.
func (s *Store) Remove(ctx context.Context, refs []storage.Ref) ([]error, error) {
	results := make([]error, len(refs))
	if len(refs) == 0 {
		// Still report a closed store or a cancelled context.
		return results, s.run(ctx, "remove", func(context.Context) error { return nil })
	}
	attempt := 0
	err := s.run(ctx, "remove", func(ctx context.Context) error {
		attempt++
		clear(results)
		now := ts(s.now())
		ids, locks := make([]string, len(refs)), make([]string, len(refs))
		for i, r := range refs {
			ids[i], locks[i] = r.ID, r.Lock
		}
		type row struct {
			lock    string
			expires time.Time
			deleted bool
		}
		found := map[string]*row{}
		rows, err := s.pool.Query(ctx, s.q.remove, ids, locks, now)
		if err != nil {
			return err
		}
		var (
			id      string
			r       row
			expires pgtype.Timestamptz
		)
		_, err = pgx.ForEachRow(rows, []any{&id, &r.lock, &expires, &r.deleted}, func() error {
			r.expires = fromTS(expires)
			found[id] = &row{lock: r.lock, expires: r.expires, deleted: r.deleted}
			return nil
		})
		if err != nil {
			return err
		}
		removed := 0
		gone := map[string]bool{} // removed by an earlier ref of this batch
		for i, ref := range refs {
			cur := found[ref.ID]
			switch {
			case cur == nil && attempt > 1 && !gone[ref.ID]:
				// Repeated after a lost connection: the first attempt
				// most likely removed it, and only the lease holder
				// could have. Not a conflict worth a warning.
				gone[ref.ID] = true
			case cur == nil || gone[ref.ID]:
				if ref.Lock != "" {
					results[i] = fmt.Errorf("postgres: remove %q: %w", ref.ID, storage.ErrNotFound)
				}
			case ref.Lock == "" || (ref.Lock == cur.lock && cur.expires.After(now)):
				if !cur.deleted {
					return fmt.Errorf("row %q should have been removed and was not", ref.ID)
				}
				gone[ref.ID] = true
				removed++
			default:
				results[i] = fmt.Errorf("postgres: remove %q: %w", ref.ID, storage.ErrConcurrency)
			}
		}
		for id, cur := range found {
			if cur.deleted && !gone[id] {
				return fmt.Errorf("row %q was removed though no ref held it", id)
			}
		}
		s.stats.addPending(-removed)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return results, nil
}

// lockCheck turns a holds flag into the result of an owner-checked call.
func lockCheck(lock string, holds bool) error {
	if lock != "" && !holds {
		return storage.ErrConcurrency
	}
	return nil
}

// Release ends the lease of id; see storage.Store.
func (s *Store) Release(ctx context.Context, id, lock string, notBefore time.Time) error {
	return s.run(ctx, fmt.Sprintf("release %q", id), func(ctx context.Context) error {
		var holds bool
		err := s.pool.QueryRow(ctx, s.q.release, id, lock, ts(s.now()), nullTSUp(notBefore)).Scan(&holds)
		if errors.Is(err, pgx.ErrNoRows) {
			return storage.ErrNotFound
		}
		if err != nil {
			return err
		}
		return lockCheck(lock, holds)
	})
}

// IncrementFailureCount records a dispatch failure of id; the lease is kept.
func (s *Store) IncrementFailureCount(ctx context.Context, id, lock, reason string) (int, error) {
	var n int
	err := s.run(ctx, fmt.Sprintf("increment failure count %q", id), func(ctx context.Context) error {
		var (
			holds    bool
			attempts *int64
		)
		err := s.pool.QueryRow(ctx, s.q.incr, id, lock, ts(s.now()), reason).Scan(&holds, &attempts)
		if errors.Is(err, pgx.ErrNoRows) {
			return storage.ErrNotFound
		}
		if err != nil {
			// Not repeated after a lost connection: the first attempt may
			// have committed, and a second would count one failure twice.
			return noReconnectRetry{err}
		}
		if err := lockCheck(lock, holds); err != nil {
			return err
		}
		if attempts == nil {
			return fmt.Errorf("row %q was not updated", id)
		}
		n = int(*attempts)
		return nil
	})
	if err != nil {
		return 0, err
	}
	return n, nil
}

// NextDue returns the earliest time a row becomes leasable: the first
// visible_at of the unleased rows or the first lease expiry, whichever is
// earlier. (A lease that expires before its row is visible, possible only
// with a lease shorter than the poller's lookahead, reports its expiry.)
func (s *Store) NextDue(ctx context.Context) (time.Time, bool, error) {
	var at pgtype.Timestamptz
	err := s.run(ctx, "next due", func(ctx context.Context) error {
		return s.pool.QueryRow(ctx, s.q.nextDue).Scan(&at)
	})
	if err != nil {
		return time.Time{}, false, err
	}
	return fromTS(at), at.Valid, nil
}

// Reap frees every row whose lease expired by the store's clock and returns
// how many it freed. Rows that a concurrent statement holds are skipped (a
// Lease taking them over, most likely); the next Reap sees them.
func (s *Store) Reap(ctx context.Context) (int, error) {
	var n int
	err := s.run(ctx, "reap", func(ctx context.Context) error {
		now := ts(s.now())
		tag, err := s.pool.Exec(ctx, s.q.reap, now)
		if err != nil {
			return err
		}
		n = int(tag.RowsAffected())
		// Best effort: a failed purge must not hide the leases freed; the
		// next Reap deletes what this one left.
		if _, perr := s.pool.Exec(ctx, s.q.purgeCancels, now); perr != nil {
			s.log.Warn().Err(perr).Msg("purging expired cancel tombstones failed; the next reap tries again")
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	if n > 0 {
		s.log.Debug().Int("rows", n).Msg("reaped expired leases")
	}
	return n, nil
}

// Cancel removes a row that is not leased and leaves a tombstone; see
// storage.Store. The row may still be in an insert that has not committed
// (of this or another instance), which a statement cannot see; and a row it
// removes may be inserted again, by an insert whose commit went through but
// whose answer was lost with its connection, and which Insert's retry or
// ingest's requeue repeats. So it first takes the cancel lock exclusively,
// which waits for every insert under way (they hold it shared), then looks,
// and records the tombstone before any later insert can check for it.
func (s *Store) Cancel(ctx context.Context, id string, mode storage.CancelMode) error {
	return s.run(ctx, fmt.Sprintf("cancel %q", id), func(ctx context.Context) error {
		now := ts(s.now())
		tx, err := s.pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		b := s.cancelLocked()
		b.Queue(s.q.cancel, id, now, tsUp(now.Add(s.window)), mode == storage.CancelOrdered)
		found, removed, err := lockedCounts(tx.SendBatch(ctx, b))
		if err != nil {
			return err
		}
		if err := tx.Commit(ctx); err != nil {
			return err
		}
		s.stats.addPending(-removed)
		return storage.FoundErr(found, removed)
	})
}

// CancelSaga deletes the rows of saga sagaID that no live lease holds and
// leaves a tombstone for each, in one transaction; see
// storage.SagaCanceller. Like Cancel it holds the cancel lock exclusively,
// so inserts under way commit first and are cancelled too.
func (s *Store) CancelSaga(ctx context.Context, sagaID string) (cancelled, leased int, err error) {
	if sagaID == "" {
		return 0, 0, errors.New("postgres: cancel saga: empty saga id")
	}
	err = s.run(ctx, fmt.Sprintf("cancel saga %q", sagaID), func(ctx context.Context) error {
		tx, err := s.pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		c, l, err := s.cancelGroups(ctx, tx, []string{sagaID}, nil, ts(s.now()))
		if err != nil {
			return err
		}
		if err := tx.Commit(ctx); err != nil {
			return err
		}
		cancelled, leased = c, l
		s.stats.addPending(-cancelled)
		return nil
	})
	if err != nil {
		return 0, 0, err
	}
	return cancelled, leased, nil
}

// ReplaceGroups cancels the groups' rows and inserts ts in one
// transaction; see storage.GroupReplacer. It holds the cancel lock
// exclusively, as CancelSaga, and inserts under it.
func (s *Store) ReplaceGroups(ctx context.Context, groups []string, in []storage.Timeout) (outcomes []storage.Outcome, cancelled, leased int, err error) {
	if slices.Contains(groups, "") {
		return nil, 0, 0, errors.New("postgres: replace groups: empty group")
	}
	if len(groups) == 0 {
		outcomes, err = s.Insert(ctx, in)
		return outcomes, 0, 0, err
	}
	if err := storage.CheckInsert(in); err != nil {
		return nil, 0, 0, fmt.Errorf("postgres: replace groups: %w", err)
	}
	var spared []string
	for id := range storage.Spared(groups, in) {
		spared = append(spared, id)
	}
	outcomes = make([]storage.Outcome, len(in))
	keys := make([]string, len(in))
	err = s.runMoving(ctx, "replace groups", func(ctx context.Context, c *pgxpool.Conn, expect func(int64)) error {
		expect(messageBytes(in))
		tx, err := c.Begin(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		now := ts(s.now())
		n, l, err := s.cancelGroups(ctx, tx, groups, spared, now)
		if err != nil {
			return err
		}
		count, err := s.insertRows(ctx, tx, in, outcomes, keys, now)
		if err != nil {
			return err
		}
		if err := tx.Commit(ctx); err != nil {
			return err
		}
		cancelled, leased = n, l
		s.stats.addPending(count - n)
		return nil
	})
	if err != nil {
		return nil, 0, 0, err
	}
	setKeys(in, outcomes, keys)
	return outcomes, cancelled, leased, nil
}

// setKeys sets the ID of each row stored to its key, once the commit is
// done (an attempt run again must see the ids, not keys).
func setKeys(in []storage.Timeout, outcomes []storage.Outcome, keys []string) {
	for i := range in {
		if outcomes[i] == storage.Stored {
			in[i].ID = keys[i]
		}
	}
}

// cancelGroups runs the cancelSaga statement for groups, sparing the ids
// of spared, in tx, under the cancel lock taken exclusively.
func (s *Store) cancelGroups(ctx context.Context, tx pgx.Tx, groups, spared []string, now time.Time) (cancelled, leased int, err error) {
	if spared == nil {
		spared = []string{}
	}
	b := s.cancelLocked()
	b.Queue(s.q.cancelSaga, groups, now, tsUp(now.Add(s.window)), spared)
	var c, l int64
	err = func() (err error) {
		br := tx.SendBatch(ctx, b)
		defer func() {
			if cerr := br.Close(); err == nil {
				err = cerr
			}
		}()
		for range 2 {
			if _, err := br.Exec(); err != nil {
				return err
			}
		}
		return br.QueryRow().Scan(&c, &l)
	}()
	return int(c), int(l), err
}

// cancelLocked starts the batch of a cancel: it takes the cancel lock
// exclusively, in the same round trip as the statements queued after it,
// so that inserts wait for the lock briefly. While this exclusive request
// waits for a long insert (a batch of large messages), every new insert of
// every instance queues behind it: it gives up soon and tries again
// (lock_not_available is retried) rather than stall intake.
func (s *Store) cancelLocked() *pgx.Batch {
	b := &pgx.Batch{}
	b.Queue(`SET LOCAL lock_timeout = '` + cancelLockWait + `'`)
	b.Queue(`SELECT pg_advisory_xact_lock($1)`, s.cancelKey)
	return b
}

// lockedCounts reads the results of a batch of cancelLocked and one
// statement answering two counts, or the first failure.
func lockedCounts(br pgx.BatchResults) (a, b int, err error) {
	defer func() {
		if cerr := br.Close(); err == nil {
			err = cerr
		}
	}()
	for range 2 {
		if _, err := br.Exec(); err != nil {
			return 0, 0, err
		}
	}
	var x, y int64
	err = br.QueryRow().Scan(&x, &y)
	return int(x), int(y), err
}

// Reschedule moves the sends of id that are not leased to a new due time
// and clears their NotBefore; an expired lease on one ends.
func (s *Store) Reschedule(ctx context.Context, id string, dueAt time.Time) error {
	if err := storage.CheckDueAt(dueAt); err != nil {
		return fmt.Errorf("postgres: reschedule %q: %w", id, err)
	}
	return s.run(ctx, fmt.Sprintf("reschedule %q", id), func(ctx context.Context) error {
		var found, moved int64
		if err := s.pool.QueryRow(ctx, s.q.reschedule, id, ts(s.now()), tsUp(dueAt)).Scan(&found, &moved); err != nil {
			return err
		}
		return storage.FoundErr(int(found), int(moved))
	})
}

// cursorVersion starts every List cursor.
const cursorVersion = 1

// encodeCursor makes the opaque List cursor after a row: base64url of a
// version byte, the due time in Unix microseconds (8 bytes, big-endian) and
// the id.
func encodeCursor(due time.Time, id string) string {
	b := make([]byte, 0, 9+len(id))
	b = append(b, cursorVersion)
	b = binary.BigEndian.AppendUint64(b, uint64(due.UnixMicro()))
	b = append(b, id...)
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodeCursor(c string) (due time.Time, id string, err error) {
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil || len(b) < 9 || b[0] != cursorVersion {
		return time.Time{}, "", fmt.Errorf("invalid cursor %q (pass back the next cursor of a previous page)", c)
	}
	id = string(b[9:])
	if wire.ValidateKey("cursor id", id) != nil {
		// A forged cursor: PostgreSQL would refuse a NUL or invalid UTF-8
		// id with an error that reads as an outage.
		return time.Time{}, "", fmt.Errorf("invalid cursor %q (pass back the next cursor of a previous page)", c)
	}
	return time.UnixMicro(int64(binary.BigEndian.Uint64(b[1:9]))).UTC(), id, nil
}

// filterConds are the SQL conditions of f's fields that SQL can test (all
// but the header); arg adds a parameter and returns its placeholder.
func filterConds(f *storage.ListFilter, arg func(any) string) []string {
	var conds []string
	// Where rows go (see storage.ListFilter): a queue is a destination
	// with no exchange.
	switch {
	case f.Exchange != "":
		conds = append(conds, "exchange = "+arg(f.Exchange))
		if f.Destination != "" {
			conds = append(conds, "destination = "+arg(f.Destination))
		}
	case f.Destination != "":
		conds = append(conds, "exchange = ''", "destination = "+arg(f.Destination))
	}
	if f.SagaID != "" {
		// Index timeouts_saga_due.
		conds = append(conds, "saga_id = "+arg(f.SagaID))
	}
	if !f.DueFrom.IsZero() {
		conds = append(conds, "due_at >= "+arg(ts(f.DueFrom)))
	}
	if !f.DueTo.IsZero() {
		conds = append(conds, "due_at < "+arg(ts(f.DueTo)))
	}
	if f.IDPrefix != "" {
		conds = append(conds, "starts_with(id, "+arg(f.IDPrefix)+")")
	}
	if f.ID != "" {
		conds = append(conds, familySQL(arg(f.ID)))
	}
	return conds
}

// List returns pending rows in (due_at, id) order from the index
// timeouts_due, one keyset page at a time; see storage.Store. The cursor is
// opaque (see encodeCursor).
func (s *Store) List(ctx context.Context, f storage.ListFilter) ([]storage.Timeout, string, error) {
	if f.Limit <= 0 {
		return nil, "", fmt.Errorf("postgres: list: limit must be positive, got %d", f.Limit)
	}
	var (
		conds []string
		args  []any
	)
	arg := func(v any) string {
		args = append(args, v)
		return "$" + strconv.Itoa(len(args))
	}
	if f.After != "" {
		due, id, err := decodeCursor(f.After)
		if err != nil {
			return nil, "", fmt.Errorf("postgres: list: %w", err)
		}
		conds = append(conds, fmt.Sprintf("(due_at, id) > (%s, %s)", arg(due), arg(id)))
	}
	conds = append(conds, filterConds(&f, arg)...)
	if f.HeaderName != "" {
		// The header is inside the message: find the page's ids by
		// reading messages (see bulkPage), then read those rows.
		ids, err := s.headerPage(ctx, f)
		if err != nil {
			return nil, "", fmt.Errorf("postgres: list: %w", err)
		}
		args = args[:0]
		conds = []string{"id = ANY(" + arg(ids) + "::text[])"}
	}
	query := "SELECT " + s.q.listCols + " FROM " + s.q.table
	if len(conds) > 0 {
		query += " WHERE " + strings.Join(conds, " AND ")
	}
	// One row more than asked tells whether there is a next page.
	query += " ORDER BY due_at, id LIMIT " + arg(int64(f.Limit)+1)

	var (
		out  []storage.Timeout
		next string
	)
	err := s.run(ctx, "list", func(ctx context.Context) error {
		out, next = make([]storage.Timeout, 0, min(f.Limit, 1000)), ""
		rows, err := s.pool.Query(ctx, query, args...)
		if err != nil {
			return err
		}
		var (
			t                        storage.Timeout
			lock                     *string
			recv, expires, notBefore pgtype.Timestamptz
			attempts                 int64
		)
		_, err = pgx.ForEachRow(rows, []any{&t.ID, &t.Destination, &t.Exchange, &t.DueAt, &recv, &attempts, &t.LastError, &lock, &expires, &notBefore, &t.SagaID, &t.Paused}, func() error {
			if len(out) == f.Limit {
				last := out[len(out)-1]
				next = encodeCursor(last.DueAt, last.ID)
				return nil
			}
			t.DueAt = t.DueAt.UTC()
			t.ReceivedAt, t.LockExpiresAt, t.NotBefore = fromTS(recv), fromTS(expires), fromTS(notBefore)
			t.Attempts = int(attempts)
			t.Lock = ""
			if lock != nil {
				t.Lock = *lock
			}
			out = append(out, t)
			return nil
		})
		return err
	})
	if err != nil {
		return nil, "", err
	}
	return out, next, nil
}

// statsCache keeps the pending count between Stats calls: counting every row
// of a large table costs a scan, and metrics, the status page and the admin
// API may ask often. The count is redone when older than pendingTTL; in
// between, this store's own inserts and removals adjust it, so it is exact
// for one instance and at most pendingTTL behind the other instances.
type statsCache struct {
	mu        sync.Mutex
	valid     bool
	pending   int
	countedAt time.Time // wall clock: the cache is about load, not the store clock

	refresh sync.Mutex // one recount at a time
}

// exactCountLimit is the table size (by the planner's estimate) from which
// Stats reports the estimate instead of counting.
var exactCountLimit = 1_000_000

// LeasedBy counts the rows leased under owner, expired leases not yet
// reaped included, up to atMost: what this instance has in flight, for the
// poller's MaxLeased backpressure (the leased count of Stats is every
// instance's).
func (s *Store) LeasedBy(ctx context.Context, owner string, atMost int) (int, error) {
	if atMost <= 0 {
		return 0, fmt.Errorf("postgres: leased: atMost must be positive, got %d", atMost)
	}
	var n int
	err := s.run(ctx, "leased", func(ctx context.Context) error {
		return s.pool.QueryRow(ctx, s.q.countLeasedBy, owner+":", atMost).Scan(&n)
	})
	return n, err
}

// pendingTTL is how long a pending count is reused.
const pendingTTL = time.Second

func (c *statsCache) addPending(delta int) {
	if delta == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.valid {
		c.pending += delta
	}
}

func (c *statsCache) get() (int, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.pending, c.valid && time.Since(c.countedAt) < pendingTTL
}

func (c *statsCache) set(pending int, at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pending, c.countedAt, c.valid = pending, at, true
}

// Stats returns how many rows the store holds (pending, leased or not) and
// how many of them are leased (expired leases not yet reaped included). The
// leased count is exact on every call: an index-only count over the partial
// index timeouts_leased, whose size is what is in flight (the poller's
// MaxLeased bounds it), cheap enough for the poller's backpressure check on
// every cycle. The pending count is cached, see statsCache; from
// exactCountLimit rows on it is the planner's estimate, not a count.
func (s *Store) Stats(ctx context.Context) (pending, leased int, err error) {
	err = s.run(ctx, "stats", func(ctx context.Context) error {
		if p, ok := s.stats.get(); ok {
			pending = p
			return s.pool.QueryRow(ctx, s.q.countLeased).Scan(&leased)
		}
		s.stats.refresh.Lock()
		defer s.stats.refresh.Unlock()
		if p, ok := s.stats.get(); ok { // another call just counted
			pending = p
			return s.pool.QueryRow(ctx, s.q.countLeased).Scan(&leased)
		}
		started := time.Now()
		// Past exactCountLimit rows an exact count scans for seconds, on
		// every instance, each second: take the planner's estimate.
		var estimate int64
		if err := s.pool.QueryRow(ctx, s.q.estimate).Scan(&estimate); err != nil {
			return err
		}
		if estimate >= int64(exactCountLimit) {
			pending = int(estimate)
			s.stats.set(pending, started)
			return s.pool.QueryRow(ctx, s.q.countLeased).Scan(&leased)
		}
		if err := s.pool.QueryRow(ctx, s.q.countBoth).Scan(&leased, &pending); err != nil {
			return err
		}
		s.stats.set(pending, started)
		return nil
	})
	if err != nil {
		return 0, 0, err
	}
	return max(pending, leased), leased, nil
}
