package circuit

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
)

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func newBreaker(ttt time.Duration) (*Breaker, *clock, *[]error, *[]State) {
	c := &clock{t: time.Date(2026, 11, 21, 0, 0, 0, 0, time.UTC)}
	var mu sync.Mutex // callbacks may run on several goroutines at once
	var triggered []error
	var changes []State
	b := New("store", ttt, Options{
		Now: c.Now,
		OnTrigger: func(err error) {
			mu.Lock()
			triggered = append(triggered, err)
			mu.Unlock()
		},
		OnChange: func(_ string, s State, _ error) {
			mu.Lock()
			changes = append(changes, s)
			mu.Unlock()
		},
	})
	return b, c, &triggered, &changes
}

func TestFirstFailureArmsSuccessDisarms(t *testing.T) {
	b, c, trig, changes := newBreaker(30 * time.Second)
	if b.State() != Disarmed {
		t.Fatal("new breaker must be disarmed")
	}
	b.Failure(errors.New("disk"))
	if b.State() != Armed {
		t.Fatal("first failure must arm")
	}
	c.Advance(29 * time.Second)
	b.Failure(errors.New("disk"))
	if b.State() != Armed || len(*trig) != 0 {
		t.Fatal("triggered before the time to trigger")
	}
	b.Success()
	if b.State() != Disarmed {
		t.Fatal("success must disarm")
	}
	// Re-armed: the clock starts again from the new first failure.
	c.Advance(10 * time.Second)
	b.Failure(errors.New("disk"))
	c.Advance(29 * time.Second)
	b.Failure(errors.New("disk"))
	if len(*trig) != 0 {
		t.Fatal("a success must reset the time to trigger")
	}
	want := []State{Armed, Disarmed, Armed}
	if len(*changes) != len(want) {
		t.Fatalf("changes %v, want %v", *changes, want)
	}
}

func TestFailuresPersistingTriggerOnce(t *testing.T) {
	b, c, trig, _ := newBreaker(30 * time.Second)
	b.Failure(errors.New("first"))
	c.Advance(30 * time.Second)
	b.Failure(errors.New("still broken"))
	if b.State() != Triggered || len(*trig) != 1 {
		t.Fatalf("state %s, triggers %d; want triggered once", b.State(), len(*trig))
	}
	msg := (*trig)[0].Error()
	if !strings.Contains(msg, "store circuit breaker triggered") || !strings.Contains(msg, "still broken") {
		t.Fatalf("trigger error %q must name the breaker and the last error", msg)
	}
	c.Advance(time.Minute)
	b.Failure(errors.New("again"))
	b.Success()
	if len(*trig) != 1 || b.State() != Triggered {
		t.Fatal("a triggered breaker stays triggered and triggers once")
	}
}

func TestBackoffGrowsAndIsCapped(t *testing.T) {
	b, _, _, _ := newBreaker(time.Hour)
	var last time.Duration
	for i := 1; i <= 30; i++ {
		d := b.Failure(errors.New("x"))
		if d <= 0 || d > 5*time.Second+time.Second {
			t.Fatalf("failure %d: backoff %s out of range", i, d)
		}
		if i == 1 && d > 100*time.Millisecond {
			t.Fatalf("first backoff %s, want short", d)
		}
		last = d
	}
	if last < 4*time.Second {
		t.Fatalf("backoff after many failures %s, want near the 5s cap", last)
	}
	short, _, _, _ := newBreaker(time.Second)
	for range 20 {
		if d := short.Failure(errors.New("x")); d > 300*time.Millisecond {
			t.Fatalf("backoff %s must stay under a quarter of a 1s time to trigger", d)
		}
	}
}

func TestConcurrentUse(t *testing.T) {
	b, c, trig, _ := newBreaker(time.Second)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 200 {
				if (i+j)%7 == 0 {
					b.Success()
				} else {
					b.Failure(errors.New("x"))
				}
				c.Advance(time.Millisecond)
			}
		}()
	}
	wg.Wait()
	if len(*trig) > 1 {
		t.Fatalf("triggered %d times", len(*trig))
	}
}
