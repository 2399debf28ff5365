package boltstore

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/wire"
)

// Pauses (storage.Pauser). Bucket pauses holds the paused destinations.
// A row of a paused destination is in neither ready nor anywhere Lease and
// NextDue look: it sits in held at its due time, where List, Bulk and the
// due-soon counts find it as they find a row a retry holds, and in parked
// under its destination, where Resume finds the destination's rows without
// reading the others. So a paused destination's rows, however many, cost
// Lease nothing. Every write that moves a row (index, unindex) asks bucket
// pauses where the row belongs, inside its own transaction, so the row's
// place always agrees with the pause as committed.
//
// Pause finds the destination's rows by reading every record once (a
// sequential read of bucket rows, outside the writer), then moves them in
// one write, together with the rows added since that read (their sequences
// are higher); Resume reads only the destination's parked rows. The writer
// is held for the move of the destination's rows, not for the read.

// createPauseBuckets makes the pause buckets of a file that lacks them.
func createPauseBuckets(tx *bolt.Tx) error {
	for _, name := range [][]byte{bucketPauses, bucketParked} {
		if _, err := tx.CreateBucketIfNotExists(name); err != nil {
			return err
		}
	}
	return nil
}

// destKey is a destination's key in pauses and the prefix of its rows in
// parked: the exchange and the routing key, each after its length (2
// bytes), so no destination's key is a prefix of another's.
func destKey(d wire.Destination) []byte {
	k := make([]byte, 0, 4+len(d.Exchange)+len(d.Key))
	k = binary.BigEndian.AppendUint16(k, uint16(len(d.Exchange)))
	k = append(k, d.Exchange...)
	k = binary.BigEndian.AppendUint16(k, uint16(len(d.Key)))
	return append(k, d.Key...)
}

// parseDestKey is destKey's inverse.
func parseDestKey(k []byte) (wire.Destination, error) {
	var d wire.Destination
	if len(k) < 2 {
		return d, fmt.Errorf("%w: pause key %x", errCorrupt, k)
	}
	n := int(binary.BigEndian.Uint16(k))
	if len(k) < 4+n {
		return d, fmt.Errorf("%w: pause key %x", errCorrupt, k)
	}
	d.Exchange = string(k[2 : 2+n])
	m := int(binary.BigEndian.Uint16(k[2+n:]))
	if len(k) != 4+n+m {
		return d, fmt.Errorf("%w: pause key %x", errCorrupt, k)
	}
	d.Key = string(k[4+n:])
	return d, nil
}

// parkKey is a paused row's key in parked.
func parkKey(t *storage.Timeout) []byte { return append(destKey(t.Dest()), dueKey(t)...) }

// isPaused reports whether t's destination is paused in this transaction.
func (b txb) isPaused(t *storage.Timeout) bool {
	if k, _ := b.pauses.Cursor().First(); k == nil {
		return false // no pause at all: the common case costs no key
	}
	return b.pauses.Get(destKey(t.Dest())) != nil
}

// maxDestKey bounds a destination's key: parked keys append a due key
// (8 bytes and an id) to it.
const maxDestKey = 1024

// Pause holds d's rows; see storage.Pauser.
func (s *Store) Pause(ctx context.Context, d wire.Destination, by string) (bool, error) {
	if err := storage.CheckPauseDestination(d); err != nil {
		return false, err
	}
	if len(destKey(d)) > maxDestKey || len(by) > maxDestKey {
		return false, errors.New("boltstore: pause: destination or name too long")
	}
	seqs, last, err := s.destRows(ctx, d)
	if err != nil {
		return false, fmt.Errorf("boltstore: pause %s: %w", d, err)
	}
	return s.switchPause(ctx, d, true, by, func(b txb, dk []byte) ([]*row, error) {
		var rs []*row
		add := func(seq []byte) error {
			if b.rows.Get(seq) == nil {
				return nil // removed since the read
			}
			r, err := b.loadSeq(seq, false)
			if err != nil {
				return err
			}
			if r.Dest() == d {
				rs = append(rs, r)
			}
			return nil
		}
		for _, seq := range seqs {
			if err := add(seq[:]); err != nil {
				return nil, err
			}
		}
		// The rows added since the read.
		cur := b.rows.Cursor()
		k, _ := cur.First()
		if last != nil {
			if k, _ = cur.Seek(last); k != nil && bytes.Equal(k, last) {
				k, _ = cur.Next()
			}
		}
		for ; k != nil; k, _ = cur.Next() {
			if err := add(k); err != nil {
				return nil, err
			}
		}
		return rs, nil
	})
}

// switchPause is the write of Pause (pause) and Resume. Unless d is paused
// (pause) or not paused already, it takes d's rows, which rows finds, out
// of the indexes, records or deletes d's pause (by: who paused), and
// indexes the rows again as they now stand, in the order of their new keys
// (see sortRows). changed: d was not in that state.
func (s *Store) switchPause(ctx context.Context, d wire.Destination, pause bool, by string, rows func(b txb, dk []byte) ([]*row, error)) (bool, error) {
	exit, err := s.enter(ctx)
	if err != nil {
		return false, err
	}
	defer exit()
	now := s.now()
	changed := false
	err = s.update(func(tx *bolt.Tx, c *counts) error {
		changed = false
		b, err := buckets(tx, c)
		if err != nil {
			return err
		}
		dk := destKey(d)
		if (b.pauses.Get(dk) != nil) == pause {
			return nil
		}
		rs, err := rows(b, dk)
		if err != nil {
			return err
		}
		for _, r := range rs {
			if err := b.unindex(r); err != nil {
				return err
			}
		}
		if pause {
			v := binary.BigEndian.AppendUint64(nil, uint64(now.UnixNano()))
			err = b.pauses.Put(dk, append(v, by...))
			sortRows(rs, dueKey) // the order of their keys in held and parked
		} else {
			err = b.pauses.Delete(dk)
			sortRows(rs, readyKey)
		}
		if err != nil {
			return err
		}
		for _, r := range rs {
			if err := b.index(r); err != nil {
				return err
			}
		}
		changed = true
		return nil
	})
	if err != nil {
		verb := "resume"
		if pause {
			verb = "pause"
		}
		return false, fmt.Errorf("boltstore: %s %s: %w", verb, d, err)
	}
	return changed, nil
}

// sortRows orders rs by key. bbolt splits nodes only at commit, and a put
// shifts the keys after it in its node: many puts in random order into one
// node (a bucket that was empty, or a run of new keys) cost the square of
// their number (200,000 took 90 s), in key order next to nothing.
func sortRows(rs []*row, key func(*storage.Timeout) []byte) {
	slices.SortFunc(rs, func(x, y *row) int { return bytes.Compare(key(&x.Timeout), key(&y.Timeout)) })
}

// destRows reads every record once, in a read transaction, and returns the
// sequences of d's rows and the last sequence it read.
func (s *Store) destRows(ctx context.Context, d wire.Destination) (seqs [][8]byte, last []byte, err error) {
	err = s.readCall(ctx, func(tx *bolt.Tx) error {
		b, err := buckets(tx, nil)
		if err != nil {
			return err
		}
		if b.pauses.Get(destKey(d)) != nil {
			return nil // paused already: the write will see it
		}
		cur := b.rows.Cursor()
		for k, v := cur.First(); k != nil; k, v = cur.Next() {
			t, err := decodeRow(v, false)
			if err != nil {
				return fmt.Errorf("record %x: %w", k, err)
			}
			if t.Dest() == d {
				seqs = append(seqs, [8]byte(k))
			}
			last = k
		}
		last = bytes.Clone(last)
		return nil
	})
	return seqs, last, err
}

// Resume makes d's rows leasable again; see storage.Pauser.
func (s *Store) Resume(ctx context.Context, d wire.Destination) (bool, error) {
	if err := storage.CheckPauseDestination(d); err != nil {
		return false, err
	}
	return s.switchPause(ctx, d, false, "", func(b txb, dk []byte) ([]*row, error) {
		var rs []*row
		cur := b.parked.Cursor()
		for k, v := cur.Seek(dk); k != nil && bytes.HasPrefix(k, dk); k, v = cur.Next() {
			r, err := b.indexed(k, v, parkKey, false)
			if err != nil {
				return nil, err
			}
			if r.Dest() == d { // not a longer destination's key with this prefix
				rs = append(rs, r)
			}
		}
		return rs, nil
	})
}

// Paused lists the paused destinations; see storage.Pauser.
func (s *Store) Paused(ctx context.Context) ([]storage.PausedDestination, error) {
	var out []storage.PausedDestination
	err := s.readCall(ctx, func(tx *bolt.Tx) error {
		b, err := buckets(tx, nil)
		if err != nil {
			return err
		}
		return b.pauses.ForEach(func(k, v []byte) error {
			d, err := parseDestKey(k)
			if err != nil {
				return err
			}
			if len(v) < 8 {
				return fmt.Errorf("%w: pause of %s", errCorrupt, d)
			}
			out = append(out, storage.PausedDestination{Destination: d,
				Since: time.Unix(0, int64(binary.BigEndian.Uint64(v))).UTC(), By: string(v[8:])})
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("boltstore: paused: %w", err)
	}
	storage.SortPaused(out)
	return out, nil
}
