package postgres

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/delaybridge/delaybridge/storage"
)

// keyset is a position in (due_at, id) order.
type keyset struct {
	due time.Time
	id  string
}

// bulkPage reads up to limit rows after from (before it when desc; nil: from
// the start) in (due_at, id) order that the SQL part of f selects, plus
// extra conditions, over the index timeouts_due. It returns the ids of those
// f selects (the header is tested here, on the message, which is read only
// when f has a header), the position of the last row read, and whether the
// walk reached the end.
func (s *Store) bulkPage(ctx context.Context, f *storage.ListFilter, extra func(arg func(any) string) []string,
	from *keyset, desc bool, limit int) (ids []string, last *keyset, done bool, err error) {
	var args []any
	arg := func(v any) string {
		args = append(args, v)
		return "$" + strconv.Itoa(len(args))
	}
	conds := filterConds(f, arg)
	if extra != nil {
		conds = append(conds, extra(arg)...)
	}
	order, cmp := "due_at, id", ">"
	if desc {
		order, cmp = "due_at DESC, id DESC", "<"
	}
	if from != nil {
		conds = append(conds, fmt.Sprintf("(due_at, id) %s (%s, %s)", cmp, arg(from.due), arg(from.id)))
	}
	cols := "id, due_at, NULL::bytea"
	if f.HeaderName != "" {
		cols = "id, due_at, message"
	}
	query := "SELECT " + cols + " FROM " + s.q.table
	if len(conds) > 0 {
		query += " WHERE " + strings.Join(conds, " AND ")
	}
	query += " ORDER BY " + order + " LIMIT " + arg(int64(limit))
	err = s.run(ctx, "bulk scan", func(ctx context.Context) error {
		ids, last = ids[:0], nil
		rows, err := s.pool.Query(ctx, query, args...)
		if err != nil {
			return err
		}
		var (
			t storage.Timeout
			n int
		)
		_, err = pgx.ForEachRow(rows, []any{&t.ID, &t.DueAt, &t.Message}, func() error {
			n++
			last = &keyset{due: t.DueAt, id: t.ID}
			if f.HeaderName == "" || f.Selects(&t) {
				ids = append(ids, t.ID)
			}
			return nil
		})
		done = n < limit
		return err
	})
	return ids, last, done, err
}

// headerPage returns the ids of List's page when f has a header: up to
// f.Limit+1 ids (one more tells List there is a next page), walked from
// f.After in pages of storage.BulkChunk rows.
func (s *Store) headerPage(ctx context.Context, f storage.ListFilter) ([]string, error) {
	var from *keyset
	if f.After != "" {
		due, id, err := decodeCursor(f.After)
		if err != nil {
			return nil, err
		}
		from = &keyset{due, id}
	}
	var out []string
	for len(out) <= f.Limit {
		ids, last, done, err := s.bulkPage(ctx, &f, nil, from, false, storage.BulkChunk)
		if err != nil {
			return nil, err
		}
		out = append(out, ids...)
		if done {
			break
		}
		from = last
	}
	if out == nil {
		out = []string{}
	}
	return out, nil
}

// Bulk applies a to every row f selects; see storage.Bulker. Each chunk is
// a keyset read of up to storage.BulkChunk row ids over the index
// timeouts_due (the header, when f has one, tested on the messages read
// along), then one statement that locks those rows in id order, checks
// each again (its due time may have changed), leaves those under a live
// lease (counted as leased) and changes the others; a cancel chunk also
// leaves their tombstones and, like Cancel, holds the cancel lock, so
// inserts under way commit first. Lease skips the rows the statement
// holds, so a row is never both changed and delivered.
//
// The walk goes the way rows move, so none is changed twice (see the
// boltstore's Bulk): down for a shift later, up otherwise, and a row
// already due at a set due time is not selected.
func (s *Store) Bulk(ctx context.Context, f storage.ListFilter, a storage.BulkAction) (storage.BulkResult, error) {
	var res storage.BulkResult
	if err := storage.CheckBulk(&f, a); err != nil {
		return res, fmt.Errorf("postgres: bulk: %w", err)
	}
	desc := a.Kind == storage.BulkShift && a.Shift > 0
	var notAt func(arg func(any) string) []string
	if a.Kind == storage.BulkSetDue {
		notAt = func(arg func(any) string) []string {
			return []string{"NOT (due_at = " + arg(tsUp(a.DueAt)) + " AND not_before IS NULL)"}
		}
	}
	var from *keyset
	for {
		ids, last, done, err := s.bulkPage(ctx, &f, notAt, from, desc, storage.BulkChunk)
		if err == nil && len(ids) > 0 {
			err = s.bulkApply(ctx, &f, a, notAt, ids, &res)
		}
		if err != nil {
			return res, fmt.Errorf("postgres: bulk: %w", err)
		}
		if done {
			return res, nil
		}
		from = last
	}
}

// bulkApply changes the rows ids with one statement (in one transaction)
// and adds to res what it did.
func (s *Store) bulkApply(ctx context.Context, f *storage.ListFilter, a storage.BulkAction,
	extra func(arg func(any) string) []string, ids []string, res *storage.BulkResult) error {
	now := ts(s.now())
	var args []any
	arg := func(v any) string {
		args = append(args, v)
		return "$" + strconv.Itoa(len(args))
	}
	conds := append([]string{"id = ANY(" + arg(ids) + "::text[])"}, filterConds(f, arg)...)
	if extra != nil {
		conds = append(conds, extra(arg)...)
	}
	oor := "false"
	newDue := ""
	switch a.Kind {
	case storage.BulkSetDue:
		newDue = arg(tsUp(a.DueAt))
	case storage.BulkShift:
		newDue = "t.due_at + " + arg(a.Shift.Microseconds()) + "::bigint * interval '1 microsecond'"
		oor = "due_at + " + arg(a.Shift.Microseconds()) + "::bigint * interval '1 microsecond' > " + arg(ts(storage.MaxDueAt))
	}
	cur := `WITH cur AS (
	SELECT id, coalesce(lock_token IS NOT NULL AND lock_expires_at > ` + arg(now) + `, false) AS busy, ` + oor + ` AS oor
	FROM ` + s.q.table + ` WHERE ` + strings.Join(conds, " AND ") + `
	ORDER BY id
	FOR UPDATE
)`
	var stmt string
	if a.Kind == storage.BulkCancel {
		stmt = cur + `, done AS (
	DELETE FROM ` + s.q.table + ` t USING cur WHERE t.id = cur.id AND NOT cur.busy
	RETURNING t.id
), tomb AS (
	INSERT INTO ` + s.qs + `.cancelled AS c (id, expires_at) SELECT DISTINCT ` + messageIDSQL("id") + `, ` + arg(tsUp(now.Add(s.window))) + `::timestamptz FROM done ORDER BY 1
	ON CONFLICT (id) DO UPDATE SET expires_at = greatest(c.expires_at, EXCLUDED.expires_at)
)`
	} else {
		stmt = cur + `, done AS (
	UPDATE ` + s.q.table + ` t SET due_at = ` + newDue + `, not_before = NULL, lock_token = NULL, lock_expires_at = NULL
	FROM cur WHERE t.id = cur.id AND NOT cur.busy AND NOT cur.oor
	RETURNING t.id
)`
	}
	stmt += `
SELECT (SELECT count(*) FROM done), (SELECT count(*) FROM cur WHERE busy AND NOT oor), (SELECT count(*) FROM cur WHERE oor)`
	var changed, leased, outOfRange int64
	err := s.run(ctx, "bulk", func(ctx context.Context) error {
		tx, err := s.pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		b := &pgx.Batch{}
		if a.Kind == storage.BulkCancel {
			b = s.cancelLocked()
		}
		b.Queue(stmt, args...)
		err = func() (err error) {
			br := tx.SendBatch(ctx, b)
			defer func() {
				if cerr := br.Close(); err == nil {
					err = cerr
				}
			}()
			for range b.Len() - 1 {
				if _, err := br.Exec(); err != nil {
					return err
				}
			}
			return br.QueryRow().Scan(&changed, &leased, &outOfRange)
		}()
		if err != nil {
			return err
		}
		return tx.Commit(ctx)
	})
	if err != nil {
		return err
	}
	if a.Kind == storage.BulkCancel {
		s.stats.addPending(-int(changed))
	}
	res.Changed += int(changed)
	res.Leased += int(leased)
	res.OutOfRange += int(outOfRange)
	return nil
}
