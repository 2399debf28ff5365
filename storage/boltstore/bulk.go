package boltstore

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/delaybridge/delaybridge/storage"
)

// bulkVisit bounds the rows one read transaction of Bulk looks at: a filter
// that selects few of many rows (a header) is walked in many short reads,
// not one long one, which would keep bbolt from reusing pages and remapping
// the file meanwhile.
const bulkVisit = 16 * storage.BulkChunk

// Bulk applies a to every row f selects; see storage.Bulker. Each chunk is
// two steps: a read transaction walks the rows in due order from where the last
// chunk stopped and picks up to storage.BulkChunk selected ids, then one
// write (through the group commit, like every write) reloads each, checks
// it still is selected, pins it as Cancel and Reschedule do (a row under a
// live lease is counted as leased and left), and changes it. The writer is
// held for one chunk at a time.
//
// A row is changed at most once: the walk goes the way the rows move. A
// cancel removes rows; a shift later walks from the latest due time down
// and a shift earlier from the earliest up, so a moved row lands behind
// the walk; a set due time may move rows ahead of it, but a row found
// already due at that time (with no retry hold) is skipped, not counted.
func (s *Store) Bulk(ctx context.Context, f storage.ListFilter, a storage.BulkAction) (storage.BulkResult, error) {
	var res storage.BulkResult
	if err := storage.CheckBulk(&f, a); err != nil {
		return res, fmt.Errorf("boltstore: bulk: %w", err)
	}
	desc := a.Kind == storage.BulkShift && a.Shift > 0
	var resume []byte
	for {
		ids, last, done, err := s.bulkScan(ctx, &f, a, resume, desc)
		if err == nil && len(ids) > 0 {
			err = s.bulkApply(ctx, &f, a, ids, &res)
		}
		if err != nil {
			return res, fmt.Errorf("boltstore: bulk: %w", err)
		}
		if done {
			return res, nil
		}
		resume = last
	}
}

// skipBulk reports whether a's change would leave t as it is.
func skipBulk(a storage.BulkAction, t *storage.Timeout) bool {
	return a.Kind == storage.BulkSetDue && t.DueAt.Equal(a.DueAt) && t.NotBefore.IsZero()
}

// bulkScan walks the rows in due order (dueWalk) after resume (before it
// when desc; nil: from the start of f's due range) and returns up to
// storage.BulkChunk ids that f selects, the due key of the last row it
// looked at, and whether the walk reached the end.
func (s *Store) bulkScan(ctx context.Context, f *storage.ListFilter, a storage.BulkAction, resume []byte, desc bool) (ids []string, last []byte, done bool, err error) {
	exit, err := s.enter(ctx)
	if err != nil {
		return nil, nil, false, err
	}
	defer exit()
	seek := resume
	switch {
	case seek != nil:
	case !desc && !f.DueFrom.IsZero():
		seek = binary.BigEndian.AppendUint64(nil, keyTime(f.DueFrom))
	case desc && !f.DueTo.IsZero() && keyTime(f.DueTo) < math.MaxUint64:
		// The last key before the first one past DueTo's time (clamped
		// times tie there; Selects decides).
		seek = binary.BigEndian.AppendUint64(nil, keyTime(f.DueTo)+1)
	}
	err = s.view(func(tx *bolt.Tx) error {
		b, err := buckets(tx, nil)
		if err != nil {
			return err
		}
		visited := 0
		done = true
		return b.dueWalk(seek, resume != nil, desc, f.HeaderName != "", func(k []byte, r *row) bool {
			if !inDueRange(k, f, desc) {
				return false
			}
			if r == nil {
				return true
			}
			if visited == bulkVisit || len(ids) == storage.BulkChunk {
				done = false
				return false
			}
			visited++
			last = bytes.Clone(k)
			if f.Selects(&r.Timeout) && !skipBulk(a, &r.Timeout) {
				ids = append(ids, r.ID)
			}
			return true
		})
	})
	return ids, last, done, err
}

// dueWalk walks the rows in due order, ties by id (backwards when desc), as
// List does: ready, in which a row that is not held sits at its due time,
// merged with held. It starts at seek (after it when exclusive; before it
// when desc; nil: at the first or the last row) and calls fn with each
// index key and its row, loaded with its message when withMessage, until fn
// returns false. A held row's entry in ready comes with a nil row: it is
// not at its due time there, but fn may still end the walk at its key.
func (b txb) dueWalk(seek []byte, exclusive, desc, withMessage bool, fn func(k []byte, r *row) bool) error {
	pos := func(c *bolt.Cursor) (k, v []byte) {
		switch {
		case seek == nil && desc:
			return c.Last()
		case seek == nil:
			return c.First()
		case desc:
			if k, _ = c.Seek(seek); k == nil {
				return c.Last()
			}
			return c.Prev()
		}
		if k, v = c.Seek(seek); exclusive && k != nil && bytes.Equal(k, seek) {
			k, v = c.Next()
		}
		return k, v
	}
	step := func(c *bolt.Cursor) (k, v []byte) {
		if desc {
			return c.Prev()
		}
		return c.Next()
	}
	rc, hc := b.ready.Cursor(), b.held.Cursor()
	rk, rv := pos(rc)
	hk, hv := pos(hc)
	for rk != nil || hk != nil {
		k, v, fromHeld := rk, rv, false
		if hk != nil && (rk == nil || (bytes.Compare(hk, rk) < 0) != desc) {
			k, v, fromHeld = hk, hv, true
			hk, hv = step(hc)
		} else {
			rk, rv = step(rc)
		}
		key := readyKey
		if fromHeld {
			key = dueKey
		}
		r, err := b.indexed(k, v, key, withMessage)
		if err != nil {
			return err
		}
		if !fromHeld && held(&r.Timeout) {
			r = nil
		}
		if !fn(k, r) {
			return nil
		}
	}
	return nil
}

// inDueRange reports whether the walk has not yet passed the end of f's
// due range at due key k.
func inDueRange(k []byte, f *storage.ListFilter, desc bool) bool {
	at := binary.BigEndian.Uint64(k[:8])
	if desc {
		return f.DueFrom.IsZero() || at >= keyTime(f.DueFrom)
	}
	return f.DueTo.IsZero() || at <= keyTime(f.DueTo)
}

// bulkApply changes the rows ids in one write and adds to res what it did.
func (s *Store) bulkApply(ctx context.Context, f *storage.ListFilter, a storage.BulkAction, ids []string, res *storage.BulkResult) error {
	var got storage.BulkResult
	err := s.pinnedWrite(ctx, func(_ *bolt.Tx, b txb, pins *pinSet, now time.Time) error {
		got = storage.BulkResult{}
		for _, id := range ids {
			r, err := b.load(id)
			if err != nil {
				return err
			}
			if r == nil || !f.Selects(&r.Timeout) || skipBulk(a, &r.Timeout) {
				continue // gone or changed since the scan
			}
			due := a.DueAt
			if a.Kind == storage.BulkShift {
				due = r.DueAt.Add(a.Shift)
				if (a.Shift > 0 && due.Before(r.DueAt)) || storage.CheckDueAt(due) != nil {
					got.OutOfRange++
					continue
				}
			}
			if err := pins.pin(id, now); err != nil {
				got.Leased++
				continue
			}
			if a.Kind == storage.BulkCancel {
				if err := b.forget(r); err != nil {
					return err
				}
				err = s.tombstone(b, id, now)
			} else {
				err = b.moveDue(r, due)
			}
			if err != nil {
				return err
			}
			got.Changed++
		}
		return nil
	})
	if err != nil {
		return err
	}
	res.Changed += got.Changed
	res.Leased += got.Leased
	res.OutOfRange += got.OutOfRange
	return nil
}
