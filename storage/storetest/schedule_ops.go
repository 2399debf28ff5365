package storetest

import (
	"errors"
	"fmt"
	"time"

	"github.com/delaybridge/delaybridge/storage"
)

// The cases of the operator's schedule calls (FireNow) and of the cancel
// tombstones PutSchedule honours (docs/contract.md §2.11).
func init() {
	tests = append(tests, []struct {
		name string
		fn   func(e *env)
	}{
		{"SchedulePutTombstone", testSchedulePutTombstone},
		{"ScheduleFireNow", testScheduleFireNow},
	}...)
}

// testSchedulePutTombstone: a put of a schedule whose name was cancelled
// within the cancel window stores nothing (ErrScheduleCancelled), and
// leaves a schedule of another name alone; once the window is over, the
// name is free again.
func testSchedulePutTombstone(e *env) {
	sc := scheduler(e)
	if err := e.s.Cancel(e.ctx, "late", storage.CancelOrdered); !errors.Is(err, storage.ErrNotFound) {
		e.Fatalf("Cancel(late) = %v, want ErrNotFound (a tombstone all the same)", err)
	}
	e.clock.Advance(time.Second)
	_, err := sc.PutSchedule(e.ctx, newSchedule("amqp:late", at(time.Minute)))
	if !errors.Is(err, storage.ErrScheduleCancelled) {
		e.Fatalf("PutSchedule of a cancelled name = %v, want ErrScheduleCancelled", err)
	}
	if _, err := sc.GetSchedule(e.ctx, "amqp:late"); !errors.Is(err, storage.ErrScheduleNotFound) {
		e.Fatalf("GetSchedule after a refused put: %v, want ErrScheduleNotFound", err)
	}
	if _, ok, err := sc.NextScheduleDue(e.ctx); err != nil || ok {
		e.Fatalf("NextScheduleDue after a refused put = %v, %v; want none", ok, err)
	}
	e.putSchedule(sc, newSchedule("amqp:other", at(time.Minute)))
	// A put refused after the schedule was stored leaves it as it was.
	e.putSchedule(sc, newSchedule("amqp:kept", at(time.Minute)))
	if err := e.s.Cancel(e.ctx, "kept", storage.CancelOrdered); !errors.Is(err, storage.ErrNotFound) {
		e.Fatalf("Cancel(kept) = %v", err)
	}
	if _, err := sc.PutSchedule(e.ctx, newSchedule("amqp:kept", at(2*time.Minute))); !errors.Is(err, storage.ErrScheduleCancelled) {
		e.Fatalf("PutSchedule of kept after its cancel = %v, want ErrScheduleCancelled", err)
	}
	if got := e.getSchedule(sc, "amqp:kept"); got.Generation != 1 || !got.NextFireAt.Equal(at(time.Minute)) {
		e.Fatalf("kept after a refused put = generation %d, next %s; want 1, %s", got.Generation, got.NextFireAt, at(time.Minute))
	}
	e.clock.Advance(storage.DefaultCancelWindow + time.Second)
	got := e.putSchedule(sc, newSchedule("amqp:late", at(storage.DefaultCancelWindow+time.Hour)))
	if got.Generation != 1 {
		e.Fatalf("put after the window: generation %d, want 1", got.Generation)
	}
}

// nowMessage is the message FireNow's cases store: it names the fire.
func nowMessage(s *storage.Schedule, id string, at time.Time) ([]byte, error) {
	return []byte(fmt.Sprintf("%s now %s %s", s.Message, id, at.UTC().Format(time.RFC3339Nano))), nil
}

// testScheduleFireNow: FireNow stores one fire due now, with the
// schedule's destination and saga, counts it, and moves nothing; a second
// one at another instant is another row; a paused schedule fires too; a
// missing key is ErrScheduleNotFound; a message that cannot be built
// stores nothing.
func testScheduleFireNow(e *env) {
	sc := scheduler(e)
	now := e.clock.Now()
	if _, err := sc.FireNow(e.ctx, "amqp:none", now, nowMessage); !errors.Is(err, storage.ErrScheduleNotFound) {
		e.Fatalf("FireNow of a missing key = %v, want ErrScheduleNotFound", err)
	}
	put := e.putSchedule(sc, newSchedule("amqp:n", at(time.Hour)))
	f, err := sc.FireNow(e.ctx, "amqp:n", now, nowMessage)
	if err != nil {
		e.Fatalf("FireNow: %v", err)
	}
	id := storage.FireNowID("amqp:n", 1, now)
	if f.ID != id || !f.Stored || !f.DueAt.Equal(now) || !f.Next.Equal(at(time.Hour)) {
		e.Fatalf("FireNow = %+v; want id %q stored, due %s, next %s", f, id, now, at(time.Hour))
	}
	row := e.get(id)
	want := fmt.Sprintf("template amqp:n now %s %s", id, now.UTC().Format(time.RFC3339Nano))
	if row.Destination != "dest.amqp:n" || row.SagaID != "amqp:n" || !row.DueAt.Equal(now) || string(row.Message) != want {
		e.Fatalf("fire row = %+v (message %q); want destination dest.amqp:n, saga amqp:n, due %s, message %q", row, row.Message, now, want)
	}
	got := e.getSchedule(sc, "amqp:n")
	if got.Fires != 1 || !got.NextFireAt.Equal(put.NextFireAt) || !got.PrevFireAt.IsZero() || got.Generation != 1 {
		e.Fatalf("schedule after FireNow = %+v; want 1 fire, next %s, no previous, generation 1", got, put.NextFireAt)
	}
	if at, ok, err := sc.NextScheduleDue(e.ctx); err != nil || !ok || !at.Equal(put.NextFireAt) {
		e.Fatalf("NextScheduleDue after FireNow = %s, %v, %v; want %s", at, ok, err, put.NextFireAt)
	}
	// The same instant again: the key is taken, nothing more.
	if f, err := sc.FireNow(e.ctx, "amqp:n", now, nowMessage); err != nil || f.Stored || f.ID != id {
		e.Fatalf("FireNow again at one instant = %+v, %v; want not stored", f, err)
	}
	if got := e.getSchedule(sc, "amqp:n"); got.Fires != 1 {
		e.Fatalf("fires after a FireNow not stored = %d, want 1", got.Fires)
	}
	if _, err := sc.PauseSchedule(e.ctx, "amqp:n"); err != nil {
		e.Fatalf("PauseSchedule: %v", err)
	}
	e.expectMissing(id) // a pause cancels the pending fires, extra ones too
	e.clock.Advance(time.Second)
	later := e.clock.Now()
	f, err = sc.FireNow(e.ctx, "amqp:n", later, nowMessage)
	if err != nil || !f.Stored || f.ID != storage.FireNowID("amqp:n", 1, later) {
		e.Fatalf("FireNow of a paused schedule = %+v, %v; want stored", f, err)
	}
	e.get(f.ID)
	if got := e.getSchedule(sc, "amqp:n"); !got.Paused || got.Fires != 2 {
		e.Fatalf("schedule after a paused FireNow = paused %v, fires %d; want paused, 2", got.Paused, got.Fires)
	}
	boom := errors.New("boom")
	_, err = sc.FireNow(e.ctx, "amqp:n", later.Add(time.Second), func(*storage.Schedule, string, time.Time) ([]byte, error) { return nil, boom })
	if !errors.Is(err, boom) {
		e.Fatalf("FireNow with a failing message = %v, want boom", err)
	}
	e.expectMissing(storage.FireNowID("amqp:n", 1, later.Add(time.Second)))
	if got := e.getSchedule(sc, "amqp:n"); got.Fires != 2 {
		e.Fatalf("fires after a failed FireNow = %d, want 2", got.Fires)
	}
}
