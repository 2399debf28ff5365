package boltstore

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/wire"
)

// Pending rows per destination are counted in memory, not in the file (its
// layout stays as it is): every commit adds the changes its writes made
// (counts.dests) after it succeeded, and a goroutine started by Open counts
// the rows already in the file, in the background, so Open does not wait
// for it: it reads each record's destination in place (rowDest), without
// copying, in steps of destScanStep records (BenchmarkOpenCount times it).
// Each step runs as a write of the group commit, reading the file as the
// last commit left it (a read transaction opened inside the write, so it
// sees none of its group's changes), and holds the writer only for that
// read. The count is exact: a row below the
// scan's cursor (a sequence of bucket rows: a row keeps its sequence while
// it is rescheduled or retried, and a new row gets a higher one) is counted
// by the scan and then followed by the deltas; a row above it is left to
// the scan, which sees it as committed. Until the
// scan ends, CountByDestination answers errDestCounting.

// destScanStep is how many records one step of the initial count reads.
const destScanStep = 10_000

// dueSoonScanLimit bounds the rows CountByDestination looks at for its due
// soon counts: past it (a window with more rows due than that), DueSoon is
// a lower bound.
const dueSoonScanLimit = 100_000

// errDestCounting: the initial count is under way.
var errDestCounting = fmt.Errorf("%w: the pending rows per destination are still being counted (after Open)", storage.ErrNotYet)

// destDelta is one row's change of its destination's count.
type destDelta struct {
	seq  [8]byte
	dest wire.Destination
	n    int64
}

// destScan is one step of the initial count: the counts of the ids it read
// and the sequence the next step starts at (done: the end).
type destScan struct {
	counts map[wire.Destination]int64
	next   []byte
	done   bool
}

// destTally counts one destination's rows within a scan step.
type destTally struct {
	dest wire.Destination
	n    int64
}

type destCounts struct {
	mu     sync.Mutex
	m      map[wire.Destination]int64
	cursor []byte // sequences below it are counted; the rest are the scan's
	done   bool
}

func newDestCounts() *destCounts { return &destCounts{m: map[wire.Destination]int64{}} }

// add applies one commit: its scan step, if it had one, then its deltas,
// of the rows the scan has passed.
func (d *destCounts) add(scan *destScan, deltas []destDelta) {
	if scan == nil && len(deltas) == 0 {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if scan != nil {
		for dest, n := range scan.counts {
			d.m[dest] += n
		}
		d.cursor, d.done = scan.next, scan.done
	}
	for _, x := range deltas {
		if !d.done && bytes.Compare(x.seq[:], d.cursor) >= 0 {
			continue // the scan will read it as committed
		}
		if d.m[x.dest] += x.n; d.m[x.dest] <= 0 {
			delete(d.m, x.dest)
		}
	}
}

// countDestinations runs the initial count, one step per write, until it
// is done or the store closes.
func (s *Store) countDestinations() {
	var next []byte
	for {
		exit, err := s.enter(context.Background())
		if err != nil {
			return // closed
		}
		var step *destScan
		err = s.update(func(tx *bolt.Tx, c *counts) error {
			c.scan, step = nil, nil
			snap, err := tx.DB().Begin(false) // the last commit, without this group's changes
			if err != nil {
				return err
			}
			defer func() { _ = snap.Rollback() }()
			b := snap.Bucket(bucketRows)
			if b == nil {
				return errors.New("buckets missing")
			}
			st := &destScan{counts: map[wire.Destination]int64{}}
			tally := map[string]*destTally{}
			var tk []byte
			cur := b.Cursor()
			k, v := cur.First()
			if next != nil {
				k, v = cur.Seek(next)
			}
			for n := 0; k != nil && n < destScanStep; k, v = cur.Next() {
				exchange, key, err := rowDest(v)
				if err != nil {
					return fmt.Errorf("record %x: %w", k, err)
				}
				// The lookup by string(tk) copies nothing; only a
				// destination the step has not seen yet allocates.
				tk = binary.AppendUvarint(tk[:0], uint64(len(exchange)))
				tk = append(append(tk, exchange...), key...)
				if c := tally[string(tk)]; c != nil {
					c.n++
				} else {
					tally[string(tk)] = &destTally{dest: wire.Destination{Exchange: string(exchange), Key: string(key)}, n: 1}
				}
				n++
			}
			for _, c := range tally {
				st.counts[c.dest] += c.n
			}
			if k == nil {
				st.done = true
			} else {
				st.next = bytes.Clone(k)
			}
			c.scan, step = st, st
			return nil
		})
		exit()
		if err != nil {
			return // the store is failing; CountByDestination keeps saying so
		}
		if step.done {
			return
		}
		next = step.next
	}
}

// CountByDestination returns the pending rows per destination from the
// counts kept in memory (no read), and the rows due in [soonFrom, soonTo)
// from a walk in due order over that window (dueWalk), which reads each of
// those records but its message (at most dueSoonScanLimit); see
// storage.DestinationCounter.
func (s *Store) CountByDestination(ctx context.Context, soonFrom, soonTo time.Time) (map[wire.Destination]storage.DestinationCount, error) {
	exit, err := s.enter(ctx)
	if err != nil {
		return nil, err
	}
	defer exit()
	if err := s.failed(); err != nil {
		return nil, fmt.Errorf("boltstore: count by destination: %w", err) // not "still counting"
	}
	out := map[wire.Destination]storage.DestinationCount{}
	s.dests.mu.Lock()
	if !s.dests.done {
		s.dests.mu.Unlock()
		return nil, fmt.Errorf("boltstore: count by destination: %w", errDestCounting)
	}
	for d, n := range s.dests.m {
		out[d] = storage.DestinationCount{Pending: int(n)}
	}
	s.dests.mu.Unlock()
	err = s.view(func(tx *bolt.Tx) error {
		b, err := buckets(tx, nil)
		if err != nil {
			return err
		}
		to := keyTime(soonTo)
		n := 0
		seek := binary.BigEndian.AppendUint64(nil, keyTime(soonFrom))
		return b.dueWalk(seek, false, false, false, func(k []byte, r *row) bool {
			if n == dueSoonScanLimit || binary.BigEndian.Uint64(k[:8]) > to {
				return false
			}
			if r == nil {
				return true
			}
			n++
			if r.DueAt.Before(soonFrom) || !r.DueAt.Before(soonTo) {
				return true // clamped keys
			}
			dc := out[r.Dest()]
			dc.DueSoon++
			out[r.Dest()] = dc
			return true
		})
	})
	if err != nil {
		return nil, fmt.Errorf("boltstore: count by destination: %w", err)
	}
	return out, nil
}
