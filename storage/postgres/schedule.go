package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/delaybridge/delaybridge/storage"
)

var _ storage.Scheduler = (*Store)(nil)

// Recurring schedules (storage.Scheduler) are rows of <schema>.schedules
// (schema version 9); a fire is a row of timeouts whose saga_id is the
// schedule's key. FireDue locks the due schedules with FOR UPDATE SKIP
// LOCKED, stores their fires and moves them on in one transaction, so two
// instances never plan one schedule at once, and the one that comes second
// sees it moved on. The fire row's key is a function of the fire time
// (storage.FireID) and goes in with ON CONFLICT DO NOTHING: even a repeat
// of a commit whose answer was lost cannot add a second row. The cancels of
// fires (put, pause, cancel) run under the cancel lock held exclusively, as
// CancelSaga, and FireDue's inserts under it held shared, as Insert's.

const scheduleCols = `key, source, expr, zone, start_at, end_at, misfire, description, destination, exchange,
	message, token, next_fire_at, prev_fire_at, paused, generation, fires, misfires, last_error, updated_at`

type scheduleScan struct {
	s                               storage.Schedule
	start, end, next, prev, updated pgtype.Timestamptz
	misfire                         int32
}

func (r *scheduleScan) dest() []any {
	return []any{&r.s.Key, &r.s.Source, &r.s.Expr, &r.s.Zone, &r.start, &r.end, &r.misfire, &r.s.Description,
		&r.s.Destination, &r.s.Exchange, &r.s.Message, &r.s.Token, &r.next, &r.prev, &r.s.Paused, &r.s.Generation,
		&r.s.Fires, &r.s.Misfires, &r.s.LastError, &r.updated}
}

func (r *scheduleScan) schedule() storage.Schedule {
	s := r.s
	s.Start, s.End, s.NextFireAt, s.PrevFireAt, s.UpdatedAt = fromTS(r.start), fromTS(r.end), fromTS(r.next), fromTS(r.prev), fromTS(r.updated)
	s.Misfire = int(r.misfire)
	return s
}

func collectSchedules(rows pgx.Rows) ([]storage.Schedule, error) {
	var out []storage.Schedule
	var r scheduleScan
	_, err := pgx.ForEachRow(rows, r.dest(), func() error {
		out = append(out, r.schedule())
		r = scheduleScan{}
		return nil
	})
	return out, err
}

// schedTx runs fn in one transaction, retried as every call.
func (s *Store) schedTx(ctx context.Context, op string, fn func(ctx context.Context, tx pgx.Tx, now time.Time) error) error {
	return s.run(ctx, op, func(ctx context.Context) error {
		tx, err := s.pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		if err := fn(ctx, tx, ts(s.now())); err != nil {
			return err
		}
		return tx.Commit(ctx)
	})
}

// PutSchedule creates or replaces a schedule; see storage.Scheduler.
func (s *Store) PutSchedule(ctx context.Context, in storage.Schedule) (storage.Schedule, error) {
	if err := storage.CheckSchedule(&in); err != nil {
		return storage.Schedule{}, err
	}
	msg := in.Message
	if msg == nil {
		msg = []byte{}
	}
	var out storage.Schedule
	var cancelled int
	err := s.schedTx(ctx, fmt.Sprintf("put schedule %q", in.Key), func(ctx context.Context, tx pgx.Tx, now time.Time) error {
		n, _, err := s.cancelGroups(ctx, tx, []string{in.Key}, nil, now)
		if err != nil {
			return err
		}
		cancelled = n
		// cancelGroups holds the cancel lock exclusively: a cancel of the
		// name committed before this transaction is seen here, one after
		// it finds the schedule.
		var dead bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+s.qs+`.cancelled WHERE id = $1 AND expires_at > $2)`,
			storage.ScheduleName(in.Key), now).Scan(&dead); err != nil {
			return err
		}
		if dead {
			return storage.ErrScheduleCancelled
		}
		rows, err := tx.Query(ctx, `
INSERT INTO `+s.qs+`.schedules AS s (`+scheduleCols+`)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, NULL, false, 1, 0, 0, '', $14)
ON CONFLICT (key) DO UPDATE SET source = EXCLUDED.source, expr = EXCLUDED.expr, zone = EXCLUDED.zone,
	start_at = EXCLUDED.start_at, end_at = EXCLUDED.end_at, misfire = EXCLUDED.misfire,
	description = EXCLUDED.description, destination = EXCLUDED.destination, exchange = EXCLUDED.exchange,
	message = EXCLUDED.message, token = EXCLUDED.token, next_fire_at = EXCLUDED.next_fire_at,
	prev_fire_at = NULL, paused = false, generation = s.generation + 1, fires = 0, misfires = 0,
	last_error = '', updated_at = EXCLUDED.updated_at
RETURNING `+scheduleCols,
			in.Key, in.Source, in.Expr, in.Zone, nullTS(in.Start), nullTS(in.End), int32(in.Misfire), in.Description,
			in.Destination, in.Exchange, msg, in.Token, nullTSUp(in.NextFireAt), now)
		if err != nil {
			return err
		}
		got, err := collectSchedules(rows)
		if err != nil {
			return err
		}
		if len(got) != 1 {
			return fmt.Errorf("upsert returned %d rows", len(got))
		}
		out = got[0]
		return nil
	})
	if err != nil {
		return storage.Schedule{}, err
	}
	s.stats.addPending(-cancelled)
	return out, nil
}

// CancelSchedule deletes a schedule and its pending fires; see storage.Scheduler.
func (s *Store) CancelSchedule(ctx context.Context, key string) (bool, error) {
	found, cancelled := false, 0
	err := s.schedTx(ctx, fmt.Sprintf("cancel schedule %q", key), func(ctx context.Context, tx pgx.Tx, now time.Time) error {
		n, _, err := s.cancelGroups(ctx, tx, []string{key}, nil, now)
		if err != nil {
			return err
		}
		ct, err := tx.Exec(ctx, `DELETE FROM `+s.qs+`.schedules WHERE key = $1`, key)
		if err != nil {
			return err
		}
		found, cancelled = ct.RowsAffected() == 1, n
		return nil
	})
	if err != nil {
		return false, err
	}
	s.stats.addPending(-cancelled)
	return found, nil
}

// PauseSchedule holds a schedule; see storage.Scheduler.
func (s *Store) PauseSchedule(ctx context.Context, key string) (bool, error) {
	return s.setSchedulePaused(ctx, key, true)
}

// ResumeSchedule ends a schedule's hold; see storage.Scheduler.
func (s *Store) ResumeSchedule(ctx context.Context, key string) (bool, error) {
	return s.setSchedulePaused(ctx, key, false)
}

func (s *Store) setSchedulePaused(ctx context.Context, key string, paused bool) (bool, error) {
	changed, cancelled := false, 0
	err := s.schedTx(ctx, fmt.Sprintf("pause/resume schedule %q", key), func(ctx context.Context, tx pgx.Tx, now time.Time) error {
		changed, cancelled = false, 0
		var was bool
		err := tx.QueryRow(ctx, `SELECT paused FROM `+s.qs+`.schedules WHERE key = $1 FOR UPDATE`, key).Scan(&was)
		if errors.Is(err, pgx.ErrNoRows) {
			return storage.ErrScheduleNotFound
		}
		if err != nil {
			return err
		}
		if paused {
			// Fires stored but not yet leased would leak through the pause.
			if cancelled, _, err = s.cancelGroups(ctx, tx, []string{key}, nil, now); err != nil {
				return err
			}
		}
		if was == paused {
			return nil
		}
		_, err = tx.Exec(ctx, `UPDATE `+s.qs+`.schedules SET paused = $2, updated_at = $3 WHERE key = $1`, key, paused, now)
		changed = err == nil
		return err
	})
	if err != nil {
		return false, err
	}
	s.stats.addPending(-cancelled)
	return changed, nil
}

// GetSchedule returns a schedule; see storage.Scheduler.
func (s *Store) GetSchedule(ctx context.Context, key string) (storage.Schedule, error) {
	var got []storage.Schedule
	err := s.run(ctx, fmt.Sprintf("get schedule %q", key), func(ctx context.Context) error {
		rows, err := s.pool.Query(ctx, `SELECT `+scheduleCols+` FROM `+s.qs+`.schedules WHERE key = $1`, key)
		if err != nil {
			return err
		}
		got, err = collectSchedules(rows)
		return err
	})
	if err != nil {
		return storage.Schedule{}, err
	}
	if len(got) == 0 {
		return storage.Schedule{}, storage.ErrScheduleNotFound
	}
	return got[0], nil
}

// ListSchedules pages through the schedules in key order; see storage.Scheduler.
func (s *Store) ListSchedules(ctx context.Context, after string, limit int) ([]storage.Schedule, string, error) {
	if limit <= 0 {
		return nil, "", errors.New("postgres: list schedules: limit must be positive")
	}
	var got []storage.Schedule
	err := s.run(ctx, "list schedules", func(ctx context.Context) error {
		rows, err := s.pool.Query(ctx, `SELECT `+scheduleCols+` FROM `+s.qs+`.schedules WHERE key > $1 ORDER BY key LIMIT $2`, after, limit+1)
		if err != nil {
			return err
		}
		got, err = collectSchedules(rows)
		return err
	})
	if err != nil {
		return nil, "", err
	}
	next := ""
	if len(got) > limit {
		got = got[:limit]
		next = got[limit-1].Key
	}
	for i := range got {
		got[i].Message = nil
	}
	return got, next, nil
}

// NextScheduleDue returns the earliest next fire time; see storage.Scheduler.
func (s *Store) NextScheduleDue(ctx context.Context) (time.Time, bool, error) {
	var at pgtype.Timestamptz
	err := s.run(ctx, "next schedule due", func(ctx context.Context) error {
		return s.pool.QueryRow(ctx, `SELECT next_fire_at FROM `+s.qs+`.schedules
WHERE NOT paused AND next_fire_at IS NOT NULL ORDER BY next_fire_at LIMIT 1`).Scan(&at)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return time.Time{}, false, nil
	}
	if err != nil {
		return time.Time{}, false, err
	}
	return fromTS(at), at.Valid, nil
}

// fireTx runs fn in a transaction that stores fires, and commits it. It
// holds the cancel lock shared, as Insert: a cancel of the key (put, pause,
// cancel) that committed first has its tombstones seen; one that comes
// later waits and then finds the fire rows.
func (s *Store) fireTx(ctx context.Context, fn func(tx pgx.Tx) error) error {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock_shared($1)`, s.cancelKey); err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// FireDue stores the due schedules' fires; see storage.Scheduler.
func (s *Store) FireDue(ctx context.Context, now time.Time, lead time.Duration, limit int, plan storage.Planner) ([]storage.Fired, error) {
	if limit <= 0 {
		return nil, errors.New("postgres: fire due: limit must be positive")
	}
	var out []storage.Fired
	stored := 0
	err := s.run(ctx, "fire due schedules", func(ctx context.Context) error {
		out, stored = nil, 0
		return s.fireTx(ctx, func(tx pgx.Tx) error {
			rows, err := tx.Query(ctx, `SELECT `+scheduleCols+` FROM `+s.qs+`.schedules
WHERE NOT paused AND next_fire_at IS NOT NULL AND next_fire_at <= $1
ORDER BY next_fire_at LIMIT $2 FOR UPDATE SKIP LOCKED`, ts(now.Add(lead)), limit)
			if err != nil {
				return err
			}
			due, err := collectSchedules(rows)
			if err != nil || len(due) == 0 {
				return err
			}
			var fires []storage.Timeout
			var fireOf []int
			keys := make([]string, len(due))
			nexts, prevs := make([]pgtype.Timestamptz, len(due)), make([]pgtype.Timestamptz, len(due))
			fireCounts, misfireCounts := make([]int64, len(due)), make([]int64, len(due))
			lastErrs := make([]string, len(due))
			for i := range due {
				sc := &due[i]
				p := plan(sc, now)
				f := storage.ApplyPlan(sc, p)
				if f.ID != "" {
					fires = append(fires, storage.FireRow(sc, &f, &p, now))
					fireOf = append(fireOf, i)
				}
				out = append(out, f)
				keys[i], nexts[i], prevs[i] = sc.Key, nullTSUp(sc.NextFireAt), nullTS(sc.PrevFireAt)
				fireCounts[i], misfireCounts[i], lastErrs[i] = sc.Fires, sc.Misfires, sc.LastError
			}
			if len(fires) > 0 {
				fkeys, idx := make([]string, len(fires)), make([]int, len(fires))
				outcomes := make([]storage.Outcome, len(fires))
				for j := range fires {
					fkeys[j], idx[j] = fires[j].ID, j
				}
				// insertAt: under its own key only, not when taken (ON
				// CONFLICT DO NOTHING) nor when tombstoned.
				if stored, err = s.insertKeyed(ctx, tx, s.q.insertAt, fires, fkeys, idx, outcomes, ts(now)); err != nil {
					return err
				}
				for j, i := range fireOf {
					out[i].Stored = outcomes[j] == storage.Stored
				}
			}
			if _, err := tx.Exec(ctx, `UPDATE `+s.qs+`.schedules s SET next_fire_at = u.next, prev_fire_at = u.prev,
	fires = u.fires, misfires = u.misfires, last_error = u.last_error
FROM unnest($1::text[], $2::timestamptz[], $3::timestamptz[], $4::bigint[], $5::bigint[], $6::text[])
	AS u(key, next, prev, fires, misfires, last_error)
WHERE s.key = u.key COLLATE "C"`, keys, nexts, prevs, fireCounts, misfireCounts, lastErrs); err != nil {
				return err
			}
			return nil
		})
	})
	if err != nil {
		return nil, err
	}
	s.stats.addPending(stored)
	return out, nil
}

// FireNow stores an extra fire of a schedule; see storage.Scheduler.
func (s *Store) FireNow(ctx context.Context, key string, now time.Time, msg storage.FireMessage) (storage.Fired, error) {
	var out storage.Fired
	stored := 0
	err := s.run(ctx, fmt.Sprintf("fire schedule %q now", key), func(ctx context.Context) error {
		out, stored = storage.Fired{}, 0
		return s.fireTx(ctx, func(tx pgx.Tx) error {
			rows, err := tx.Query(ctx, `SELECT `+scheduleCols+` FROM `+s.qs+`.schedules WHERE key = $1 FOR UPDATE`, key)
			if err != nil {
				return err
			}
			got, err := collectSchedules(rows)
			if err != nil {
				return err
			}
			if len(got) == 0 {
				return storage.ErrScheduleNotFound
			}
			row, f, err := storage.NowFire(&got[0], now, msg)
			if err != nil {
				return err
			}
			outcomes := make([]storage.Outcome, 1)
			if stored, err = s.insertKeyed(ctx, tx, s.q.insertAt, []storage.Timeout{row}, []string{row.ID}, []int{0}, outcomes, ts(now)); err != nil {
				return err
			}
			f.Stored = outcomes[0] == storage.Stored
			if f.Stored {
				if _, err := tx.Exec(ctx, `UPDATE `+s.qs+`.schedules SET fires = fires + 1 WHERE key = $1`, key); err != nil {
					return err
				}
			}
			out = f
			return nil
		})
	})
	if err != nil {
		return storage.Fired{}, err
	}
	s.stats.addPending(stored)
	return out, nil
}
