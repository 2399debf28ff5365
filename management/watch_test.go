package management

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/rs/zerolog"
)

// fakeLister answers from a map, or with err.
type fakeLister struct {
	mu       sync.Mutex
	bindings map[string][]Binding
	err      error
}

func (f *fakeLister) BindingsFrom(_ context.Context, x string) ([]Binding, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.bindings[x], f.err
}

func (f *fakeLister) set(x string, bs []Binding, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.bindings[x], f.err = bs, err
}

// A foreign binding is reported to Report and Foreign at every check, and
// logged once when it appears and once when it is gone; a check that
// fails is logged once until one succeeds, and what was known stays.
func TestWatcher(t *testing.T) {
	own := Binding{Source: "orders", Destination: "E.Timeouts", DestinationType: "queue"}
	stray := Binding{Source: "orders", Destination: "orders-q", DestinationType: "queue", RoutingKey: "orders.*"}
	l := &fakeLister{bindings: map[string][]Binding{"orders": {own}, "billing": {own}}}
	var logs bytes.Buffer
	reported := map[string]int{}
	w := NewWatcher(WatchOptions{Lister: l, Exchanges: []string{"orders", "billing"},
		Own:    func(b Binding) bool { return b.Destination == "E.Timeouts" },
		Report: func(x string, foreign []Binding) { reported[x] = len(foreign) },
		Hint:   "set DELAYBRIDGE_MANAGEMENT_URL", Logger: zerolog.New(&logs)})
	ctx := context.Background()
	lines := func(part string) int { return strings.Count(logs.String(), part) }

	w.Check(ctx)
	if len(w.Foreign()) != 0 || reported["orders"] != 0 || logs.Len() != 0 {
		t.Fatalf("with the bridge's own bindings only: foreign %v, reported %v, logged %q", w.Foreign(), reported, logs.String())
	}
	l.set("orders", []Binding{own, stray}, nil)
	for range 3 {
		w.Check(ctx)
	}
	if f := w.Foreign(); len(f) != 1 || len(f["orders"]) != 1 || f["orders"][0].Destination != "orders-q" || reported["orders"] != 1 || reported["billing"] != 0 {
		t.Fatalf("foreign %v, reported %v", f, reported)
	}
	if n := lines("foreign bindings on a delayed exchange"); n != 1 || lines(`"level":"warn"`) != 1 || lines("migrate-bindings --exchange orders") != 1 {
		t.Fatalf("%d lines about the foreign binding, want 1: %s", n, logs.String())
	}
	l.set("orders", nil, errors.New("connection refused"))
	for range 3 {
		w.Check(ctx)
	}
	if n := lines("cannot check the bindings"); n != 1 || lines("set DELAYBRIDGE_MANAGEMENT_URL") != 1 {
		t.Fatalf("%d lines about the failing check, want 1: %s", n, logs.String())
	}
	if len(w.Foreign()["orders"]) != 1 {
		t.Fatalf("a failed check forgot the foreign binding: %v", w.Foreign())
	}
	l.set("orders", []Binding{own}, nil)
	w.Check(ctx)
	if len(w.Foreign()) != 0 || reported["orders"] != 0 || lines("no foreign binding any more") != 1 || lines("checking the bindings of the delayed exchanges") != 1 {
		t.Fatalf("after the binding went: foreign %v, reported %v, log %s", w.Foreign(), reported, logs.String())
	}
}

// Run checks at once, and stops with its context.
func TestWatcherRun(t *testing.T) {
	l := &fakeLister{bindings: map[string][]Binding{"orders": {{Destination: "q", DestinationType: "queue"}}}}
	checked := make(chan struct{}, 1)
	w := NewWatcher(WatchOptions{Lister: l, Exchanges: []string{"orders"}, Own: func(Binding) bool { return false },
		Report: func(string, []Binding) {
			select {
			case checked <- struct{}{}:
			default:
			}
		}, Logger: zerolog.Nop()})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- w.Run(ctx) }()
	<-checked
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
