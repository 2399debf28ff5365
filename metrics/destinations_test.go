package metrics

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/wire"
)

// The gauges show the destinations with the most pending rows up to the
// cap and sum the rest under the empty labels; the store is asked once per
// interval, however many scrapes.
func TestDestinationGaugesCapped(t *testing.T) {
	m := New()
	var calls atomic.Int32
	counts := map[wire.Destination]storage.DestinationCount{
		wire.Queue("a"): {Pending: 10, DueSoon: 1}, wire.Queue("b"): {Pending: 30, DueSoon: 2},
		{Exchange: "x", Key: "k"}: {Pending: 20, DueSoon: 3}, wire.Queue("c"): {Pending: 5, DueSoon: 4}, wire.Queue("d"): {Pending: 1},
	}
	var fail atomic.Bool
	m.WatchDestinations(DestinationOptions{MaxDestinations: 2, Interval: time.Hour,
		Count: func(context.Context, time.Time, time.Time) (map[wire.Destination]storage.DestinationCount, error) {
			calls.Add(1)
			if fail.Load() {
				return nil, errors.New("store closed")
			}
			return counts, nil
		}})
	want := `
# HELP delaybridge_destination_pending Messages in the store for each destination (exchange "": a queue; otherwise destination is the routing key), leased ones included; destinations past the cap are summed in the series with both labels empty.
# TYPE delaybridge_destination_pending gauge
delaybridge_destination_pending{destination="",exchange=""} 16
delaybridge_destination_pending{destination="b",exchange=""} 30
delaybridge_destination_pending{destination="k",exchange="x"} 20
# HELP delaybridge_destination_due_soon Messages in the store for each destination due within the next minute (not those overdue); capped as destination_pending.
# TYPE delaybridge_destination_due_soon gauge
delaybridge_destination_due_soon{destination="",exchange=""} 5
delaybridge_destination_due_soon{destination="b",exchange=""} 2
delaybridge_destination_due_soon{destination="k",exchange="x"} 3
`
	for range 3 {
		if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(want), "delaybridge_destination_pending", "delaybridge_destination_due_soon"); err != nil {
			t.Fatal(err)
		}
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("the store was asked %d times in one interval, want once", n)
	}
	// A failed count leaves the gauges out.
	fail.Store(true)
	m.WatchDestinations(DestinationOptions{MaxDestinations: 2, Interval: time.Hour, Count: m.dests.opts.Count})
	if n, err := testutil.GatherAndCount(m.Registry(), "delaybridge_destination_pending"); err != nil || n != 0 {
		t.Fatalf("after a failed count: %d series, %v", n, err)
	}
	lint(t, m)
}

// The counters give the first destinations under the cap series of their
// own for good and count the others under the empty labels.
func TestDestinationCountersSticky(t *testing.T) {
	m := New()
	m.WatchDestinations(DestinationOptions{MaxDestinations: 2})
	a, b, c := wire.Queue("a"), wire.Destination{Exchange: "x", Key: ""}, wire.Queue("c")
	m.DestinationDispatched(a, 2)
	m.DestinationDispatchFailed(b)
	m.DestinationDispatched(c, 5)
	m.DestinationDispatchFailed(c)
	m.DestinationDispatched(a, 1)
	m.DestinationDispatched(b, 0)
	var nilMetrics *Metrics
	nilMetrics.DestinationDispatched(a, 1)
	nilMetrics.DestinationDispatchFailed(a)
	for name, got := range map[string][2]float64{
		"a dispatched":     {testutil.ToFloat64(m.dests.dispatched.WithLabelValues("", "a")), 3},
		"b failures":       {testutil.ToFloat64(m.dests.failures.WithLabelValues("x", "")), 1},
		"other dispatched": {testutil.ToFloat64(m.dests.dispatched.WithLabelValues("", "")), 5},
		"other failures":   {testutil.ToFloat64(m.dests.failures.WithLabelValues("", "")), 1},
	} {
		if got[0] != got[1] {
			t.Errorf("%s = %v, want %v", name, got[0], got[1])
		}
	}
	if n := testutil.CollectAndCount(m.dests.dispatched); n != 2 {
		t.Errorf("%d dispatched series, want 2 (a and the rest)", n)
	}
}

// delaybridge_destination_paused is 1 per paused destination, up to the
// cap; the empty labels count the others. The store is asked once per
// interval.
func TestDestinationPausedGauge(t *testing.T) {
	m := New()
	var calls atomic.Int32
	m.WatchDestinations(DestinationOptions{MaxDestinations: 2, Interval: time.Hour,
		Paused: func(context.Context) ([]storage.PausedDestination, error) {
			calls.Add(1)
			return []storage.PausedDestination{{Destination: wire.Queue("a")}, {Destination: wire.Queue("b")},
				{Destination: wire.Destination{Exchange: "x", Key: "k"}}, {Destination: wire.Destination{Exchange: "y"}}}, nil
		}})
	want := `
# HELP delaybridge_destination_paused 1 for each paused destination (its messages are held past their due time until it is resumed); past the cap, the series with both labels empty counts the others.
# TYPE delaybridge_destination_paused gauge
delaybridge_destination_paused{destination="",exchange=""} 2
delaybridge_destination_paused{destination="a",exchange=""} 1
delaybridge_destination_paused{destination="b",exchange=""} 1
`
	for range 3 {
		if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(want), "delaybridge_destination_paused"); err != nil {
			t.Fatal(err)
		}
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("the store was asked %d times in one interval, want once", n)
	}
}
