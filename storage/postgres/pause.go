package postgres

import (
	"context"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/wire"
)

// Pauses (storage.Pauser) are rows of <schema>.paused, and each row of a
// paused destination has paused set, which keeps it out of the index Lease
// and NextDue read (timeouts_unpaused_ready; see schema version 7). Insert
// marks its rows from the table, under the cancel lock held shared; Pause
// and Resume change the table under it held exclusively, briefly. So an
// insert either committed before the change, and the marking that follows
// it finds its rows, or it sees the change. Every instance reads the same
// table: a pause holds on all.
//
// Marking and unmarking a destination's rows goes in chunks, each a short
// transaction under the lock held shared (inserts go on), so that a
// destination of millions of rows never holds a statement for longer than
// a store call may take. Each chunk checks that the pause is still in the
// state it works for, so a Pause and a Resume of one destination racing
// never leave rows marked against the table. A call that fails midway is
// completed by calling it again: a Pause re-marks (rows of a destination
// being paused may be leased until it returns), and a pause whose Resume
// failed stays listed, resuming set, its rows still held, until a Resume
// completes it.

// Chunk sizes (variables for tests): rows read by one marking statement
// (in id order, over the whole table: there is no index by destination),
// and rows unmarked by one statement (from index timeouts_paused).
var (
	pauseScanChunk = 20_000
	resumeChunk    = 5_000
)

// pausedExists, closed by ")", tests the pause of destination $1, $2.
const (
	pausedExists     = `EXISTS (SELECT 1 FROM {{p}} p WHERE p.exchange = $1 AND p.destination = $2 AND `
	pausedExistsTail = `)`
)

// Pause holds d's rows; see storage.Pauser. It records the pause (or turns
// a resume under way back into a pause), then marks the rows already stored.
func (s *Store) Pause(ctx context.Context, d wire.Destination, by string) (bool, error) {
	if err := storage.CheckPauseDestination(d); err != nil {
		return false, err
	}
	n, err := s.underCancelLock(ctx, "pause "+d.String(), stmt{`INSERT INTO ` + s.qs + `.paused AS p (exchange, destination, since, paused_by)
VALUES ($1, $2, $3, $4) ON CONFLICT (exchange, destination) DO UPDATE SET resuming = false WHERE p.resuming`,
		[]any{d.Exchange, d.Key, ts(s.now()), by}})
	if err != nil {
		return false, err
	}
	mark := s.pauseQuery(`
WITH c AS (SELECT id FROM {{t}} WHERE id > $3 ORDER BY id LIMIT $4),
u AS (
	UPDATE {{t}} t SET paused = true FROM c
	WHERE t.id = c.id AND t.exchange = $1 AND t.destination = $2 AND NOT t.paused
	AND ` + pausedExists + `NOT p.resuming` + pausedExistsTail + `
	RETURNING 1
)
SELECT (SELECT max(id) FROM c), ` + pausedExists + `NOT p.resuming` + pausedExistsTail)
	last := ""
	for {
		var next pgtype.Text
		var still bool
		err := s.sharedChunk(ctx, "pause "+d.String()+": mark its rows", func(ctx context.Context, tx pgx.Tx) error {
			return tx.QueryRow(ctx, mark, d.Exchange, d.Key, last, pauseScanChunk).Scan(&next, &still)
		})
		if err != nil {
			return false, err
		}
		if !next.Valid || !still {
			return n == 1, nil // the end of the table, or resumed meanwhile
		}
		last = next.String
	}
}

// Resume ends d's pause: it sets resuming (from then on inserts store d's
// rows unmarked), unmarks d's rows in chunks, then deletes the pause,
// unmarking any row left, under the exclusive lock.
func (s *Store) Resume(ctx context.Context, d wire.Destination) (bool, error) {
	if err := storage.CheckPauseDestination(d); err != nil {
		return false, err
	}
	n, err := s.underCancelLock(ctx, "resume "+d.String(),
		stmt{`UPDATE ` + s.qs + `.paused SET resuming = true WHERE exchange = $1 AND destination = $2`, []any{d.Exchange, d.Key}})
	if err != nil || n == 0 {
		return false, err
	}
	unmark := s.pauseQuery(`
WITH c AS (
	SELECT id FROM {{t}} WHERE exchange = $1 AND destination = $2 AND paused
	AND ` + pausedExists + `p.resuming` + pausedExistsTail + `
	ORDER BY id LIMIT $3
)
UPDATE {{t}} t SET paused = false FROM c WHERE t.id = c.id`)
	for {
		var changed int64
		err := s.sharedChunk(ctx, "resume "+d.String()+": unmark its rows", func(ctx context.Context, tx pgx.Tx) error {
			ct, err := tx.Exec(ctx, unmark, d.Exchange, d.Key, resumeChunk)
			changed = ct.RowsAffected()
			return err
		})
		if err != nil {
			return false, err
		}
		if changed < int64(resumeChunk) {
			break
		}
	}
	_, err = s.underCancelLock(ctx, "resume "+d.String(),
		stmt{`DELETE FROM ` + s.qs + `.paused WHERE exchange = $1 AND destination = $2 AND resuming`, []any{d.Exchange, d.Key}},
		stmt{s.pauseQuery(`UPDATE {{t}} SET paused = false WHERE exchange = $1 AND destination = $2 AND paused
AND NOT EXISTS (SELECT 1 FROM {{p}} p WHERE p.exchange = $1 AND p.destination = $2)`), []any{d.Exchange, d.Key}})
	if err != nil {
		return false, err
	}
	return true, nil
}

// pauseQuery fills in the table names of q.
func (s *Store) pauseQuery(q string) string {
	return strings.NewReplacer("{{t}}", s.q.table, "{{p}}", s.qs+".paused").Replace(q)
}

// sharedChunk runs fn in a transaction holding the cancel lock shared, as
// inserts hold it: a Pause or Resume cannot change the table meanwhile.
func (s *Store) sharedChunk(ctx context.Context, op string, fn func(ctx context.Context, tx pgx.Tx) error) error {
	return s.run(ctx, op, func(ctx context.Context) error {
		return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock_shared($1)`, s.cancelKey); err != nil {
				return err
			}
			return fn(ctx, tx)
		})
	})
}

// stmt is a statement and its arguments.
type stmt struct {
	sql  string
	args []any
}

// underCancelLock runs stmts in one transaction, in one round trip, under
// the cancel lock held exclusively, and returns how many rows the first
// changed.
func (s *Store) underCancelLock(ctx context.Context, op string, stmts ...stmt) (int64, error) {
	var n int64
	err := s.run(ctx, op, func(ctx context.Context) error {
		return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) (err error) {
			b := s.cancelLocked()
			locking := b.Len()
			for _, st := range stmts {
				b.Queue(st.sql, st.args...)
			}
			br := tx.SendBatch(ctx, b)
			defer func() {
				if cerr := br.Close(); err == nil {
					err = cerr
				}
			}()
			for i := range b.Len() {
				ct, err := br.Exec()
				if err != nil {
					return err
				}
				if i == locking {
					n = ct.RowsAffected()
				}
			}
			return nil
		})
	})
	return n, err
}

// Paused lists the paused destinations, those being resumed included (their
// rows are held until the resume completes); see storage.Pauser.
func (s *Store) Paused(ctx context.Context) ([]storage.PausedDestination, error) {
	var out []storage.PausedDestination
	err := s.run(ctx, "paused", func(ctx context.Context) error {
		rows, err := s.pool.Query(ctx, `SELECT exchange, destination, since, paused_by FROM `+s.qs+`.paused`)
		if err != nil {
			return err
		}
		out = out[:0]
		var p storage.PausedDestination
		_, err = pgx.ForEachRow(rows, []any{&p.Destination.Exchange, &p.Destination.Key, &p.Since, &p.By}, func() error {
			p.Since = p.Since.UTC()
			out = append(out, p)
			return nil
		})
		return err
	})
	if err != nil {
		return nil, err
	}
	storage.SortPaused(out)
	return out, nil
}
