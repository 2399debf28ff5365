package ingest

import (
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/wire"
)

// The delayed exchanges' routing exchanges are allowed whatever the
// allow-list, each exactly: the operator named them in
// DELAYBRIDGE_DELAYED_EXCHANGES. Wildcard characters in such a name are
// literal.
func TestAllowListAdmitsTheDelayedExchangesRoutes(t *testing.T) {
	globs, err := CompileGlobs([]string{"orders"})
	if err != nil {
		t.Fatal(err)
	}
	withRoutes := globs.WithExchanges("a*.route").WithExchanges("b.route")
	for d, want := range map[wire.Destination]bool{
		{Exchange: "a*.route", Key: "k"}: true,
		{Exchange: "b.route"}:            true,
		{Exchange: "ab.route", Key: "k"}: false,
		{Exchange: "b"}:                  false,
		{Exchange: "b.route.x"}:          false,
		wire.Queue("orders"):             true,
		wire.Queue("b.route"):            false,
		wire.Queue("exchange:b.route"):   false,
		{Exchange: "orders", Key: "x"}:   false,
	} {
		if got := withRoutes.Allows(d); got != want {
			t.Errorf("Allows(%v) = %v, want %v", d, got, want)
		}
	}
	if globs.Allows(wire.Destination{Exchange: "b.route"}) {
		t.Error("WithExchanges changed the Globs it was called on")
	}
	r := Rules{Allowed: withRoutes}
	p := Parsed{ID: "m1", Destination: wire.Destination{Exchange: "b.route", Key: "orders.created.eu"}, DueAt: received.Add(5 * time.Millisecond)}
	if err := r.Check(p, 1, received); err != nil {
		t.Errorf("a delayed exchange's message refused: %v", err)
	}
}
