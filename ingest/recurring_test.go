package ingest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/broker/brokertest"
	"github.com/delaybridge/delaybridge/intake"
	"github.com/delaybridge/delaybridge/internal/amqptest"
	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/wire"
)

// schedStore is a fakeStore that keeps schedules: puts and cancels are
// recorded; putFail makes PutSchedule fail.
type schedStore struct {
	*fakeStore
	puts    []storage.Schedule
	ended   []string
	putFail error
}

func (s *schedStore) PutSchedule(_ context.Context, sc storage.Schedule) (storage.Schedule, error) {
	if s.putFail != nil {
		return storage.Schedule{}, s.putFail
	}
	s.puts = append(s.puts, sc)
	return sc, nil
}

func (s *schedStore) CancelSchedule(_ context.Context, key string) (bool, error) {
	for i, p := range s.puts {
		if p.Key == key {
			s.puts = append(s.puts[:i], s.puts[i+1:]...)
			s.ended = append(s.ended, key)
			return true, nil
		}
	}
	return false, nil
}

func (s *schedStore) InsertAndCancel(ctx context.Context, ts []storage.Timeout, cancels []storage.OrderedCancel) ([]storage.Outcome, []storage.CancelResult, error) {
	return s.insertAndCancel(ts, cancels, func(key string) bool {
		found, _ := s.CancelSchedule(ctx, key)
		return found
	})
}

func (s *schedStore) PauseSchedule(context.Context, string) (bool, error)  { return false, errUnused }
func (s *schedStore) ResumeSchedule(context.Context, string) (bool, error) { return false, errUnused }
func (s *schedStore) GetSchedule(context.Context, string) (storage.Schedule, error) {
	return storage.Schedule{}, errUnused
}
func (s *schedStore) ListSchedules(context.Context, string, int) ([]storage.Schedule, string, error) {
	return nil, "", errUnused
}
func (s *schedStore) NextScheduleDue(context.Context) (time.Time, bool, error) {
	return time.Time{}, false, errUnused
}
func (s *schedStore) FireDue(context.Context, time.Time, time.Duration, int, storage.Planner) ([]storage.Fired, error) {
	return nil, errUnused
}

func (s *schedStore) FireNow(context.Context, string, time.Time, storage.FireMessage) (storage.Fired, error) {
	return storage.Fired{}, errUnused
}

var errUnused = errors.New("not used by ingest")

// TestRecurringIntake: a schedule message is stored as a schedule (acked,
// the firer woken), requeued when the store fails, refused to the error
// queue by a store that keeps no schedules; a cancel with its id ends it.
func TestRecurringIntake(t *testing.T) {
	store, pub, a := &schedStore{fakeStore: &fakeStore{}}, &brokertest.Publisher{}, amqptest.New(t)
	var woke []time.Time
	in := newIngester(store, pub, &woke)
	wakes := 0
	in.opts.ScheduleWake = func() { wakes++ }
	h := amqp.Table{wire.HeaderDestination: "a", wire.HeaderCron: "0 0 * * * ?", wire.HeaderTimeZone: "W. Europe Standard Time"}
	if err := in.take(pub, deliveries(a, h)); err != nil {
		t.Fatal(err)
	}
	if a.Outcome(1) != amqptest.Acked || len(store.puts) != 1 || wakes != 1 || len(pub.Sent()) != 0 {
		t.Fatalf("outcome %s, puts %+v, wakes %d, error copies %d", a.Outcome(1), store.puts, wakes, len(pub.Sent()))
	}
	sc := store.puts[0] // now0 is on the hour: a fire time at intake fires
	if sc.Key != "amqp:m0" || sc.Destination != "a" || !sc.NextFireAt.Equal(now0) || sc.Zone != "W. Europe Standard Time" {
		t.Fatalf("schedule = %+v", sc)
	}

	cancel := deliveries(amqptest.New(t), amqp.Table{wire.HeaderCancel: "m0"})
	cancel[0].Body = nil
	if err := in.take(pub, cancel); err != nil {
		t.Fatal(err)
	}
	if len(store.puts) != 0 || len(store.ended) != 1 || store.ended[0] != "amqp:m0" {
		t.Fatalf("after the cancel: puts %+v, ended %v", store.puts, store.ended)
	}

	store.putFail = errors.New("disk")
	a2 := amqptest.New(t)
	if err := in.take(pub, deliveries(a2, h)); err != nil {
		t.Fatal(err)
	}
	if a2.Outcome(1) != amqptest.Requeued {
		t.Fatalf("a schedule whose put failed: %s, want requeued", a2.Outcome(1))
	}

	refusedWithoutSchedules(t, testSource, h)
}

// refusedWithoutSchedules checks that ingest on a store that keeps no
// schedules acks a delivery of src with headers h and moves it to the
// error queue, saying so.
func refusedWithoutSchedules(t *testing.T, src intake.Source, h amqp.Table) {
	t.Helper()
	pub, a := &brokertest.Publisher{}, amqptest.New(t)
	var woke []time.Time
	if err := newIngester(&fakeStore{}, pub, &woke).takeFrom(src, pub, deliveries(a, h)); err != nil {
		t.Fatal(err)
	}
	sent := pub.Sent()
	if a.Outcome(1) != amqptest.Acked || len(sent) != 1 ||
		!strings.Contains(sent[0].Msg.Headers[wire.HeaderError].(string), "cannot keep recurring schedules") {
		t.Fatalf("store without schedules: %s, error copies %+v", a.Outcome(1), sent)
	}
}

// TestRecurringIntakeCancelled: a schedule message the store refuses as
// cancelled (its id has a live tombstone, docs/contract.md §2.11) is acked
// and dropped like a cancelled one-shot: no schedule, no error copy, no
// requeue, no firer wake.
func TestRecurringIntakeCancelled(t *testing.T) {
	store, pub, a := &schedStore{fakeStore: &fakeStore{}}, &brokertest.Publisher{}, amqptest.New(t)
	store.putFail = fmt.Errorf("put: %w", storage.ErrScheduleCancelled)
	var woke []time.Time
	in := newIngester(store, pub, &woke)
	rec := &recorder{}
	in.opts.Metrics = rec
	wakes := 0
	in.opts.ScheduleWake = func() { wakes++ }
	h := amqp.Table{wire.HeaderDestination: "a", wire.HeaderCron: "0 0 * * * ?"}
	if err := in.take(pub, deliveries(a, h)); err != nil {
		t.Fatal(err)
	}
	if a.Outcome(1) != amqptest.Acked || len(store.puts) != 0 || wakes != 0 || len(pub.Sent()) != 0 || rec.dropped[DropCancelled] != 1 {
		t.Fatalf("outcome %s, puts %+v, wakes %d, error copies %d, dropped %v; want acked and dropped as cancelled",
			a.Outcome(1), store.puts, wakes, len(pub.Sent()), rec.dropped)
	}
}

// ctlStore records the schedule controls it is given; a key not in known
// is not found (the store's ErrScheduleNotFound for a pause or resume,
// found false for a cancel); fail makes each control fail.
type ctlStore struct {
	*schedStore
	known map[string]bool
	did   []string
	fail  error
}

func (s *ctlStore) control(what, key string) (bool, error) {
	if s.fail != nil {
		return false, s.fail
	}
	s.did = append(s.did, what+" "+key)
	if !s.known[key] {
		if what == "cancel" {
			return false, nil
		}
		return false, storage.ErrScheduleNotFound
	}
	return true, nil
}

func (s *ctlStore) CancelSchedule(_ context.Context, key string) (bool, error) {
	return s.control("cancel", key)
}
func (s *ctlStore) PauseSchedule(_ context.Context, key string) (bool, error) {
	return s.control("pause", key)
}
func (s *ctlStore) ResumeSchedule(_ context.Context, key string) (bool, error) {
	return s.control("resume", key)
}

// controlSource turns each delivery into the control its headers name.
var controlSource = intake.Source{Name: "control", Queue: "ctl", Parser: intake.ParserFunc(func(d *amqp.Delivery, _ time.Time) intake.Intake {
	return intake.Intake{Op: intake.OpScheduleControl, ScheduleKey: d.Headers["key"].(string), Control: intake.ScheduleControl(d.Headers["c"].(int))}
})}

// TestScheduleControl: a parser's cancel, pause and resume reach the store
// and are acked, a resume wakes the firer; a missing schedule is no error;
// a store failure requeues; a store without schedules refuses them to the
// error queue; an unknown control or an empty key never reaches a store.
func TestScheduleControl(t *testing.T) {
	store := &ctlStore{schedStore: &schedStore{fakeStore: &fakeStore{}}, known: map[string]bool{"mt:g/a": true}}
	pub, a := &brokertest.Publisher{}, amqptest.New(t)
	var woke []time.Time
	in := newIngester(store, pub, &woke)
	wakes := 0
	in.opts.ScheduleWake = func() { wakes++ }
	hs := []amqp.Table{
		{"key": "mt:g/a", "c": int(intake.SchedulePause)}, {"key": "mt:g/a", "c": int(intake.ScheduleResume)},
		{"key": "mt:g/missing", "c": int(intake.SchedulePause)}, {"key": "mt:g/missing", "c": int(intake.ScheduleResume)},
		{"key": "mt:g/a", "c": int(intake.ScheduleCancel)}, {"key": "mt:g/missing", "c": int(intake.ScheduleCancel)},
	}
	if err := in.takeFrom(controlSource, pub, deliveries(a, hs...)); err != nil {
		t.Fatal(err)
	}
	want := []string{"pause mt:g/a", "resume mt:g/a", "pause mt:g/missing", "resume mt:g/missing", "cancel mt:g/a", "cancel mt:g/missing"}
	if strings.Join(store.did, ",") != strings.Join(want, ",") {
		t.Fatalf("store saw %q, want %q", store.did, want)
	}
	for i := range hs {
		if a.Outcome(uint64(i+1)) != amqptest.Acked {
			t.Fatalf("control %d: %s, want acked", i, a.Outcome(uint64(i+1)))
		}
	}
	if wakes != 1 || len(pub.Sent()) != 0 {
		t.Fatalf("wakes %d (one resume changed a schedule), error copies %d", wakes, len(pub.Sent()))
	}

	store.fail = errors.New("disk")
	a2 := amqptest.New(t)
	if err := in.takeFrom(controlSource, pub, deliveries(a2, hs[0])); err != nil {
		t.Fatal(err)
	}
	if a2.Outcome(1) != amqptest.Requeued {
		t.Fatalf("a control whose store failed: %s, want requeued", a2.Outcome(1))
	}

	refusedWithoutSchedules(t, controlSource, hs[0])

	for _, it := range []intake.Intake{{Op: intake.OpScheduleControl, ScheduleKey: "k"}, {Op: intake.OpScheduleControl, ScheduleKey: "k", Control: 9},
		{Op: intake.OpScheduleControl, Control: intake.ScheduleCancel}} {
		if err := it.Validate(); err == nil {
			t.Errorf("%+v passed Validate", it)
		}
	}
}
