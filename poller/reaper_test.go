package poller

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/delaybridge/delaybridge/internal/logtest"
	"github.com/delaybridge/delaybridge/internal/testenv"
)

func TestReaperFreesExpiredLeases(t *testing.T) {
	s := openStore(t)
	insert(t, s, "a", time.Now().Add(-time.Second))
	if ls, err := s.Lease(context.Background(), "dead-instance", time.Time{}, 10, 30*time.Millisecond); err != nil || len(ls) != 1 {
		t.Fatalf("Lease: %v, %v", ls, err)
	}
	var mu sync.Mutex
	var freed int
	r := &Reaper{Store: s, Interval: 10 * time.Millisecond, Logger: zerolog.Nop(), OnReap: func(n int) {
		mu.Lock()
		freed += n
		mu.Unlock()
	}}
	stop := testenv.Start(t, r.Run)
	waitFor(t, "the expired lease to be reaped", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return freed == 1
	})
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if _, leased, err := s.Stats(context.Background()); err != nil || leased != 0 {
		t.Fatalf("after reaping: leased=%d err=%v, want 0", leased, err)
	}
}

type flakyReaping struct{ calls atomic.Int32 }

func (f *flakyReaping) Reap(context.Context) (int, error) {
	if f.calls.Add(1) <= 2 {
		return 0, errors.New("store down")
	}
	return 0, nil
}

// A failing pass is logged and retried on the next tick; Run keeps going.
func TestReaperKeepsGoingAfterAFailure(t *testing.T) {
	f := &flakyReaping{}
	r := &Reaper{Store: f, Interval: 5 * time.Millisecond, Logger: zerolog.Nop()}
	stop := testenv.Start(t, r.Run)
	waitFor(t, "passes after the failures", func() bool { return f.calls.Load() >= 4 })
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
}

type freeingReaping struct{ calls atomic.Int32 }

func (f *freeingReaping) Reap(context.Context) (int, error) {
	f.calls.Add(1)
	return 3, nil
}

// A pass that freed leases is logged, unless the reaper is Quiet (its
// store logs its own passes); OnReap is told either way.
func TestReaperQuiet(t *testing.T) {
	for _, quiet := range []bool{false, true} {
		var buf logtest.Buffer
		f := &freeingReaping{}
		var told atomic.Int32
		r := &Reaper{Store: f, Interval: 5 * time.Millisecond, Quiet: quiet, OnReap: func(n int) { told.Add(int32(n)) },
			Logger: zerolog.New(&buf)}
		stop := testenv.Start(t, r.Run)
		waitFor(t, "two passes told", func() bool { return told.Load() >= 6 })
		if err := stop(); err != nil {
			t.Fatalf("Run: %v", err)
		}
		if logged := buf.Count("reaped expired leases") > 0; logged == quiet {
			t.Errorf("Quiet %v: logged %v", quiet, logged)
		}
	}
}
