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
