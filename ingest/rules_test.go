package ingest

import (
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/intake"
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
	p := intake.Parsed{ID: "m1", Destination: wire.Destination{Exchange: "b.route", Key: "orders.created.eu"}, DueAt: received.Add(5 * time.Millisecond)}
	if err := r.Check(p, 1, received); err != nil {
		t.Errorf("a delayed exchange's message refused: %v", err)
	}
}

// received is when the messages of the tests of this package were taken in.
var received = time.Date(2026, 11, 21, 19, 0, 0, 0, time.UTC)

func TestRules(t *testing.T) {
	globs, err := CompileGlobs([]string{"orders.*", " billing ", "a?c", "x/*"})
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]bool{
		"orders.eu": true, "orders.": true, "orders": false, "billing": true, "billing2": false,
		"abc": true, "abbc": false, "x/y/z": true, "ordersXeu": false, "a.c": true,
	} {
		if got := globs.Match(name); got != want {
			t.Errorf("Match(%q) = %v, want %v", name, got, want)
		}
	}
	if all, _ := CompileGlobs([]string{"*"}); !all.Match("any/thing.at all") {
		t.Error("* must match every queue name")
	}
	if _, err := CompileGlobs([]string{"a", " "}); err == nil {
		t.Error("an empty pattern must be refused")
	}

	r := Rules{MaxDelay: time.Hour, MaxMessageBytes: 10, Allowed: globs, Reserved: []string{"e.Timeouts"}}
	ok := intake.Parsed{Destination: wire.Queue("billing"), DueAt: received.Add(time.Minute)}
	if err := r.Check(ok, 10, received); err != nil {
		t.Fatalf("valid message refused: %v", err)
	}
	for name, c := range map[string]struct {
		p    intake.Parsed
		size int
		want string
	}{
		"too big":     {ok, 11, "MAX_MESSAGE_BYTES"},
		"not allowed": {intake.Parsed{Destination: wire.Queue("shipping"), DueAt: ok.DueAt}, 1, "ALLOWED_DESTINATIONS"},
		"own queue":   {intake.Parsed{Destination: wire.Queue("e.Timeouts"), DueAt: ok.DueAt}, 1, "own queues"},
		"too far out": {intake.Parsed{Destination: wire.Queue("billing"), DueAt: received.Add(time.Hour + time.Nanosecond)}, 1, "MAX_DELAY"},
	} {
		if err := r.Check(c.p, c.size, received); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want an error mentioning %s", name, err, c.want)
		}
	}
}
