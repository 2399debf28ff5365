package boltstore

import (
	"errors"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/delaybridge/delaybridge/storage"
)

// Group commit. bbolt has one writer, and each commit costs two fsyncs. The
// bridge writes from ingest (inserts), the poller, and every dispatch worker
// (removals) at once; one transaction each made them queue behind each
// other's fsyncs, so a removal or a lease waited for several commits under
// steady intake (docs/performance.md). One goroutine now runs every write:
// it takes the writes that queued while the previous commit was on disk and
// commits them together, so a write waits for at most the commit in
// progress and its own.

// maxGroup bounds the writes of one commit.
const maxGroup = 64

// op is one write waiting for its commit.
type op struct {
	fn   func(tx *bolt.Tx, c *counts) error
	err  error
	done chan struct{}
}

// refusal reports whether err is an answer about a row (it is leased, gone,
// or its lease is not the caller's) rather than a failure. Every write
// refuses before it changes anything, so a refusal does not spoil the
// writes it shares a transaction with.
func refusal(err error) bool {
	return errors.Is(err, storage.ErrLeased) || errors.Is(err, storage.ErrNotFound) || errors.Is(err, storage.ErrConcurrency)
}

// update runs fn in a write transaction, committed with whatever other
// writes are waiting, and commits the row counts fn changed along with it.
// fn may run more than once (when a write it shares a commit with fails),
// so it must set its results afresh each time.
func (s *Store) update(fn func(tx *bolt.Tx, c *counts) error) error {
	o := &op{fn: fn, done: make(chan struct{})}
	s.ops <- o
	<-o.done
	return o.err
}

// commitLoop runs every write until ops is closed.
func (s *Store) commitLoop() {
	defer close(s.loopDone)
	group := make([]*op, 0, maxGroup)
	for o := range s.ops {
		group = append(group[:0], o)
	more:
		for len(group) < maxGroup {
			select {
			case o, ok := <-s.ops:
				if !ok {
					break more
				}
				group = append(group, o)
			default:
				break more
			}
		}
		large := s.commit(group)
		clear(group)
		if s.dbErr == nil {
			now := time.Now()
			s.trim.maybeTrim(s.db, now, large)
			s.maybeRenew(now)
		}
	}
}

// commit runs group in one transaction. When one write fails, the
// transaction is rolled back and each write runs again alone, so that only
// the failing one fails. It reports whether a committed write touched a
// large record.
func (s *Store) commit(group []*op) (large bool) {
	var dests []destDelta
	var scan *destScan
	if s.dbErr != nil {
		for _, o := range group {
			o.err = s.dbErr
			close(o.done)
		}
		return false
	}
	err := s.db.Update(func(tx *bolt.Tx) error {
		var sum counts
		dests, scan, large = dests[:0], nil, false
		for _, o := range group {
			var c counts
			o.err = o.fn(tx, &c)
			large = large || c.large
			if o.err != nil {
				if refusal(o.err) {
					continue
				}
				return o.err
			}
			sum.pending += c.pending
			dests = append(dests, c.dests...)
			if c.scan != nil {
				scan = c.scan
			}
		}
		if sum.pending == 0 {
			return nil
		}
		meta := tx.Bucket(bucketMeta)
		cur := readCounts(meta)
		return writeCounts(meta, counts{pending: cur.pending + sum.pending})
	})
	if err == nil {
		s.dests.add(scan, dests)
	}
	if err != nil && len(group) > 1 {
		large = false
		for i := range group {
			group[i].err = nil
			if s.commit(group[i : i+1]) {
				large = true
			}
		}
		return large
	}
	for _, o := range group {
		if err != nil && o.err == nil {
			o.err = err // the commit itself failed
		}
		close(o.done)
	}
	return large && err == nil
}
