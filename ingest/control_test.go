package ingest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/broker/brokertest"
	"github.com/delaybridge/delaybridge/intake"
	"github.com/delaybridge/delaybridge/internal/amqptest"
	"github.com/delaybridge/delaybridge/storage"
)

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
