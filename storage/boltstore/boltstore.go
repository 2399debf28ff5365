// Package boltstore is the embedded storage.Store: one bbolt file owned by one
// process (DELAYBRIDGE_STORE=bbolt).
//
// Layout, format 2 (all buckets at the top level):
//
//	rows      seq (8 bytes) -> record (see codec.go, version 5)
//	ids       key -> seq: a row's key is its message id, or for a later
//	          send of an id, the id, wire.SendSep and its number, so the
//	          keys of an id are the id and those after id+SendSep (family)
//	ready     visible-at (8 bytes) + id -> seq, every row,
//	          visible-at = max(DueAt, NotBefore)
//	held      due (8 bytes) + id -> seq, the rows a retry holds back past
//	          their due time (NotBefore after DueAt), and every row of a
//	          paused destination
//	pauses    destination (see destKey) -> since (8 bytes) + by: the
//	          paused destinations (pause.go)
//	parked    destination + due (8 bytes) + id -> seq, every row of a
//	          paused destination, which is then in neither ready nor
//	          (for Lease) anywhere else
//	sagas     saga id, NUL, id -> nothing
//	cancelled message id -> expiry (8 bytes, Unix ns), cancel tombstones
//	          (see Cancel)
//	meta      "format" -> file format version, "pending" -> row count
//	schedules, schedules_due: recurring schedules (schedule.go)
//
// Records are keyed by a sequence that only grows, so they are appended and
// their pages fill (bucket rows has FillPercent 1); the indexes, whose keys
// arrive in any order, hold only short keys and an 8-byte seq. Every index
// key follows from the record, so moving or deleting a row costs O(log n).
// Lease walks ready from the start and stops at the first key in the
// future; NextDue reads its first keys. List merges ready (in which a row
// that is not held sits at its due time) with held, in due order, ties by
// id. Nothing ever scans the pending rows to find due work, and Open reads
// nothing per row (docs/scaling.md).
//
// Leases live in memory (leases.go). Open converts a file of format 1 (rows
// keyed by id) once, by copying it (migrate.go).
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
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/wire"
)

var (
	bucketRows      = []byte("rows")
	bucketIDs       = []byte("ids")
	bucketReady     = []byte("ready")
	bucketHeld      = []byte("held")
	bucketCancelled = []byte("cancelled")
	bucketSagas     = []byte("sagas")
	bucketMeta      = []byte("meta")
	bucketPauses    = []byte("pauses")
	bucketParked    = []byte("parked")
	keyFormat       = []byte("format")
)

// fileFormat is the layout version stored in bucket meta. Format 1 (rows
// keyed by id) is converted at Open (migrate.go).
const fileFormat = "2"

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
	// Logger receives the progress of a conversion from format 1 and the
	// file's reopens (renew.go); the zero value logs nothing.
	Logger zerolog.Logger

	// Tests: renewAfter replaces renewAfterAllocs (and checks after every
	// commit), renewMaxWait replaces renewMaxWait, and renewHook runs
	// inside each reopen.
	renewAfter   int64
	renewMaxWait time.Duration
	renewHook    func()
}

// Store is a storage.Store on a bbolt file.
type Store struct {
	gate storage.Gate
	// dbMu is read-held by every read transaction (view) and write-held
	// while the commit loop reopens the file (renew.go); db and dbErr
	// change only then, in the commit loop, which reads them unlocked.
	dbMu        sync.RWMutex
	db          *bolt.DB
	dbErr       error // the reopen failed: every call fails with it
	openTimeout time.Duration
	log         zerolog.Logger
	now         func() time.Time
	path        string
	window      time.Duration // cancel window

	recovered int
	leases    *leaseTable // see leases.go
	dests     *destCounts // see destcount.go

	ops      chan *op      // writes for commitLoop (group.go)
	loopDone chan struct{} // closed when commitLoop has returned
	trim     mapTrimmer    // used by commitLoop only (dropmap_linux.go)
	renew    renewer       // used by commitLoop only (renew.go)

	// steps counts index entries visited by Lease and NextDue (tests assert
	// that due work is found without scanning).
	steps atomic.Int64
}

var (
	_ storage.Store         = (*Store)(nil)
	_ storage.LeaseReleaser = (*Store)(nil)
)

// Properties: the file is locked by one process (bbolt's flock), so the
// store is not shared.
func (s *Store) Properties() storage.Properties { return storage.Properties{Shared: false} }

// Open opens or creates the store file at path, creating its parent
// directories. A file of format 1 is converted first, once (migrate.go);
// the leases it held are freed (see RecoveredLeases).
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
	db, err := openDB(path, opts.OpenTimeout)
	if err != nil {
		return nil, err
	}
	var format []byte
	err = db.View(func(tx *bolt.Tx) error {
		if meta := tx.Bucket(bucketMeta); meta != nil {
			format = bytes.Clone(meta.Get(keyFormat))
		}
		return nil
	})
	recovered := 0
	if err == nil && string(format) == "1" {
		recovered, err = migrate1(db, path, opts.Logger)
		_ = db.Close()
		db = nil
		if err == nil {
			db, err = openDB(path, opts.OpenTimeout)
			if err != nil {
				return nil, err
			}
		}
	}
	if err == nil {
		err = db.Update(func(tx *bolt.Tx) error {
			var f []byte
			if meta := tx.Bucket(bucketMeta); meta != nil {
				f = meta.Get(keyFormat)
			}
			switch {
			case f == nil:
				return createLayout(tx)
			case string(f) != fileFormat:
				return fmt.Errorf("unsupported file format %q (this build reads %q, and converts %q)", f, fileFormat, "1")
			}
			// Pauses came within format 2: a file made before has no
			// pause, which empty buckets say; so did schedules (schedule.go).
			if err := createPauseBuckets(tx); err != nil {
				return err
			}
			return createScheduleBuckets(tx)
		})
	}
	if err != nil {
		if db != nil {
			_ = db.Close()
		}
		return nil, fmt.Errorf("boltstore: open %s: %w", path, err)
	}
	renew := renewer{limit: renewAfterAllocs, interval: renewCheckInterval, maxWait: renewMaxWait, hook: opts.renewHook}
	if opts.renewAfter > 0 {
		renew.limit, renew.interval = opts.renewAfter, 0
	}
	if opts.renewMaxWait > 0 {
		renew.maxWait = opts.renewMaxWait
	}
	s := &Store{db: db, openTimeout: opts.OpenTimeout, log: opts.Logger, now: opts.Now, path: path, window: opts.CancelWindow, recovered: recovered,
		ops: make(chan *op, maxGroup), loopDone: make(chan struct{}), trim: mapTrimmer{limit: mapTrimLimit, interval: mapTrimInterval}, leases: newLeaseTable(),
		dests: newDestCounts(), renew: renew}
	go s.commitLoop()
	go s.countDestinations()
	return s, nil
}

// openDB opens the bbolt file at path.
func openDB(path string, timeout time.Duration) (*bolt.DB, error) {
	// A generous initial mmap (address space, not memory) spares the
	// remaps that block every reader while the file grows.
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: timeout, InitialMmapSize: 1 << 30})
	if err != nil {
		if errors.Is(err, bolterrors.ErrTimeout) {
			return nil, fmt.Errorf("boltstore: %s is in use by another process (file lock not acquired within %s): %w",
				path, timeout, err)
		}
		return nil, fmt.Errorf("boltstore: open %s: %w", path, err)
	}
	return db, nil
}

// createLayout makes the buckets of an empty file and marks its format.
func createLayout(tx *bolt.Tx) error {
	for _, name := range [][]byte{bucketMeta, bucketRows, bucketIDs, bucketReady, bucketHeld, bucketSagas, bucketCancelled, bucketPauses, bucketParked,
		bucketSchedules, bucketSchedulesDue} {
		if _, err := tx.CreateBucketIfNotExists(name); err != nil {
			return err
		}
	}
	meta := tx.Bucket(bucketMeta)
	if err := meta.Put(keyFormat, []byte(fileFormat)); err != nil {
		return err
	}
	return writeCounts(meta, counts{})
}

// RecoveredLeases is the number of leases Open found in the file and freed.
func (s *Store) RecoveredLeases() int { return s.recovered }

// Path is the file the store was opened on.
func (s *Store) Path() string { return s.path }

// Close closes the file. It waits for calls in flight; later calls return
// storage.ErrClosed. Closing twice is not an error.
func (s *Store) Close() error {
	return s.gate.Close(func() error {
		s.stopLoop() // no write is in flight: they are inside the gate
		if s.db == nil {
			return fmt.Errorf("boltstore: close: %w", s.dbErr) // nothing to close
		}
		if err := s.db.Close(); err != nil {
			return fmt.Errorf("boltstore: close: %w", err)
		}
		return nil
	})
}

func (s *Store) stopLoop() {
	close(s.ops)
	<-s.loopDone
}

// enter starts a call: it holds the read lock until the returned func runs.
func (s *Store) enter(ctx context.Context) (func(), error) {
	exit, err := s.gate.Enter(ctx)
	if err != nil {
		return nil, fmt.Errorf("boltstore: %w", err)
	}
	return exit, nil
}

// readCall runs fn in a read transaction within one call (enter).
func (s *Store) readCall(ctx context.Context, fn func(tx *bolt.Tx) error) error {
	exit, err := s.enter(ctx)
	if err != nil {
		return err
	}
	defer exit()
	return s.view(fn)
}

// pinnedWrite is the frame of a write that must leave rows under a live
// lease alone: one call (enter), its time, and one write transaction whose
// fn pins what it changes; the pins are released when the call ends.
func (s *Store) pinnedWrite(ctx context.Context, fn func(tx *bolt.Tx, b txb, pins *pinSet, now time.Time) error) error {
	exit, err := s.enter(ctx)
	if err != nil {
		return err
	}
	defer exit()
	now := s.now()
	pins := pinSet{t: s.leases}
	defer pins.release()
	return s.update(func(tx *bolt.Tx, c *counts) error {
		b, err := buckets(tx, c)
		if err != nil {
			return err
		}
		return fn(tx, b, &pins, now)
	})
}

// buckets of one transaction, and the changes it makes to the row count
// (nil in read-only transactions).
type txb struct {
	rows, ids, ready, held *bolt.Bucket
	// cancels holds the cancel tombstones.
	cancels *bolt.Bucket
	// sagas indexes rows by saga id.
	sagas *bolt.Bucket
	// pauses and parked: see pause.go.
	pauses, parked *bolt.Bucket
	c              *counts
}

// counts are kept in bucket meta so Stats costs nothing and Open scans
// nothing, whatever the number pending. dests, the change of each
// destination's pending count, is not: see destcount.go.
type counts struct {
	pending int64
	dests   []destDelta
	scan    *destScan // a step of the initial count (destcount.go)
	// large: the write touched a record of dropMappedAbove bytes or more,
	// whose pages the commit maps (mapTrimmer, dropmap_linux.go).
	large bool
}

// dest adds n to the pending count of destination d, for row r.
func (c *counts) dest(r *row, n int64) {
	c.dests = append(c.dests, destDelta{seq: r.seq, dest: r.Dest(), n: n})
}

func buckets(tx *bolt.Tx, c *counts) (txb, error) {
	b := txb{
		rows:    tx.Bucket(bucketRows),
		ids:     tx.Bucket(bucketIDs),
		ready:   tx.Bucket(bucketReady),
		held:    tx.Bucket(bucketHeld),
		cancels: tx.Bucket(bucketCancelled),
		sagas:   tx.Bucket(bucketSagas),
		pauses:  tx.Bucket(bucketPauses),
		parked:  tx.Bucket(bucketParked),
		c:       c,
	}
	if b.rows == nil || b.ids == nil || b.ready == nil || b.held == nil || b.cancels == nil || b.sagas == nil ||
		b.pauses == nil || b.parked == nil {
		return b, errors.New("buckets missing")
	}
	// Records are appended (their keys only grow): full pages cost no
	// splits. Index keys arrive in any order (random ids, due times); there
	// a split that leaves 90% in one page makes pages a third full on
	// average, against two thirds at bbolt's default of half (measured with
	// BenchmarkScaleFile).
	b.rows.FillPercent = 1
	b.ids.FillPercent, b.ready.FillPercent, b.held.FillPercent = indexFillPercent, indexFillPercent, indexFillPercent
	b.parked.FillPercent = indexFillPercent
	return b, nil
}

const indexFillPercent = 0.5

// maxIDLen is the longest key of a row: an index key is 8 bytes and the
// row's key. storage.CheckInsert holds ids to the same limit
// (TestStorageLimitsAreBolts).
const maxIDLen = bolt.MaxKeySize - 8

var keyPending = []byte("pending")

func readCounts(meta *bolt.Bucket) counts {
	if v := meta.Get(keyPending); len(v) == 8 {
		return counts{pending: int64(binary.BigEndian.Uint64(v))}
	}
	return counts{}
}

func writeCounts(meta *bolt.Bucket, c counts) error {
	return meta.Put(keyPending, binary.BigEndian.AppendUint64(nil, uint64(c.pending)))
}

// row is a pending timeout and the sequence its record is stored under.
type row struct {
	storage.Timeout
	seq [8]byte
}

// load returns the row of id, or nil when there is none.
func (b txb) load(id string) (*row, error) {
	seq := b.ids.Get([]byte(id))
	if seq == nil {
		return nil, nil
	}
	r, err := b.loadSeq(seq, true)
	if err != nil {
		return nil, fmt.Errorf("record %q: %w", id, err)
	}
	if r.ID != id {
		return nil, fmt.Errorf("record %q: %w: holds id %q", id, errCorrupt, r.ID)
	}
	return r, nil
}

// loadSeq returns the row stored under seq; without withMessage its Message
// is nil.
func (b txb) loadSeq(seq []byte, withMessage bool) (*row, error) {
	if len(seq) != 8 {
		return nil, fmt.Errorf("%w: sequence %x", errCorrupt, seq)
	}
	v := b.rows.Get(seq)
	if v == nil {
		return nil, fmt.Errorf("%w: no record under sequence %x", errCorrupt, seq)
	}
	t, err := decodeRow(v, withMessage)
	if err != nil {
		return nil, err
	}
	if b.c != nil && len(v) >= dropMappedAbove {
		b.c.large = true
	}
	if withMessage {
		dropMapped(b.rows.Tx(), v)
	}
	r := &row{Timeout: *t}
	copy(r.seq[:], seq)
	return r, nil
}

// indexed loads the row of the index entry k -> seq whose key ends in the
// row's id, and checks that the row's own key there is k.
func (b txb) indexed(k, seq []byte, key func(*storage.Timeout) []byte, withMessage bool) (*row, error) {
	r, err := b.loadSeq(seq, withMessage)
	if err != nil {
		return nil, fmt.Errorf("index entry %x: %w", k, err)
	}
	if !bytes.Equal(key(&r.Timeout), k) {
		return nil, fmt.Errorf("%w: index entry %x does not match its record %q", errCorrupt, k, r.ID)
	}
	return r, nil
}

// save writes r's record.
func (b txb) save(r *row) error {
	v := encodeRow(&r.Timeout)
	if b.c != nil && len(v) >= dropMappedAbove {
		b.c.large = true
	}
	return b.rows.Put(r.seq[:], v)
}

// add stores t as a new row.
func (b txb) add(t *storage.Timeout) error {
	n, err := b.rows.NextSequence()
	if err != nil {
		return err
	}
	r := &row{Timeout: *t}
	r.Lock, r.LockExpiresAt = "", time.Time{}
	binary.BigEndian.PutUint64(r.seq[:], n)
	if err := b.ids.Put([]byte(r.ID), r.seq[:]); err != nil {
		return err
	}
	if r.SagaID != "" {
		if err := b.sagas.Put(sagaKey(r.SagaID, r.ID), []byte{}); err != nil {
			return err
		}
	}
	b.c.pending++
	b.c.dest(r, 1)
	if err := b.index(r); err != nil {
		return err
	}
	return b.save(r)
}

// index puts r's entries into ready and, when it is held, into held; a
// row of a paused destination goes into held and parked instead.
func (b txb) index(r *row) error {
	if b.isPaused(&r.Timeout) {
		if err := b.held.Put(dueKey(&r.Timeout), r.seq[:]); err != nil {
			return err
		}
		return b.parked.Put(parkKey(&r.Timeout), r.seq[:])
	}
	if err := b.ready.Put(readyKey(&r.Timeout), r.seq[:]); err != nil {
		return err
	}
	if held(&r.Timeout) {
		return b.held.Put(dueKey(&r.Timeout), r.seq[:])
	}
	return nil
}

// unindex deletes r's entries from ready, held and parked.
func (b txb) unindex(r *row) error {
	if b.isPaused(&r.Timeout) {
		if err := b.held.Delete(dueKey(&r.Timeout)); err != nil {
			return err
		}
		return b.parked.Delete(parkKey(&r.Timeout))
	}
	if err := b.ready.Delete(readyKey(&r.Timeout)); err != nil {
		return err
	}
	if held(&r.Timeout) {
		return b.held.Delete(dueKey(&r.Timeout))
	}
	return nil
}

// reindex applies change to r, which moves it in the indexes, and saves it.
func (b txb) reindex(r *row, change func(*storage.Timeout)) error {
	if err := b.unindex(r); err != nil {
		return err
	}
	change(&r.Timeout)
	if err := b.index(r); err != nil {
		return err
	}
	return b.save(r)
}

// forget deletes r: its record and its entries in the indexes.
func (b txb) forget(r *row) error {
	if err := b.unindex(r); err != nil {
		return err
	}
	if err := b.ids.Delete([]byte(r.ID)); err != nil {
		return err
	}
	if err := b.rows.Delete(r.seq[:]); err != nil {
		return err
	}
	if r.SagaID != "" {
		if err := b.sagas.Delete(sagaKey(r.SagaID, r.ID)); err != nil {
			return err
		}
	}
	b.c.pending--
	b.c.dest(r, -1)
	return nil
}

// held reports whether a retry holds t back past its due time: such a row
// sits in ready at its NotBefore and in held at its due time.
func held(t *storage.Timeout) bool { return t.NotBefore.After(t.DueAt) }

// timeKey is an index key: the time (see keyTime), then the id.
func timeKey(at time.Time, id string) []byte {
	k := binary.BigEndian.AppendUint64(make([]byte, 0, 8+len(id)), keyTime(at))
	return append(k, id...)
}

// readyKey is a row's key in ready.
func readyKey(t *storage.Timeout) []byte { return timeKey(visibleAt(t), t.ID) }

// dueKey is a row's key in held, and List's cursor.
func dueKey(t *storage.Timeout) []byte { return timeKey(t.DueAt, t.ID) }

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

// keyDue reports whether index key k's time part is at or before now's.
func keyDue(k []byte, now uint64) bool {
	return len(k) >= 8 && binary.BigEndian.Uint64(k[:8]) <= now
}

// readyAt is when a row that is not leased becomes leasable.
func readyAt(r *row) time.Time { return visibleAt(&r.Timeout) }

// Insert stores ts in one commit; see storage.Store. Lock and LockExpiresAt
// of the input are ignored: a new row is never leased.
func (s *Store) Insert(ctx context.Context, ts []storage.Timeout) ([]storage.Outcome, error) {
	exit, err := s.enter(ctx)
	if err != nil {
		return nil, err
	}
	defer exit()
	if err := storage.CheckInsert(ts); err != nil {
		return nil, fmt.Errorf("boltstore: insert: %w", err)
	}
	outcomes, keys := make([]storage.Outcome, len(ts)), make([]string, len(ts))
	if len(ts) == 0 {
		return outcomes, nil
	}
	now := s.now()
	err = s.update(func(tx *bolt.Tx, c *counts) error {
		b, err := buckets(tx, c)
		if err != nil {
			return err
		}
		return s.insert(b, ts, outcomes, keys, now)
	})
	if err != nil {
		return nil, fmt.Errorf("boltstore: insert: %w", err)
	}
	setKeys(ts, outcomes, keys)
	return outcomes, nil
}

// setKeys sets the ID of each row stored to its key, once the commit is
// done (a write run again must not see keys for ids).
func setKeys(ts []storage.Timeout, outcomes []storage.Outcome, keys []string) {
	for i := range ts {
		if outcomes[i] == storage.Stored {
			ts[i].ID = keys[i]
		}
	}
}

// insert stores the rows of ts that are neither cancelled at now nor the
// redelivery of a pending send (storage.PlaceSend), and sets each one's
// outcome.
func (s *Store) insert(b txb, ts []storage.Timeout, outcomes []storage.Outcome, keys []string, now time.Time) error {
	for i := range ts {
		if b.cancelled(ts[i].ID, now) {
			outcomes[i] = storage.Cancelled
			continue
		}
		// The family read sees this transaction's own puts, so a
		// repeated send in ts is caught here too.
		rs, err := b.family(ts[i].ID, false)
		if err != nil {
			return err
		}
		pending := make([]storage.PendingSend, len(rs))
		for j, r := range rs {
			pending[j] = storage.PendingSend{Key: r.ID, Fingerprint: r.Fingerprint, Leased: s.leases.leased(r.ID, now)}
		}
		key, o := storage.PlaceSend(ts[i].ID, ts[i].Fingerprint, pending)
		if outcomes[i] = o; o != storage.Stored {
			continue
		}
		keys[i] = key
		t := ts[i]
		t.ID = key
		if len(key) > maxIDLen {
			return fmt.Errorf("timeout %q: key of send %q is longer than %d bytes", ts[i].ID, key, maxIDLen)
		}
		if err := b.add(&t); err != nil {
			return fmt.Errorf("timeout %q: %w", key, err)
		}
	}
	return nil
}

// family returns the rows of message id, every send of it, in key order.
func (b txb) family(id string, withMessage bool) ([]*row, error) {
	var rs []*row
	load := func(k, seq []byte) error {
		r, err := b.loadSeq(seq, withMessage)
		if err != nil {
			return fmt.Errorf("record %q: %w", k, err)
		}
		if r.ID != string(k) {
			return fmt.Errorf("record %q: %w: holds id %q", k, errCorrupt, r.ID)
		}
		rs = append(rs, r)
		return nil
	}
	if seq := b.ids.Get([]byte(id)); seq != nil {
		if err := load([]byte(id), seq); err != nil {
			return nil, err
		}
	}
	prefix := []byte(id + wire.SendSep)
	c := b.ids.Cursor()
	for k, seq := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, seq = c.Next() {
		if !wire.IsKeyOf(string(k), id) {
			continue
		}
		if err := load(k, seq); err != nil {
			return nil, err
		}
	}
	return rs, nil
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
	err = s.view(func(tx *bolt.Tx) error {
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
			if !t.available(string(k[8:]), now) {
				continue
			}
			r, err := b.indexed(k, v, readyKey, false)
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
	var r *row
	err = s.view(func(tx *bolt.Tx) error {
		b, err := buckets(tx, nil)
		if err != nil {
			return err
		}
		if r, err = b.load(id); r != nil {
			r.Paused = b.isPaused(&r.Timeout)
		}
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

// GetMany returns copies of the rows with these ids, read in one read
// transaction; see storage.MultiGetter.
func (s *Store) GetMany(ctx context.Context, ids []string) (map[string]storage.Timeout, error) {
	exit, err := s.enter(ctx)
	if err != nil {
		return nil, err
	}
	defer exit()
	rows := make(map[string]storage.Timeout, len(ids))
	if len(ids) == 0 {
		return rows, nil
	}
	err = s.view(func(tx *bolt.Tx) error {
		b, err := buckets(tx, nil)
		if err != nil {
			return err
		}
		for _, id := range ids {
			if _, ok := rows[id]; ok {
				continue
			}
			r, err := b.load(id)
			if err != nil {
				return err
			}
			if r != nil {
				r.Paused = b.isPaused(&r.Timeout)
				rows[id] = r.Timeout
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("boltstore: get many: %w", err)
	}
	for id, r := range rows {
		s.leases.annotate(&r)
		rows[id] = r
	}
	return rows, nil
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
	err := s.updateRow(ctx, "release", id, func(b txb, r *row, now time.Time) error {
		if err := s.leases.check(id, lock, now); err != nil {
			return err
		}
		return b.reindex(r, func(t *storage.Timeout) { t.NotBefore = notBefore })
	})
	if err == nil {
		s.leases.end(id, lock)
	}
	return err
}

// IncrementFailureCount records a dispatch failure of id; the lease is kept.
func (s *Store) IncrementFailureCount(ctx context.Context, id, lock, reason string) (int, error) {
	var attempts int
	err := s.updateRow(ctx, "increment failure count", id, func(b txb, r *row, now time.Time) error {
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
	err = s.view(func(tx *bolt.Tx) error {
		b, err := buckets(tx, nil)
		if err != nil {
			return err
		}
		c := b.ready.Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			s.steps.Add(1)
			if !t.available(string(k[8:]), now) {
				continue
			}
			r, err := b.indexed(k, v, readyKey, false)
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

// ReleaseLeases frees every lease and returns how many it freed: their rows
// can be leased again at once. The bridge calls it before its dispatcher
// consumes again after losing the broker, since the tokens of those leases
// (handed over as transient messages) may have gone with a broker restart;
// a token that did survive no longer matches and is dropped as stale.
func (s *Store) ReleaseLeases() int { return s.leases.clearAll() }

// Stats returns how many rows the store holds (pending, leased or not) and
// how many of them are leased; see storage.Stater. It reads the counts kept
// in bucket meta: nothing is counted.
func (s *Store) Stats(ctx context.Context) (pending, leased int, err error) {
	exit, err := s.enter(ctx)
	if err != nil {
		return 0, 0, err
	}
	defer exit()
	err = s.view(func(tx *bolt.Tx) error {
		c := readCounts(tx.Bucket(bucketMeta))
		pending = int(c.pending)
		return nil
	})
	if err != nil {
		return 0, 0, fmt.Errorf("boltstore: stats: %w", err)
	}
	return pending, s.leases.count(), nil
}

// LeasedBy counts owner's leases, at most atMost of them; see
// storage.LeaseCounter. The leases live in memory, counted by owner: nothing
// is read.
func (s *Store) LeasedBy(ctx context.Context, owner string, atMost int) (int, error) {
	if atMost <= 0 {
		return 0, fmt.Errorf("boltstore: leased by: atMost %d is not positive", atMost)
	}
	exit, err := s.enter(ctx)
	if err != nil {
		return 0, err
	}
	exit()
	return min(s.leases.countOwner(owner), atMost), nil
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
	err = s.view(func(tx *bolt.Tx) error {
		b, err := buckets(tx, nil)
		if err != nil {
			return err
		}
		switch {
		case f.ID != "":
			rs, err := b.family(f.ID, f.HeaderName != "")
			if err == nil {
				rows, next = listFew(b, rs, f, after)
			}
			return err
		case f.SagaID != "":
			rs, err := b.sagaRecords(f.SagaID)
			if err == nil {
				rows, next = listFew(b, rs, f, after)
			}
			return err
		}
		rows, next, err = listDue(b, f, after)
		return err
	})
	if err != nil {
		return nil, "", fmt.Errorf("boltstore: list: %w", err)
	}
	// The lease table is locked only outside read transactions (Lease
	// holds it while it begins one): a read transaction waiting for it
	// while a remap or a reopen (renew.go) waits for that transaction
	// would stop every read.
	for i := range rows {
		s.leases.annotate(&rows[i])
	}
	return rows, next, nil
}

// listDue is List for the other filters: a row that is not held sits in
// ready at its due time; a held one is listed from held and skipped in
// ready. Both are keyed by time and id: merged, they give due order, ties by
// id.
func listDue(b txb, f storage.ListFilter, after []byte) ([]storage.Timeout, string, error) {
	var rows []storage.Timeout
	rc, hc := b.ready.Cursor(), b.held.Cursor()
	rk, rv := seekList(rc, f, after)
	hk, hv := seekList(hc, f, after)
	for rk != nil || hk != nil {
		k, v, fromHeld := rk, rv, false
		if hk != nil && (rk == nil || bytes.Compare(hk, rk) < 0) {
			k, v, fromHeld = hk, hv, true
			hk, hv = hc.Next()
		} else {
			rk, rv = rc.Next()
		}
		key := readyKey
		if fromHeld {
			key = dueKey
		}
		// A header filter reads the message (see storage.ListFilter).
		r, err := b.indexed(k, v, key, f.HeaderName != "")
		if err != nil {
			return nil, "", err
		}
		if !fromHeld && held(&r.Timeout) {
			continue
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
		r.Message, r.Fingerprint = nil, nil
		if len(rows) == f.Limit {
			return rows, hex.EncodeToString(dueKey(&rows[len(rows)-1])), nil
		}
		r.Paused = fromHeld && b.isPaused(&r.Timeout)
		rows = append(rows, r.Timeout)
	}
	return rows, "", nil
}

// seekList puts c on the first key List reads: the one after the cursor,
// else the first at or after f.DueFrom, else the first.
func seekList(c *bolt.Cursor, f storage.ListFilter, after []byte) (k, v []byte) {
	switch {
	case after != nil:
		if k, v = c.Seek(after); k != nil && bytes.Equal(k, after) {
			k, v = c.Next()
		}
	case !f.DueFrom.IsZero():
		k, v = c.Seek(binary.BigEndian.AppendUint64(nil, keyTime(f.DueFrom)))
	default:
		k, v = c.First()
	}
	return k, v
}

// listFew is List for a filter with an ID or a SagaID, over rs, the rows
// of that id (every send) or saga, read from their index, whose keys are
// not in due order: it sorts them by their due-index keys, so pages and
// cursors are those of the due index, at the cost of reading the rows on
// every page (an id or a saga has a few).
func listFew(b txb, rs []*row, f storage.ListFilter, after []byte) ([]storage.Timeout, string) {
	var found []storage.Timeout
	for _, r := range rs {
		switch {
		case after != nil && bytes.Compare(dueKey(&r.Timeout), after) <= 0,
			!f.Selects(&r.Timeout):
			continue
		}
		r.Message, r.Fingerprint = nil, nil
		r.Paused = b.isPaused(&r.Timeout)
		found = append(found, r.Timeout)
	}
	slices.SortFunc(found, func(x, y storage.Timeout) int { return bytes.Compare(dueKey(&x), dueKey(&y)) })
	var next string
	if len(found) > f.Limit {
		found = found[:f.Limit]
		next = hex.EncodeToString(dueKey(&found[len(found)-1]))
	}
	return found, next // annotated by List
}

// Cancel removes the sends of id that are not leased and records a
// tombstone, in the same transaction as the lookup; see storage.Store.
// bbolt's single writer makes Cancel and Insert atomic.
func (s *Store) Cancel(ctx context.Context, id string, mode storage.CancelMode) error {
	var found, removed int
	err := s.pinnedWrite(ctx, func(_ *bolt.Tx, b txb, pins *pinSet, now time.Time) error {
		var err error
		found, removed, err = s.cancel(b, pins, id, mode, now)
		return err
	})
	if err == nil {
		err = storage.FoundErr(found, removed)
	}
	if err != nil {
		return fmt.Errorf("boltstore: cancel %q: %w", id, err)
	}
	return nil
}

// cancel is Cancel within a write: it removes the sends of id that are not
// leased, pinning them, leaves the tombstone, and counts what it found and
// removed.
func (s *Store) cancel(b txb, pins *pinSet, id string, mode storage.CancelMode, now time.Time) (found, removed int, err error) {
	rs, err := b.family(id, false)
	if err != nil {
		return 0, 0, err
	}
	found = len(rs)
	for _, r := range rs {
		if pins.pin(r.ID, now) != nil {
			continue // leased: too late for this send
		}
		if err := b.forget(r); err != nil {
			return 0, 0, err
		}
		removed++
	}
	switch {
	case found > 0 && removed == 0:
		return found, 0, nil // every send is being dispatched: no tombstone
	case found == 0 && (mode == storage.CancelFound || len(id) == 0 || len(id) > maxIDLen):
		return 0, 0, nil // nothing to remember
	}
	return found, removed, s.tombstone(b, id, now)
}

// InsertAndCancel applies ts and cancels in their order in one write
// transaction; see storage.InsertCanceller.
func (s *Store) InsertAndCancel(ctx context.Context, ts []storage.Timeout, cancels []storage.OrderedCancel) ([]storage.Outcome, []storage.CancelResult, error) {
	if len(cancels) == 0 {
		outcomes, err := s.Insert(ctx, ts)
		return outcomes, nil, err
	}
	if err := storage.CheckInsert(ts); err != nil {
		return nil, nil, fmt.Errorf("boltstore: insert and cancel: %w", err)
	}
	if err := storage.CheckCancels(len(ts), cancels); err != nil {
		return nil, nil, fmt.Errorf("boltstore: insert and cancel: %w", err)
	}
	outcomes, keys := make([]storage.Outcome, len(ts)), make([]string, len(ts))
	results := make([]storage.CancelResult, len(cancels))
	err := s.pinnedWrite(ctx, func(tx *bolt.Tx, b txb, pins *pinSet, now time.Time) error {
		clear(outcomes)
		clear(keys)
		clear(results)
		sb, err := scheduleBuckets(tx)
		if err != nil {
			return err
		}
		next := 0 // the first row not yet inserted
		for i, c := range cancels {
			if err := s.insert(b, ts[next:c.At], outcomes[next:c.At], keys[next:c.At], now); err != nil {
				return err
			}
			next = c.At
			if c.Schedule != "" {
				if results[i].ScheduleFound, err = s.cancelSchedule(b, sb, pins, c.Schedule, now); err != nil {
					return err
				}
			}
			found, removed, err := s.cancel(b, pins, c.ID, storage.CancelOrdered, now)
			if err != nil {
				return err
			}
			results[i].Err = storage.FoundErr(found, removed)
		}
		return s.insert(b, ts[next:], outcomes[next:], keys[next:], now)
	})
	if err != nil {
		return nil, nil, fmt.Errorf("boltstore: insert and cancel: %w", err)
	}
	setKeys(ts, outcomes, keys)
	return outcomes, results, nil
}

// CancelSaga removes the rows of saga sagaID that are not leased and leaves
// a tombstone for each, in one transaction; see storage.SagaCanceller.
func (s *Store) CancelSaga(ctx context.Context, sagaID string) (cancelled, leased int, err error) {
	if sagaID == "" {
		return 0, 0, errors.New("boltstore: cancel saga: empty saga id")
	}
	err = s.pinnedWrite(ctx, func(_ *bolt.Tx, b txb, pins *pinSet, now time.Time) error {
		var err error
		cancelled, leased, err = s.cancelSaga(b, pins, sagaID, nil, now)
		return err
	})
	if err != nil {
		return 0, 0, fmt.Errorf("boltstore: cancel saga %q: %w", sagaID, err)
	}
	return cancelled, leased, nil
}

// ReplaceGroups cancels the groups' rows and inserts ts in one
// transaction; see storage.GroupReplacer.
func (s *Store) ReplaceGroups(ctx context.Context, groups []string, ts []storage.Timeout) (outcomes []storage.Outcome, cancelled, leased int, err error) {
	if slices.Contains(groups, "") {
		return nil, 0, 0, errors.New("boltstore: replace groups: empty group")
	}
	exit, err := s.enter(ctx)
	if err != nil {
		return nil, 0, 0, err
	}
	defer exit()
	if err := storage.CheckInsert(ts); err != nil {
		return nil, 0, 0, fmt.Errorf("boltstore: replace groups: %w", err)
	}
	outcomes = make([]storage.Outcome, len(ts))
	keys := make([]string, len(ts))
	if len(groups) == 0 && len(ts) == 0 {
		return outcomes, 0, 0, nil
	}
	spared := storage.Spared(groups, ts)
	now := s.now()
	pins := pinSet{t: s.leases}
	defer pins.release()
	err = s.update(func(tx *bolt.Tx, c *counts) error {
		cancelled, leased = 0, 0
		b, err := buckets(tx, c)
		if err != nil {
			return err
		}
		for _, g := range groups {
			n, l, err := s.cancelSaga(b, &pins, g, spared, now)
			if err != nil {
				return err
			}
			cancelled, leased = cancelled+n, leased+l
		}
		return s.insert(b, ts, outcomes, keys, now)
	})
	if err != nil {
		return nil, 0, 0, fmt.Errorf("boltstore: replace groups: %w", err)
	}
	setKeys(ts, outcomes, keys)
	return outcomes, cancelled, leased, nil
}

// cancelSaga removes the rows of saga that are not leased and not spared,
// leaving a tombstone for each, and counts them and the leased ones.
func (s *Store) cancelSaga(b txb, pins *pinSet, saga string, spared map[string]bool, now time.Time) (cancelled, leased int, err error) {
	rs, err := b.sagaRecords(saga)
	if err != nil {
		return 0, 0, err
	}
	for _, r := range rs {
		if spared[wire.KeyID(r.ID)] {
			continue
		}
		if err := pins.pin(r.ID, now); err != nil {
			leased++
			continue
		}
		if err := b.forget(r); err != nil {
			return 0, 0, err
		}
		// A tombstone, as Cancel leaves: a copy of a cancelled timeout
		// stored again (a requeue) must not bring it back.
		if err := s.tombstone(b, r.ID, now); err != nil {
			return 0, 0, err
		}
		cancelled++
	}
	return cancelled, leased, nil
}

// sagaRecords returns the records of saga's rows, in id order, from the
// saga index. They are decoded copies: the caller may change the buckets.
func (b txb) sagaRecords(saga string) ([]*row, error) {
	prefix := sagaKey(saga, "")
	var ids []string
	cur := b.sagas.Cursor()
	for k, _ := cur.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = cur.Next() {
		ids = append(ids, string(k[len(prefix):]))
	}
	rs := make([]*row, 0, len(ids))
	for _, id := range ids {
		r, err := b.load(id)
		switch {
		case err != nil:
			return nil, err
		case r == nil || r.SagaID != saga:
			return nil, fmt.Errorf("%w: saga index entry for %q does not match its record", errCorrupt, id)
		}
		rs = append(rs, r)
	}
	return rs, nil
}

// tombstone records that the message id of key was cancelled at now, for
// the cancel window: a tombstone holds for every send of the id.
func (s *Store) tombstone(b txb, key string, now time.Time) error {
	return b.cancels.Put([]byte(wire.KeyID(key)), binary.BigEndian.AppendUint64(nil, uint64(now.Add(s.window).UnixNano())))
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

// Reschedule moves the sends of id that are not leased to a new due time.
func (s *Store) Reschedule(ctx context.Context, id string, dueAt time.Time) error {
	if err := storage.CheckDueAt(dueAt); err != nil {
		return fmt.Errorf("boltstore: reschedule %q: %w", id, err)
	}
	var found, moved int
	err := s.pinnedWrite(ctx, func(_ *bolt.Tx, b txb, pins *pinSet, now time.Time) error {
		found, moved = 0, 0
		rs, err := b.family(id, true) // save writes the whole record
		if err != nil {
			return err
		}
		found = len(rs)
		for _, r := range rs {
			if pins.pin(r.ID, now) != nil {
				continue // leased
			}
			if err := b.moveDue(r, dueAt); err != nil {
				return err
			}
			moved++
		}
		return nil
	})
	if err == nil {
		err = storage.FoundErr(found, moved)
	}
	if err != nil {
		return fmt.Errorf("boltstore: reschedule %q: %w", id, err)
	}
	return nil
}

// moveDue sets r's due time to dueAt and clears its retry hold, in the
// indexes too; r is not under a live lease.
func (b txb) moveDue(r *row, dueAt time.Time) error {
	return b.reindex(r, func(t *storage.Timeout) { t.DueAt, t.NotBefore = dueAt, time.Time{} })
}

// changeUnleased applies change to row id unless it is leased and its lease
// still valid (ErrLeased).
func (s *Store) changeUnleased(ctx context.Context, op, id string, change func(txb, *row) error) error {
	pins := pinSet{t: s.leases}
	defer pins.release()
	return s.updateRow(ctx, op, id, func(b txb, r *row, now time.Time) error {
		if err := pins.pin(id, now); err != nil {
			return err // storage.ErrLeased
		}
		return change(b, r)
	})
}

// updateRow runs fn on row id in a write transaction, with the store's now;
// a missing row is ErrNotFound. Errors name op and id.
func (s *Store) updateRow(ctx context.Context, op, id string, fn func(b txb, r *row, now time.Time) error) error {
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
