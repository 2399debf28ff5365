// Package storage defines the durable store of pending timeouts: the contract
// every backend implements and the conformance suite in storage/storetest
// checks. The semantics follow the ServiceConnect ITimeoutStore and the MSMQ
// delayed message store: idempotent insert, leased batches of due rows, and
// owner-checked remove and release.
package storage

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/delaybridge/delaybridge/message"
	"github.com/delaybridge/delaybridge/wire"
)

var (
	// ErrNotFound means no pending timeout has the given id.
	ErrNotFound = errors.New("storage: timeout not found")
	// ErrConcurrency means the caller's lock no longer matches the row: the
	// lease expired, was released, or another lease took the row since.
	ErrConcurrency = errors.New("storage: lock does not match (lease expired or taken)")
	// ErrClosed means the store was used after Close.
	ErrClosed = errors.New("storage: store is closed")
	// ErrLeased means the timeout is being dispatched and cannot be changed.
	ErrLeased = errors.New("storage: timeout is being dispatched")
	// ErrDueOutOfRange means a due time after MaxDueAt.
	ErrDueOutOfRange = errors.New("storage: due time out of range")
)

// MaxDueAt is the latest due time a store accepts: the latest instant Unix
// nanoseconds hold in an int64 (2262-04-11T23:47:16.854775807Z). bbolt's
// index keys are such counts, so later times could not be kept in order
// (docs/contract.md §2.3).
var MaxDueAt = time.Unix(0, math.MaxInt64).UTC()

// CheckDueAt returns an error wrapping ErrDueOutOfRange, in words for
// people, when due is after MaxDueAt. Reschedule checks with it; ingest
// refuses such due times before they reach Insert, which does not check (a
// refused batch would be requeued forever).
func CheckDueAt(due time.Time) error {
	if due.After(MaxDueAt) {
		return fmt.Errorf("%w: %s is after %s, the latest due time the bridge can keep in order",
			ErrDueOutOfRange, due.UTC().Format(time.RFC3339Nano), MaxDueAt.Format(time.RFC3339Nano))
	}
	return nil
}

// DefaultCancelWindow is how long a cancel keeps cancelling messages with
// its id (see Store.Cancel): long enough for a message published before the
// cancel to be stored by a slower instance, or again after a lost commit
// answer, even after requeues (docs/contract.md §2.5).
const DefaultCancelWindow = 10 * time.Minute

// ListFilter selects pending timeouts for List.
type ListFilter struct {
	// Destination and Exchange select rows by where they go, exactly:
	// Exchange "" and Destination "" select all rows; Exchange "" and a
	// Destination, the rows for that queue; an Exchange, the rows for that
	// exchange, and with a Destination only those with that routing key.
	// So the rows of an exchange whose routing key is empty cannot be
	// selected apart from the exchange's other rows.
	Destination string
	Exchange    string
	DueFrom     time.Time // inclusive; zero: unbounded
	DueTo       time.Time // exclusive; zero: unbounded
	After       string    // cursor from the previous page; empty: from the start
	Limit       int       // at most this many rows (required, > 0)

	// ID, when set, selects the rows of that message id: every send of it
	// (wire.IsKeyOf), with the other fields those of them that match too.
	ID string
	// SagaID, when set, selects the rows of that saga (Timeout.SagaID)
	// exactly, and with the other fields those of them that match too. A
	// store finds a saga's rows in an index, without scanning the others;
	// the order and the cursor are List's as for any filter.
	SagaID string
	// IDPrefix, when set, selects the rows whose id starts with it.
	IDPrefix string
	// HeaderName, when set, selects the rows whose message has that header
	// with the text HeaderValue (see message.HeaderIs). Headers are inside
	// the encoded message, so a store reads each candidate row's message:
	// narrow the scan with the other fields where possible.
	HeaderName, HeaderValue string
}

// Empty reports whether f selects every row (its paging fields aside).
func (f *ListFilter) Empty() bool {
	return f.Destination == "" && f.Exchange == "" && f.DueFrom.IsZero() && f.DueTo.IsZero() &&
		f.IDPrefix == "" && f.HeaderName == "" && f.SagaID == "" && f.ID == ""
}

// Selects reports whether f selects t, Limit and After aside: the rule every
// store applies (a store may apply the cheap parts in its own query first).
// The header test decodes t.Message: a message that does not decode has no
// headers to match.
func (f *ListFilter) Selects(t *Timeout) bool {
	switch {
	case f.Exchange != "":
		if t.Exchange != f.Exchange || (f.Destination != "" && t.Destination != f.Destination) {
			return false
		}
	case f.Destination != "":
		if t.Exchange != "" || t.Destination != f.Destination {
			return false
		}
	}
	if (!f.DueFrom.IsZero() && t.DueAt.Before(f.DueFrom)) || (!f.DueTo.IsZero() && !t.DueAt.Before(f.DueTo)) {
		return false
	}
	if f.SagaID != "" && t.SagaID != f.SagaID {
		return false
	}
	if !strings.HasPrefix(t.ID, f.IDPrefix) || (f.ID != "" && !wire.IsKeyOf(t.ID, f.ID)) {
		return false
	}
	if f.HeaderName != "" {
		ok, err := message.HeaderIs(t.Message, f.HeaderName, f.HeaderValue)
		return ok && err == nil
	}
	return true
}

// Timeout is one pending message: one send of it (docs/contract.md §2.4).
// Message is opaque to the store: the encoded body, AMQP properties and
// headers (see package message).
type Timeout struct {
	// ID is the row key. Insert takes the message id here and stores the
	// row under it, or, while another send of that id holds it, under the
	// key of a later send (wire.SendKey); every other method takes and
	// returns keys, except those that say they take a message id.
	ID string
	// Destination is the queue the message goes to, or, when Exchange is
	// set, the routing key it is published with to that exchange
	// (docs/contract.md §2.2). Only a routing key may be empty.
	Destination string
	Exchange    string // "": the default exchange, Destination a queue
	DueAt       time.Time
	ReceivedAt  time.Time
	Message     []byte
	// SagaID, when set, names the saga the timeout belongs to (NServiceBus's
	// NServiceBus.SagaId): SagaCanceller cancels a saga's timeouts together.
	SagaID string
	// Fingerprint identifies the send (message.Fingerprint): Insert takes a
	// row for a redelivery of a pending send when the two agree. Empty
	// fingerprints agree with each other (rows stored by builds that kept
	// none). The caller of Insert gives a send that must never be taken
	// for a redelivery a fingerprint of its own (NewSendFingerprint).
	Fingerprint []byte

	// Attempts counts dispatch failures so far; LastError is the latest reason.
	Attempts  int
	LastError string

	// Lock is the token of the current lease, empty when the row is not leased.
	Lock          string
	LockExpiresAt time.Time
	// NotBefore, when set, holds the row back after a release for retry.
	NotBefore time.Time

	// Paused, set by Get, GetMany and List, says that the row's
	// destination is paused (see Pauser): the row is held past its due
	// time until the destination is resumed. Insert ignores it.
	Paused bool
}

// Dest is where t goes.
func (t *Timeout) Dest() wire.Destination {
	return wire.Destination{Exchange: t.Exchange, Key: t.Destination}
}

// Lease names a timeout handed to one caller of Store.Lease.
type Lease struct {
	ID    string
	Lock  string
	DueAt time.Time
}

// Ref addresses a leased row for removal: an empty Lock removes unconditionally.
type Ref struct {
	ID   string
	Lock string
}

// Outcome is what Insert did with one row.
type Outcome uint8

const (
	// Stored: the row was stored, under its message id, or while a send
	// of that id holds that key, under the key of a later send
	// (wire.SendKey, the lowest number free).
	Stored Outcome = iota + 1
	// Duplicate: a pending send of the same message id with the same
	// Fingerprint, not under a live lease, is in the store (or earlier in
	// the same call): the row is taken for a redelivery of that send and
	// not stored. A matching send under a live lease (being dispatched)
	// does not count: the row is stored as another send.
	Duplicate
	// Cancelled: the message id was cancelled within the cancel window
	// (see Cancel); the row is not stored.
	Cancelled
)

func (o Outcome) String() string {
	switch o {
	case Stored:
		return "stored"
	case Duplicate:
		return "duplicate"
	case Cancelled:
		return "cancelled"
	}
	return fmt.Sprintf("Outcome(%d)", uint8(o))
}

// NewSendFingerprint is a fingerprint no other send has: a row with it is
// never taken for a redelivery (a first delivery from a delayed exchange,
// which the delayed-message-exchange plugin never deduplicates).
func NewSendFingerprint() []byte {
	b := make([]byte, 17)
	b[0] = 0xff // 17 bytes: never message.Fingerprint's 16
	_, _ = rand.Read(b[1:])
	return b
}

// FoundErr is the answer of a Cancel or Reschedule of a message id that
// found found sends and changed changed of them (the others are leased):
// ErrNotFound, ErrLeased or nil, as Store says.
func FoundErr(found, changed int) error {
	switch {
	case found == 0:
		return ErrNotFound
	case changed == 0:
		return ErrLeased
	}
	return nil
}

// CheckMessageID refuses an id Insert cannot take: empty, or holding
// wire.SendSep (a row key, not a message id).
func CheckMessageID(id string) error {
	switch {
	case id == "":
		return errors.New("empty id")
	case strings.Contains(id, wire.SendSep):
		return errors.New("id holds the send separator (a row key, not a message id)")
	}
	return nil
}

// Limits of a stored timeout, the same for every store so that what one
// takes the other takes too (docs/contract.md §7). They are bbolt's: its
// keys hold at most MaxStoreKeyBytes, and storage/boltstore indexes a row by
// an 8-byte prefix and the id, and a saga's rows by saga id, NUL and id.
// Ingest never comes near them: wire.ValidateID holds ids and saga ids to
// 255 bytes without control characters.
const (
	MaxStoreKeyBytes = 32768
	MaxStoredIDBytes = MaxStoreKeyBytes - 8
)

// CheckInsert refuses timeouts no store can hold, naming the first one:
// an id CheckMessageID refuses or longer than MaxStoredIDBytes, no
// destination (neither queue nor exchange), or a saga id that holds a NUL
// or makes the saga key (saga id, NUL, id) longer than MaxStoreKeyBytes.
// Every store's Insert and ReplaceGroups call it before writing anything.
func CheckInsert(ts []Timeout) error {
	for i := range ts {
		switch t := &ts[i]; {
		case CheckMessageID(t.ID) != nil:
			return fmt.Errorf("timeout %d: %w", i, CheckMessageID(t.ID))
		case len(t.ID) > MaxStoredIDBytes:
			return fmt.Errorf("timeout %d: id is %d bytes, longer than %d", i, len(t.ID), MaxStoredIDBytes)
		case t.Destination == "" && t.Exchange == "":
			return fmt.Errorf("timeout %q has an empty destination", t.ID)
		case strings.IndexByte(t.SagaID, 0) >= 0 || len(t.SagaID)+1+len(t.ID) > MaxStoreKeyBytes:
			return fmt.Errorf("timeout %q: saga id holds a NUL or is too long", t.ID)
		}
	}
	return nil
}

// CancelMode says whether Cancel leaves a tombstone when nothing with the
// id is pending.
type CancelMode uint8

const (
	// CancelOrdered leaves one either way: a message published before the
	// cancel may be stored after it, by another instance or after a
	// requeue (the AMQP cancel, docs/contract.md §2.5).
	CancelOrdered CancelMode = iota
	// CancelFound leaves one only when it removed a send (an operator's
	// cancel, §6.3: it has no ordering to keep, and a tombstone for an id
	// that was never stored would drop the next message with it).
	CancelFound
)

// Store is the contract of docs/contract.md §7. All methods are safe for concurrent
// use. Times are compared against the store's injected clock.
type Store interface {
	// Insert stores timeouts in one commit, each under its message id
	// (Timeout.ID) or the key of a later send of it, and says for each
	// what it did (see Outcome): a redelivery of a pending send
	// (Duplicate) and a cancelled id (Cancelled) are not stored. Rows of
	// one call are taken in order, so a later one may be a Duplicate of an
	// earlier one. An id holding wire.SendSep fails the call. When it
	// succeeds, it sets the ID of each row it stored to that row's key.
	// Callers keep DueAt at or before MaxDueAt (ingest refuses later
	// ones; see CheckDueAt).
	Insert(ctx context.Context, ts []Timeout) ([]Outcome, error)

	// Lease takes up to limit rows that are due by dueBy (DueAt and NotBefore
	// at or before it) and not leased, or whose lease expired, in due order,
	// and leases them to owner for d. A zero dueBy means the store's now. A
	// dueBy a little ahead lets the caller hand rows over early and forward
	// them exactly on time; it never makes a row leasable before that. A row
	// is never handed to two concurrent callers.
	Lease(ctx context.Context, owner string, dueBy time.Time, limit int, d time.Duration) ([]Lease, error)

	// Get returns a copy of the pending timeout with this key, or ErrNotFound.
	Get(ctx context.Context, key string) (Timeout, error)

	// Remove deletes rows in one commit. results[i] is nil on success,
	// ErrConcurrency when refs[i].Lock is set and does not hold the row, and
	// ErrNotFound when a locked ref finds no row (an unlocked ref to a missing
	// row is a silent success). err reports a failure of the whole commit.
	Remove(ctx context.Context, refs []Ref) (results []error, err error)

	// Release ends the lease so the row is leased again once due and not before
	// notBefore (zero: as soon as due). A non-empty lock must hold the row.
	Release(ctx context.Context, id, lock string, notBefore time.Time) error

	// IncrementFailureCount records one more dispatch failure and its reason
	// and returns the new count. A non-empty lock must hold the row.
	IncrementFailureCount(ctx context.Context, id, lock, reason string) (int, error)

	// NextDue returns the earliest time at which a row becomes leasable
	// (due time, NotBefore or lease expiry); ok is false when nothing is pending.
	NextDue(ctx context.Context) (at time.Time, ok bool, err error)

	// Reap frees rows whose lease expired and returns how many it freed.
	// It also deletes expired cancel tombstones (not counted).
	Reap(ctx context.Context) (int, error)

	// List returns pending timeouts in due-time order (ties by id), without
	// their Message, and the cursor of the next page ("" when there is none).
	List(ctx context.Context, f ListFilter) (rows []Timeout, next string, err error)

	// Cancel removes every pending send of message id id that is not
	// being dispatched: ErrNotFound when none is pending, ErrLeased when
	// every pending one is leased (then it removes nothing). It also
	// leaves a tombstone, unless every pending send is leased, or, with
	// CancelFound, nothing is pending: for the store's cancel window
	// (DefaultCancelWindow unless configured) Insert stores no timeout
	// with this id. A cancel thus applies to a message published before it
	// that another instance, or a requeue, stores after it, and to one
	// stored again because the answer to its first insert was lost. Cancel
	// and Insert of one id are atomic with respect to each other,
	// whichever instances call them. Reap purges expired tombstones.
	Cancel(ctx context.Context, id string, mode CancelMode) error

	// Reschedule sets a new due time on every pending send of message id
	// id that is not being dispatched (and clears any retry hold):
	// ErrNotFound when none is pending, ErrLeased when every pending one
	// is leased, and ErrDueOutOfRange for a dueAt after MaxDueAt.
	Reschedule(ctx context.Context, id string, dueAt time.Time) error

	// The parts below are named for what they serve; every store has
	// them all, and storetest checks each on every store.
	Stater
	LeaseCounter
	MultiGetter
	SagaCanceller
	GroupReplacer
	InsertCanceller
	Bulker
	DestinationCounter
	Pauser

	// Properties says what the store is, for what depends on it rather
	// than on what the store does (see Properties). It is constant.
	Properties() Properties

	Close() error
}

// Properties are what a store is, as opposed to what it does: callers adapt
// to them instead of to the configuration that chose the store.
type Properties struct {
	// Shared: several processes use the store at once (PostgreSQL), each
	// seeing the others' rows and leases. A store that is not shared (a
	// bbolt file, locked by its one process) holds only this process's
	// leases, so it can free them all (LeaseReleaser), and a second
	// process on the same endpoint would have none of its rows.
	Shared bool
}

// LeaseReleaser frees every lease at once: a store that is not shared
// offers it (boltstore), since all its leases are its process's. The bridge
// frees them when the broker may have lost the tokens of those leases
// (transient hand-overs). A shared store cannot: the leases it holds are
// other processes' too; this is the one optional interface, so it is the
// one a caller finds by type assertion.
type LeaseReleaser interface {
	// ReleaseLeases frees every lease and returns how many it freed: their
	// rows can be leased again at once.
	ReleaseLeases() int
}

// TakerOver frees at once the leases of instances that are gone, judged
// by the database (storage/postgres: a liveness session per instance,
// docs/contract.md §7.1), rather than when the leases expire. The bridge
// calls it on a short timer and wakes its poller when it freed any.
type TakerOver interface {
	TakeOver(ctx context.Context) (freed int, err error)
}

// Stater counts the store's rows. The admin API's stats, the status page,
// /debug/vars and the store metrics show the counts.
type Stater interface {
	// Stats returns how many timeouts are pending, leased ones included,
	// and how many of them are leased. A lease counts until its row is
	// removed or released, or, once expired, freed by Reap, Lease, Cancel
	// or Reschedule. It is cheap enough for every poll cycle. A shared store may count the
	// pending rows of other instances late (postgres: up to a second) and
	// estimate them when there are millions.
	Stats(ctx context.Context) (pending, leased int, err error)
}

// LeaseCounter counts one owner's leases: the poller's MaxLeased
// backpressure, per instance on a store several instances share, whose
// Stats count every instance's leases.
type LeaseCounter interface {
	// LeasedBy returns how many rows are leased under owner (the owner
	// given to Lease), expired leases counted as in Stats, but at most
	// atMost: the store stops counting there, and atMost must be positive.
	// Owners are told apart by the "owner:" prefix of lock tokens, so an
	// owner containing ':' may also count those of another owner.
	LeasedBy(ctx context.Context, owner string, atMost int) (int, error)
}

// MultiGetter reads many rows in one call: the dispatcher reads the rows
// behind a dispatcher message's tokens with one read (one round trip to a
// shared store, one read transaction of bbolt), not one Get each.
type MultiGetter interface {
	// GetMany returns the pending timeouts with these keys, by key, each
	// a copy as Get returns it. A key with no pending timeout is absent from
	// the map, not an error; a repeated key is read once. The map is not nil
	// when err is nil, even for no keys.
	GetMany(ctx context.Context, keys []string) (map[string]Timeout, error)
}

// SagaCanceller cancels the timeouts of a saga together: NServiceBus's
// NServiceBus.ClearTimeouts, and the admin API's cancel by saga id.
type SagaCanceller interface {
	// CancelSaga removes, in one commit, every pending timeout whose
	// SagaID is sagaID and that is not being dispatched, and returns how
	// many it removed and how many it left because they are leased (an
	// expired lease does not count as one; such a row is removed). The
	// message id of each row it removed gets a tombstone, as Cancel
	// leaves, so a copy stored again
	// stays cancelled; the saga id gets none: the saga may schedule new
	// timeouts at once. As Cancel, it applies to inserts of other instances
	// that are under way. An empty sagaID is an error.
	CancelSaga(ctx context.Context, sagaID string) (cancelled, leased int, err error)
}

// GroupReplacer replaces the pending timeouts of many groups (saga ids) in
// one commit: MassTransit's ScheduleMessage replaces whatever its schedule
// token has pending, and ingest commits a batch of them, of distinct
// tokens, together instead of one commit each.
type GroupReplacer interface {
	// ReplaceGroups does in one commit what CancelSaga of each of groups,
	// then Insert of ts, would do: it removes every pending timeout whose
	// SagaID is one of groups and that is not being dispatched, leaving a
	// tombstone for each, then inserts ts. It spares the pending rows
	// whose message id is that of a row of ts in one of groups: a repeat
	// of a call whose commit went through but whose answer was lost then
	// finds its own rows and changes nothing, rather than cancelling them
	// and being refused by their tombstones. outcomes is Insert's answer;
	// cancelled and leased are CancelSaga's, summed over groups. An empty
	// group is an error; no groups is an Insert.
	ReplaceGroups(ctx context.Context, groups []string, ts []Timeout) (outcomes []Outcome, cancelled, leased int, err error)
}

// Spared is the set of message ids that ReplaceGroups spares: those of the
// rows of ts whose SagaID is one of groups.
func Spared(groups []string, ts []Timeout) map[string]bool {
	in := make(map[string]bool, len(groups))
	for _, g := range groups {
		in[g] = true
	}
	spared := make(map[string]bool)
	for i := range ts {
		if ts[i].SagaID != "" && in[ts[i].SagaID] {
			spared[ts[i].ID] = true
		}
	}
	return spared
}

// InsertCanceller commits inserts and AMQP cancels together, in their
// order: ingest commits a batch that holds cancels (docs/contract.md §2.5)
// with one call instead of a commit per cancel, which on a shared store
// serialises against every instance's inserts.
type InsertCanceller interface {
	// InsertAndCancel does in one commit what Insert of each row of ts and
	// each cancel would do one by one, in order: a cancel comes after the
	// first At rows of ts (and after the cancels before it in cancels,
	// whose At are in ascending order). A cancel does what CancelSchedule
	// of Schedule (storage.Scheduler), when set, then Cancel of ID with
	// CancelOrdered would do. So a cancel removes the pending sends of its
	// id that are not being dispatched, rows stored earlier in the call
	// included, and leaves its tombstone as Cancel does; a later row of
	// the id is Cancelled. outcomes is Insert's answer for ts: a row
	// stored and then removed by a later cancel of the call is Stored
	// (and never written). results[i] is cancels[i]'s. An id or At that
	// Cancel or Insert could not take fails the call before it changes
	// anything (CheckCancels). No cancels is an Insert.
	InsertAndCancel(ctx context.Context, ts []Timeout, cancels []OrderedCancel) (outcomes []Outcome, results []CancelResult, err error)
}

// OrderedCancel is one cancel of an InsertAndCancel call: ingest's AMQP
// cancel (docs/contract.md §2.5, and §2.11 for the schedule it ends).
type OrderedCancel struct {
	// At places the cancel after the first At rows of the call.
	At int
	// ID is the message id cancelled (Cancel's id).
	ID string
	// Schedule, when set, is the key of a recurring schedule to end first,
	// as CancelSchedule does: the schedule and its pending fires that are
	// not being dispatched.
	Schedule string
}

// CancelResult is what one cancel of InsertAndCancel did.
type CancelResult struct {
	// Err is Cancel's answer: nil, ErrNotFound or ErrLeased.
	Err error
	// ScheduleFound is CancelSchedule's found: Schedule named a schedule.
	ScheduleFound bool
}

// CheckCancels refuses the cancels of an InsertAndCancel of n rows that no
// store can apply, naming the first one: an At outside 0..n or before the
// previous cancel's, an id CheckInsert would refuse, or a schedule key
// holding a NUL.
func CheckCancels(n int, cancels []OrderedCancel) error {
	prev := 0
	for i := range cancels {
		switch c := &cancels[i]; {
		case c.At < prev || c.At > n:
			return fmt.Errorf("cancel %d: at %d, want %d to %d", i, c.At, prev, n)
		case CheckMessageID(c.ID) != nil:
			return fmt.Errorf("cancel %d: %w", i, CheckMessageID(c.ID))
		case len(c.ID) > MaxStoredIDBytes:
			return fmt.Errorf("cancel %d: id is %d bytes, longer than %d", i, len(c.ID), MaxStoredIDBytes)
		case strings.IndexByte(c.Schedule, 0) >= 0:
			return fmt.Errorf("cancel %d: schedule key holds a NUL", i)
		default:
			prev = c.At
		}
	}
	return nil
}

// BulkChunk is how many rows a Bulker changes per commit at most: a match
// of millions of rows never holds bbolt's single writer, or PostgreSQL row
// locks, for long; other writes run between chunks.
const BulkChunk = 1000

// BulkKind is what a bulk action does to each row.
type BulkKind int

const (
	// BulkCancel cancels each row, as Cancel does (a tombstone each).
	BulkCancel BulkKind = iota + 1
	// BulkSetDue reschedules each row to BulkAction.DueAt, as Reschedule
	// does. A row already due then, with no retry hold, is left as it is
	// and not counted: nothing would change.
	BulkSetDue
	// BulkShift moves each row's due time by BulkAction.Shift (negative:
	// earlier) and clears its retry hold. A row that would move past
	// MaxDueAt is left as it is and counted in BulkResult.OutOfRange.
	BulkShift
)

// BulkAction is a bulk change: its kind and its argument.
type BulkAction struct {
	Kind  BulkKind
	DueAt time.Time     // BulkSetDue
	Shift time.Duration // BulkShift
}

// BulkResult counts what a bulk action did.
type BulkResult struct {
	// Changed is how many rows were cancelled or rescheduled.
	Changed int
	// Leased is how many selected rows were being dispatched (a live
	// lease) and so were left alone: each was either changed or is being
	// delivered, never both.
	Leased int
	// OutOfRange is how many rows a BulkShift left because their new due
	// time would be after MaxDueAt.
	OutOfRange int
}

// Bulker applies one action to every pending timeout a filter selects: the
// admin API's and the CLI's bulk cancel, dispatch-now and reschedule.
type Bulker interface {
	// Bulk applies a to every row f selects (f's Limit and After are
	// ignored), in commits of at most BulkChunk rows, so a huge match
	// never holds the store's writers for long; the action is therefore
	// not atomic as a whole: a crash midway leaves the chunks committed so
	// far. Each row is treated as the single-row call would (Cancel,
	// Reschedule): a row under a live lease is left and counted in Leased,
	// an expired lease ends. Rows inserted while Bulk runs are changed
	// when the walk reaches them and they match. A row is changed at most
	// once. An empty filter (f.Empty) is an error: callers must not cancel
	// everything by mistake. ctx ending stops Bulk between chunks; the
	// result then counts the committed chunks.
	Bulk(ctx context.Context, f ListFilter, a BulkAction) (BulkResult, error)
}

// ErrEmptyFilter is Bulk's answer to a filter that selects every row.
var ErrEmptyFilter = errors.New("storage: bulk action needs a filter")

// CheckBulk checks a bulk call's arguments, for every Bulker.
func CheckBulk(f *ListFilter, a BulkAction) error {
	if f.Empty() {
		return ErrEmptyFilter
	}
	switch a.Kind {
	case BulkCancel:
	case BulkSetDue:
		return CheckDueAt(a.DueAt)
	case BulkShift:
		if a.Shift == 0 {
			return errors.New("storage: bulk shift of zero")
		}
	default:
		return fmt.Errorf("storage: unknown bulk action %d", a.Kind)
	}
	return nil
}

// ErrNotYet means the answer is not available yet: ask again later.
var ErrNotYet = errors.New("storage: not available yet")

// DestinationCount is one destination's share of the pending rows.
type DestinationCount struct {
	// Pending counts its pending rows, leased ones included.
	Pending int
	// DueSoon counts those of them due in the window asked for.
	DueSoon int
}

// DestinationCounter counts pending rows per destination: the
// per-destination metrics (delaybridge_destination_pending and
// delaybridge_destination_due_soon). Each store says what a call costs;
// callers keep to an interval, not one call per scrape.
type DestinationCounter interface {
	// CountByDestination returns the counts of every destination with a
	// pending row; DueSoon counts the rows due at or after soonFrom and
	// before soonTo. A shared store may count other instances' rows late.
	// A store that counts its rows after Open answers ErrNotYet until it
	// has.
	CountByDestination(ctx context.Context, soonFrom, soonTo time.Time) (map[wire.Destination]DestinationCount, error)
}

// PausedDestination is a destination whose deliveries are paused.
type PausedDestination struct {
	Destination wire.Destination
	// Since is when the pause was made (the pausing store's clock).
	Since time.Time
	// By is who paused it, as the caller said ("" when unknown).
	By string
}

// Pauser pauses and resumes the deliveries to one destination: an
// operator stops them while its consumer is being repaired. A destination
// is a queue or an exchange's routing key (wire.Destination), matched
// exactly: pausing an exchange's routing key "q" leaves the queue "q" alone.
type Pauser interface {
	// Pause holds every pending row of d, and every row inserted for d
	// while it is paused, past its due time: Lease does not take them and
	// NextDue does not report them; Get, GetMany and List show them with
	// Paused set, and every other call treats them as usual (cancel,
	// reschedule, bulk actions, counts). A row already leased when the
	// pause lands is not recalled: its lease runs on and it may still be
	// delivered; released, or its lease expired, it is held like the
	// others. Pausing a destination with nothing pending is allowed. The
	// pause is durable and, in a store several instances share, holds on
	// every instance. paused is false when d was paused already (its
	// Since and By are kept).
	Pause(ctx context.Context, d wire.Destination, by string) (paused bool, err error)
	// Resume ends d's pause: its rows are leasable again, those past due
	// at once. resumed is false when d was not paused.
	Resume(ctx context.Context, d wire.Destination) (resumed bool, err error)
	// Paused returns the paused destinations, ordered by exchange, then
	// destination.
	Paused(ctx context.Context) ([]PausedDestination, error)
}

// CheckPauseDestination refuses a destination no row can have: an empty
// queue name.
func CheckPauseDestination(d wire.Destination) error {
	if d.Exchange == "" && d.Key == "" {
		return errors.New("storage: pause: empty destination")
	}
	return nil
}

// SortPaused orders ps as Pauser.Paused returns them.
func SortPaused(ps []PausedDestination) {
	slices.SortFunc(ps, func(a, b PausedDestination) int {
		if c := strings.Compare(a.Destination.Exchange, b.Destination.Exchange); c != 0 {
			return c
		}
		return strings.Compare(a.Destination.Key, b.Destination.Key)
	})
}

// PendingSend is what Insert needs to know of a pending send of an id.
type PendingSend struct {
	Key         string
	Fingerprint []byte
	// Leased: under a live lease (being dispatched).
	Leased bool
}

// PlaceSend is Insert's rule for a send of message id whose pending sends
// are pending: Duplicate when one of them has its fingerprint and is not
// leased; otherwise Stored, under the lowest key of id that none of them
// holds (wire.SendKey). Every store applies it, so that both decide alike.
func PlaceSend(id string, fingerprint []byte, pending []PendingSend) (key string, o Outcome) {
	taken := make(map[string]bool, len(pending))
	for _, p := range pending {
		if !p.Leased && bytes.Equal(p.Fingerprint, fingerprint) {
			return p.Key, Duplicate
		}
		taken[p.Key] = true
	}
	for n := 1; ; n++ {
		if k := wire.SendKey(id, n); !taken[k] {
			return k, Stored
		}
	}
}
