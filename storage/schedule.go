package storage

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/delaybridge/delaybridge/wire"
)

// Recurring schedules (docs/contract.md §2.11). A schedule is one row that
// lives until it is cancelled or has no fire time left; each fire becomes an
// ordinary timeout row, stored in the same commit that moves the
// schedule's next fire time on, so the dispatcher forwards it with every
// guarantee of a one-shot (§3.3) and knows nothing of cron.

// ErrScheduleNotFound means no schedule has the given key.
var ErrScheduleNotFound = errors.New("storage: schedule not found")

// ErrScheduleCancelled means PutSchedule stored nothing: the schedule's
// name (ScheduleName) has a live cancel tombstone, so the put is a message
// published before the cancel and stored after it (a requeue, another
// instance), which must not bring the schedule back (docs/contract.md
// §2.5, §2.11).
var ErrScheduleCancelled = errors.New("storage: schedule's id was cancelled within the cancel window")

// Schedule is one recurring schedule. The store keeps what it is given and
// reads only Key, NextFireAt, Paused and Generation; the expression, zone,
// window and policy are the planner's (see Planner).
type Schedule struct {
	// Key names the schedule (ScheduleKey): unique in the store.
	Key string
	// Source says which way it came in ("amqp", "masstransit", "admin").
	Source string
	// Expr and Zone as given (cron.Parse, cron.LoadLocation).
	Expr, Zone string
	// Start and End bound the fire times; zero is unbounded.
	Start, End time.Time
	// Misfire is the misfire policy, a cron.MisfirePolicy value.
	Misfire int
	// Description is free text for lists.
	Description string
	// Destination and Exchange are where each fire goes, as
	// Timeout.Destination and Timeout.Exchange.
	Destination string
	Exchange    string
	// Message is the template of every fire (package message); the
	// planner stamps each fire's headers into a copy.
	Message []byte
	// Token is the sender's own id of the schedule request, if any.
	Token string

	// NextFireAt is the next fire time; zero when the schedule is over.
	NextFireAt time.Time
	// PrevFireAt is what the next fire reports as the previous one.
	PrevFireAt time.Time
	// Paused holds the schedule: FireDue skips it.
	Paused bool
	// Generation counts the puts of the key: PutSchedule sets it. A fire
	// row's key holds it, so the fires of a replaced schedule never clash
	// with those of its successor.
	Generation int64
	// Fires and Misfires count what FireDue did with it (misfires count
	// late fires and skipped ones alike); Fires counts FireNow's too.
	Fires, Misfires int64
	// LastError is why the planner could not plan it (the schedule is then
	// over: NextFireAt zero), "" otherwise.
	LastError string
	// UpdatedAt is when it was last put, paused or resumed (store clock).
	UpdatedAt time.Time
}

// Dest is where s's fires go.
func (s *Schedule) Dest() wire.Destination {
	return wire.Destination{Exchange: s.Exchange, Key: s.Destination}
}

// ScheduleKey is the key of a schedule from source named name: AMQP
// schedules are named by their message id ("amqp:<id>").
func ScheduleKey(source, name string) string { return source + ":" + name }

// ScheduleName is the name of the schedule key: ScheduleKey's name (an AMQP
// schedule's message id), the key itself when it has no source. Its cancel
// tombstone is the one PutSchedule honours.
func ScheduleName(key string) string {
	if _, name, ok := strings.Cut(key, ":"); ok {
		return name
	}
	return key
}

// FireID is the row key of the fire of schedule key, generation gen, at
// scheduled: a function of the three, so that a second attempt to store the
// same fire finds the first (FireDue stores it only when the key is free).
func FireID(key string, gen int64, scheduled time.Time) string {
	return key + "#" + strconv.FormatInt(gen, 10) + "@" + strconv.FormatInt(scheduled.Unix(), 10)
}

// FireNowID is the row key of an extra fire of schedule key, generation
// gen, asked for at at (FireNow): never one of FireID's keys, so an extra
// fire never takes the place of a scheduled one.
func FireNowID(key string, gen int64, at time.Time) string {
	return key + "#" + strconv.FormatInt(gen, 10) + "@now" + strconv.FormatInt(at.UnixNano(), 10)
}

// FireMessage builds the message of FireNow's extra fire of s: id is its
// row key, at its fire time.
type FireMessage func(s *Schedule, id string, at time.Time) ([]byte, error)

// CheckSchedule refuses a schedule no store can hold.
func CheckSchedule(s *Schedule) error {
	switch {
	case s.Key == "" || strings.Contains(s.Key, wire.SendSep) || strings.IndexByte(s.Key, 0) >= 0:
		return fmt.Errorf("storage: schedule key %q is empty or holds a separator", s.Key)
	case len(s.Key) > 512:
		return fmt.Errorf("storage: schedule key is %d bytes, over 512", len(s.Key))
	case s.Destination == "" && s.Exchange == "":
		return fmt.Errorf("storage: schedule %q has an empty destination", s.Key)
	case s.NextFireAt.After(MaxDueAt):
		return fmt.Errorf("storage: schedule %q: %w", s.Key, CheckDueAt(s.NextFireAt))
	}
	return nil
}

// FirePlan is what a Planner decided for one due schedule.
type FirePlan struct {
	// Fire says whether a fire row is stored; Scheduled is the fire time
	// it stands for (its row key's), DueAt when it is delivered (Scheduled
	// when on time, the moment of planning for a late catch-up), Message
	// its message.
	Fire      bool
	Scheduled time.Time
	DueAt     time.Time
	Message   []byte
	// Misfired says the due fire time was missed (fired late or skipped).
	Misfired bool
	// Next and Prev are stored as the schedule's NextFireAt and
	// PrevFireAt; a zero Next ends the schedule. A Next at or before the
	// fire time planned is an error of the planner: the store ends the
	// schedule with LastError rather than fire it again and again.
	Next, Prev time.Time
	// Err, when set, ends the schedule (NextFireAt zero) with this as
	// LastError, firing nothing: the schedule cannot be planned any more
	// (say, a zone the tz database lost).
	Err string
}

// Planner plans the fire of a due schedule seen at now. It is pure: it may
// run more than once for one fire (a store retries a commit), and must
// decide alike each time.
type Planner func(s *Schedule, now time.Time) FirePlan

// Fired is one schedule that FireDue handled.
type Fired struct {
	Key string
	// ID is the fire row's key; "" when nothing fired (a skipped misfire,
	// or a planner error).
	ID        string
	Scheduled time.Time
	DueAt     time.Time
	Misfired  bool
	// Stored is false when the fire row's key was already taken (the fire
	// is stored already) or cancelled: no second row.
	Stored bool
	// Next is the schedule's next fire time now; zero when it is over.
	Next time.Time
	Err  string
}

// Scheduler keeps recurring schedules: a named optional interface, found
// by type assertion (both stores of this repository have it).
type Scheduler interface {
	// PutSchedule creates the schedule s.Key or replaces it, in one
	// commit: the pending fires of the schedule it replaces that are not
	// being dispatched are cancelled (as CancelSaga of the key), and the
	// new one gets the next generation, its counters start at zero and it
	// is not paused. The caller sets NextFireAt (the first fire time).
	// It returns the schedule as stored. When ScheduleName(s.Key) has a
	// live cancel tombstone it changes nothing and returns
	// ErrScheduleCancelled, as Insert does Cancelled for a one-shot.
	PutSchedule(ctx context.Context, s Schedule) (Schedule, error)
	// CancelSchedule deletes the schedule and its pending fires that are
	// not being dispatched, in one commit. found is false when there was
	// no schedule (its fires, if any, are cancelled still).
	CancelSchedule(ctx context.Context, key string) (found bool, err error)
	// PauseSchedule holds the schedule (FireDue skips it) and cancels its
	// pending fires that are not being dispatched; ResumeSchedule ends the
	// hold, after which FireDue sees fire times that passed meanwhile as
	// missed (the planner's misfire policy decides). ErrScheduleNotFound
	// when there is no such schedule; changed is false when it already
	// was in that state.
	PauseSchedule(ctx context.Context, key string) (changed bool, err error)
	ResumeSchedule(ctx context.Context, key string) (changed bool, err error)
	// GetSchedule returns the schedule, or ErrScheduleNotFound.
	GetSchedule(ctx context.Context, key string) (Schedule, error)
	// ListSchedules returns up to limit schedules in key order, after the
	// key after ("" from the start), without their Message, and the key to
	// continue after ("" at the end).
	ListSchedules(ctx context.Context, after string, limit int) ([]Schedule, string, error)
	// NextScheduleDue returns the earliest NextFireAt of a schedule that
	// is not paused; ok is false when there is none.
	NextScheduleDue(ctx context.Context) (at time.Time, ok bool, err error)
	// FireDue plans up to limit schedules whose NextFireAt is at or before
	// now+lead, not paused, earliest first, and for each, in one commit per
	// call: stores the planned fire as a timeout row with key FireID(key,
	// generation, Scheduled), SagaID key, the schedule's destination,
	// ReceivedAt now, only when that key is free and not cancelled (never
	// a second row for one fire time), and moves the schedule on to the
	// plan's Next and Prev, counting the fire and the misfire. Two
	// callers, of one instance or several, never plan one schedule's fire
	// time both: the second sees the schedule moved on.
	FireDue(ctx context.Context, now time.Time, lead time.Duration, limit int, plan Planner) ([]Fired, error)
	// FireNow stores one extra fire of the schedule, due at now, in one
	// commit: a timeout row with key FireNowID(key, generation, now),
	// SagaID key, the schedule's destination and the message msg builds,
	// paused or not, and counts it in Fires. It does not move the
	// schedule (NextFireAt, PrevFireAt stay). ErrScheduleNotFound when
	// there is no such schedule; Stored is false when the key was taken.
	FireNow(ctx context.Context, key string, now time.Time, msg FireMessage) (Fired, error)
}

// ApplyPlan is the rule every store applies to a schedule after planning
// its due fire: the fields to store and what to report. A plan that does
// not move the schedule on ends it, so a broken planner cannot fire one
// time forever.
func ApplyPlan(s *Schedule, p FirePlan) Fired {
	f := Fired{Key: s.Key, Misfired: p.Misfired}
	if p.Err == "" && !p.Next.IsZero() && !p.Next.After(s.NextFireAt) {
		p = FirePlan{Err: fmt.Sprintf("planner did not move the schedule on: next fire %s after %s",
			p.Next.UTC().Format(time.RFC3339Nano), s.NextFireAt.UTC().Format(time.RFC3339Nano))}
	}
	if p.Err != "" {
		s.NextFireAt, s.LastError = time.Time{}, p.Err
		f.Err = p.Err
		return f
	}
	if p.Misfired {
		s.Misfires++
	}
	if p.Fire {
		s.Fires++
		f.ID, f.Scheduled, f.DueAt = FireID(s.Key, s.Generation, p.Scheduled), p.Scheduled, p.DueAt
	}
	if !p.Prev.IsZero() {
		s.PrevFireAt = p.Prev
	}
	s.NextFireAt = p.Next
	f.Next = p.Next
	return f
}

// FireRow is the timeout row of the fire f of s planned as p. It has no
// fingerprint: it is stored under its own key (FireID), never placed as a
// send of another row.
func FireRow(s *Schedule, f *Fired, p *FirePlan, now time.Time) Timeout {
	return Timeout{ID: f.ID, Destination: s.Destination, Exchange: s.Exchange, DueAt: p.DueAt, ReceivedAt: now,
		Message: p.Message, SagaID: s.Key}
}

// NowFire is the timeout row and report of FireNow's extra fire of s at now.
func NowFire(s *Schedule, now time.Time, msg FireMessage) (Timeout, Fired, error) {
	id := FireNowID(s.Key, s.Generation, now)
	m, err := msg(s, id, now)
	if err != nil {
		return Timeout{}, Fired{}, fmt.Errorf("schedule %q: fire now: %w", s.Key, err)
	}
	f := Fired{Key: s.Key, ID: id, Scheduled: now, DueAt: now, Next: s.NextFireAt}
	return Timeout{ID: id, Destination: s.Destination, Exchange: s.Exchange, DueAt: now, ReceivedAt: now,
		Message: m, SagaID: s.Key}, f, nil
}
