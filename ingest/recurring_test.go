package ingest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/cron"
	"github.com/delaybridge/delaybridge/intake"
	"github.com/delaybridge/delaybridge/internal/amqptest"
	"github.com/delaybridge/delaybridge/protocol/nsbtimeout"
	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/wire"
)

// TestParseRecurring: x-delaybridge-cron makes a recurring schedule named
// by the message id, first firing at the next fire time in its zone; the
// forwarded message has no schedule or due-time headers; what cannot make
// a schedule is refused with a reason that names the header.
func TestParseRecurring(t *testing.T) {
	now := time.Date(2026, 3, 29, 0, 30, 0, 0, time.UTC)
	d := &amqp.Delivery{MessageId: "daily", Body: []byte("b"), Headers: amqp.Table{
		wire.HeaderDestination: "q", wire.HeaderCron: "30 2 * * *", wire.HeaderTimeZone: "Europe/Berlin",
		wire.HeaderMisfire: "Skip", wire.HeaderEnd: "2026-12-31T00:00:00Z", wire.HeaderDueAt: "2026-01-01T00:00:00Z", "keep": "me"}}
	it := nsbtimeout.ParseHeaders(d, now)
	if it.Op != intake.OpRecur || it.ID != "daily" || it.Destination != "q" || it.Recur == nil {
		t.Fatalf("intake = %+v", it)
	}
	// 02:30 does not exist in Berlin that day: it fires at 03:30 CEST.
	if want := time.Date(2026, 3, 29, 1, 30, 0, 0, time.UTC); !it.DueAt.Equal(want) || !it.Recur.First.Equal(want) {
		t.Fatalf("first fire = %v, want %v", it.DueAt, want)
	}
	if it.Recur.Misfire != cron.MisfireSkip || it.Recur.Zone != "Europe/Berlin" || !it.Recur.End.Equal(time.Date(2026, 12, 31, 0, 0, 0, 0, time.UTC)) {
		t.Fatalf("recurrence = %+v", it.Recur)
	}
	for _, h := range append(append([]string{}, wire.ScheduleHeaders...), wire.DueTimeHeaders...) {
		if _, ok := it.Msg.Headers[h]; ok {
			t.Fatalf("forwarded message keeps header %s", h)
		}
	}
	if it.Msg.Headers["keep"] != "me" {
		t.Fatalf("forwarded headers = %v", it.Msg.Headers)
	}
	if err := it.Validate(); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name    string
		id      string
		headers amqp.Table
		reason  string
	}{
		{"bad cron", "x", amqp.Table{wire.HeaderCron: "61 * * * *"}, "header x-delaybridge-cron \"61 * * * *\": cron: minute"},
		{"unknown zone", "x", amqp.Table{wire.HeaderCron: "* * * * *", wire.HeaderTimeZone: "Mars/Olympus"}, "header x-delaybridge-timezone"},
		{"no id", "", amqp.Table{wire.HeaderCron: "* * * * *"}, "needs a message id"},
		{"bad misfire", "x", amqp.Table{wire.HeaderCron: "* * * * *", wire.HeaderMisfire: "Later"}, "header x-delaybridge-misfire"},
		{"bad start", "x", amqp.Table{wire.HeaderCron: "* * * * *", wire.HeaderStart: "tomorrow"}, "header x-delaybridge-start \"tomorrow\" is not an RFC 3339"},
		{"over", "x", amqp.Table{wire.HeaderCron: "* * * * *", wire.HeaderEnd: "2020-01-01T00:00:00Z"}, "has no fire time left"},
		{"no destination", "x", amqp.Table{wire.HeaderCron: "* * * * *"}, "no destination"},
	} {
		h := amqp.Table{wire.HeaderDestination: "q"}
		if tc.name == "no destination" {
			h = amqp.Table{}
		}
		for k, v := range tc.headers {
			h[k] = v
		}
		it := nsbtimeout.ParseHeaders(&amqp.Delivery{MessageId: tc.id, Headers: h}, now)
		if it.Op != intake.OpReject || !strings.Contains(it.Reason, tc.reason) {
			t.Errorf("%s: intake %v %q, want a rejection containing %q", tc.name, it.Op, it.Reason, tc.reason)
		}
	}
}

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

var errUnused = errors.New("not used by ingest")

// TestRecurringIntake: a schedule message is stored as a schedule (acked,
// the firer woken), requeued when the store fails, refused to the error
// queue by a store that keeps no schedules; a cancel with its id ends it.
func TestRecurringIntake(t *testing.T) {
	store, pub, a := &schedStore{fakeStore: &fakeStore{}}, &fakePublisher{}, amqptest.New(t)
	var woke []time.Time
	in := newIngester(store, pub, &woke)
	wakes := 0
	in.opts.ScheduleWake = func() { wakes++ }
	h := amqp.Table{wire.HeaderDestination: "a", wire.HeaderCron: "0 0 * * * ?", wire.HeaderTimeZone: "W. Europe Standard Time"}
	if err := in.take(pub, deliveries(a, h)); err != nil {
		t.Fatal(err)
	}
	if a.Outcome(1) != amqptest.Acked || len(store.puts) != 1 || wakes != 1 || len(pub.sent) != 0 {
		t.Fatalf("outcome %s, puts %+v, wakes %d, error copies %d", a.Outcome(1), store.puts, wakes, len(pub.sent))
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

	plain := newIngester(&fakeStore{}, pub, &woke)
	a3 := amqptest.New(t)
	if err := plain.take(pub, deliveries(a3, h)); err != nil {
		t.Fatal(err)
	}
	if a3.Outcome(1) != amqptest.Acked || len(pub.sent) != 1 ||
		!strings.Contains(pub.sent[0].Msg.Headers[wire.HeaderError].(string), "cannot keep recurring schedules") {
		t.Fatalf("store without schedules: %s, error copies %+v", a3.Outcome(1), pub.sent)
	}
}
