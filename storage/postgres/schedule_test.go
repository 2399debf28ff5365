package postgres

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/storage"
)

// TestFireDueAcrossInstances: 4 stores (4 pools, as 4 bridge instances)
// fire 50 schedules through 30 fire times, each calling FireDue with its
// own clock running a little apart; every schedule's fire times are stored
// once each, never twice, never missed.
func TestFireDueAcrossInstances(t *testing.T) {
	const schedules, instances, times = 50, 4, 30
	stores := openInstances(t, instances)
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for i := range schedules {
		_, err := stores[0].PutSchedule(ctx, storage.Schedule{Key: fmt.Sprintf("amqp:s%02d", i), Destination: "d", Message: []byte("m"), NextFireAt: t0.Add(time.Second)})
		if err != nil {
			t.Fatal(err)
		}
	}
	// Every second, on time (the planner never sees a misfire).
	plan := func(s *storage.Schedule, now time.Time) storage.FirePlan {
		return storage.FirePlan{Fire: true, Scheduled: s.NextFireAt, DueAt: s.NextFireAt, Message: []byte("m"), Next: s.NextFireAt.Add(time.Second), Prev: s.NextFireAt}
	}
	var mu sync.Mutex
	stored := map[string]int{}
	var wg sync.WaitGroup
	for w, s := range stores {
		wg.Go(func() {
			for step := 1; step <= times; step++ {
				now := t0.Add(time.Duration(step)*time.Second + time.Duration(w)*10*time.Millisecond)
				for {
					got, err := s.FireDue(ctx, now, 0, 7, plan)
					if err != nil {
						t.Errorf("instance %d: FireDue: %v", w, err)
						return
					}
					mu.Lock()
					for _, f := range got {
						if f.Stored {
							stored[f.ID]++
						}
					}
					mu.Unlock()
					if len(got) == 0 {
						break
					}
				}
			}
		})
	}
	wg.Wait()
	// What an instance left locked by another's call is due still.
	for {
		got, err := stores[0].FireDue(ctx, t0.Add(times*time.Second), 0, 100, plan)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) == 0 {
			break
		}
		for _, f := range got {
			if f.Stored {
				stored[f.ID]++
			}
		}
	}
	if len(stored) != schedules*times {
		t.Fatalf("%d fires stored, want %d", len(stored), schedules*times)
	}
	for id, n := range stored {
		if n != 1 {
			t.Fatalf("fire %s stored %d times", id, n)
		}
	}
	pending, _, err := stores[0].Stats(ctx)
	if err != nil || pending != schedules*times {
		t.Fatalf("Stats = %d, %v; want %d rows", pending, err, schedules*times)
	}
}
