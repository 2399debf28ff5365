package faultstore

import (
	"errors"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/storage/storetest"
)

// The schedule methods fail with their op's fault without reaching the
// wrapped store, and delegate once healed: the firer and ingest run over a
// faultstore the paths they run in production.
func TestScheduleFaults(t *testing.T) {
	clock := storetest.NewClock(storetest.T0)
	s, inner := open(t, clock.Now)
	sched := storage.Schedule{Key: "amqp:s", Source: "amqp", Expr: "*/10 * * * * ?", Zone: "UTC", Destination: "dest",
		Message: []byte("m"), NextFireAt: clock.Now().Add(time.Minute)}

	s.Fail(PutSchedule, errBoom)
	_, err := s.PutSchedule(ctx, sched)
	wantInjected(t, "PutSchedule", err)
	if _, err := inner.GetSchedule(ctx, sched.Key); !errors.Is(err, storage.ErrScheduleNotFound) {
		t.Fatalf("inner GetSchedule after a failed put: %v, want ErrScheduleNotFound", err)
	}
	s.Heal()
	if _, err := s.PutSchedule(ctx, sched); err != nil {
		t.Fatalf("PutSchedule after Heal: %v", err)
	}

	s.Fail(ReadSchedules, errBoom)
	_, err = s.GetSchedule(ctx, sched.Key)
	wantInjected(t, "GetSchedule", err)
	_, _, err = s.ListSchedules(ctx, "", 10)
	wantInjected(t, "ListSchedules", err)
	_, _, err = s.NextScheduleDue(ctx)
	wantInjected(t, "NextScheduleDue", err)

	s.Fail(ChangeSchedule, errBoom)
	_, err = s.PauseSchedule(ctx, sched.Key)
	wantInjected(t, "PauseSchedule", err)
	_, err = s.CancelSchedule(ctx, sched.Key)
	wantInjected(t, "CancelSchedule", err)
	if got, err := inner.GetSchedule(ctx, sched.Key); err != nil || got.Paused {
		t.Fatalf("inner schedule after failed changes: %+v, %v; want it there and not paused", got, err)
	}

	s.Fail(Fire, errBoom)
	_, err = s.FireDue(ctx, clock.Now().Add(time.Hour), 0, 10, nil)
	wantInjected(t, "FireDue", err)
	_, err = s.FireNow(ctx, sched.Key, clock.Now(), nil)
	wantInjected(t, "FireNow", err)

	s.Heal()
	if changed, err := s.PauseSchedule(ctx, sched.Key); err != nil || !changed {
		t.Fatalf("PauseSchedule after Heal = %v, %v", changed, err)
	}
	if got, err := s.GetSchedule(ctx, sched.Key); err != nil || !got.Paused {
		t.Fatalf("GetSchedule after Heal = %+v, %v; want it paused", got, err)
	}
	for _, op := range []Op{PutSchedule, ChangeSchedule, ReadSchedules, Fire} {
		if s.Calls(op) == 0 {
			t.Errorf("Calls(%v) = 0", op)
		}
	}
}
