package postgres

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/wire"
)

// InsertAndCancel applies ts and cancels in their order in one
// transaction of two round trips; see storage.InsertCanceller. The first
// opens it, takes the cancel lock exclusively, as Cancel does (so inserts
// under way commit first and are found), and reads what the call may
// meet: the tombstones of its rows' ids, and, locked, every send of its
// ids and every row of its schedules' keys. Under that lock no other
// insert runs, and the locked rows cannot be leased, so what was read
// stays true until the commit: planBatch decides every outcome from it,
// in order, as Insert (storage.PlaceSend) and Cancel do one by one, and
// the second round trip writes the result and commits.
func (s *Store) InsertAndCancel(ctx context.Context, in []storage.Timeout, cancels []storage.OrderedCancel) ([]storage.Outcome, []storage.CancelResult, error) {
	if len(cancels) == 0 {
		outcomes, err := s.Insert(ctx, in)
		return outcomes, nil, err
	}
	if err := storage.CheckInsert(in); err != nil {
		return nil, nil, fmt.Errorf("postgres: insert and cancel: %w", err)
	}
	if err := storage.CheckCancels(len(in), cancels); err != nil {
		return nil, nil, fmt.Errorf("postgres: insert and cancel: %w", err)
	}
	var p *batchPlan
	err := s.runMoving(ctx, "insert and cancel", func(ctx context.Context, c *pgxpool.Conn, expect func(int64)) error {
		expect(messageBytes(in))
		var err error
		p, err = s.insertCancel(ctx, c, in, cancels)
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	s.stats.addPending(len(p.write) - len(p.deletes))
	setKeys(in, p.outcomes, p.keys)
	return p.outcomes, p.results, nil
}

// insertCancel is one attempt of InsertAndCancel on c. The transaction is
// begun and committed by statements of the two pipelines (a pgx.Tx would
// cost a round trip for each); when the attempt fails before its commit,
// it is rolled back here.
func (s *Store) insertCancel(ctx context.Context, c *pgxpool.Conn, in []storage.Timeout, cancels []storage.OrderedCancel) (p *batchPlan, err error) {
	defer func() {
		if c.Conn().PgConn().TxStatus() != 'I' {
			_, _ = c.Exec(context.WithoutCancel(ctx), `ROLLBACK`)
		}
	}()
	now := ts(s.now())
	dead, found, err := s.readBatch(ctx, c, in, cancels, now)
	if err != nil {
		return nil, err
	}
	p = planBatch(in, cancels, dead, found)
	ended, err := s.writeBatch(ctx, c, in, p, now)
	if err != nil {
		return nil, err
	}
	// The first cancel of a schedule ended it; later ones found none.
	for i, cn := range cancels {
		if cn.Schedule != "" && ended[cn.Schedule] {
			p.results[i].ScheduleFound = true
			delete(ended, cn.Schedule)
		}
	}
	return p, nil
}

// readBatch is InsertAndCancel's first round trip: it opens the
// transaction, takes the cancel lock exclusively, and reads the live
// tombstones of the rows' ids (dead) and, locked, every send of the call's
// ids and every row of its schedules (found).
func (s *Store) readBatch(ctx context.Context, c *pgxpool.Conn, in []storage.Timeout, cancels []storage.OrderedCancel, now time.Time) (dead map[string]bool, found []planRow, err error) {
	var rowIDs, ids, sagas []string
	for i := range in {
		rowIDs = append(rowIDs, in[i].ID)
	}
	ids = slices.Clone(rowIDs)
	for _, cn := range cancels {
		ids = append(ids, cn.ID)
		if cn.Schedule != "" {
			sagas = append(sagas, cn.Schedule)
		}
	}
	rowIDs, ids, sagas = distinct(rowIDs), distinct(ids), distinct(sagas)

	b := &pgx.Batch{}
	b.Queue(`BEGIN`)
	b.Queue(`SET LOCAL lock_timeout = '` + cancelLockWait + `'`)
	b.Queue(`SELECT pg_advisory_xact_lock($1)`, s.cancelKey)
	b.Queue(s.q.tombstoned, rowIDs, now)
	b.Queue(s.q.batchRows, ids, sagas, now)
	dead = make(map[string]bool)
	err = sendBatch(ctx, c, b, func(br pgx.BatchResults) error {
		for range 3 {
			if _, err := br.Exec(); err != nil {
				return err
			}
		}
		if err := readTombstoned(br, dead); err != nil {
			return err
		}
		rows, err := br.Query()
		if err != nil {
			return err
		}
		var r planRow
		_, err = pgx.ForEachRow(rows, []any{&r.key, &r.saga, &r.fingerprint, &r.busy}, func() error {
			r.id, r.row = wire.KeyID(r.key), -1
			found = append(found, r)
			r = planRow{}
			return nil
		})
		return err
	})
	return dead, found, err
}

// writeBatch is InsertAndCancel's second round trip: it deletes, inserts
// and records tombstones as p says, and commits. ended holds the schedule
// keys whose rows it deleted.
func (s *Store) writeBatch(ctx context.Context, c *pgxpool.Conn, in []storage.Timeout, p *batchPlan, now time.Time) (ended map[string]bool, err error) {
	b := &pgx.Batch{}
	if len(p.deletes) > 0 {
		b.Queue(s.q.delKeys, p.deletes)
	}
	if len(p.schedules) > 0 {
		b.Queue(s.q.delScheds, p.schedules)
	}
	chunks := chunkKeyed(in, p.keys, p.write)
	byKeys := make([]map[string]int, len(chunks))
	for i, chunk := range chunks {
		var args []any
		args, byKeys[i] = insertArgs(in, p.keys, chunk, now)
		b.Queue(s.q.insertAt, args...)
	}
	if len(p.tombs) > 0 {
		b.Queue(s.q.tombstone, p.tombs, tsUp(now.Add(s.window)))
	}
	// COMMIT travels in the pipeline, so the row counts checked below are
	// read after the server committed: a mismatch (a bug, as nothing else
	// changes the locked rows) is reported, not undone. The caller then
	// requeues the batch, and the redelivered rows find their own copies
	// (Duplicate) or tombstones (Cancelled): reported twice, never lost.
	b.Queue(`COMMIT`)
	ended = make(map[string]bool)
	err = sendBatch(ctx, c, b, func(br pgx.BatchResults) error {
		if len(p.deletes) > 0 {
			tag, err := br.Exec()
			if err != nil {
				return err
			}
			if n := tag.RowsAffected(); n != int64(len(p.deletes)) {
				return fmt.Errorf("insert and cancel: deleted %d of %d locked rows", n, len(p.deletes))
			}
		}
		if len(p.schedules) > 0 {
			rows, err := br.Query()
			if err != nil {
				return err
			}
			var key string
			if _, err := pgx.ForEachRow(rows, []any{&key}, func() error { ended[key] = true; return nil }); err != nil {
				return err
			}
		}
		stored := make([]storage.Outcome, len(in))
		for i, chunk := range chunks {
			rows, err := br.Query()
			if err != nil {
				return err
			}
			n, err := scanStored(rows, byKeys[i], stored)
			if err != nil {
				return err
			}
			if n != len(chunk) {
				// Nothing inserts beside the exclusive cancel lock: a bug.
				return fmt.Errorf("insert and cancel: stored %d of %d rows under keys read free", n, len(chunk))
			}
		}
		if len(p.tombs) > 0 {
			if _, err := br.Exec(); err != nil {
				return err
			}
		}
		tag, err := br.Exec()
		if err == nil && tag.String() != "COMMIT" {
			err = fmt.Errorf("insert and cancel: commit answered %q", tag.String())
		}
		return err
	})
	return ended, err
}

// sendBatch sends b on c (a connection or a transaction) as one pipeline
// and reads its results with read.
func sendBatch(ctx context.Context, c interface {
	SendBatch(context.Context, *pgx.Batch) pgx.BatchResults
}, b *pgx.Batch, read func(pgx.BatchResults) error) (err error) {
	br := c.SendBatch(ctx, b)
	defer func() {
		if cerr := br.Close(); err == nil {
			err = cerr
		}
	}()
	return read(br)
}

// readTombstoned reads the next result of br, the tombstoned statement's,
// into dead.
func readTombstoned(br pgx.BatchResults, dead map[string]bool) error {
	rows, err := br.Query()
	if err != nil {
		return err
	}
	var id string
	_, err = pgx.ForEachRow(rows, []any{&id}, func() error { dead[id] = true; return nil })
	return err
}

// distinct sorts ss and drops repeats; never nil (an empty array, not NULL).
func distinct(ss []string) []string {
	if ss == nil {
		return []string{}
	}
	slices.Sort(ss)
	return slices.Compact(ss)
}

// planRow is a row InsertAndCancel may meet: one read from the store, or
// one the call stores.
type planRow struct {
	key, id, saga string
	fingerprint   []byte
	busy          bool // under a live lease
	row           int  // the call's row it is; -1: a row of the store
	gone          bool // removed by a cancel of the call
}

// batchPlan is what an InsertAndCancel does, decided in Go from its read.
type batchPlan struct {
	outcomes []storage.Outcome
	keys     []string // of the rows stored
	results  []storage.CancelResult
	// write: the rows of the call to insert (stored and not removed by a
	// later cancel); deletes: keys of the store's rows that cancels
	// removed; tombs: message ids to tombstone, distinct, in order;
	// schedules: the schedule keys to delete, distinct.
	write            []int
	deletes          []string
	tombs, schedules []string
}

// planBatch applies rows in and cancels one by one, in their order, to the
// store's rows found (every send of their ids and every row of their
// schedules, in key order) and the live tombstones dead, as Insert and
// Cancel (CancelOrdered), after CancelSchedule for a cancel with a
// schedule, would: the rule both stores keep (boltstore runs those very
// operations in one transaction).
func planBatch(in []storage.Timeout, cancels []storage.OrderedCancel, dead map[string]bool, found []planRow) *batchPlan {
	p := &batchPlan{outcomes: make([]storage.Outcome, len(in)), keys: make([]string, len(in)),
		results: make([]storage.CancelResult, len(cancels))}
	byID, bySaga := make(map[string][]*planRow), make(map[string][]*planRow)
	add := func(r *planRow) {
		byID[r.id] = append(byID[r.id], r)
		if r.saga != "" {
			bySaga[r.saga] = append(bySaga[r.saga], r)
		}
	}
	for i := range found {
		add(&found[i])
	}
	tombs := make(map[string]bool)
	kill := func(id string) { dead[id], tombs[id] = true, true }
	remove := func(r *planRow) {
		r.gone = true
		if r.row < 0 {
			p.deletes = append(p.deletes, r.key)
		}
	}
	stored := make([]*planRow, len(in))
	next := 0
	insert := func(upTo int) {
		for ; next < upTo; next++ {
			t := &in[next]
			if dead[t.ID] {
				p.outcomes[next] = storage.Cancelled
				continue
			}
			var pending []storage.PendingSend
			for _, r := range byID[t.ID] {
				if !r.gone {
					pending = append(pending, storage.PendingSend{Key: r.key, Fingerprint: r.fingerprint, Leased: r.busy})
				}
			}
			key, o := storage.PlaceSend(t.ID, t.Fingerprint, pending)
			if p.outcomes[next] = o; o != storage.Stored {
				continue
			}
			p.keys[next] = key
			stored[next] = &planRow{key: key, id: t.ID, saga: t.SagaID, fingerprint: t.Fingerprint, row: next}
			add(stored[next])
		}
	}
	seen := make(map[string]bool)
	for i, c := range cancels {
		insert(c.At)
		if c.Schedule != "" {
			if !seen[c.Schedule] {
				seen[c.Schedule] = true
				p.schedules = append(p.schedules, c.Schedule)
			}
			for _, r := range bySaga[c.Schedule] { // as CancelSaga
				if !r.gone && !r.busy {
					remove(r)
					kill(r.id)
				}
			}
		}
		n, removed := 0, 0
		for _, r := range byID[c.ID] { // as Cancel
			if r.gone {
				continue
			}
			n++
			if !r.busy {
				remove(r)
				removed++
			}
		}
		if removed > 0 || n == 0 {
			kill(c.ID)
		}
		p.results[i].Err = storage.FoundErr(n, removed)
	}
	insert(len(in))
	for i, r := range stored {
		if r != nil && !r.gone {
			p.write = append(p.write, i)
		}
	}
	for id := range tombs {
		p.tombs = append(p.tombs, id)
	}
	slices.Sort(p.tombs)
	slices.Sort(p.deletes)
	return p
}
