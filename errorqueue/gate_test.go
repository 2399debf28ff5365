package errorqueue

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/rs/zerolog"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/broker/brokertest"
	"github.com/delaybridge/delaybridge/internal/logtest"
)

func copies(n int) []broker.Outgoing {
	out := make([]broker.Outgoing, n)
	for i := range out {
		out[i] = broker.Outgoing{RoutingKey: "error", Mandatory: true, Msg: amqp.Publishing{MessageId: fmt.Sprint("c", i)}}
	}
	return out
}

type gateClock struct{ t time.Time }

func (c *gateClock) now() time.Time           { return c.t }
func (c *gateClock) add(d time.Duration)      { c.t = c.t.Add(d) }
func newGateClock() *gateClock                { return &gateClock{t: time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)} }
func errorsOf(errs []error, target error) int { return countIs(errs, target) }

func allNil(errs []error) bool {
	for _, err := range errs {
		if err != nil {
			return false
		}
	}
	return true
}

func countIs(errs []error, target error) int {
	n := 0
	for _, err := range errs {
		if errors.Is(err, target) {
			n++
		}
	}
	return n
}

// Refusal is true of what the gate answers while the queue refuses (the
// broker's refusal that started it, the copies it then holds back, the ones
// after a failed probe), and of nothing else a copy can fail with.
func TestRefusal(t *testing.T) {
	clock := newGateClock()
	refuse := fmt.Errorf("%w: 312 NO_ROUTE", broker.ErrReturned)
	pub := &brokertest.Publisher{Outcome: func(broker.Outgoing) error { return refuse }}
	g := NewGate(GateOptions{Queue: "error", Now: clock.now, Logger: zerolog.Nop()})
	first := g.Publish(context.Background(), pub, copies(1))[0]
	held := g.Publish(context.Background(), pub, copies(1))[0]
	clock.add(time.Hour)
	afterProbe := g.Publish(context.Background(), pub, copies(2))
	for _, c := range []struct {
		err  error
		want bool
	}{
		{first, true},
		{held, true},
		{afterProbe[0], true},
		{afterProbe[1], true},
		{fmt.Errorf("%w: 406 PRECONDITION_FAILED", broker.ErrNacked), true},
		{nil, false},
		{fmt.Errorf("%w: connection closed", broker.ErrNotConfirmed), false},
		{fmt.Errorf("%w: %w", broker.ErrNotConfirmed, context.DeadlineExceeded), false},
		{fmt.Errorf("%w: frame too large", broker.ErrUnpublishable), false},
		{errors.New("anything else"), false},
	} {
		if got := Refusal(c.err); got != c.want {
			t.Errorf("Refusal(%v) = %v, want %v", c.err, got, c.want)
		}
	}
	if !errors.Is(held, ErrRefusing) || !errors.Is(afterProbe[1], ErrRefusing) {
		t.Errorf("held back: %v, %v; want ErrRefusing", held, afterProbe[1])
	}
}

// While the error queue refuses copies, a thousand copies cost one publish
// per try, tries back off (doubling, capped, jittered), the refusals are
// one warning plus one summary per interval, and once a probe is taken the
// rest go out.
func TestGateIsBoundedWhileTheQueueRefuses(t *testing.T) {
	clock := newGateClock()
	full := true
	pub := &brokertest.Publisher{Outcome: func(broker.Outgoing) error {
		if full {
			return broker.ErrNacked
		}
		return nil
	}}
	logs := &logtest.Buffer{}
	g := NewGate(GateOptions{Queue: "error", MinBackoff: time.Second, MaxBackoff: 8 * time.Second,
		WarnInterval: 10 * time.Second, Now: clock.now, Logger: zerolog.New(logs)})
	ctx := context.Background()

	if res := g.Publish(ctx, pub, copies(5)); errorsOf(res, broker.ErrNacked) != 5 {
		t.Fatalf("first publish: %v", res)
	}
	if refusing, _, cause := g.Refusing(); !refusing || !strings.Contains(cause, "nack") {
		t.Fatalf("Refusing = %v %q after nacks", refusing, cause)
	}
	var waits []time.Duration
	for range 1000 {
		res := g.Publish(ctx, pub, copies(3))
		if errorsOf(res, ErrRefusing)+errorsOf(res, broker.ErrNacked) != 3 {
			t.Fatalf("while refusing: %v", res)
		}
		if wait := g.RetryIn(clock.now()); wait > 0 && res[0] != nil && errors.Is(res[0], broker.ErrNacked) {
			waits = append(waits, wait)
		}
		clock.add(100 * time.Millisecond)
	}
	// 100 s of tries, one every 0.5–8 s: each a single message.
	calls := pub.Calls()
	for _, n := range calls[1:] {
		if n != 1 {
			t.Fatalf("a publish of %d copies while refusing; want probes of one (%v)", n, calls)
		}
	}
	if len(calls) > 1+100/0.5 || len(calls) < 1+100/8 {
		t.Errorf("%d publishes in 100 s of refusals", len(calls))
	}
	if len(waits) < 5 {
		t.Fatalf("%d refused probes measured, want more", len(waits))
	}
	for i, w := range waits {
		if w > 8*time.Second || (i >= 4 && w < 4*time.Second) {
			t.Errorf("wait %d is %s: not doubling to the 8 s cap", i, w)
		}
	}
	if warns := len(logs.LinesAt("warn")); warns > 1+100/10 {
		t.Errorf("%d warnings for 100 s of refusals, want one and a summary per 10 s", warns)
	}

	full = false
	clock.add(8 * time.Second)
	before := len(pub.Sent())
	if res := g.Publish(ctx, pub, copies(4)); !allNil(res) || res[0] != nil || res[3] != nil {
		t.Fatalf("after the queue has room: %v", res)
	}
	if got := pub.Calls(); got[len(got)-2] != 1 || got[len(got)-1] != 3 || len(pub.Sent())-before != 4 {
		t.Errorf("calls %v: want the probe, then the other three", got[len(got)-2:])
	}
	if refusing, _, _ := g.Refusing(); refusing || g.Refused(clock.now()) != nil || g.RetryIn(clock.now()) != 0 {
		t.Error("still refusing after a copy was taken")
	}
	last := logs.Lines()[len(logs.Lines())-1]
	if last["message"] != "the error queue takes copies again" {
		t.Errorf("last line %v", last)
	}
	// The summary of what was left was written before that line.
	var summaries int
	for _, l := range logs.Lines() {
		if l["copies"] != nil {
			summaries++
		}
	}
	if summaries == 0 {
		t.Error("no summary of the refused copies")
	}
}

// A copy returned as unroutable means the queue is gone: the gate declares
// it again and publishes the returned copies once more.
func TestGateDeclaresAMissingQueueAgain(t *testing.T) {
	clock := newGateClock()
	exists := false
	declares := 0
	pub := &brokertest.Publisher{Outcome: func(broker.Outgoing) error {
		if !exists {
			return fmt.Errorf("%w: 312 NO_ROUTE", broker.ErrReturned)
		}
		return nil
	}}
	logs := &logtest.Buffer{}
	g := NewGate(GateOptions{Queue: "error", Now: clock.now, Logger: zerolog.New(logs),
		Declare: func(context.Context) error { declares++; exists = true; return nil }})
	if res := g.Publish(context.Background(), pub, copies(3)); !allNil(res) || res[0] != nil {
		t.Fatalf("Publish = %v, want all taken after the declaration", res)
	}
	if declares != 1 || len(pub.Calls()) != 2 || pub.Calls()[1] != 3 {
		t.Errorf("%d declarations, calls %v; want one, then the three again", declares, pub.Calls())
	}
	if refusing, _, _ := g.Refusing(); refusing {
		t.Error("refusing after the copies were taken")
	}
	if ls := logs.Lines(); len(ls) != 1 || !strings.Contains(ls[0]["message"].(string), "declared it again") {
		t.Errorf("log %v", ls)
	}
}

// A declaration that fails leaves the queue refusing, with the reason.
func TestGateWhenTheDeclarationFails(t *testing.T) {
	clock := newGateClock()
	pub := &brokertest.Publisher{Outcome: func(broker.Outgoing) error { return fmt.Errorf("%w: 312 NO_ROUTE", broker.ErrReturned) }}
	declares := 0
	g := NewGate(GateOptions{Queue: "error", Now: clock.now, Logger: zerolog.Nop(),
		Declare: func(context.Context) error { declares++; return errors.New("403 ACCESS_REFUSED") }})
	res := g.Publish(context.Background(), pub, copies(2))
	if errorsOf(res, broker.ErrReturned) != 2 || !strings.Contains(res[0].Error(), "ACCESS_REFUSED") {
		t.Fatalf("Publish = %v", res)
	}
	if refusing, _, cause := g.Refusing(); !refusing || !strings.Contains(cause, "ACCESS_REFUSED") {
		t.Errorf("Refusing: %v %q", refusing, cause)
	}
	// Tries wait for the backoff: no declaration per copy.
	for range 10 {
		g.Publish(context.Background(), pub, copies(2))
	}
	if declares != 1 || len(pub.Calls()) != 1 {
		t.Errorf("%d declarations and %d publishes, want 1 and 1 before the next try", declares, len(pub.Calls()))
	}
}

// A probe that gets no answer about the queue (the connection failed) lets
// the next publish probe at once; one probe at a time goes out.
func TestGateProbes(t *testing.T) {
	clock := newGateClock()
	answer := error(broker.ErrNacked)
	var mu sync.Mutex
	entered, release := make(chan struct{}, 1), make(chan struct{})
	block := false
	pub := &brokertest.Publisher{Outcome: func(broker.Outgoing) error {
		mu.Lock()
		defer mu.Unlock()
		return answer
	}}
	blocking := Publisher(brokertest.PublishFunc(func(ctx context.Context, msgs []broker.Outgoing) []error {
		if block {
			entered <- struct{}{}
			<-release
		}
		return pub.Publish(ctx, msgs)
	}))
	g := NewGate(GateOptions{Queue: "error", Now: clock.now, Logger: zerolog.Nop()})
	ctx := context.Background()
	g.Publish(ctx, blocking, copies(1))
	clock.add(time.Minute)
	answer = fmt.Errorf("%w: connection lost", broker.ErrNotConfirmed)
	if res := g.Publish(ctx, blocking, copies(3)); !errors.Is(res[0], broker.ErrNotConfirmed) || !errors.Is(res[1], ErrRefusing) {
		t.Fatalf("probe without an answer: %v", res)
	}
	if g.RetryIn(clock.now()) != 0 {
		t.Error("after a probe without an answer, the next publish waits")
	}
	// A probe in flight: others are not published meanwhile.
	answer = nil
	block = true
	done := make(chan []error)
	go func() { done <- g.Publish(ctx, blocking, copies(1)) }()
	<-entered
	block = false
	if res := g.Publish(ctx, blocking, copies(2)); errorsOf(res, ErrRefusing) != 2 {
		t.Errorf("while a probe is in flight: %v", res)
	}
	close(release)
	if res := <-done; res[0] != nil {
		t.Errorf("probe: %v", res)
	}
	if res := g.Publish(ctx, blocking, copies(2)); !allNil(res) || res[0] != nil || res[1] != nil {
		t.Errorf("after the probe was taken: %v", res)
	}
}
