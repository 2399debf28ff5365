package dispatch

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/rs/zerolog"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/errorqueue"
	"github.com/delaybridge/delaybridge/internal/logtest"
)

// An error queue that refuses copies (full, with x-overflow reject-publish)
// while 120 messages are due to a missing queue: the messages stay in the
// store, each one retried on its backoff; the error queue gets one probe per
// try of the gate, not a publish per message; the refusals are not a
// critical error, and are logged summed up, not per message. Once the queue
// takes copies every message reaches it, exactly once, and leaves the store.
func TestRefusingErrorQueueIsBoundedAndLosesNothing(t *testing.T) {
	const msgs = 120
	f := newFixture(t, 0)
	logs := &logtest.Buffer{}
	var mu sync.Mutex
	var critical []error
	f.rebuild(f.store, Options{NumberOfRetries: 0, RecoveryFailuresPerSecond: 1,
		OnCritical: func(err error) { mu.Lock(); defer mu.Unlock(); critical = append(critical, err) },
		Logger:     zerolog.New(logs).Level(zerolog.InfoLevel)})
	full := true
	f.pub.Outcome = func(m broker.Outgoing) error {
		switch {
		case m.RoutingKey == "nowhere":
			return fmt.Errorf("%w: 312 NO_ROUTE", broker.ErrReturned)
		case m.RoutingKey == "error" && full:
			return broker.ErrNacked
		}
		return nil
	}
	for i := range msgs {
		id := fmt.Sprintf("m-%03d", i)
		f.insert(id, "nowhere", t0, amqp.Publishing{MessageId: id, Body: []byte(id)})
	}
	rounds := 0
	next := func() bool {
		at, ok, err := f.store.NextDue(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return false
		}
		f.clock.Set(at)
		f.run(40)
		rounds++
		return true
	}
	f.run(40)
	for range 10 {
		if !next() {
			t.Fatal("the store emptied while the error queue refused every copy")
		}
	}
	// Failed messages are moved one at a time: after the first nack, one
	// probe per round at most (the gate's backoff is 1 s and more).
	if n := len(f.pub.To("error")); n > 1+rounds {
		t.Errorf("%d error-queue publishes over %d rounds of %d failed messages; want a probe per try", n, rounds, msgs)
	}
	for i := range msgs {
		if _, ok := f.pending(fmt.Sprintf("m-%03d", i)); !ok {
			t.Fatalf("m-%03d left the store while its copy was refused", i)
		}
	}
	perMessage := 0
	for _, l := range logs.LinesAt("") {
		if l["message"] == "could not move a failed message to the error queue; it is retried" {
			perMessage++
		}
	}
	if perMessage > 0 {
		t.Errorf("%d log lines, one per refused copy; want them summed up", perMessage)
	}
	mu.Lock()
	if len(critical) > 0 {
		t.Errorf("a refusing error queue is a critical error: %v", critical[0])
	}
	mu.Unlock()

	full = false
	for next() {
		if rounds > 200 {
			t.Fatal("messages still pending long after the error queue takes copies")
		}
	}
	seen := map[string]int{}
	for _, m := range f.pub.To("error") {
		seen[m.Msg.MessageId]++
	}
	if len(seen) != msgs {
		t.Errorf("%d distinct messages reached the error queue, want %d", len(seen), msgs)
	}
	taken := 0
	for _, l := range logs.LinesAt("error") {
		if l["message"] == "message moved to the error queue" {
			taken++
		}
	}
	if taken != msgs {
		t.Errorf("%d messages moved to the error queue, want each of %d once", taken, msgs)
	}
	if !strings.Contains(fmt.Sprint(logs.LinesAt("info")), "the error queue takes copies again") {
		t.Error("no line saying the error queue takes copies again")
	}
}

// A deleted error queue is declared again by the gate the bridge shares
// between ingest and dispatch, and the copy goes out: nothing waits for an
// operator.
func TestDispatchDeclaresADeletedErrorQueueAgain(t *testing.T) {
	f := newFixture(t, 0)
	exists := false
	declared := 0
	gate := errorqueue.New(errorqueue.Options{Queue: "error", Now: f.clock.Now, Logger: zerolog.Nop(),
		Declare: func(context.Context) error { declared++; exists = true; return nil }})
	f.rebuild(f.store, Options{NumberOfRetries: 0, Errors: gate, Logger: zerolog.Nop()})
	f.pub.Outcome = func(m broker.Outgoing) error {
		if m.RoutingKey == "nowhere" || (m.RoutingKey == "error" && !exists) {
			return fmt.Errorf("%w: 312 NO_ROUTE", broker.ErrReturned)
		}
		return nil
	}
	f.insert("a", "nowhere", t0, amqp.Publishing{MessageId: "a"})
	f.run(10)
	if _, ok := f.pending("a"); ok || declared != 1 {
		t.Fatalf("pending %v after %d declarations; want the copy on the error queue after one", ok, declared)
	}
	if refusing, _, _ := gate.Refusing(); refusing {
		t.Error("the gate still refuses")
	}
	if errs := f.pub.To("error"); len(errs) != 2 || errors.Is(f.pub.Outcome(errs[1]), broker.ErrReturned) {
		t.Errorf("%d publishes to the error queue, want the returned one and the one after the declaration", len(errs))
	}
}
