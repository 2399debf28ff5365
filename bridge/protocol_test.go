package bridge

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/delaybridge/delaybridge/config"
	"github.com/delaybridge/delaybridge/wire/nsbdelay"
)

// The protocols add up to what the configuration turns on: with nothing
// on, E.Timeouts alone; with everything on, each protocol's queues
// consumed (the delayed exchanges' deliveries on E.Timeouts), its intake
// queues no destination and its forwarding exchanges allowed. Both
// stampers stamp either way: rows stored while a protocol was on are
// forwarded after it is turned off.
func TestProtocols(t *testing.T) {
	queues := func(in intakes) []string {
		var qs []string
		for _, s := range in.sources {
			qs = append(qs, s.Queue)
		}
		return qs
	}
	off := intakeOf(protocols(config.Config{Endpoint: "E", RebusDirectExchange: "RebusDirect"}))
	if diff := cmp.Diff([]string{"E.Timeouts"}, queues(off)); diff != "" || off.reserved != nil || off.routes != nil || len(off.stamp) != 2 {
		t.Fatalf("nothing on: queues %s, reserved %q, routes %q, %d stampers", diff, off.reserved, off.routes, len(off.stamp))
	}

	on := intakeOf(protocols(config.Config{Endpoint: "E", DelayedExchanges: []string{"orders:topic"},
		RebusQueue: "timeouts", RebusDirectExchange: "RebusDirect", MassTransitQueue: "quartz", NSBNativeDelays: true, QueueType: "quorum"}))
	levels := func() []string {
		var qs []string
		for _, c := range []nsbdelay.Chain{nsbdelay.V2, nsbdelay.V1} {
			for k := nsbdelay.Levels - 1; k >= 0; k-- {
				qs = append(qs, c.Level(k))
			}
		}
		return qs
	}()
	if diff := cmp.Diff(append([]string{"E.Timeouts", "E.Timeouts", "timeouts", "quartz"}, levels...), queues(on)); diff != "" {
		t.Errorf("queues (-want +got):\n%s", diff)
	}
	if x := on.sources[1].Exchanges; !cmp.Equal(x, []string{"orders"}) {
		t.Errorf("the delayed exchanges' source reads deliveries through %q", x)
	}
	if diff := cmp.Diff(append([]string{"timeouts", "quartz"}, levels...), on.reserved, cmpopts.SortSlices(func(a, b string) bool { return a < b })); diff != "" {
		t.Errorf("reserved (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"orders.route", "RebusDirect", nsbdelay.V2.Delivery, nsbdelay.V1.Delivery}, on.routes); diff != "" {
		t.Errorf("routes (-want +got):\n%s", diff)
	}
	if len(on.stamp) != 2 {
		t.Errorf("%d stampers", len(on.stamp))
	}
}
