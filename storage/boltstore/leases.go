package boltstore

import (
	"crypto/rand"
	"encoding/hex"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/delaybridge/delaybridge/storage"
)

// Leases live in memory. The file has one owner, and Open frees every lease
// it finds, since one in the file was left by a predecessor that died: a
// lease never outlives its process, so writing it down bought nothing and
// cost a commit and two fsyncs on the path of every due message, queued
// behind the inserts and removals of the same moment. A leased
// row stays where it is in the ready index; Lease skips the rows leased
// here, and takes a row whose lease expired again, in its due order.
//
// Ordering with the file: a write that ends a lease (Remove, Release,
// Cancel, Reschedule) checks the lease inside its write transaction and
// drops it from the table only after its commit; Lease holds the table's
// lock for its whole read transaction. So a Lease either reads the file
// before that commit and sees the row still leased, or after it and sees
// the row as the commit left it. A write that changes a row that is not
// leased (Cancel, Reschedule, an unconditional Remove) pins it for the
// same span, checking and pinning at once, so that no Lease takes the row
// from a snapshot older than the change.

// leaseTable is the store's leases, by row id.
type leaseTable struct {
	mu   sync.Mutex
	byID map[string]heldLease
	// byOwner counts the leases of byID by owner (LeasedBy).
	byOwner map[string]int
	// pins counts the writes in flight on a row that is not leased: Lease
	// skips such a row (see unleased).
	pins map[string]int
	// tag makes this Open's locks unlike those of any earlier one, so a
	// dispatcher token from before a restart never matches a new lease.
	tag string
	seq uint64
	// minExpiry is at or before every lease's expiry (zero: no lease); it
	// may be earlier than the earliest, after that lease ended.
	minExpiry time.Time
}

type heldLease struct {
	lock    string
	expires time.Time
}

// owner is the owner the lease was taken for: its lock is owner, ':', then
// the table's tag and a number, neither holding ':'.
func (l heldLease) owner() string {
	return l.lock[:strings.LastIndexByte(l.lock, ':')]
}

func newLeaseTable() *leaseTable {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return &leaseTable{byID: make(map[string]heldLease), byOwner: make(map[string]int), pins: make(map[string]int),
		tag: hex.EncodeToString(b)}
}

// live returns the lease on id that is valid at now.
func (t *leaseTable) live(id string, now time.Time) (heldLease, bool) {
	l, ok := t.byID[id]
	return l, ok && now.Before(l.expires)
}

// available reports whether Lease may take id at now; the caller holds mu.
func (t *leaseTable) available(id string, now time.Time) bool {
	if t.pins[id] > 0 {
		return false
	}
	_, ok := t.live(id, now)
	return !ok
}

// pin refuses with storage.ErrLeased while id has a valid lease, and
// otherwise keeps Lease off id until unpin. Any expired lease on id ends.
func (t *leaseTable) pin(id string, now time.Time) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.live(id, now); ok {
		return storage.ErrLeased
	}
	t.endLocked(id, "")
	t.pins[id]++
	return nil
}

// unpin undoes one pin, after the commit (or the failure) of its write.
func (t *leaseTable) unpin(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.pins[id]--; t.pins[id] <= 0 {
		delete(t.pins, id)
	}
}

// take leases id to owner until expires; the caller holds mu.
func (t *leaseTable) take(id, owner string, expires time.Time) string {
	t.seq++
	lock := owner + ":" + t.tag + "." + strconv.FormatUint(t.seq, 10)
	if old, ok := t.byID[id]; ok { // expired: taken again
		t.uncount(old)
	}
	t.byID[id] = heldLease{lock: lock, expires: expires}
	t.byOwner[owner]++
	if t.minExpiry.IsZero() || expires.Before(t.minExpiry) {
		t.minExpiry = expires
	}
	return lock
}

// check returns storage.ErrConcurrency unless lock (when not empty) is the
// valid lease on id at now: the lease expired, or another poller holds it.
func (t *leaseTable) check(id, lock string, now time.Time) error {
	if lock == "" {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if l, ok := t.live(id, now); !ok || l.lock != lock {
		return storage.ErrConcurrency
	}
	return nil
}

// leased reports whether id has a valid lease at now.
func (t *leaseTable) leased(id string, now time.Time) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, ok := t.live(id, now)
	return ok
}

// end drops the lease on id, if it still is the one named lock (any lease
// when lock is empty): called after the commit that ended it.
func (t *leaseTable) end(id, lock string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.endLocked(id, lock)
}

func (t *leaseTable) endLocked(id, lock string) {
	if l, ok := t.byID[id]; ok && (lock == "" || l.lock == lock) {
		delete(t.byID, id)
		t.uncount(l)
	}
	if len(t.byID) == 0 {
		t.minExpiry = time.Time{}
	}
}

// annotate sets the lease fields of a row read from the file.
func (t *leaseTable) annotate(r *storage.Timeout) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if l, ok := t.byID[r.ID]; ok {
		r.Lock, r.LockExpiresAt = l.lock, l.expires
	} else {
		r.Lock, r.LockExpiresAt = "", time.Time{}
	}
}

// count is the number of leases, expired ones included until they are
// freed (see storage.Stater).
func (t *leaseTable) count() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.byID)
}

// countOwner is the number of owner's leases, expired ones included until
// they are freed, as count.
func (t *leaseTable) countOwner(owner string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.byOwner[owner]
}

// uncount takes l out of byOwner; the caller holds mu.
func (t *leaseTable) uncount(l heldLease) {
	o := l.owner()
	if t.byOwner[o]--; t.byOwner[o] <= 0 {
		delete(t.byOwner, o)
	}
}

// clearAll frees every lease and returns how many there were.
func (t *leaseTable) clearAll() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := len(t.byID)
	clear(t.byID)
	clear(t.byOwner)
	t.minExpiry = time.Time{}
	return n
}

// reap frees the leases expired at now and returns how many.
func (t *leaseTable) reap(now time.Time) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for id, l := range t.byID {
		if !now.Before(l.expires) {
			delete(t.byID, id)
			t.uncount(l)
			n++
		}
	}
	t.refreshMin()
	return n
}

// nextExpiry returns when the earliest lease expires; the caller holds mu.
func (t *leaseTable) nextExpiry() (time.Time, bool) {
	return t.minExpiry, !t.minExpiry.IsZero()
}

// refreshMin recomputes minExpiry; the caller holds mu.
func (t *leaseTable) refreshMin() {
	t.minExpiry = time.Time{}
	for _, l := range t.byID {
		if t.minExpiry.IsZero() || l.expires.Before(t.minExpiry) {
			t.minExpiry = l.expires
		}
	}
}

// pinAny keeps Lease off id until unpin, leased or not: for a write that
// ends any lease (an unconditional Remove).
func (t *leaseTable) pinAny(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.pins[id]++
}

// pinSet is the pins one write took, undone together once it is committed.
type pinSet struct {
	t   *leaseTable
	ids []string
}

func (p *pinSet) pin(id string, now time.Time) error {
	if err := p.t.pin(id, now); err != nil {
		return err
	}
	p.ids = append(p.ids, id)
	return nil
}

func (p *pinSet) pinAny(id string) {
	p.t.pinAny(id)
	p.ids = append(p.ids, id)
}

// release undoes every pin, also those of a run of the write that was
// rolled back and run again (see update).
func (p *pinSet) release() {
	for _, id := range p.ids {
		p.t.unpin(id)
	}
	p.ids = nil
}
