package boltstore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"

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
// time:   varint seconds since 0001-01-01T00:00:00Z, then uvarint nanoseconds
//
//	(< 1e9). The zero time.Time encodes as 0,0 and decodes as the zero
//	time; every time decodes in UTC.
//
// Decoding is strict: an unknown version or index, a length running past the
// end, nanoseconds >= 1e9 or trailing bytes are errors.

// secondsToUnix is the offset between seconds since year 1 and Unix seconds.
const secondsToUnix int64 = 62135596800

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
	b = appendString(b, r.Lock)
	b = appendTime(b, r.LockExpiresAt)
	return appendTime(b, r.NotBefore)
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func appendTime(b []byte, t time.Time) []byte {
	if t.IsZero() {
		return append(b, 0, 0)
	}
	b = binary.AppendVarint(b, t.Unix()+secondsToUnix)
	return binary.AppendUvarint(b, uint64(t.Nanosecond()))
}

// decodeRecord decodes v, a record of versions 1 to 3 (format 1), into a
// record that shares no memory with v (v may be bbolt's mmap, valid only
// inside the transaction).
func decodeRecord(v []byte) (*record, error) {
	d := decoder{b: v}
	version := d.byte()
	if d.err == nil && (version < 1 || version > recordVersion) {
		return nil, fmt.Errorf("%w: unknown version %d", errCorrupt, version)
	}
	r := &record{}
	r.index = d.byte()
	if d.err == nil && r.index != idxReady && r.index != idxLeased {
		return nil, fmt.Errorf("%w: unknown index %d", errCorrupt, r.index)
	}
	copy(r.key[:], d.next(keyLen))
	d.head(&r.Timeout, version, true)
	r.Lock = d.string()
	r.LockExpiresAt = d.time()
	r.NotBefore = d.time()
	if err := d.end(); err != nil {
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
	b = appendTime(b, t.NotBefore)
	return appendBytes(b, t.Fingerprint)
}

// appendBytes writes p as the format's bytes: a nil p is length 0.
func appendBytes(b, p []byte) []byte {
	if p == nil {
		return binary.AppendUvarint(b, 0)
	}
	b = binary.AppendUvarint(b, uint64(len(p))+1)
	return append(b, p...)
}

// appendHead appends the fields versions 3 and 4 share, ID to LastError.
func appendHead(b []byte, t *storage.Timeout) []byte {
	b = appendString(b, t.ID)
	b = appendString(b, t.Destination)
	b = appendString(b, t.Exchange)
	b = appendString(b, t.SagaID)
	b = appendTime(b, t.DueAt)
	b = appendTime(b, t.ReceivedAt)
	b = appendBytes(b, t.Message)
	b = binary.AppendVarint(b, int64(t.Attempts))
	return appendString(b, t.LastError)
}

// decodeRow decodes a record of version 4 or 5 into a timeout that shares
// no memory with v; without withMessage it leaves Message nil and copies
// nothing of it.
func decodeRow(v []byte, withMessage bool) (*storage.Timeout, error) {
	d := decoder{b: v}
	version := d.byte()
	if d.err == nil && version != rowVersion && version != rowVersion4 {
		return nil, fmt.Errorf("%w: unknown version %d", errCorrupt, version)
	}
	t := &storage.Timeout{}
	d.head(t, version, withMessage)
	t.NotBefore = d.time()
	if version >= 5 {
		if n := d.uvarint(); n > 0 {
			if fp := d.next(n - 1); fp != nil {
				t.Fingerprint = bytes.Clone(fp)
			}
		}
	}
	if err := d.end(); err != nil {
		return nil, err
	}
	return t, nil
}

// rowDest returns the exchange and the key of a record of version 4 or 5 as
// slices of v: the initial count (destcount.go) reads every row of the
// file, and decodeRow would copy five fields of each. Only the fields up to
// the exchange are checked; a read of the row (decodeRow) checks the rest.
func rowDest(v []byte) (exchange, key []byte, err error) {
	d := decoder{b: v}
	if version := d.byte(); d.err == nil && version != rowVersion && version != rowVersion4 {
		return nil, nil, fmt.Errorf("%w: unknown version %d", errCorrupt, version)
	}
	d.next(d.uvarint()) // ID
	key = d.next(d.uvarint())
	exchange = d.next(d.uvarint())
	return exchange, key, d.err
}

// head decodes the fields from ID to LastError of a record of version.
func (d *decoder) head(t *storage.Timeout, version byte, withMessage bool) {
	t.ID = d.string()
	t.Destination = d.string()
	if version >= 2 {
		t.Exchange = d.string()
	}
	if version >= 3 {
		t.SagaID = d.string()
	}
	t.DueAt = d.time()
	t.ReceivedAt = d.time()
	if n := d.uvarint(); n > 0 {
		if msg := d.next(n - 1); msg != nil && withMessage {
			t.Message = make([]byte, len(msg))
			copy(t.Message, msg)
		}
	}
	attempts := d.varint()
	if d.err == nil && (attempts < math.MinInt || attempts > math.MaxInt) {
		d.fail("attempts out of range")
	}
	t.Attempts = int(attempts)
	t.LastError = d.string()
}

// end fails on trailing bytes and returns the first error.
func (d *decoder) end() error {
	if d.err == nil && len(d.b) != 0 {
		d.fail(fmt.Sprintf("%d trailing bytes", len(d.b)))
	}
	return d.err
}

// decoder consumes v; after the first error every read returns zero values.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: %s", errCorrupt, what)
	}
	d.b = nil
}

func (d *decoder) next(n uint64) []byte {
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.b)) {
		d.fail("truncated")
		return nil
	}
	p := d.b[:n:n]
	d.b = d.b[n:]
	return p
}

func (d *decoder) byte() byte {
	if p := d.next(1); p != nil {
		return p[0]
	}
	return 0
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail("bad uvarint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) varint() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail("bad varint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) string() string {
	n := d.uvarint()
	return string(d.next(n)) // string() copies
}

func (d *decoder) time() time.Time {
	sec := d.varint()
	nsec := d.uvarint()
	if d.err != nil {
		return time.Time{}
	}
	if nsec >= 1e9 {
		d.fail("nanoseconds out of range")
		return time.Time{}
	}
	if sec == 0 && nsec == 0 {
		return time.Time{}
	}
	if sec < math.MinInt64+secondsToUnix {
		d.fail("time out of range")
		return time.Time{}
	}
	return time.Unix(sec-secondsToUnix, int64(nsec)).UTC()
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
