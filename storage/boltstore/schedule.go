package boltstore

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/delaybridge/delaybridge/storage"
)

// Recurring schedules (storage.Scheduler). Bucket schedules holds each
// schedule's record under its key (JSON: a schedule is written once per
// fire, not per message, so its size and speed do not matter); bucket
// schedules_due holds next fire time (8 bytes, Unix ns) + key -> nothing
// for every schedule that is not paused and has a next fire time, so
// FireDue and NextScheduleDue read its first keys and never scan the
// schedules. A fire is an ordinary row, added by txb.add in the same write
// transaction that moves the schedule on.

var (
	bucketSchedules    = []byte("schedules")
	bucketSchedulesDue = []byte("schedules_due")
)

var _ storage.Scheduler = (*Store)(nil)

// createScheduleBuckets makes the schedule buckets of a file that lacks
// them (schedules came within format 2: a file made before has none).
func createScheduleBuckets(tx *bolt.Tx) error {
	for _, name := range [][]byte{bucketSchedules, bucketSchedulesDue} {
		if _, err := tx.CreateBucketIfNotExists(name); err != nil {
			return err
		}
	}
	return nil
}

// schedBuckets are the schedule buckets of one transaction.
type schedBuckets struct{ recs, due *bolt.Bucket }

func scheduleBuckets(tx *bolt.Tx) (schedBuckets, error) {
	b := schedBuckets{recs: tx.Bucket(bucketSchedules), due: tx.Bucket(bucketSchedulesDue)}
	if b.recs == nil || b.due == nil {
		return b, errors.New("schedule buckets missing")
	}
	return b, nil
}

func schedDueKey(s *storage.Schedule) []byte {
	k := binary.BigEndian.AppendUint64(nil, keyTime(s.NextFireAt))
	return append(k, s.Key...)
}

// due reports whether s belongs in schedules_due.
func schedIndexed(s *storage.Schedule) bool { return !s.Paused && !s.NextFireAt.IsZero() }

func (b schedBuckets) get(key string) (*storage.Schedule, error) {
	v := b.recs.Get([]byte(key))
	if v == nil {
		return nil, nil
	}
	var s storage.Schedule
	if err := json.Unmarshal(v, &s); err != nil {
		return nil, fmt.Errorf("%w: schedule %q: %v", errCorrupt, key, err)
	}
	if s.Key != key {
		return nil, fmt.Errorf("%w: schedule record %q holds key %q", errCorrupt, key, s.Key)
	}
	return &s, nil
}

// put writes s, moving its index entry from where old had it.
func (b schedBuckets) put(old, s *storage.Schedule) error {
	if old != nil && schedIndexed(old) {
		if err := b.due.Delete(schedDueKey(old)); err != nil {
			return err
		}
	}
	v, err := json.Marshal(s)
	if err != nil {
		return err
	}
	if err := b.recs.Put([]byte(s.Key), v); err != nil {
		return err
	}
	if schedIndexed(s) {
		return b.due.Put(schedDueKey(s), []byte{})
	}
	return nil
}

func (b schedBuckets) del(old *storage.Schedule) error {
	if schedIndexed(old) {
		if err := b.due.Delete(schedDueKey(old)); err != nil {
			return err
		}
	}
	return b.recs.Delete([]byte(old.Key))
}

// schedWrite runs fn in a write transaction with both sets of buckets and
// the lease pins of cancelled fires.
func (s *Store) schedWrite(ctx context.Context, op string, fn func(b txb, sb schedBuckets, pins *pinSet, now time.Time) error) error {
	err := s.pinnedWrite(ctx, func(tx *bolt.Tx, b txb, pins *pinSet, now time.Time) error {
		sb, err := scheduleBuckets(tx)
		if err != nil {
			return err
		}
		return fn(b, sb, pins, now)
	})
	if err != nil {
		return fmt.Errorf("boltstore: %s: %w", op, err)
	}
	return nil
}

// PutSchedule creates or replaces a schedule; see storage.Scheduler.
func (s *Store) PutSchedule(ctx context.Context, in storage.Schedule) (storage.Schedule, error) {
	if err := storage.CheckSchedule(&in); err != nil {
		return storage.Schedule{}, err
	}
	var out storage.Schedule
	err := s.schedWrite(ctx, "put schedule "+in.Key, func(b txb, sb schedBuckets, pins *pinSet, now time.Time) error {
		if b.cancelled(storage.ScheduleName(in.Key), now) {
			return storage.ErrScheduleCancelled
		}
		old, err := sb.get(in.Key)
		if err != nil {
			return err
		}
		if _, _, err := s.cancelSaga(b, pins, in.Key, nil, now); err != nil {
			return err
		}
		out = in
		out.Generation, out.Fires, out.Misfires, out.Paused, out.LastError, out.PrevFireAt, out.UpdatedAt = 1, 0, 0, false, "", time.Time{}, now
		if old != nil {
			out.Generation = old.Generation + 1
		}
		return sb.put(old, &out)
	})
	if err != nil {
		return storage.Schedule{}, err
	}
	return out, nil
}

// CancelSchedule deletes a schedule and its pending fires; see storage.Scheduler.
func (s *Store) CancelSchedule(ctx context.Context, key string) (bool, error) {
	found := false
	err := s.schedWrite(ctx, "cancel schedule "+key, func(b txb, sb schedBuckets, pins *pinSet, now time.Time) error {
		var err error
		found, err = s.cancelSchedule(b, sb, pins, key, now)
		return err
	})
	return found, err
}

// cancelSchedule is CancelSchedule within a write.
func (s *Store) cancelSchedule(b txb, sb schedBuckets, pins *pinSet, key string, now time.Time) (found bool, err error) {
	old, err := sb.get(key)
	if err != nil {
		return false, err
	}
	if _, _, err := s.cancelSaga(b, pins, key, nil, now); err != nil {
		return false, err
	}
	if old == nil {
		return false, nil
	}
	return true, sb.del(old)
}

// PauseSchedule holds a schedule; see storage.Scheduler.
func (s *Store) PauseSchedule(ctx context.Context, key string) (bool, error) {
	return s.setPaused(ctx, key, true)
}

// ResumeSchedule ends a schedule's hold; see storage.Scheduler.
func (s *Store) ResumeSchedule(ctx context.Context, key string) (bool, error) {
	return s.setPaused(ctx, key, false)
}

func (s *Store) setPaused(ctx context.Context, key string, paused bool) (bool, error) {
	changed := false
	err := s.schedWrite(ctx, "pause/resume schedule "+key, func(b txb, sb schedBuckets, pins *pinSet, now time.Time) error {
		changed = false
		old, err := sb.get(key)
		if err != nil {
			return err
		}
		if old == nil {
			return storage.ErrScheduleNotFound
		}
		if paused {
			// Fires stored but not yet leased would leak through the pause.
			if _, _, err := s.cancelSaga(b, pins, key, nil, now); err != nil {
				return err
			}
		}
		if old.Paused == paused {
			return nil
		}
		n := *old
		n.Paused, n.UpdatedAt = paused, now
		changed = true
		return sb.put(old, &n)
	})
	return changed, err
}

// GetSchedule returns a schedule; see storage.Scheduler.
func (s *Store) GetSchedule(ctx context.Context, key string) (storage.Schedule, error) {
	var out *storage.Schedule
	err := s.readCall(ctx, func(tx *bolt.Tx) error {
		sb, err := scheduleBuckets(tx)
		if err != nil {
			return err
		}
		out, err = sb.get(key)
		return err
	})
	if err != nil {
		return storage.Schedule{}, fmt.Errorf("boltstore: get schedule %q: %w", key, err)
	}
	if out == nil {
		return storage.Schedule{}, storage.ErrScheduleNotFound
	}
	return *out, nil
}

// ListSchedules pages through the schedules in key order; see storage.Scheduler.
func (s *Store) ListSchedules(ctx context.Context, after string, limit int) ([]storage.Schedule, string, error) {
	if limit <= 0 {
		return nil, "", errors.New("boltstore: list schedules: limit must be positive")
	}
	exit, err := s.enter(ctx)
	if err != nil {
		return nil, "", err
	}
	defer exit()
	var out []storage.Schedule
	next := ""
	err = s.view(func(tx *bolt.Tx) error {
		sb, err := scheduleBuckets(tx)
		if err != nil {
			return err
		}
		cur := sb.recs.Cursor()
		k, _ := cur.First()
		if after != "" {
			if k, _ = cur.Seek([]byte(after)); k != nil && string(k) == after {
				k, _ = cur.Next()
			}
		}
		for ; k != nil; k, _ = cur.Next() {
			if len(out) == limit {
				next = out[len(out)-1].Key
				return nil
			}
			sc, err := sb.get(string(k))
			if err != nil {
				return err
			}
			sc.Message = nil
			out = append(out, *sc)
		}
		return nil
	})
	if err != nil {
		return nil, "", fmt.Errorf("boltstore: list schedules: %w", err)
	}
	return out, next, nil
}

// NextScheduleDue returns the earliest next fire time; see storage.Scheduler.
func (s *Store) NextScheduleDue(ctx context.Context) (time.Time, bool, error) {
	exit, err := s.enter(ctx)
	if err != nil {
		return time.Time{}, false, err
	}
	defer exit()
	var at time.Time
	ok := false
	err = s.view(func(tx *bolt.Tx) error {
		sb, err := scheduleBuckets(tx)
		if err != nil {
			return err
		}
		k, _ := sb.due.Cursor().First()
		if k == nil {
			return nil
		}
		if len(k) < 8 {
			return fmt.Errorf("%w: schedules_due key %x", errCorrupt, k)
		}
		at, ok = time.Unix(0, int64(binary.BigEndian.Uint64(k)^(1<<63))).UTC(), true // keyTime's inverse
		return nil
	})
	if err != nil {
		return time.Time{}, false, fmt.Errorf("boltstore: next schedule due: %w", err)
	}
	return at, ok, nil
}

// FireDue stores the due schedules' fires; see storage.Scheduler. The
// store has one writer, so no two calls ever plan one fire time.
func (s *Store) FireDue(ctx context.Context, now time.Time, lead time.Duration, limit int, plan storage.Planner) ([]storage.Fired, error) {
	if limit <= 0 {
		return nil, errors.New("boltstore: fire due: limit must be positive")
	}
	by := keyTime(now.Add(lead))
	var out []storage.Fired
	err := s.schedWrite(ctx, "fire due schedules", func(b txb, sb schedBuckets, _ *pinSet, _ time.Time) error {
		out = out[:0]
		var keys []string
		cur := sb.due.Cursor()
		for k, _ := cur.First(); k != nil && len(keys) < limit; k, _ = cur.Next() {
			if len(k) < 8 {
				return fmt.Errorf("%w: schedules_due key %x", errCorrupt, k)
			}
			if binary.BigEndian.Uint64(k) > by {
				break
			}
			keys = append(keys, string(k[8:]))
		}
		for _, key := range keys {
			old, err := sb.get(key)
			if err != nil {
				return err
			}
			if old == nil {
				return fmt.Errorf("%w: schedules_due names missing schedule %q", errCorrupt, key)
			}
			n := *old
			p := plan(&n, now)
			f := storage.ApplyPlan(&n, p)
			if f.ID != "" {
				switch {
				case b.ids.Get([]byte(f.ID)) != nil, b.cancelled(f.ID, now):
				default:
					row := storage.FireRow(&n, &f, &p, now)
					if err := b.add(&row); err != nil {
						return fmt.Errorf("fire %q: %w", f.ID, err)
					}
					f.Stored = true
				}
			}
			if err := sb.put(old, &n); err != nil {
				return err
			}
			out = append(out, f)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// FireNow stores an extra fire of a schedule; see storage.Scheduler.
func (s *Store) FireNow(ctx context.Context, key string, now time.Time, msg storage.FireMessage) (storage.Fired, error) {
	var out storage.Fired
	err := s.schedWrite(ctx, "fire schedule now "+key, func(b txb, sb schedBuckets, _ *pinSet, _ time.Time) error {
		old, err := sb.get(key)
		if err != nil {
			return err
		}
		if old == nil {
			return storage.ErrScheduleNotFound
		}
		row, f, err := storage.NowFire(old, now, msg)
		if err != nil {
			return err
		}
		out = f
		if b.ids.Get([]byte(f.ID)) != nil || b.cancelled(f.ID, now) {
			return nil
		}
		if err := b.add(&row); err != nil {
			return fmt.Errorf("fire %q: %w", f.ID, err)
		}
		out.Stored = true
		n := *old
		n.Fires++
		return sb.put(old, &n)
	})
	if err != nil {
		return storage.Fired{}, err
	}
	return out, nil
}
