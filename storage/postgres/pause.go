package postgres

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/wire"
)

var _ storage.Pauser = (*Store)(nil)

// Pauses (storage.Pauser) are rows of <schema>.paused, and each row of a
// paused destination has paused set, which keeps it out of the index Lease
// and NextDue read (timeouts_unpaused_ready; see schema version 7). Insert
// sets paused from the table, under the cancel lock held shared; Pause and
// Resume change the table under it held exclusively. So an insert either
// committed before the change, and the change finds its rows, or it sees
// the change. Every instance reads the same table: a pause holds on all.

// Pause holds d's rows; see storage.Pauser. Two transactions: the first
// records the pause under the exclusive cancel lock (briefly: from then on
// inserts store d's rows paused); the second marks d's rows that are
// already stored, which reads the whole table (there is no index by
// destination), under the lock held shared, as inserts hold it, so it
// does not stop them. It marks them only while the pause is still there
// (a Resume cannot commit in between). A second Pause of a paused
// destination runs the second step again: it completes a pause whose
// first call failed after the first step.
func (s *Store) Pause(ctx context.Context, d wire.Destination, by string) (bool, error) {
	if err := storage.CheckPauseDestination(d); err != nil {
		return false, err
	}
	n, err := s.underCancelLock(ctx, "pause "+d.String(), stmt{`INSERT INTO ` + s.qs + `.paused (exchange, destination, since, paused_by)
VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING`, []any{d.Exchange, d.Key, ts(s.now()), by}})
	if err != nil {
		return false, err
	}
	err = s.run(ctx, "pause "+d.String()+": mark its rows", func(ctx context.Context) error {
		return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock_shared($1)`, s.cancelKey); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `UPDATE `+s.q.table+` t SET paused = true
WHERE exchange = $1 AND destination = $2 AND NOT paused
AND EXISTS (SELECT 1 FROM `+s.qs+`.paused p WHERE p.exchange = $1 AND p.destination = $2)`, d.Exchange, d.Key)
			return err
		})
	})
	if err != nil {
		return false, err
	}
	return n == 1, nil
}

// Resume ends d's pause and clears the mark of its rows (index
// timeouts_paused) in one transaction, under the exclusive cancel lock.
func (s *Store) Resume(ctx context.Context, d wire.Destination) (bool, error) {
	if err := storage.CheckPauseDestination(d); err != nil {
		return false, err
	}
	n, err := s.underCancelLock(ctx, "resume "+d.String(),
		stmt{`DELETE FROM ` + s.qs + `.paused WHERE exchange = $1 AND destination = $2`, []any{d.Exchange, d.Key}},
		stmt{`UPDATE ` + s.q.table + ` SET paused = false WHERE exchange = $1 AND destination = $2 AND paused`, []any{d.Exchange, d.Key}})
	if err != nil {
		return false, err
	}
	return n == 1, nil
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

// Paused lists the paused destinations; see storage.Pauser.
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
