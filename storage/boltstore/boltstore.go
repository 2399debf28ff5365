// Package boltstore is the embedded storage.Store: one bbolt file owned by one
// process (DELAYBRIDGE_STORE=bbolt).
//
// Layout (all buckets at the top level):
//
//	timeouts  id -> record (see codec.go); its sequence numbers index keys and locks
//	ready     visible-at (8 bytes) + seq (8 bytes) -> id, rows not leased,
//	          visible-at = max(DueAt, NotBefore)
//	leased    lock expiry (8 bytes) + seq (8 bytes) -> id, rows leased
//	cancelled id -> expiry (8 bytes, Unix ns), cancel tombstones (see Cancel)
//	meta      "format" -> file format version
//
// Every row is in exactly one of ready and leased, and its record names the
// key it occupies there, so leasing, releasing and removing a row cost
// O(log n). Lease walks both indexes from the start and stops at the first
// key in the future; NextDue reads the first key of each. Nothing ever scans
// the pending rows to find due work.
//
// The file belongs to one process: Open frees every lease it finds, since a
// lease in the file was left by a predecessor that died.
package boltstore

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/wire"
)

var (
	bucketTimeouts = []byte("timeouts")
	bucketReady    = []byte("ready")
	bucketLeased   = []byte("leased")
	bucketDue      = []byte("due")
	// bucketCancelled came after format 1 without changing it: Open adds
	// it to older files, and older builds ignore it.
	bucketCancelled = []byte("cancelled")
	// bucketSagas indexes the rows that have a saga id (sagaKey), for
	// CancelSaga. It came with record version 3, like bucketCancelled
	// without a new format: older records have no saga id to index.
	bucketSagas = []byte("sagas")
	bucketMeta  = []byte("meta")
	keyFormat   = []byte("format")
)

// fileFormat is the layout version stored in bucket meta.
const fileFormat = "1"

// DefaultOpenTimeout is how long Open waits for the file lock by default.
const DefaultOpenTimeout = time.Second

// Options configure Open.
type Options struct {
	// Now is the store's clock; nil means time.Now.
	Now func() time.Time
	// OpenTimeout is how long Open waits for another process to release the
	// file lock; zero or negative means DefaultOpenTimeout.
	OpenTimeout time.Duration
	// CancelWindow is how long a Cancel that was not too late keeps its id
	// cancelled; zero or negative means storage.DefaultCancelWindow.
	CancelWindow time.Duration
}

// Store is a storage.Store on a bbolt file.
type Store struct {
	mu     sync.RWMutex // read-held by every call, write-held by Close
	closed bool
	db     *bolt.DB
	now    func() time.Time
	path   string
	window time.Duration // cancel window

	recovered int
	leases    *leaseTable // see leases.go
	dests     *destCounts // see destcount.go

	ops      chan *op      // writes for commitLoop (group.go)
	loopDone chan struct{} // closed when commitLoop has returned

	// steps counts index entries visited by Lease and NextDue (tests assert
	// that due work is found without scanning).
	steps atomic.Int64
}

var (
	_ storage.Store              = (*Store)(nil)
	_ storage.Stater             = (*Store)(nil)
	_ storage.SagaCanceller      = (*Store)(nil)
	_ storage.Bulker             = (*Store)(nil)
	_ storage.DestinationCounter = (*Store)(nil)
	// No LeaseCounter: the file has one owner, so Stats counts its leases.
	// No MultiGetter: a Get is a local read, not a round trip.
)

// Open opens or creates the store file at path, creating its parent
// directories, and frees every lease left in it (see RecoveredLeases).
func Open(path string, opts Options) (*Store, error) {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.OpenTimeout <= 0 {
		opts.OpenTimeout = DefaultOpenTimeout
	}
	if opts.CancelWindow <= 0 {
		opts.CancelWindow = storage.DefaultCancelWindow
	}
	if dir := filepath.Dir(path); dir != "" {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return nil, fmt.Errorf("boltstore: create directory for %s: %w", path, err)
		}
	}
	// A generous initial mmap (address space, not memory) spares the
	// remaps that block every reader while the file grows.
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: opts.OpenTimeout, InitialMmapSize: 1 << 30})
	if err != nil {
		if errors.Is(err, bolterrors.ErrTimeout) {
			return nil, fmt.Errorf("boltstore: %s is in use by another process (file lock not acquired within %s): %w",
				path, opts.OpenTimeout, err)
		}
		return nil, fmt.Errorf("boltstore: open %s: %w", path, err)
	}
	s := &Store{db: db, now: opts.Now, path: path, window: opts.CancelWindow,
		ops: make(chan *op, maxGroup), loopDone: make(chan struct{}), leases: newLeaseTable(),
		dests: newDestCounts()}
	go s.commitLoop()
	err = db.Update(func(tx *bolt.Tx) error {
		meta, err := tx.CreateBucketIfNotExists(bucketMeta)
		if err != nil {
			return err
		}
		switch f := meta.Get(keyFormat); {
		case f == nil:
			if err := meta.Put(keyFormat, []byte(fileFormat)); err != nil {
				return err
			}
		case string(f) != fileFormat:
			return fmt.Errorf("unsupported file format %q (this build reads %q)", f, fileFormat)
		}
		for _, name := range [][]byte{bucketTimeouts, bucketReady, bucketLeased, bucketCancelled, bucketSagas} {
			if _, err := tx.CreateBucketIfNotExists(name); err != nil {
				return err
			}
		}
		if tx.Bucket(bucketDue) == nil {
			// A file from before the due-time index: build it once.
			due, err := tx.CreateBucket(bucketDue)
			if err != nil {
				return err
			}
			err = tx.Bucket(bucketTimeouts).ForEach(func(k, v []byte) error {
				r, err := decodeRecord(v)
				if err != nil {
					return fmt.Errorf("record %q: %w", k, err)
				}
				return due.Put(dueKey(&r.Timeout), []byte{})
			})
			if err != nil {
				return err
			}
		}
		if meta.Get(keyPending) == nil {
			// A file from before the counts were kept: count once.
			leased := tx.Bucket(bucketLeased).Stats().KeyN
			pending := tx.Bucket(bucketReady).Stats().KeyN + leased
			return writeCounts(meta, counts{pending: int64(pending), leased: int64(leased)})
		}
		return nil
	})
	if err == nil {
		err = s.update(func(tx *bolt.Tx, c *counts) error {
			n, err := s.freeLeases(tx, c, nil, -1)
			s.recovered = n
			return err
		})
	}
	if err != nil {
		s.stopLoop()
		_ = db.Close()
		return nil, fmt.Errorf("boltstore: open %s: %w", path, err)
	}
	go s.countDestinations()
	return s, nil
}

// RecoveredLeases is the number of leases Open found in the file and freed.
func (s *Store) RecoveredLeases() int { return s.recovered }

// Path is the file the store was opened on.
func (s *Store) Path() string { return s.path }

// Close closes the file. It waits for calls in flight; later calls return
// storage.ErrClosed. Closing twice is not an error.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	s.stopLoop() // no write is in flight: they hold s.mu
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("boltstore: close: %w", err)
	}
	return nil
}

func (s *Store) stopLoop() {
	close(s.ops)
	<-s.loopDone
}

// enter starts a call: it holds the read lock until the returned func runs.
func (s *Store) enter(ctx context.Context) (func(), error) {
	s.mu.RLock()
	if s.closed {
		s.mu.RUnlock()
		return nil, fmt.Errorf("boltstore: %w", storage.ErrClosed)
	}
	if err := ctx.Err(); err != nil {
		s.mu.RUnlock()
		return nil, fmt.Errorf("boltstore: %w", err)
	}
	return s.mu.RUnlock, nil
}

// buckets of one transaction, and the changes it makes to the row counts
// (nil in read-only transactions).
type txb struct {
	timeouts, ready, leased *bolt.Bucket
	// due orders every pending row by due time and id, for List.
	due *bolt.Bucket
	// cancels holds the cancel tombstones.
	cancels *bolt.Bucket
	// sagas indexes rows by saga id.
	sagas *bolt.Bucket
	c     *counts
}

// counts are kept in bucket meta so Stats costs nothing and Open scans
// nothing, whatever the number pending. dests, the change of each
// destination's pending count, is not: see destcount.go.
type counts struct {
	pending, leased int64
	dests           []destDelta
	scan            *destScan // a step of the initial count (destcount.go)
}

// dest adds n to the pending count of row id's destination d.
func (c *counts) dest(id string, d wire.Destination, n int64) {
	c.dests = append(c.dests, destDelta{id: id, dest: d, n: n})
}

func buckets(tx *bolt.Tx, c *counts) (txb, error) {
	b := txb{
		timeouts: tx.Bucket(bucketTimeouts),
		ready:    tx.Bucket(bucketReady),
		leased:   tx.Bucket(bucketLeased),
		due:      tx.Bucket(bucketDue),
		cancels:  tx.Bucket(bucketCancelled),
		sagas:    tx.Bucket(bucketSagas),
		c:        c,
	}
	if b.timeouts == nil || b.ready == nil || b.leased == nil || b.due == nil || b.cancels == nil || b.sagas == nil {
		return b, errors.New("buckets missing")
	}
	// Index keys mostly arrive in ascending order (due times, sequences):
	// fuller pages halve the file without costing splits.
	b.ready.FillPercent, b.leased.FillPercent = indexFillPercent, indexFillPercent
	return b, nil
}

const indexFillPercent = 0.9

var keyPending, keyLeased = []byte("pending"), []byte("leased")

func readCounts(meta *bolt.Bucket) counts {
	get := func(k []byte) int64 {
		if v := meta.Get(k); len(v) == 8 {
			return int64(binary.BigEndian.Uint64(v))
		}
		return 0
	}
	return counts{pending: get(keyPending), leased: get(keyLeased)}
}

func writeCounts(meta *bolt.Bucket, c counts) error {
	if err := meta.Put(keyPending, binary.BigEndian.AppendUint64(nil, uint64(c.pending))); err != nil {
		return err
	}
	return meta.Put(keyLeased, binary.BigEndian.AppendUint64(nil, uint64(c.leased)))
}

func (b txb) index(idx byte) *bolt.Bucket {
	if idx == idxLeased {
		return b.leased
	}
	return b.ready
}

// load returns the record of id, or nil when there is none.
func (b txb) load(id string) (*record, error) {
	v := b.timeouts.Get([]byte(id))
	if v == nil {
		return nil, nil
	}
	r, err := decodeRecord(v)
	if err != nil {
		return nil, fmt.Errorf("record %q: %w", id, err)
	}
	if r.ID != id {
		return nil, fmt.Errorf("record %q: %w: holds id %q", id, errCorrupt, r.ID)
	}
	return r, nil
}

func (b txb) save(r *record) error {
	return b.timeouts.Put([]byte(r.ID), encodeRecord(r))
}

// place puts r into index idx at time at, removing it from the index it was
// in (unless fresh), and saves it.
func (b txb) place(r *record, fresh bool, idx byte, at time.Time, seq uint64) error {
	wasLeased := !fresh && r.index == idxLeased
	if !fresh {
		if err := b.index(r.index).Delete(r.key[:]); err != nil {
			return err
		}
	}
	if fresh {
		b.c.pending++
		b.c.dest(r.ID, r.Dest(), 1)
		if err := b.due.Put(dueKey(&r.Timeout), []byte{}); err != nil {
			return err
		}
		if r.SagaID != "" {
			if err := b.sagas.Put(sagaKey(r.SagaID, r.ID), []byte{}); err != nil {
				return err
			}
		}
	}
	switch {
	case wasLeased && idx != idxLeased:
		b.c.leased--
	case !wasLeased && idx == idxLeased:
		b.c.leased++
	}
	r.index = idx
	r.key = indexKey(at, seq)
	if err := b.index(idx).Put(r.key[:], []byte(r.ID)); err != nil {
		return err
	}
	return b.save(r)
}

// forget deletes r: its record and its entries in the indexes.
func (b txb) forget(r *record) error {
	if err := b.index(r.index).Delete(r.key[:]); err != nil {
		return err
	}
	if err := b.due.Delete(dueKey(&r.Timeout)); err != nil {
		return err
	}
	if err := b.timeouts.Delete([]byte(r.ID)); err != nil {
		return err
	}
	if r.SagaID != "" {
		if err := b.sagas.Delete(sagaKey(r.SagaID, r.ID)); err != nil {
			return err
		}
	}
	b.c.pending--
	b.c.dest(r.ID, r.Dest(), -1)
	if r.index == idxLeased {
		b.c.leased--
	}
	return nil
}

// dueKey is a row's key in the due index: its due time, then its id, so the
// key follows from the record and needs no storing.
func dueKey(t *storage.Timeout) []byte {
	k := binary.BigEndian.AppendUint64(make([]byte, 0, 8+len(t.ID)), keyTime(t.DueAt))
	return append(k, t.ID...)
}

// sagaKey is a row's key in the saga index: saga id, NUL, id. Neither may
// hold a NUL (Insert refuses a saga id with one; ids are checked by
// wire.ValidateID before they reach a store), so a saga's keys are exactly
// those with its prefix.
func sagaKey(saga, id string) []byte {
	k := make([]byte, 0, len(saga)+1+len(id))
	k = append(k, saga...)
	k = append(k, 0)
	return append(k, id...)
}

// makeReady clears r's lease and moves it to the ready index.
func (b txb) makeReady(r *record) error {
	seq, err := b.timeouts.NextSequence()
	if err != nil {
		return err
	}
	r.Lock = ""
	r.LockExpiresAt = time.Time{}
	return b.place(r, false, idxReady, visibleAt(&r.Timeout), seq)
}

// dueRecords walks index idx from its start while the key time is at or
// before now and returns up to limit records (limit < 0: all) whose exact
// time when(r) is at or before now; now nil takes every record of the index.
// The walk stops at the first key in the future. Records are decoded copies,
// so the caller may modify the buckets afterwards.
func (s *Store) dueRecords(b txb, idx byte, now *time.Time, limit int, when func(*record) time.Time) ([]*record, error) {
	var nowKey uint64
	if now != nil {
		nowKey = keyTime(*now)
	}
	var out []*record
	c := b.index(idx).Cursor()
	for k, v := c.First(); k != nil && limit != 0; k, v = c.Next() {
		s.steps.Add(1)
		if now != nil && !keyDue(k, nowKey) {
			break
		}
		r, err := b.indexed(idx, k, v)
		if err != nil {
			return nil, err
		}
		if now != nil && when(r).After(*now) {
			// Only in a clamped key range (before 1678 or after 2262),
			// where keys order by sequence, not by time.
			continue
		}
		out = append(out, r)
		limit--
	}
	return out, nil
}

// indexed loads the record of index idx's entry k -> v and checks that it
// names that entry.
func (b txb) indexed(idx byte, k, v []byte) (*record, error) {
	r, err := b.load(string(v))
	if err != nil {
		return nil, err
	}
	if r == nil {
		return nil, fmt.Errorf("%w: index entry for %q has no record", errCorrupt, v)
	}
	if r.index != idx || !bytes.Equal(r.key[:], k) {
		return nil, fmt.Errorf("%w: index entry for %q does not match its record", errCorrupt, v)
	}
	return r, nil
}

func leaseExpiry(r *record) time.Time { return r.LockExpiresAt }

func readyAt(r *record) time.Time { return visibleAt(&r.Timeout) }

// freeLeases moves leased rows back to ready: those whose lease expired by
// *now (at most limit of them; limit < 0: all), or all of them when now is
// nil. It returns how many it moved.
func (s *Store) freeLeases(tx *bolt.Tx, c *counts, now *time.Time, limit int) (int, error) {
	b, err := buckets(tx, c)
	if err != nil {
		return 0, err
	}
	rs, err := s.dueRecords(b, idxLeased, now, limit, leaseExpiry)
	if err != nil {
		return 0, err
	}
	for _, r := range rs {
		if err := b.makeReady(r); err != nil {
			return 0, err
		}
	}
	return len(rs), nil
}

// Insert stores ts in one commit; see storage.Store. Lock and LockExpiresAt
// of the input are ignored: a new row is never leased.
func (s *Store) Insert(ctx context.Context, ts []storage.Timeout) ([]bool, error) {
	exit, err := s.enter(ctx)
	if err != nil {
		return nil, err
	}
	defer exit()
	for i := range ts {
		switch t := &ts[i]; {
		case t.ID == "":
			return nil, fmt.Errorf("boltstore: insert: timeout %d has an empty id", i)
		case len(t.ID) > bolt.MaxKeySize:
			return nil, fmt.Errorf("boltstore: insert: timeout %d: id is %d bytes, longer than %d", i, len(t.ID), bolt.MaxKeySize)
		case t.Destination == "" && t.Exchange == "":
			return nil, fmt.Errorf("boltstore: insert: timeout %q has an empty destination", t.ID)
		case strings.IndexByte(t.SagaID, 0) >= 0 || len(t.SagaID)+1+len(t.ID) > bolt.MaxKeySize:
			return nil, fmt.Errorf("boltstore: insert: timeout %q: saga id holds a NUL or is too long", t.ID)
		}
	}
	inserted := make([]bool, len(ts))
	if len(ts) == 0 {
		return inserted, nil
	}
	now := s.now()
	err = s.update(func(tx *bolt.Tx, c *counts) error {
		clear(inserted)
		b, err := buckets(tx, c)
		if err != nil {
			return err
		}
		for i := range ts {
			// Get sees this transaction's own puts, so a repeated id in ts
			// is caught here too.
			if b.timeouts.Get([]byte(ts[i].ID)) != nil || b.cancelled(ts[i].ID, now) {
				continue
			}
			r := &record{Timeout: ts[i]}
			r.Lock = ""
			r.LockExpiresAt = time.Time{}
			seq, err := b.timeouts.NextSequence()
			if err != nil {
				return err
			}
			if err := b.place(r, true, idxReady, visibleAt(&r.Timeout), seq); err != nil {
				return fmt.Errorf("timeout %q: %w", r.ID, err)
			}
			inserted[i] = true
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("boltstore: insert: %w", err)
	}
	return inserted, nil
}

// Lease leases up to limit due rows to owner for d; see storage.Store. It
// is a read: the leases are kept in memory (leases.go). Rows are taken from
// the ready index in order of max(DueAt, NotBefore), those leased skipped,
// those whose lease expired taken again.
func (s *Store) Lease(ctx context.Context, owner string, dueBy time.Time, limit int, d time.Duration) ([]storage.Lease, error) {
	exit, err := s.enter(ctx)
	if err != nil {
		return nil, err
	}
	defer exit()
	if limit <= 0 {
		return nil, fmt.Errorf("boltstore: lease: limit must be positive, got %d", limit)
	}
	if d <= 0 {
		return nil, fmt.Errorf("boltstore: lease: duration must be positive, got %s", d)
	}
	now := s.now()
	if dueBy.IsZero() {
		dueBy = now
	}
	t := s.leases
	t.mu.Lock()
	defer t.mu.Unlock()
	leases := []storage.Lease{}
	err = s.db.View(func(tx *bolt.Tx) error {
		b, err := buckets(tx, nil)
		if err != nil {
			return err
		}
		byKey := keyTime(dueBy)
		c := b.ready.Cursor()
		for k, v := c.First(); k != nil && len(leases) < limit; k, v = c.Next() {
			s.steps.Add(1)
			if !keyDue(k, byKey) {
				break
			}
			if !t.available(string(v), now) {
				continue
			}
			r, err := b.indexed(idxReady, k, v)
			if err != nil {
				return err
			}
			if readyAt(r).After(dueBy) {
				// Only in a clamped key range (before 1678 or after 2262),
				// where keys order by sequence, not by time.
				continue
			}
			leases = append(leases, storage.Lease{ID: r.ID, DueAt: r.DueAt})
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("boltstore: lease: %w", err)
	}
	for i := range leases {
		leases[i].Lock = t.take(leases[i].ID, owner, now.Add(d))
	}
	return leases, nil
}

// Get returns a copy of the row with this id.
func (s *Store) Get(ctx context.Context, id string) (storage.Timeout, error) {
	exit, err := s.enter(ctx)
	if err != nil {
		return storage.Timeout{}, err
	}
	defer exit()
	var r *record
	err = s.db.View(func(tx *bolt.Tx) error {
		b, err := buckets(tx, nil)
		if err != nil {
			return err
		}
		r, err = b.load(id)
		return err
	})
	if err != nil {
		return storage.Timeout{}, fmt.Errorf("boltstore: get %q: %w", id, err)
	}
	if r == nil {
		return storage.Timeout{}, fmt.Errorf("boltstore: get %q: %w", id, storage.ErrNotFound)
	}
	s.leases.annotate(&r.Timeout)
	return r.Timeout, nil
}

// Remove deletes rows in one commit; see storage.Store.
func (s *Store) Remove(ctx context.Context, refs []storage.Ref) ([]error, error) {
	exit, err := s.enter(ctx)
	if err != nil {
		return nil, err
	}
	defer exit()
	results := make([]error, len(refs))
	if len(refs) == 0 {
		return results, nil
	}
	now := s.now()
	pins := pinSet{t: s.leases}
	defer pins.release()
	var removed []storage.Ref
	err = s.update(func(tx *bolt.Tx, c *counts) error {
		clear(results)
		removed = removed[:0]
		b, err := buckets(tx, c)
		if err != nil {
			return err
		}
		for i, ref := range refs {
			r, err := b.load(ref.ID)
			if err != nil {
				return err
			}
			if r == nil {
				if ref.Lock != "" {
					results[i] = fmt.Errorf("boltstore: remove %q: %w", ref.ID, storage.ErrNotFound)
				}
				continue
			}
			if ref.Lock == "" {
				pins.pinAny(ref.ID)
			} else if err := s.leases.check(ref.ID, ref.Lock, now); err != nil {
				results[i] = fmt.Errorf("boltstore: remove %q: %w", ref.ID, err)
				continue
			}
			if err := b.forget(r); err != nil {
				return err
			}
			removed = append(removed, ref)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("boltstore: remove: %w", err)
	}
	for _, ref := range removed {
		s.leases.end(ref.ID, ref.Lock)
	}
	return results, nil
}

// Release ends the lease of id; see storage.Store.
func (s *Store) Release(ctx context.Context, id, lock string, notBefore time.Time) error {
	err := s.updateRow(ctx, "release", id, func(b txb, r *record, now time.Time) error {
		if err := s.leases.check(id, lock, now); err != nil {
			return err
		}
		r.NotBefore = notBefore
		return b.makeReady(r)
	})
	if err == nil {
		s.leases.end(id, lock)
	}
	return err
}

// IncrementFailureCount records a dispatch failure of id; the lease is kept.
func (s *Store) IncrementFailureCount(ctx context.Context, id, lock, reason string) (int, error) {
	var attempts int
	err := s.updateRow(ctx, "increment failure count", id, func(b txb, r *record, now time.Time) error {
		if err := s.leases.check(id, lock, now); err != nil {
			return err
		}
		r.Attempts++
		r.LastError = reason
		attempts = r.Attempts
		return b.save(r)
	})
	if err != nil {
		return 0, err
	}
	return attempts, nil
}

// NextDue returns the earliest time a row becomes leasable; see
// storage.Store: the first entry of the ready index that is not leased, or
// the earliest lease expiry if sooner.
func (s *Store) NextDue(ctx context.Context) (time.Time, bool, error) {
	exit, err := s.enter(ctx)
	if err != nil {
		return time.Time{}, false, err
	}
	defer exit()
	now := s.now()
	t := s.leases
	t.mu.Lock()
	defer t.mu.Unlock()
	var at time.Time
	var ok bool
	err = s.db.View(func(tx *bolt.Tx) error {
		b, err := buckets(tx, nil)
		if err != nil {
			return err
		}
		c := b.ready.Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			s.steps.Add(1)
			if !t.available(string(v), now) {
				continue
			}
			r, err := b.indexed(idxReady, k, v)
			if err != nil {
				return err
			}
			at, ok = visibleAt(&r.Timeout), true
			return nil
		}
		return nil
	})
	if err != nil {
		return time.Time{}, false, fmt.Errorf("boltstore: next due: %w", err)
	}
	exp, leased := t.nextExpiry()
	if leased && !exp.After(now) {
		t.refreshMin() // minExpiry may be that of a lease that ended
		exp, leased = t.nextExpiry()
	}
	if leased && (!ok || exp.Before(at)) {
		at, ok = exp, true
	}
	return at, ok, nil
}

// Reap frees every row whose lease expired and returns how many.
func (s *Store) Reap(ctx context.Context) (int, error) {
	exit, err := s.enter(ctx)
	if err != nil {
		return 0, err
	}
	defer exit()
	now := s.now()
	n := s.leases.reap(now)
	err = s.update(func(tx *bolt.Tx, c *counts) error {
		b, err := buckets(tx, c)
		if err != nil {
			return err
		}
		return b.purgeCancels(now)
	})
	if err != nil {
		return n, fmt.Errorf("boltstore: reap: %w", err)
	}
	return n, nil
}

// Stats returns how many rows the store holds (pending, leased or not) and
// how many of them are leased; see storage.Stater. It reads the counts kept
// in bucket meta: nothing is counted.
func (s *Store) Stats(ctx context.Context) (pending, leased int, err error) {
	exit, err := s.enter(ctx)
	if err != nil {
		return 0, 0, err
	}
	defer exit()
	err = s.db.View(func(tx *bolt.Tx) error {
		c := readCounts(tx.Bucket(bucketMeta))
		pending = int(c.pending)
		return nil
	})
	if err != nil {
		return 0, 0, fmt.Errorf("boltstore: stats: %w", err)
	}
	return pending, s.leases.count(), nil
}

// List returns pending rows in due order from the due index; see
// storage.Store. The cursor is the hex of the last row's due-index key.
func (s *Store) List(ctx context.Context, f storage.ListFilter) ([]storage.Timeout, string, error) {
	exit, err := s.enter(ctx)
	if err != nil {
		return nil, "", err
	}
	defer exit()
	if f.Limit <= 0 {
		return nil, "", fmt.Errorf("boltstore: list: limit must be positive, got %d", f.Limit)
	}
	var after []byte
	if f.After != "" {
		if after, err = hex.DecodeString(f.After); err != nil || len(after) < 8 {
			return nil, "", fmt.Errorf("boltstore: list: invalid cursor %q", f.After)
		}
	}
	var rows []storage.Timeout
	var next string
	err = s.db.View(func(tx *bolt.Tx) error {
		b, err := buckets(tx, nil)
		if err != nil {
			return err
		}
		c := b.due.Cursor()
		var k []byte
		switch {
		case after != nil:
			if k, _ = c.Seek(after); k != nil && bytes.Equal(k, after) {
				k, _ = c.Next()
			}
		case !f.DueFrom.IsZero():
			k, _ = c.Seek(binary.BigEndian.AppendUint64(nil, keyTime(f.DueFrom)))
		default:
			k, _ = c.First()
		}
		for ; k != nil; k, _ = c.Next() {
			r, err := b.load(string(k[8:]))
			if err != nil {
				return err
			}
			if r == nil {
				return fmt.Errorf("%w: due index entry %x has no record", errCorrupt, k)
			}
			if !f.DueTo.IsZero() && !r.DueAt.Before(f.DueTo) {
				if keyTime(r.DueAt) > keyTime(f.DueTo) {
					break // past the range (clamped keys may tie; go on within them)
				}
				continue
			}
			if !f.Selects(&r.Timeout) {
				continue
			}
			if len(rows) == f.Limit {
				next = hex.EncodeToString(dueKey(&rows[len(rows)-1]))
				return nil
			}
			r.Message = nil
			s.leases.annotate(&r.Timeout)
			rows = append(rows, r.Timeout)
		}
		return nil
	})
	if err != nil {
		return nil, "", fmt.Errorf("boltstore: list: %w", err)
	}
	return rows, next, nil
}

// Cancel removes a row that is not leased and records a tombstone, in the
// same transaction as the lookup; see storage.Store. bbolt's single writer
// makes Cancel and Insert atomic.
func (s *Store) Cancel(ctx context.Context, id string) error {
	exit, err := s.enter(ctx)
	if err != nil {
		return err
	}
	defer exit()
	now := s.now()
	missing := false
	pins := pinSet{t: s.leases}
	defer pins.release()
	err = s.update(func(tx *bolt.Tx, c *counts) error {
		missing = false
		b, err := buckets(tx, c)
		if err != nil {
			return err
		}
		r, err := b.load(id)
		switch {
		case err != nil:
			return err
		case r == nil:
			missing = true
			if len(id) == 0 || len(id) > bolt.MaxKeySize {
				return nil // no row can have it; nothing to remember
			}
		default:
			if err := pins.pin(id, now); err != nil {
				return err // storage.ErrLeased
			}
			if err := b.forget(r); err != nil {
				return err
			}
		}
		return s.tombstone(b, id, now)
	})
	if err == nil && missing {
		err = storage.ErrNotFound
	}
	if err != nil {
		return fmt.Errorf("boltstore: cancel %q: %w", id, err)
	}
	return nil
}

// CancelSaga removes the rows of saga sagaID that are not leased and leaves
// a tombstone for each, in one transaction; see storage.SagaCanceller.
func (s *Store) CancelSaga(ctx context.Context, sagaID string) (cancelled, leased int, err error) {
	if sagaID == "" {
		return 0, 0, errors.New("boltstore: cancel saga: empty saga id")
	}
	exit, err := s.enter(ctx)
	if err != nil {
		return 0, 0, err
	}
	defer exit()
	now := s.now()
	pins := pinSet{t: s.leases}
	defer pins.release()
	err = s.update(func(tx *bolt.Tx, c *counts) error {
		cancelled, leased = 0, 0
		b, err := buckets(tx, c)
		if err != nil {
			return err
		}
		prefix := sagaKey(sagaID, "")
		var ids []string
		cur := b.sagas.Cursor()
		for k, _ := cur.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = cur.Next() {
			ids = append(ids, string(k[len(prefix):]))
		}
		for _, id := range ids {
			r, err := b.load(id)
			switch {
			case err != nil:
				return err
			case r == nil || r.SagaID != sagaID:
				return fmt.Errorf("%w: saga index entry for %q does not match its record", errCorrupt, id)
			}
			if err := pins.pin(id, now); err != nil {
				leased++
				continue
			}
			if err := b.forget(r); err != nil {
				return err
			}
			// A tombstone, as Cancel leaves: a copy of a cancelled timeout
			// stored again (a requeue) must not bring it back.
			if err := s.tombstone(b, id, now); err != nil {
				return err
			}
			cancelled++
		}
		return nil
	})
	if err != nil {
		return 0, 0, fmt.Errorf("boltstore: cancel saga %q: %w", sagaID, err)
	}
	return cancelled, leased, nil
}

// tombstone records that id was cancelled at now, for the cancel window.
func (s *Store) tombstone(b txb, id string, now time.Time) error {
	return b.cancels.Put([]byte(id), binary.BigEndian.AppendUint64(nil, uint64(now.Add(s.window).UnixNano())))
}

// cancelled reports whether id has a tombstone that is live at now.
func (b txb) cancelled(id string, now time.Time) bool {
	v := b.cancels.Get([]byte(id))
	return len(v) == 8 && now.UnixNano() < int64(binary.BigEndian.Uint64(v))
}

// purgeCancels deletes the tombstones expired at now.
func (b txb) purgeCancels(now time.Time) error {
	var dead [][]byte
	err := b.cancels.ForEach(func(k, v []byte) error {
		if len(v) != 8 || now.UnixNano() >= int64(binary.BigEndian.Uint64(v)) {
			dead = append(dead, k) // bbolt's keys stay valid until the transaction ends
		}
		return nil
	})
	for _, k := range dead {
		if err == nil {
			err = b.cancels.Delete(k)
		}
	}
	return err
}

// Reschedule moves a row that is not leased to a new due time.
func (s *Store) Reschedule(ctx context.Context, id string, dueAt time.Time) error {
	if err := storage.CheckDueAt(dueAt); err != nil {
		return fmt.Errorf("boltstore: reschedule %q: %w", id, err)
	}
	return s.changeUnleased(ctx, "reschedule", id, func(b txb, r *record) error {
		return b.moveDue(r, dueAt)
	})
}

// moveDue sets r's due time to dueAt and clears its retry hold, in the due
// and ready indexes too; r is not under a live lease.
func (b txb) moveDue(r *record, dueAt time.Time) error {
	if err := b.due.Delete(dueKey(&r.Timeout)); err != nil {
		return err
	}
	r.DueAt, r.NotBefore = dueAt, time.Time{}
	r.Lock, r.LockExpiresAt = "", time.Time{} // an expired lease ends here
	if err := b.due.Put(dueKey(&r.Timeout), []byte{}); err != nil {
		return err
	}
	seq, err := b.timeouts.NextSequence()
	if err != nil {
		return err
	}
	return b.place(r, false, idxReady, visibleAt(&r.Timeout), seq)
}

// changeUnleased applies change to row id unless it is leased and its lease
// still valid (ErrLeased).
func (s *Store) changeUnleased(ctx context.Context, op, id string, change func(txb, *record) error) error {
	pins := pinSet{t: s.leases}
	defer pins.release()
	return s.updateRow(ctx, op, id, func(b txb, r *record, now time.Time) error {
		if err := pins.pin(id, now); err != nil {
			return err // storage.ErrLeased
		}
		return change(b, r)
	})
}

// updateRow runs fn on row id in a write transaction, with the store's now;
// a missing row is ErrNotFound. Errors name op and id.
func (s *Store) updateRow(ctx context.Context, op, id string, fn func(b txb, r *record, now time.Time) error) error {
	exit, err := s.enter(ctx)
	if err != nil {
		return err
	}
	defer exit()
	now := s.now()
	err = s.update(func(tx *bolt.Tx, c *counts) error {
		b, err := buckets(tx, c)
		if err != nil {
			return err
		}
		r, err := b.load(id)
		if err != nil {
			return err
		}
		if r == nil {
			return storage.ErrNotFound
		}
		return fn(b, r, now)
	})
	if err != nil {
		return fmt.Errorf("boltstore: %s %q: %w", op, id, err)
	}
	return nil
}
