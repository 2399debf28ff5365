package boltstore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/delaybridge/delaybridge/internal/codec"
	"github.com/delaybridge/delaybridge/storage"
)

// recordVersion is the first byte of every record encodeRecord writes.
// decodeRecord also reads version 1, which files written before exchange
// destinations hold: it lacks Exchange, which then decodes as "", and
// version 2, which lacks SagaID (likewise "").
const recordVersion = 3

// Index a record currently occupies.
const (
	idxReady  byte = 1 // in bucket "ready": not leased, keyed by visible-at
	idxLeased byte = 2 // in bucket "leased": keyed by lock expiry
)

// keyLen is the length of an index key: 8-byte time + 8-byte sequence.
const keyLen = 16

// record is one row of bucket "timeouts": the timeout plus the index entry
// that points at it, so that moving or deleting the row never needs a scan.
type record struct {
	storage.Timeout
	index byte
	key   [keyLen]byte
}

// Record encoding, version 3 (all integers are encoding/binary varints):
//
//	version     byte   = 3
//	index       byte   1 = ready, 2 = leased
//	key         [16]byte index key (see indexKey)
//	ID          string
//	Destination string
//	Exchange    string (not in version 1)
//	SagaID      string (not in versions 1 and 2)
//	DueAt       time
//	ReceivedAt  time
//	Message     bytes
//	Attempts    varint
//	LastError   string
//	Lock        string
//	LockExpires time
//	NotBefore   time
//
// string: uvarint length, then the bytes.
// bytes:  uvarint length+1, then the bytes; 0 encodes a nil slice.
// time:   codec.AppendYear1Time: varint seconds since 0001-01-01T00:00:00Z,
//
//	then uvarint nanoseconds (< 1e9). The zero time.Time encodes as 0,0
//	and decodes as the zero time; every time decodes in UTC.
//
// Decoding is strict: an unknown version or index, a length running past the
// end, nanoseconds >= 1e9 or trailing bytes are errors.

var errCorrupt = errors.New("corrupt record")

func encodeRecord(r *record) []byte {
	n := 2 + keyLen +
		5*binary.MaxVarintLen64 + len(r.ID) + len(r.Destination) + len(r.Exchange) + len(r.SagaID) + len(r.LastError) +
		2*binary.MaxVarintLen64 + len(r.Lock) + len(r.Message) +
		8*binary.MaxVarintLen64
	b := make([]byte, 0, n)
	b = append(b, recordVersion, r.index)
	b = append(b, r.key[:]...)
	b = appendHead(b, &r.Timeout)
	b = codec.AppendString(b, r.Lock)
	b = codec.AppendYear1Time(b, r.LockExpiresAt)
	return codec.AppendYear1Time(b, r.NotBefore)
}

// decodeRecord decodes v, a record of versions 1 to 3 (format 1), into a
// record that shares no memory with v (v may be bbolt's mmap, valid only
// inside the transaction).
func decodeRecord(v []byte) (*record, error) {
	d := codec.NewDecoder(v, errCorrupt)
	version := d.Byte()
	if d.Err() == nil && (version < 1 || version > recordVersion) {
		return nil, fmt.Errorf("%w: unknown version %d", errCorrupt, version)
	}
	r := &record{}
	r.index = d.Byte()
	if d.Err() == nil && r.index != idxReady && r.index != idxLeased {
		return nil, fmt.Errorf("%w: unknown index %d", errCorrupt, r.index)
	}
	copy(r.key[:], d.Next(keyLen))
	readHead(d, &r.Timeout, version, true)
	r.Lock = d.String()
	r.LockExpiresAt = d.Year1Time()
	r.NotBefore = d.Year1Time()
	if err := d.End(); err != nil {
		return nil, err
	}
	return r, nil
}

// rowVersion is the version of the records of format 2 (bucket rows): those
// of version 3 without the index entry, which follows from the record, and
// without the lock, which lives in memory (leases.go).
//
//	version     byte   = 5
//	ID, Destination, Exchange, SagaID, DueAt, ReceivedAt, Message,
//	Attempts, LastError as in version 3
//	NotBefore   time
//	Fingerprint bytes (not in version 4, whose rows decode without one)
const rowVersion = 5

// rowVersion4 is the version of format 2's rows written before fingerprints.
const rowVersion4 = 4

// dropMappedAbove is the value size from which a read drops the value's
// mapped pages after copying it (dropMapped).
const dropMappedAbove = 1 << 20

// Mapped file pages above mapTrimLimit are dropped after a commit, at most
// once per mapTrimInterval (dropmap_linux.go).
const (
	mapTrimLimit    = 64 << 20
	mapTrimInterval = 100 * time.Millisecond
)

func encodeRow(t *storage.Timeout) []byte {
	b := make([]byte, 0, 1+8*binary.MaxVarintLen64+len(t.ID)+len(t.Destination)+len(t.Exchange)+len(t.SagaID)+
		len(t.LastError)+len(t.Message)+len(t.Fingerprint)+6*binary.MaxVarintLen64)
	b = append(b, rowVersion)
	b = appendHead(b, t)
	b = codec.AppendYear1Time(b, t.NotBefore)
	return codec.AppendNullableBytes(b, t.Fingerprint)
}

// appendHead appends the fields versions 3 and 4 share, ID to LastError.
func appendHead(b []byte, t *storage.Timeout) []byte {
	b = codec.AppendString(b, t.ID)
	b = codec.AppendString(b, t.Destination)
	b = codec.AppendString(b, t.Exchange)
	b = codec.AppendString(b, t.SagaID)
	b = codec.AppendYear1Time(b, t.DueAt)
	b = codec.AppendYear1Time(b, t.ReceivedAt)
	b = codec.AppendNullableBytes(b, t.Message)
	b = binary.AppendVarint(b, int64(t.Attempts))
	return codec.AppendString(b, t.LastError)
}

// decodeRow decodes a record of version 4 or 5 into a timeout that shares
// no memory with v; without withMessage it leaves Message nil and copies
// nothing of it.
func decodeRow(v []byte, withMessage bool) (*storage.Timeout, error) {
	d := codec.NewDecoder(v, errCorrupt)
	version := d.Byte()
	if d.Err() == nil && version != rowVersion && version != rowVersion4 {
		return nil, fmt.Errorf("%w: unknown version %d", errCorrupt, version)
	}
	t := &storage.Timeout{}
	readHead(d, t, version, withMessage)
	t.NotBefore = d.Year1Time()
	if version >= 5 {
		if fp := d.NullableBytes(); fp != nil {
			t.Fingerprint = bytes.Clone(fp)
		}
	}
	if err := d.End(); err != nil {
		return nil, err
	}
	return t, nil
}

// rowDest returns the exchange and the key of a record of version 4 or 5 as
// slices of v: the initial count (destcount.go) reads every row of the
// file, and decodeRow would copy five fields of each. Only the fields up to
// the exchange are checked; a read of the row (decodeRow) checks the rest.
func rowDest(v []byte) (exchange, key []byte, err error) {
	d := codec.NewDecoder(v, errCorrupt)
	if version := d.Byte(); d.Err() == nil && version != rowVersion && version != rowVersion4 {
		return nil, nil, fmt.Errorf("%w: unknown version %d", errCorrupt, version)
	}
	d.Next(d.Uvarint()) // ID
	key = d.Next(d.Uvarint())
	exchange = d.Next(d.Uvarint())
	return exchange, key, d.Err()
}

// readHead decodes the fields from ID to LastError of a record of version.
func readHead(d *codec.Decoder, t *storage.Timeout, version byte, withMessage bool) {
	t.ID = d.String()
	t.Destination = d.String()
	if version >= 2 {
		t.Exchange = d.String()
	}
	if version >= 3 {
		t.SagaID = d.String()
	}
	t.DueAt = d.Year1Time()
	t.ReceivedAt = d.Year1Time()
	if msg := d.NullableBytes(); msg != nil && withMessage {
		t.Message = make([]byte, len(msg))
		copy(t.Message, msg)
	}
	attempts := d.Varint()
	if d.Err() == nil && (attempts < math.MinInt || attempts > math.MaxInt) {
		d.Fail("attempts out of range")
	}
	t.Attempts = int(attempts)
	t.LastError = d.String()
}

// Index keys: 8 bytes big-endian time, then 8 bytes big-endian sequence (the
// sequence makes keys unique and orders equal times by arrival).
//
// The time part is the Unix nanosecond count with its sign bit flipped, so
// that unsigned byte order equals time order for every instant Unix
// nanoseconds can express (years 1678 to 2262), including those before 1970.
// Earlier instants clamp to 0 and later ones to all ones; inside a clamped
// range keys order by sequence, and callers compare the exact time stored in
// the record before acting.

var (
	minKeyTime = time.Unix(0, math.MinInt64)
	maxKeyTime = time.Unix(0, math.MaxInt64)
)

func keyTime(t time.Time) uint64 {
	switch {
	case t.Before(minKeyTime):
		return 0
	case t.After(maxKeyTime):
		return math.MaxUint64
	}
	return uint64(t.UnixNano()) ^ (1 << 63)
}

func indexKey(t time.Time, seq uint64) [keyLen]byte {
	var k [keyLen]byte
	binary.BigEndian.PutUint64(k[:8], keyTime(t))
	binary.BigEndian.PutUint64(k[8:], seq)
	return k
}

// visibleAt is when a row that is not leased becomes leasable.
func visibleAt(t *storage.Timeout) time.Time {
	if t.NotBefore.After(t.DueAt) {
		return t.NotBefore
	}
	return t.DueAt
}
