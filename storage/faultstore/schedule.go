package faultstore

import (
	"context"
	"errors"
	"time"

	"github.com/delaybridge/delaybridge/storage"
)

// errNoSchedules answers a Scheduler call over a store that keeps no
// schedules (both of the project's stores keep them).
var errNoSchedules = errors.New("faultstore: the wrapped store keeps no recurring schedules")

// scheduler enters op and returns the wrapped store's Scheduler.
func (s *Store) scheduler(ctx context.Context, op Op) (storage.Scheduler, error) {
	if err := s.enter(ctx, op); err != nil {
		return nil, err
	}
	sc, ok := s.inner.(storage.Scheduler)
	if !ok {
		return nil, errNoSchedules
	}
	return sc, nil
}

// PutSchedule implements storage.Scheduler (op PutSchedule).
func (s *Store) PutSchedule(ctx context.Context, sched storage.Schedule) (storage.Schedule, error) {
	sc, err := s.scheduler(ctx, PutSchedule)
	if err != nil {
		return storage.Schedule{}, err
	}
	return sc.PutSchedule(ctx, sched)
}

// CancelSchedule implements storage.Scheduler (op ChangeSchedule).
func (s *Store) CancelSchedule(ctx context.Context, key string) (bool, error) {
	sc, err := s.scheduler(ctx, ChangeSchedule)
	if err != nil {
		return false, err
	}
	return sc.CancelSchedule(ctx, key)
}

// PauseSchedule implements storage.Scheduler (op ChangeSchedule).
func (s *Store) PauseSchedule(ctx context.Context, key string) (bool, error) {
	sc, err := s.scheduler(ctx, ChangeSchedule)
	if err != nil {
		return false, err
	}
	return sc.PauseSchedule(ctx, key)
}

// ResumeSchedule implements storage.Scheduler (op ChangeSchedule).
func (s *Store) ResumeSchedule(ctx context.Context, key string) (bool, error) {
	sc, err := s.scheduler(ctx, ChangeSchedule)
	if err != nil {
		return false, err
	}
	return sc.ResumeSchedule(ctx, key)
}

// GetSchedule implements storage.Scheduler (op ReadSchedules).
func (s *Store) GetSchedule(ctx context.Context, key string) (storage.Schedule, error) {
	sc, err := s.scheduler(ctx, ReadSchedules)
	if err != nil {
		return storage.Schedule{}, err
	}
	return sc.GetSchedule(ctx, key)
}

// ListSchedules implements storage.Scheduler (op ReadSchedules).
func (s *Store) ListSchedules(ctx context.Context, after string, limit int) ([]storage.Schedule, string, error) {
	sc, err := s.scheduler(ctx, ReadSchedules)
	if err != nil {
		return nil, "", err
	}
	return sc.ListSchedules(ctx, after, limit)
}

// NextScheduleDue implements storage.Scheduler (op ReadSchedules).
func (s *Store) NextScheduleDue(ctx context.Context) (time.Time, bool, error) {
	sc, err := s.scheduler(ctx, ReadSchedules)
	if err != nil {
		return time.Time{}, false, err
	}
	return sc.NextScheduleDue(ctx)
}

// FireDue implements storage.Scheduler (op Fire).
func (s *Store) FireDue(ctx context.Context, now time.Time, lead time.Duration, limit int, plan storage.Planner) ([]storage.Fired, error) {
	sc, err := s.scheduler(ctx, Fire)
	if err != nil {
		return nil, err
	}
	return sc.FireDue(ctx, now, lead, limit, plan)
}

// FireNow implements storage.Scheduler (op Fire).
func (s *Store) FireNow(ctx context.Context, key string, now time.Time, msg storage.FireMessage) (storage.Fired, error) {
	sc, err := s.scheduler(ctx, Fire)
	if err != nil {
		return storage.Fired{}, err
	}
	return sc.FireNow(ctx, key, now, msg)
}
