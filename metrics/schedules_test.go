package metrics

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/delaybridge/delaybridge/storage"
)

// fakeSchedules pages through n schedules: every third paused, every
// fifth (not paused) ended, the rest active.
func fakeSchedules(n int, fail error) func(context.Context, string, int) ([]storage.Schedule, string, error) {
	var all []storage.Schedule
	for i := range n {
		s := storage.Schedule{Key: fmt.Sprintf("amqp:%06d", i), NextFireAt: time.Unix(1e9, 0)}
		switch {
		case i%3 == 0:
			s.Paused = true
		case i%5 == 0:
			s.NextFireAt = time.Time{}
		}
		all = append(all, s)
	}
	return func(_ context.Context, after string, limit int) ([]storage.Schedule, string, error) {
		if fail != nil {
			return nil, "", fail
		}
		i := 0
		for i < len(all) && all[i].Key <= after {
			i++
		}
		end := min(i+limit, len(all))
		next := ""
		if end < len(all) {
			next = all[end-1].Key
		}
		return all[i:end], next, nil
	}
}

// delaybridge_schedules counts every schedule by state across pages;
// absent when not watched or when the store read fails.
func TestScheduleGauge(t *testing.T) {
	m := New()
	if n, err := testutil.GatherAndCount(m.Registry(), "delaybridge_schedules"); err != nil || n != 0 {
		t.Fatalf("unwatched: %d series, %v", n, err)
	}
	m.WatchSchedules(fakeSchedules(2500, nil))
	// 2500: 834 paused (i%3==0); of the rest, i%5==0 and i%3!=0: 500-167=333 ended; 1333 active.
	want := `
# HELP delaybridge_schedules Recurring schedules in the store, by state: active, paused, ended (no fire time left). Absent when the store keeps none.
# TYPE delaybridge_schedules gauge
delaybridge_schedules{state="active"} 1333
delaybridge_schedules{state="ended"} 333
delaybridge_schedules{state="paused"} 834
`
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(want), "delaybridge_schedules"); err != nil {
		t.Fatal(err)
	}
	m.WatchSchedules(fakeSchedules(0, nil))
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(strings.NewReplacer("1333", "0", "333", "0", "834", "0").Replace(want)), "delaybridge_schedules"); err != nil {
		t.Fatalf("no schedules: %v", err)
	}
	m.WatchSchedules(fakeSchedules(10, errors.New("store down")))
	if n, err := testutil.GatherAndCount(m.Registry(), "delaybridge_schedules"); err != nil || n != 0 {
		t.Fatalf("failed read: %d series, %v; want none", n, err)
	}
	if _, err := CountSchedules(context.Background(), fakeSchedules(maxScheduleScan+1000, nil)); !errors.Is(err, errTooManySchedules) {
		t.Fatalf("over the scan cap: %v", err)
	}
	lint(t, m)
}

type fireStore struct {
	fired []storage.Fired
	err   error
}

func (f *fireStore) NextScheduleDue(context.Context) (time.Time, bool, error) {
	return time.Time{}, false, nil
}
func (f *fireStore) FireDue(context.Context, time.Time, time.Duration, int, storage.Planner) ([]storage.Fired, error) {
	return f.fired, f.err
}

// FireCounter counts the stored fires and the misfires each FireDue
// reports, and nothing of a failed one; both series exist from the start.
func TestScheduleFireCounters(t *testing.T) {
	m := New()
	for _, name := range []string{"delaybridge_schedule_fires_total", "delaybridge_schedule_misfires_total"} {
		if n, err := testutil.GatherAndCount(m.Registry(), name); err != nil || n != 1 {
			t.Fatalf("%s before any fire: %d series, %v", name, n, err)
		}
	}
	st := &fireStore{fired: []storage.Fired{
		{Key: "a", ID: "a#1@1", Stored: true},
		{Key: "b", ID: "b#1@1", Stored: true, Misfired: true}, // a late catch-up fire
		{Key: "c", Misfired: true},                            // skipped
		{Key: "d", ID: "d#1@1"},                               // stored already
	}}
	fs := m.FireCounter(st)
	if _, err := fs.FireDue(context.Background(), time.Now(), 0, 10, nil); err != nil {
		t.Fatal(err)
	}
	st.err = errors.New("store down")
	if _, err := fs.FireDue(context.Background(), time.Now(), 0, 10, nil); err == nil {
		t.Fatal("the store's error was not passed on")
	}
	if f, mf := testutil.ToFloat64(m.scheduleFires), testutil.ToFloat64(m.scheduleMisfires); f != 2 || mf != 2 {
		t.Fatalf("fires %v, misfires %v; want 2, 2", f, mf)
	}
	var nilM *Metrics
	nilM.ScheduleFired(st.fired)
	nilM.WatchSchedules(nil)
}
