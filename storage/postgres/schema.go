package postgres

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrSchemaTooNew means the database schema was migrated by a newer build of
// delaybridge than this one: Open refuses to run against it.
var ErrSchemaTooNew = errors.New("database schema is newer than this build")

// migration is one step of the schema: its statements run in one
// transaction, together with the row recording its version.
type migration struct {
	version int
	name    string
	stmts   []string
}

// migrations is the ordered schema history; append only, never edit a
// released step. {{s}} is the quoted schema name.
//
// Version 1, the timeouts table:
//
//   - id has collation "C": bytewise order (as boltstore's), cheaper compares,
//     and List's (due_at, id) order does not depend on the database locale.
//   - visible_at is a stored generated column, greatest(due_at, not_before):
//     when an unleased row becomes leasable. Being generated, it can never
//     disagree with due_at and not_before.
//   - timeouts_ready (visible_at, id) WHERE lock_token IS NULL holds exactly
//     the rows waiting to be leased, in lease order: Lease reads the first
//     limit entries at or before dueBy, NextDue the first entry. Live leases
//     are not in it, so a large in-flight set costs nothing to skip.
//   - timeouts_leased (lock_expires_at) WHERE lock_token IS NOT NULL holds
//     only the leased rows (bounded by what is in flight): Lease and Reap find
//     expired leases in it, NextDue the first expiry, Stats counts it.
//   - timeouts_due (due_at, id) serves List's keyset paging and due ranges.
//   - lock_seq numbers leases, so a lock token (owner:n) is never reused,
//     whichever instance leased.
//   - A queue table churns (every row is inserted, updated a few times and
//     deleted), so autovacuum is asked to clean it up at 2% dead rows instead
//     of 20%: dead index entries at the head of timeouts_ready slow Lease.
var migrations = []migration{
	{1, "timeouts table", []string{
		`CREATE TABLE {{s}}.timeouts (
			id              text COLLATE "C" PRIMARY KEY,
			destination     text        NOT NULL,
			due_at          timestamptz NOT NULL,
			received_at     timestamptz,
			message         bytea       NOT NULL,
			attempts        bigint      NOT NULL DEFAULT 0,
			last_error      text        NOT NULL DEFAULT '',
			lock_token      text,
			lock_expires_at timestamptz,
			not_before      timestamptz,
			visible_at      timestamptz NOT NULL GENERATED ALWAYS AS (greatest(due_at, not_before)) STORED,
			CONSTRAINT timeouts_lock_pair CHECK ((lock_token IS NULL) = (lock_expires_at IS NULL))
		) WITH (autovacuum_vacuum_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02)`,
		`CREATE INDEX timeouts_ready ON {{s}}.timeouts (visible_at, id) WHERE lock_token IS NULL`,
		`CREATE INDEX timeouts_leased ON {{s}}.timeouts (lock_expires_at) WHERE lock_token IS NOT NULL`,
		`CREATE INDEX timeouts_due ON {{s}}.timeouts (due_at, id)`,
		`CREATE SEQUENCE {{s}}.lock_seq`,
	}},
	// Version 2: the endpoint a schema serves. Two endpoints sharing one
	// schema would lease each other's timeouts and send them through the
	// wrong dispatcher queue; Open refuses a second endpoint instead.
	{2, "endpoint claim", []string{
		`CREATE TABLE {{s}}.endpoint (
			one      boolean PRIMARY KEY DEFAULT true CHECK (one),
			name     text        NOT NULL,
			claimed_at timestamptz NOT NULL DEFAULT now()
		)`,
	}},
	// Version 3: cancel tombstones. A cancel that is not refused (the row
	// leased) leaves its id here until expires_at, whether it removed a row
	// or found none, and Insert stores no row with a
	// live tombstone's id (see Store.Cancel). Reap deletes expired ones.
	{3, "cancel tombstones", []string{
		`CREATE TABLE {{s}}.cancelled (
			id         text COLLATE "C" PRIMARY KEY,
			expires_at timestamptz NOT NULL
		)`,
		// Reap purges by expiry on every instance: no full scan.
		`CREATE INDEX cancelled_expiry ON {{s}}.cancelled (expires_at)`,
	}},
	// Version 4: exchange destinations (storage.Timeout.Exchange). '' is
	// the default exchange, so existing rows keep going to their queue. A
	// constant default is recorded in the catalog: the table is not
	// rewritten, however many rows it holds.
	{4, "exchange destinations", []string{
		`ALTER TABLE {{s}}.timeouts ADD COLUMN exchange text NOT NULL DEFAULT ''`,
	}},
	// Version 5: the saga a timeout belongs to (storage.Timeout.SagaID),
	// NULL for none, so existing rows need no rewrite and the partial index
	// holds only saga rows: CancelSaga finds a saga's rows without a scan.
	{5, "saga ids", []string{
		`ALTER TABLE {{s}}.timeouts ADD COLUMN saga_id text COLLATE "C"`,
		`CREATE INDEX timeouts_saga ON {{s}}.timeouts (saga_id) WHERE saga_id IS NOT NULL`,
	}},
	// Version 6: List by saga (storage.ListFilter.SagaID) pages through a
	// saga's rows in (due_at, id) order straight from this index, where
	// timeouts_saga left a sort of all the saga's rows on every page, or
	// a walk of timeouts_due. CancelSaga's saga_id = $1 uses its prefix,
	// so it replaces timeouts_saga.
	{6, "saga rows in due order", []string{
		`CREATE INDEX timeouts_saga_due ON {{s}}.timeouts (saga_id, due_at, id) WHERE saga_id IS NOT NULL`,
		`DROP INDEX {{s}}.timeouts_saga`,
	}},
	// Version 7: paused destinations (storage.Pauser). A row of a paused
	// destination has paused set and is left out of the ready index,
	// which replaces timeouts_ready: Lease and NextDue never step over a
	// paused row, however many are due. The default needs no rewrite of
	// the table; the new ready index is built once, here (writes wait
	// for it). timeouts_paused holds only paused rows, in id order: Resume
	// finds a destination's rows there. A pause being resumed has
	// resuming set until all its rows are unmarked (pause.go).
	{7, "paused destinations", []string{
		`CREATE TABLE {{s}}.paused (
			exchange    text        NOT NULL,
			destination text        NOT NULL,
			since       timestamptz NOT NULL,
			paused_by   text        NOT NULL DEFAULT '',
			resuming    boolean     NOT NULL DEFAULT false,
			PRIMARY KEY (exchange, destination)
		)`,
		`ALTER TABLE {{s}}.timeouts ADD COLUMN paused boolean NOT NULL DEFAULT false`,
		`CREATE INDEX timeouts_unpaused_ready ON {{s}}.timeouts (visible_at, id) WHERE lock_token IS NULL AND NOT paused`,
		`DROP INDEX {{s}}.timeouts_ready`,
		`CREATE INDEX timeouts_paused ON {{s}}.timeouts (exchange, destination, id) WHERE paused`,
	}},
	// Version 8: the send a row holds (storage.Timeout.Fingerprint), so
	// that a redelivery of a pending send is told from another send of the
	// same message id, which is stored under a key of its own
	// (wire.SendKey: the id, 0x1F and its number; the keys of an id are
	// the id and the range after id||0x1F, read from the primary key).
	// NULL for rows stored before: they match only sends without one. A
	// column without a default: the table is not rewritten.
	{8, "send fingerprints", []string{
		`ALTER TABLE {{s}}.timeouts ADD COLUMN fingerprint bytea`,
	}},
	// Version 9: the instances whose liveness PostgreSQL judges
	// (liveness.go). Each holds a session-level advisory lock on
	// (livenessClass(schema), lock_key) for as long as it runs; a row
	// whose lock no session holds is a dead instance, whose leases any
	// other instance frees (Store.TakeOver). An instance of an older
	// build has no row here: its leases only expire, as before.
	{9, "instance liveness", []string{
		`CREATE TABLE {{s}}.instances (
			owner    text COLLATE "C" PRIMARY KEY,
			lock_key integer GENERATED BY DEFAULT AS IDENTITY (MINVALUE 1 MAXVALUE 2147483647 CYCLE) UNIQUE,
			since    timestamptz NOT NULL DEFAULT now()
		)`,
	}},
	// Version 10: recurring schedules (storage.Scheduler, schedule.go). One
	// row per schedule; its fires are rows of timeouts (saga_id = key).
	// schedules_due holds exactly the schedules FireDue may plan, in fire
	// time order: FireDue and NextScheduleDue read its head.
	{10, "recurring schedules", []string{
		`CREATE TABLE {{s}}.schedules (
			key          text COLLATE "C" PRIMARY KEY,
			source       text        NOT NULL,
			expr         text        NOT NULL,
			zone         text        NOT NULL,
			start_at     timestamptz,
			end_at       timestamptz,
			misfire      integer     NOT NULL,
			description  text        NOT NULL DEFAULT '',
			destination  text        NOT NULL,
			exchange     text        NOT NULL DEFAULT '',
			message      bytea       NOT NULL,
			token        text        NOT NULL DEFAULT '',
			next_fire_at timestamptz,
			prev_fire_at timestamptz,
			paused       boolean     NOT NULL DEFAULT false,
			generation   bigint      NOT NULL,
			fires        bigint      NOT NULL DEFAULT 0,
			misfires     bigint      NOT NULL DEFAULT 0,
			last_error   text        NOT NULL DEFAULT '',
			updated_at   timestamptz NOT NULL
		)`,
		`CREATE INDEX schedules_due ON {{s}}.schedules (next_fire_at) WHERE NOT paused AND next_fire_at IS NOT NULL`,
	}},
}

// ErrOtherEndpoint means the schema already serves another endpoint.
var ErrOtherEndpoint = errors.New("schema serves another endpoint")

// claimEndpoint records endpoint as the schema's, or checks that it is.
func (s *Store) claimEndpoint(ctx context.Context, endpoint string) error {
	// Two statements, not one: a single statement's snapshot may predate
	// the claim of an instance starting at the same moment, whose row its
	// INSERT then waits for and skips, and its SELECT does not see. The
	// second statement's snapshot is taken after that wait.
	var owner string
	_, err := s.pool.Exec(ctx, `INSERT INTO `+s.qs+`.endpoint (name) VALUES ($1) ON CONFLICT (one) DO NOTHING`, endpoint)
	if err == nil {
		err = s.pool.QueryRow(ctx, `SELECT name FROM `+s.qs+`.endpoint`).Scan(&owner)
	}
	if err != nil {
		return fmt.Errorf("claim schema %q for endpoint %q: %w", s.schema, endpoint, err)
	}
	if owner != endpoint {
		return fmt.Errorf("%w: schema %q holds the timeouts of endpoint %q, not %q; give each endpoint a schema of its own (DELAYBRIDGE_POSTGRES_SCHEMA)",
			ErrOtherEndpoint, s.schema, owner, endpoint)
	}
	return nil
}

// SchemaVersion is the schema version this build creates and understands.
var SchemaVersion = migrations[len(migrations)-1].version

// migrate brings the schema to SchemaVersion, one migration per transaction.
// Every transaction first takes a transaction-scoped advisory lock named
// after the schema, so instances starting together apply each step once and
// in order; the loser of the race finds the step done and moves on.
func (s *Store) migrate(ctx context.Context) error {
	var phase atomic.Pointer[string]
	stop := s.migrationProgress(&phase)
	defer stop()
	for {
		done, err := s.migrateStep(ctx, &phase)
		if err != nil {
			return err
		}
		if done {
			return nil
		}
	}
}

// migrationProgressEvery is how often a migration that is still running
// says so (a variable for tests).
var migrationProgressEvery = 10 * time.Second

// migrationProgress logs what phase holds every migrationProgressEvery
// until stop is called, so that a long migration (an index built over
// millions of rows, or another instance's being waited for) is seen
// running, not taken for a hang. Most migrations end before the first
// tick and log nothing here.
func (s *Store) migrationProgress(phase *atomic.Pointer[string]) (stop func()) {
	start := time.Now()
	done := make(chan struct{})
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		t := time.NewTicker(migrationProgressEvery)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				if p := phase.Load(); p != nil {
					s.log.Info().Str("schema", s.schema).Dur("elapsed", time.Since(start).Round(time.Second)).Msg(*p)
				}
			}
		}
	}()
	return func() {
		close(done)
		<-exited
	}
}

func (s *Store) migrateStep(ctx context.Context, phase *atomic.Pointer[string]) (done bool, err error) {
	waiting := "schema migration: waiting for another instance's migration of this schema (advisory lock)"
	phase.Store(&waiting)
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return false, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()

	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, migrationLockKey(s.schema)); err != nil {
		return false, fmt.Errorf("advisory lock: %w", err)
	}
	// CREATE SCHEMA IF NOT EXISTS needs the CREATE privilege on the database
	// even when the schema exists: only create what is missing.
	var exists bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`, s.schema).Scan(&exists); err != nil {
		return false, fmt.Errorf("look up schema %q: %w", s.schema, err)
	}
	if !exists {
		if _, err := tx.Exec(ctx, `CREATE SCHEMA `+s.qs); err != nil {
			return false, fmt.Errorf("create schema %q: %w", s.schema, err)
		}
	}
	// applied_at is a record for operators, never compared: the server's
	// clock is fine there.
	if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+s.qs+`.schema_version (
		version    integer     PRIMARY KEY,
		applied_at timestamptz NOT NULL DEFAULT now()
	)`); err != nil {
		return false, fmt.Errorf("create schema_version: %w", err)
	}
	var current int
	if err := tx.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM `+s.qs+`.schema_version`).Scan(&current); err != nil {
		return false, fmt.Errorf("read schema version: %w", err)
	}
	switch {
	case current > SchemaVersion:
		return false, fmt.Errorf("%w: it is at version %d, this build knows up to version %d (upgrade delaybridge, or use another schema)",
			ErrSchemaTooNew, current, SchemaVersion)
	case current == SchemaVersion:
		return true, tx.Commit(ctx)
	}
	m := migrations[current] // versions are 1, 2, 3, ...
	if m.version != current+1 {
		return false, fmt.Errorf("migration list broken: step %d has version %d", current, m.version)
	}
	applying := fmt.Sprintf("schema migration: still applying version %d (%s); writes to its tables wait until it commits", m.version, m.name)
	phase.Store(&applying)
	for i, stmt := range m.stmts {
		if _, err := tx.Exec(ctx, strings.ReplaceAll(stmt, "{{s}}", s.qs)); err != nil {
			return false, fmt.Errorf("version %d (%s), statement %d: %w", m.version, m.name, i+1, err)
		}
	}
	if _, err := tx.Exec(ctx, `INSERT INTO `+s.qs+`.schema_version (version, applied_at) VALUES ($1, now())`, m.version); err != nil {
		return false, fmt.Errorf("record version %d: %w", m.version, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return false, fmt.Errorf("commit version %d: %w", m.version, err)
	}
	s.log.Info().Str("schema", s.schema).Int("version", m.version).Str("migration", m.name).Msg("applied schema migration")
	return false, nil
}

// migrationLockKey is the advisory lock serializing migrations of one schema
// (advisory locks are per database, so the schema is part of the key).
func migrationLockKey(schema string) int64 {
	h := fnv.New64a()
	h.Write([]byte("delaybridge schema migration\x00" + schema))
	return int64(h.Sum64())
}

// cancelLockKey is the advisory lock that orders cancels of missing ids
// against inserts in one schema: Insert holds it shared, Cancel takes it
// exclusively before it records a tombstone.
func cancelLockKey(schema string) int64 {
	h := fnv.New64a()
	h.Write([]byte("delaybridge cancel\x00" + schema))
	return int64(h.Sum64())
}

// livenessClass is the first key of the instances' liveness locks in one
// schema (the second is instances.lock_key): advisory locks are per
// database, so the schema is part of it. Two-key locks never meet the
// one-key locks above. Kept positive, so that it reads back from pg_locks'
// classid (an oid) unchanged.
func livenessClass(schema string) int32 {
	h := fnv.New32a()
	h.Write([]byte("delaybridge liveness\x00" + schema))
	return int32(h.Sum32() & 0x7fffffff)
}

// quoteIdent quotes a schema name for use in SQL.
func quoteIdent(name string) string { return pgx.Identifier{name}.Sanitize() }

// quoteLiteral quotes s as an SQL string literal.
func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
