package ingest

import (
	"context"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/google/uuid"

	"github.com/delaybridge/delaybridge/broker/brokertest"
	"github.com/delaybridge/delaybridge/intake"
	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/protocol/nsbtimeout"
	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/wire"
)

// runHolding runs an Ingester on a fresh intake queue with an hour's Hold,
// batches of maxBatch and urgent as Urgent.
func runHolding(t *testing.T, maxBatch int, urgent time.Duration) (*amqp.Channel, string, *fakeStore, func() error) {
	t.Helper()
	return runOnFake(t, Options{Prefetch: maxBatch, MaxBatch: maxBatch, Hold: time.Hour, Urgent: urgent})
}

// runOnFake runs an Ingester with opts on a fresh intake queue of
// E.Timeouts messages, over a fakeStore.
func runOnFake(t *testing.T, opts Options) (*amqp.Channel, string, *fakeStore, func() error) {
	t.Helper()
	ach := testChannel(t)
	q := "ingest-test-" + uuid.NewString()[:8] + ".Timeouts"
	declareTestQueues(t, ach, q)
	store := &fakeStore{}
	opts.Sources, opts.Rules = []intake.Source{nsbtimeout.TimeoutsSource(q)}, Rules{Reserved: []string{q}}
	stop := runIngester(t, store, &brokertest.Publisher{}, opts)
	return ach, q, store, stop
}

// With a Hold, a batch of messages due later than Urgent waits for more,
// and the first message due sooner ends the wait: it and everything held
// are stored in one commit, so holding never delays what falls due soon.
func TestHoldGathersUntilSomethingIsDueSoon(t *testing.T) {
	ach, q, store, stop := runHolding(t, 50, 10*time.Second)
	publish := func(id string, delay time.Duration) {
		t.Helper()
		h := amqp.Table{wire.HeaderDestination: "orders", wire.HeaderDelay: int32(delay / time.Millisecond)}
		if err := ach.PublishWithContext(context.Background(), "", q, true, false, amqp.Publishing{MessageId: id, Headers: h, Body: []byte("b")}); err != nil {
			t.Fatal(err)
		}
	}
	stored := func() (rows, calls int) {
		store.mu.Lock()
		defer store.mu.Unlock()
		return len(store.rows), store.calls
	}
	for _, id := range []string{"later1", "later2", "later3"} {
		publish(id, time.Hour)
	}
	// Far longer than the default linger (2 ms): without the hold, these
	// three would be stored by now.
	time.Sleep(300 * time.Millisecond)
	if rows, calls := stored(); rows != 0 || calls != 0 {
		t.Fatalf("%d rows in %d commits while held, want none", rows, calls)
	}
	publish("soon", time.Second)
	if !testenv.Eventually(20*time.Second, func() bool { rows, _ := stored(); return rows == 4 }) {
		rows, calls := stored()
		t.Fatalf("%d of 4 rows stored in %d commits after a message due soon", rows, calls)
	}
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if _, calls := stored(); calls != 1 {
		t.Errorf("%d commits, want 1: the held messages and the one due soon together", calls)
	}
	if n := testenv.QueueDepth(t, ach, q); n != 0 {
		t.Errorf("%s holds %d messages: a delivery was not acknowledged", q, n)
	}
}

// A batch of half MaxBatch is stored at once, however long the hold: in a
// burst the broker delivers the other half of the prefetch meanwhile.
func TestHoldEndsAtHalfABatch(t *testing.T) {
	ach, q, store, stop := runHolding(t, 10, time.Second)
	for i := range 5 {
		h := amqp.Table{wire.HeaderDestination: "orders", wire.HeaderDelay: int32(3600_000)}
		if err := ach.PublishWithContext(context.Background(), "", q, true, false,
			amqp.Publishing{MessageId: "m" + string(rune('a'+i)), Headers: h, Body: []byte("b")}); err != nil {
			t.Fatal(err)
		}
	}
	rows := func() int {
		store.mu.Lock()
		defer store.mu.Unlock()
		return len(store.rows)
	}
	if !testenv.Eventually(20*time.Second, func() bool { return rows() == 5 }) {
		t.Fatalf("%d of 5 rows stored: half a batch waited for the hold", rows())
	}
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
}

func TestPatient(t *testing.T) {
	in := &Ingester{opts: Options{Linger: 2 * time.Millisecond, Hold: 100 * time.Millisecond, Urgent: time.Second,
		Now: func() time.Time { return now0 }}}
	row := func(due time.Duration) *entry {
		return &entry{intake: intake.Intake{Op: intake.OpSchedule}, row: storage.Timeout{DueAt: now0.Add(due)}}
	}
	for _, c := range []struct {
		name string
		e    *entry
		want bool
	}{
		{"due after Urgent", row(time.Second + time.Millisecond), true},
		{"due at Urgent", row(time.Second), false},
		{"due already", row(-time.Minute), false},
		{"a replace due later", &entry{intake: intake.Intake{Op: intake.OpReplace}, row: storage.Timeout{DueAt: now0.Add(time.Hour)}}, true},
		{"a rejection", &entry{intake: intake.Reject(context.Canceled)}, true},
		{"a cancel", &entry{intake: intake.Intake{Op: intake.OpCancel}}, false},
	} {
		if got := in.patient(c.e); got != c.want {
			t.Errorf("%s: patient = %v, want %v", c.name, got, c.want)
		}
	}
	in.opts.Hold = in.opts.Linger
	if in.patient(row(time.Hour)) {
		t.Error("patient with a Hold no longer than Linger")
	}
}
