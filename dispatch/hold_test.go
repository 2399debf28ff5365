package dispatch

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/internal/amqptest"
	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/wire"
)

// removeCounter counts Remove calls: one per commit of removals.
type removeCounter struct {
	Store
	removes atomic.Int32
}

func (s *removeCounter) Remove(ctx context.Context, refs []storage.Ref) ([]error, error) {
	s.removes.Add(1)
	return s.Store.Remove(ctx, refs)
}

// owedFor forwards toks as one dispatcher message and returns what
// removeLoop is to settle.
func (f *fixture) owedFor(a *amqptest.Acker, toks []wire.Token) owed {
	f.t.Helper()
	body, err := wire.EncodeTokens(toks)
	if err != nil {
		f.t.Fatal(err)
	}
	del := a.Deliver(amqp.Delivery{Body: body})
	o, rm, err := f.d.forwardAll(context.Background(), &del, f.pub)
	if err != nil || o != ack || rm == nil {
		f.t.Fatalf("forwardAll = %v, %+v, %v; want a removal left to removeLoop", o, rm, err)
	}
	return owed{del: del, rm: rm}
}

// removedAlone hands o alone to a removeLoop, and reports whether its
// message was acked within 30 s: whether its removal was not held.
func (f *fixture) removedAlone(a *amqptest.Acker, o owed) bool {
	f.t.Helper()
	in := make(chan owed, 1)
	done := make(chan error, 1)
	go func() { done <- f.d.removeLoop(context.Background(), in) }()
	defer func() {
		close(in)
		if err := <-done; err != nil {
			f.t.Error(err)
		}
	}()
	in <- o
	return testenv.Eventually(30*time.Second, func() bool { return a.Outcome(o.del.DeliveryTag) == amqptest.Acked })
}

// With RemoveHold, removeLoop holds a removal so that the ones queued after
// it share its commit; closing its input (shutdown) ends the hold at once.
func TestRemoveLoopHoldsForLaterRemovals(t *testing.T) {
	f := newFixture(t, 3)
	for i := range 4 {
		f.insert(fmt.Sprint("r", i), "q", t0, amqp.Publishing{Body: []byte("b")})
	}
	rc := &removeCounter{Store: f.d.store}
	f.d.store = rc
	f.d.opts.RemoveHold = time.Hour
	toks := f.lease()
	a := amqptest.New(t)
	first, second := f.owedFor(a, toks[:2]), f.owedFor(a, toks[2:])
	in := make(chan owed, 2)
	done := make(chan error, 1)
	go func() { done <- f.d.removeLoop(context.Background(), in) }()
	in <- first
	time.Sleep(200 * time.Millisecond)
	if n := rc.removes.Load(); n != 0 {
		t.Fatalf("%d removals within the hold, want none yet", n)
	}
	if a.Outcome(first.del.DeliveryTag) != amqptest.Unsettled {
		t.Fatal("message acked before its removal")
	}
	in <- second
	close(in)
	testenv.WaitNil(t, done, 30*time.Second, "removeLoop to return once its input closed")
	if n := rc.removes.Load(); n != 1 {
		t.Errorf("%d removals, want 1 for both messages", n)
	}
	for _, tok := range toks {
		if _, ok := f.pending(tok.ID); ok {
			t.Errorf("%s still pending", tok.ID)
		}
	}
	for _, o := range []owed{first, second} {
		if got := a.Outcome(o.del.DeliveryTag); got != amqptest.Acked {
			t.Errorf("message %d: %v, want acked", o.del.DeliveryTag, got)
		}
	}
}

// A hold never eats into the time a lease leaves for its removal: a removal
// whose lease ends within removeSlack of the hold's end is done earlier.
func TestRemoveLoopHoldKeepsTheLease(t *testing.T) {
	f := newFixture(t, 3)
	f.insert("r", "q", t0, amqp.Publishing{Body: []byte("b")})
	f.d.opts.RemoveHold = time.Hour
	// A short lease that still leaves the margin a token needs to be
	// forwarded (leaseMargin: half of it).
	f.d.opts.LeaseDuration = 2 * time.Second
	ls, err := f.store.Lease(context.Background(), "me", time.Time{}, 1, removeSlack+300*time.Millisecond)
	if err != nil || len(ls) != 1 {
		t.Fatalf("Lease = %v, %v", ls, err)
	}
	a := amqptest.New(t)
	o := f.owedFor(a, []wire.Token{{ID: ls[0].ID, Lock: ls[0].Lock}})
	if !f.removedAlone(a, o) {
		t.Fatal("removal still held 30 s later, with its lease ending in 300 ms past the slack")
	}
	if _, ok := f.pending("r"); ok {
		t.Error("acked but still pending")
	}
}

// The hold counts from the first confirm of what it removes, and leaves
// the time recent removals took to commit: a removal whose forwards were
// confirmed a hold ago, or whose commit would end past the hold, is done
// at once, so a crash forwards again about RemoveHold of forwards.
func TestRemoveLoopHoldCountsFromTheConfirm(t *testing.T) {
	for name, c := range map[string]struct {
		confirmedAgo, commitTook time.Duration
	}{
		"confirmed a hold ago":        {confirmedAgo: time.Hour},
		"commits take the whole hold": {commitTook: time.Hour},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, 3)
			f.insert("r", "q", t0, amqp.Publishing{Body: []byte("b")})
			f.d.opts.RemoveHold = time.Hour
			f.d.commitTook.observe(c.commitTook)
			a := amqptest.New(t)
			o := f.owedFor(a, f.lease())
			o.rm.since = o.rm.since.Add(-c.confirmedAgo)
			if !f.removedAlone(a, o) {
				t.Fatal("removal still held 30 s later")
			}
		})
	}
	// A fast commit lowers the estimate by an eighth of the difference;
	// a slow one raises it at once.
	var c commitTime
	c.observe(80 * time.Millisecond)
	c.observe(0)
	if got := c.estimate(); got != 70*time.Millisecond {
		t.Errorf("estimate after 80 ms, 0 = %s, want 70ms", got)
	}
	c.observe(time.Second)
	if got := c.estimate(); got != time.Second {
		t.Errorf("estimate after a 1 s commit = %s", got)
	}
}
