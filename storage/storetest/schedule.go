package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/delaybridge/delaybridge/cron"
	"github.com/delaybridge/delaybridge/storage"
)

// The cases of storage.Scheduler, for every store that has it.
func init() {
	tests = append(tests, []struct {
		name string
		fn   func(e *env)
	}{
		{"SchedulePutGetList", testSchedulePutGetList},
		{"ScheduleFireDue", testScheduleFireDue},
		{"ScheduleFireDueConcurrent", testScheduleFireDueConcurrent},
		{"ScheduleMisfire", testScheduleMisfire},
		{"ScheduleReplace", testScheduleReplace},
		{"ScheduleCancel", testScheduleCancel},
		{"SchedulePauseResume", testSchedulePauseResume},
		{"ScheduleFireAtomic", testScheduleFireAtomic},
		{"SchedulePlannerErrors", testSchedulePlannerErrors},
	}...)
}

// every10s fires on every tenth second, in UTC.
var every10s = func() cron.Schedule {
	s, err := cron.Parse("*/10 * * * * ?")
	if err != nil {
		panic(err)
	}
	return s
}()

// testPlanner plans as the bridge's firer does, with cron.Decide and a 60 s
// misfire threshold; each fire's message names its fire time.
func testPlanner(s *storage.Schedule, now time.Time) storage.FirePlan {
	d := cron.Decide(every10s, time.UTC, cron.Window{}, cron.MisfirePolicy(s.Misfire), s.NextFireAt, now, cron.DefaultMisfireThreshold)
	p := storage.FirePlan{Fire: d.Fire, Scheduled: d.Scheduled, Misfired: d.Misfired, Next: d.Next, Prev: d.Previous}
	if d.Fire {
		p.DueAt = d.Scheduled
		if d.Misfired {
			p.DueAt = now
		}
		p.Message = []byte(fmt.Sprintf("%s fire %s", s.Message, d.Scheduled.UTC().Format(time.RFC3339)))
	}
	return p
}

// scheduler is the store as a storage.Scheduler; a store that keeps no
// schedules skips the case.
func scheduler(e *env) storage.Scheduler {
	e.Helper()
	sc, ok := e.s.(storage.Scheduler)
	if !ok {
		e.Skipf("%T keeps no recurring schedules (storage.Scheduler)", e.s)
	}
	return sc
}

func newSchedule(key string, next time.Time) storage.Schedule {
	return storage.Schedule{Key: key, Source: "amqp", Expr: every10s.String(), Zone: "UTC", Destination: "dest." + key,
		Message: []byte("template " + key), Description: "d", Token: "tok", NextFireAt: next}
}

func (e *env) putSchedule(sc storage.Scheduler, s storage.Schedule) storage.Schedule {
	e.Helper()
	got, err := sc.PutSchedule(e.ctx, s)
	if err != nil {
		e.Fatalf("PutSchedule(%q): %v", s.Key, err)
	}
	return got
}

func (e *env) getSchedule(sc storage.Scheduler, key string) storage.Schedule {
	e.Helper()
	got, err := sc.GetSchedule(e.ctx, key)
	if err != nil {
		e.Fatalf("GetSchedule(%q): %v", key, err)
	}
	return got
}

func (e *env) fireDue(sc storage.Scheduler, lead time.Duration) []storage.Fired {
	e.Helper()
	got, err := sc.FireDue(e.ctx, e.clock.Now(), lead, 100, testPlanner)
	if err != nil {
		e.Fatalf("FireDue: %v", err)
	}
	return got
}

var scheduleOpts = cmp.Options{cmpopts.EquateEmpty(), cmpopts.IgnoreFields(storage.Schedule{}, "UpdatedAt")}

// testSchedulePutGetList: a schedule comes back as put, with generation 1;
// putting it again replaces it (generation 2); List pages in key order
// without messages; NextScheduleDue is the earliest next fire time; a
// missing key is ErrScheduleNotFound.
func testSchedulePutGetList(e *env) {
	sc := scheduler(e)
	if _, err := sc.GetSchedule(e.ctx, "amqp:none"); !errors.Is(err, storage.ErrScheduleNotFound) {
		e.Fatalf("GetSchedule of a missing key: %v, want ErrScheduleNotFound", err)
	}
	if _, ok, err := sc.NextScheduleDue(e.ctx); err != nil || ok {
		e.Fatalf("NextScheduleDue of no schedules = %v, %v", ok, err)
	}
	in := newSchedule("amqp:b", at(20*time.Second))
	in.Start, in.End, in.Misfire, in.Exchange = at(-time.Hour), at(time.Hour), int(cron.MisfireSkip), "x"
	got := e.putSchedule(sc, in)
	want := in
	want.Generation = 1
	if diff := cmp.Diff(want, got, scheduleOpts); diff != "" {
		e.Fatalf("PutSchedule returned (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(want, e.getSchedule(sc, "amqp:b"), scheduleOpts); diff != "" {
		e.Fatalf("GetSchedule (-want +got):\n%s", diff)
	}
	e.putSchedule(sc, newSchedule("amqp:a", at(10*time.Second)))
	e.putSchedule(sc, newSchedule("amqp:c", at(30*time.Second)))
	if at2, ok, err := sc.NextScheduleDue(e.ctx); err != nil || !ok || !at2.Equal(at(10*time.Second)) {
		e.Fatalf("NextScheduleDue = %v, %v, %v; want %v", at2, ok, err, at(10*time.Second))
	}
	again := e.putSchedule(sc, newSchedule("amqp:b", at(40*time.Second)))
	if again.Generation != 2 || again.Exchange != "" || again.Misfire != 0 {
		e.Fatalf("replaced schedule = %+v; want generation 2 and the new fields", again)
	}
	page, next, err := sc.ListSchedules(e.ctx, "", 2)
	if err != nil || len(page) != 2 || page[0].Key != "amqp:a" || page[1].Key != "amqp:b" || next != "amqp:b" {
		e.Fatalf("ListSchedules page 1 = %v, %q, %v", scheduleKeys(page), next, err)
	}
	for _, s := range page {
		if s.Message != nil {
			e.Fatalf("ListSchedules returned %q with its message", s.Key)
		}
	}
	page, next, err = sc.ListSchedules(e.ctx, next, 2)
	if err != nil || len(page) != 1 || page[0].Key != "amqp:c" || next != "" {
		e.Fatalf("ListSchedules page 2 = %v, %q, %v", scheduleKeys(page), next, err)
	}
	if _, err := sc.PutSchedule(e.ctx, storage.Schedule{Key: "", Destination: "d"}); err == nil {
		e.Fatal("PutSchedule of an empty key succeeded")
	}
	if _, err := sc.PutSchedule(e.ctx, storage.Schedule{Key: "k"}); err == nil {
		e.Fatal("PutSchedule without a destination succeeded")
	}
}

func scheduleKeys(ss []storage.Schedule) []string {
	var ks []string
	for _, s := range ss {
		ks = append(ks, s.Key)
	}
	return ks
}

// testScheduleFireDue: FireDue stores a schedule's fire a lead ahead as an
// ordinary row keyed by FireID, due at the fire time (never leasable
// before it), and moves the schedule on; called again it stores nothing.
func testScheduleFireDue(e *env) {
	sc := scheduler(e)
	e.putSchedule(sc, newSchedule("amqp:s", at(10*time.Second)))
	if got := e.fireDue(sc, 200*time.Millisecond); len(got) != 0 {
		e.Fatalf("FireDue 10 s early = %+v; want nothing", got)
	}
	e.clock.Set(at(9*time.Second + 900*time.Millisecond))
	got := e.fireDue(sc, 200*time.Millisecond)
	id := storage.FireID("amqp:s", 1, at(10*time.Second))
	want := []storage.Fired{{Key: "amqp:s", ID: id, Scheduled: at(10 * time.Second), DueAt: at(10 * time.Second), Stored: true, Next: at(20 * time.Second)}}
	if diff := cmp.Diff(want, got, cmpOpts); diff != "" {
		e.Fatalf("FireDue (-want +got):\n%s", diff)
	}
	row := e.get(id)
	if !row.DueAt.Equal(at(10*time.Second)) || row.SagaID != "amqp:s" || row.Destination != "dest.amqp:s" ||
		string(row.Message) != "template amqp:s fire 2026-03-01T12:00:10Z" {
		e.Fatalf("fire row = %+v", row)
	}
	s := e.getSchedule(sc, "amqp:s")
	if !s.NextFireAt.Equal(at(20*time.Second)) || !s.PrevFireAt.Equal(at(10*time.Second)) || s.Fires != 1 || s.Misfires != 0 {
		e.Fatalf("schedule after a fire = %+v", s)
	}
	if got := e.fireDue(sc, 200*time.Millisecond); len(got) != 0 {
		e.Fatalf("FireDue again = %+v; want nothing", got)
	}
	e.expectNoLease() // due at 10 s, now 9.9 s: never early
	e.clock.Set(at(10 * time.Second))
	e.leaseOne(id, time.Minute)
	e.expectNextDue(at(10*time.Second + time.Minute)) // the lease's expiry: no other row
}

// testScheduleFireDueConcurrent: callers of FireDue at once, on one fire
// time of many schedules, store one row per schedule and fire time and
// report each fire once.
func testScheduleFireDueConcurrent(e *env) {
	sc := scheduler(e)
	const n = 20
	for i := range n {
		e.putSchedule(sc, newSchedule(fmt.Sprintf("amqp:c%02d", i), at(10*time.Second)))
	}
	e.clock.Set(at(10 * time.Second))
	var mu sync.Mutex
	fired := map[string]int{}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got, err := sc.FireDue(e.ctx, at(10*time.Second), 0, 3, testPlanner)
			if err != nil {
				errs <- err
				return
			}
			mu.Lock()
			defer mu.Unlock()
			for _, f := range got {
				if f.Stored {
					fired[f.ID]++
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		e.Fatalf("FireDue: %v", err)
	}
	// The callers took 3 each at most: what is left fires now.
	for _, f := range e.fireDue(sc, 0) {
		fired[f.ID]++
	}
	if len(fired) != n {
		e.Fatalf("%d fires stored, want %d: %v", len(fired), n, fired)
	}
	for id, c := range fired {
		if c != 1 {
			e.Fatalf("fire %s reported stored %d times", id, c)
		}
	}
	if rows := e.listAll(storage.ListFilter{Limit: 100}); len(rows) != n {
		e.Fatalf("%d rows stored, want %d: %v", len(rows), n, rows)
	}
}

// testScheduleMisfire: a fire time missed by more than the threshold fires
// once, late (Default), or not at all (Skip), and the schedule continues
// from the first fire time after now: never a burst of the missed ones.
func testScheduleMisfire(e *env) {
	sc := scheduler(e)
	e.putSchedule(sc, newSchedule("amqp:default", at(10*time.Second)))
	skip := newSchedule("amqp:skip", at(10*time.Second))
	skip.Misfire = int(cron.MisfireSkip)
	e.putSchedule(sc, skip)
	now := at(10*time.Minute + 5*time.Second) // 59 fire times missed
	e.clock.Set(now)
	got := e.fireDue(sc, 200*time.Millisecond)
	want := []storage.Fired{
		{Key: "amqp:default", ID: storage.FireID("amqp:default", 1, at(10*time.Second)), Scheduled: at(10 * time.Second), DueAt: now,
			Misfired: true, Stored: true, Next: at(10*time.Minute + 10*time.Second)},
		{Key: "amqp:skip", Misfired: true, Next: at(10*time.Minute + 10*time.Second)},
	}
	if diff := cmp.Diff(want, got, cmpOpts, cmpopts.SortSlices(func(a, b storage.Fired) bool { return a.Key < b.Key })); diff != "" {
		e.Fatalf("FireDue after downtime (-want +got):\n%s", diff)
	}
	if got := e.fireDue(sc, 200*time.Millisecond); len(got) != 0 {
		e.Fatalf("FireDue again = %+v; want nothing (no burst)", got)
	}
	if rows := e.listAll(storage.ListFilter{Limit: 100}); len(rows) != 1 {
		e.Fatalf("rows after downtime = %v; want the one catch-up fire", rows)
	}
	s := e.getSchedule(sc, "amqp:skip")
	if s.Misfires != 1 || s.Fires != 0 || !s.PrevFireAt.IsZero() {
		e.Fatalf("skipped schedule = %+v", s)
	}
	if d := e.getSchedule(sc, "amqp:default"); d.Misfires != 1 || d.Fires != 1 || !d.PrevFireAt.Equal(now.Truncate(time.Second)) {
		e.Fatalf("caught-up schedule = %+v", d)
	}
}

// testScheduleReplace: putting a schedule again cancels its pending fire
// and starts a new generation, whose fire has a key of its own.
func testScheduleReplace(e *env) {
	sc := scheduler(e)
	e.putSchedule(sc, newSchedule("amqp:r", at(10*time.Second)))
	e.clock.Set(at(10 * time.Second))
	old := e.fireDue(sc, 0)[0].ID
	e.get(old)
	e.putSchedule(sc, newSchedule("amqp:r", at(10*time.Second)))
	e.expectMissing(old)
	got := e.fireDue(sc, 0)
	if len(got) != 1 || got[0].ID != storage.FireID("amqp:r", 2, at(10*time.Second)) || !got[0].Stored {
		e.Fatalf("fire of the replacement = %+v", got)
	}
}

// testScheduleCancel: CancelSchedule ends the schedule and removes its
// pending fire; a leased fire is left to its dispatch.
func testScheduleCancel(e *env) {
	sc := scheduler(e)
	e.putSchedule(sc, newSchedule("amqp:x", at(10*time.Second)))
	e.putSchedule(sc, newSchedule("amqp:y", at(10*time.Second)))
	e.clock.Set(at(10 * time.Second))
	fires := e.fireDue(sc, 0)
	if len(fires) != 2 {
		e.Fatalf("fires = %+v", fires)
	}
	ls, err := e.s.Lease(e.ctx, "owner", time.Time{}, 1, time.Minute)
	if err != nil || len(ls) != 1 || ls[0].ID != storage.FireID("amqp:x", 1, at(10*time.Second)) {
		e.Fatalf("Lease = %v, %v; want the fire of amqp:x", ls, err)
	}
	leased := ls[0]
	for _, k := range []string{"amqp:x", "amqp:y"} {
		if found, err := sc.CancelSchedule(e.ctx, k); err != nil || !found {
			e.Fatalf("CancelSchedule(%s) = %v, %v", k, found, err)
		}
		if _, err := sc.GetSchedule(e.ctx, k); !errors.Is(err, storage.ErrScheduleNotFound) {
			e.Fatalf("GetSchedule after cancel: %v", err)
		}
	}
	e.expectMissing(storage.FireID("amqp:y", 1, at(10*time.Second)))
	e.get(leased.ID) // being dispatched: too late to cancel
	if found, err := sc.CancelSchedule(e.ctx, "amqp:x"); err != nil || found {
		e.Fatalf("CancelSchedule again = %v, %v; want not found", found, err)
	}
	e.clock.Set(at(time.Minute))
	if got := e.fireDue(sc, 0); len(got) != 0 {
		e.Fatalf("FireDue after cancel = %+v", got)
	}
}

// testSchedulePauseResume: a paused schedule fires nothing and its pending
// fire goes; resumed after its fire times passed, the misfire policy
// decides (one catch-up fire).
func testSchedulePauseResume(e *env) {
	sc := scheduler(e)
	if _, err := sc.PauseSchedule(e.ctx, "amqp:none"); !errors.Is(err, storage.ErrScheduleNotFound) {
		e.Fatalf("PauseSchedule of a missing key: %v", err)
	}
	e.putSchedule(sc, newSchedule("amqp:p", at(10*time.Second)))
	e.clock.Set(at(10 * time.Second))
	fire := e.fireDue(sc, 0)[0].ID
	for _, want := range []bool{true, false} {
		if changed, err := sc.PauseSchedule(e.ctx, "amqp:p"); err != nil || changed != want {
			e.Fatalf("PauseSchedule = %v, %v; want %v", changed, err, want)
		}
	}
	e.expectMissing(fire)
	if _, ok, err := sc.NextScheduleDue(e.ctx); err != nil || ok {
		e.Fatalf("NextScheduleDue of a paused schedule = %v, %v", ok, err)
	}
	e.clock.Set(at(5 * time.Minute))
	if got := e.fireDue(sc, 0); len(got) != 0 {
		e.Fatalf("FireDue while paused = %+v", got)
	}
	if !e.getSchedule(sc, "amqp:p").Paused {
		e.Fatal("GetSchedule does not show the pause")
	}
	for _, want := range []bool{true, false} {
		if changed, err := sc.ResumeSchedule(e.ctx, "amqp:p"); err != nil || changed != want {
			e.Fatalf("ResumeSchedule = %v, %v; want %v", changed, err, want)
		}
	}
	got := e.fireDue(sc, 0)
	if len(got) != 1 || !got[0].Misfired || !got[0].Stored || !got[0].DueAt.Equal(at(5*time.Minute)) || !got[0].Next.Equal(at(5*time.Minute+10*time.Second)) {
		e.Fatalf("FireDue after resume = %+v; want one catch-up fire", got)
	}
}

// testScheduleFireAtomic: a fire row is stored in the commit that moves
// its schedule on: when FireDue fails midway (its context ends while it
// plans), each schedule has either both or neither.
func testScheduleFireAtomic(e *env) {
	sc := scheduler(e)
	for _, k := range []string{"amqp:a1", "amqp:a2", "amqp:a3"} {
		e.putSchedule(sc, newSchedule(k, at(10*time.Second)))
	}
	e.clock.Set(at(10 * time.Second))
	ctx, cancel := context.WithCancel(e.ctx)
	planned := 0
	_, err := sc.FireDue(ctx, e.clock.Now(), 0, 10, func(s *storage.Schedule, now time.Time) storage.FirePlan {
		if planned++; planned == 2 {
			cancel()
		}
		return testPlanner(s, now)
	})
	cancel()
	for _, k := range []string{"amqp:a1", "amqp:a2", "amqp:a3"} {
		moved := e.getSchedule(sc, k).NextFireAt.Equal(at(20 * time.Second))
		_, gerr := e.s.Get(e.ctx, storage.FireID(k, 1, at(10*time.Second)))
		if stored := gerr == nil; stored != moved {
			e.Fatalf("schedule %s: fire stored %v, schedule moved on %v (FireDue: %v)", k, stored, moved, err)
		}
	}
}

// testSchedulePlannerErrors: a plan that fails, or does not move the
// schedule on, ends the schedule with the reason and fires nothing.
func testSchedulePlannerErrors(e *env) {
	sc := scheduler(e)
	e.putSchedule(sc, newSchedule("amqp:bad", at(10*time.Second)))
	e.putSchedule(sc, newSchedule("amqp:stuck", at(10*time.Second)))
	e.clock.Set(at(10 * time.Second))
	got, err := sc.FireDue(e.ctx, e.clock.Now(), 0, 10, func(s *storage.Schedule, now time.Time) storage.FirePlan {
		if s.Key == "amqp:bad" {
			return storage.FirePlan{Err: "zone gone"}
		}
		return storage.FirePlan{Fire: true, Scheduled: s.NextFireAt, DueAt: s.NextFireAt, Next: s.NextFireAt}
	})
	if err != nil || len(got) != 2 {
		e.Fatalf("FireDue = %+v, %v", got, err)
	}
	for _, f := range got {
		if f.ID != "" || f.Stored || f.Err == "" {
			e.Fatalf("fire of a failed plan = %+v", f)
		}
		s := e.getSchedule(sc, f.Key)
		if !s.NextFireAt.IsZero() || s.LastError == "" {
			e.Fatalf("schedule after a failed plan = %+v", s)
		}
	}
	if rows := e.listAll(storage.ListFilter{Limit: 100}); len(rows) != 0 {
		e.Fatalf("rows = %v", rows)
	}
}
