package dispatch

import (
	"context"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/internal/amqptest"
	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/wire"
)

// Two copies of one dispatcher message (a quorum queue failing over, a
// requeue racing a new session): the second comes while the first's removal
// is held, when the row still holds the token's lease. It is stale, not a
// second forward; once the first is settled, the token is free again.
func TestSecondCopyOfATokenIsNotForwardedAgain(t *testing.T) {
	f := newFixture(t, 3)
	f.insert("r", "q", t0, amqp.Publishing{Body: []byte("b")})
	f.d.opts.RemoveHold = time.Hour
	toks := f.lease()
	a := amqptest.New(t)
	first := f.owedFor(a, toks)
	if n := len(f.pub.To("q")); n != 1 {
		t.Fatalf("%d forwards of the first copy, want 1", n)
	}

	body := mustTokens(t, toks)
	second := a.Deliver(amqp.Delivery{Body: body})
	o, rm, err := f.d.forwardAll(context.Background(), &second, f.pub)
	if err != nil || o != ack || rm != nil {
		t.Fatalf("second copy: forwardAll = %v, %+v, %v; want ack with nothing owed", o, rm, err)
	}
	if err := settle(&second, o); err != nil {
		t.Fatal(err)
	}
	if n := len(f.pub.To("q")); n != 1 {
		t.Fatalf("%d forwards after the second copy, want still 1", n)
	}
	if got := f.counted().stale; got != 1 {
		t.Errorf("%d stale tokens counted, want 1", got)
	}

	in := make(chan owed, 1)
	in <- first
	close(in)
	if err := f.d.removeLoop(context.Background(), in); err != nil {
		t.Fatal(err)
	}
	if _, ok := f.pending("r"); ok {
		t.Error("r still pending after the first copy's removal")
	}
	if !f.d.claims.take(toks[0]) {
		t.Error("the token is still claimed after its message was settled")
	}
}

// A dispatcher message settled without a removal owed (here: its row is
// gone) gives its claims up at once.
func TestClaimsGivenUpWhenNothingIsOwed(t *testing.T) {
	f := newFixture(t, 3)
	f.insert("r", "q", t0, amqp.Publishing{Body: []byte("b")})
	toks := f.lease()
	res, err := f.store.Remove(context.Background(), []storage.Ref{{ID: toks[0].ID, Lock: toks[0].Lock}})
	if err != nil || res[0] != nil {
		t.Fatalf("remove: %v %v", res, err)
	}
	if out, err := f.deliver(toks...); err != nil || out != amqptest.Acked {
		t.Fatalf("deliver = %v, %v; want acked", out, err)
	}
	if len(f.pub.To("q")) != 0 {
		t.Fatal("a removed row was forwarded")
	}
	if !f.d.claims.take(toks[0]) {
		t.Error("the token is still claimed after its message was acked")
	}
}

func mustTokens(t *testing.T, toks []wire.Token) []byte {
	t.Helper()
	body, err := wire.EncodeTokens(toks)
	if err != nil {
		t.Fatal(err)
	}
	return body
}
