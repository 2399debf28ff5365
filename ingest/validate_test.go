package ingest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/rs/zerolog"

	"github.com/delaybridge/delaybridge/circuit"
	"github.com/delaybridge/delaybridge/internal/amqptest"
	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/storage/postgres"
	"github.com/delaybridge/delaybridge/storage/postgres/pgtest"
	"github.com/delaybridge/delaybridge/wire"
)

// badCancelIDs are cancel ids no stored message can have: PostgreSQL refuses
// them outright (NUL, invalid UTF-8), so they must never reach a store.
var badCancelIDs = map[string]string{
	"a\x00b":      "control characters",
	"\xff\xfeid":  "not valid UTF-8",
	"tab\there":   "control characters",
	"\xc3":        "not valid UTF-8",
	"line\nbreak": "control characters",
}

// cancelsOfBadIDs runs one cancel of each bad id through ingest over store and
// checks that each is that message's failure: copied to the error queue with
// the reason and acked, with the store breaker untouched.
func cancelsOfBadIDs(t *testing.T, store Store) {
	t.Helper()
	breaker := circuit.New("store", time.Hour, circuit.Options{Now: func() time.Time { return now0 }})
	all, _ := CompileGlobs([]string{"*"})
	in := New(nil, nil, store, Options{
		Sources: []Source{testSource}, ErrorQueue: "error", MaxBatch: 100,
		Rules:        Rules{MaxMessageBytes: 1 << 20, Allowed: all, Reserved: []string{"e.Timeouts", "e.TimeoutsDispatcher"}},
		StoreBreaker: breaker,
		Now:          func() time.Time { return now0 }, Logger: zerolog.Nop(),
	})
	for id, want := range badCancelIDs {
		pub, a := &fakePublisher{}, amqptest.New(t)
		d := a.Deliver(amqp.Delivery{Headers: amqp.Table{wire.HeaderCancel: id}})
		if err := in.take(pub, []amqp.Delivery{d}); err != nil {
			t.Fatalf("cancel %q: %v", id, err)
		}
		if s := breaker.State(); s != circuit.Disarmed {
			t.Errorf("cancel %q: store breaker %s: one bad message was taken for a store outage", id, s)
		}
		if a.Outcome(1) != amqptest.Acked {
			t.Errorf("cancel %q: %s, want acked after its error copy", id, a.Outcome(1))
		}
		if len(pub.sent) != 1 {
			t.Errorf("cancel %q: %d error copies, want 1", id, len(pub.sent))
			continue
		}
		h := pub.sent[0].Msg.Headers
		if r, _ := h[wire.HeaderError].(string); !strings.Contains(r, wire.HeaderCancel) || !strings.Contains(r, want) {
			t.Errorf("cancel %q: reason %q, want it to name %s and say %q", id, r, wire.HeaderCancel, want)
		}
		if h[wire.HeaderStage] != wire.StageIngest {
			t.Errorf("cancel %q: stage %v", id, h[wire.HeaderStage])
		}
	}
}

// A cancel naming an id with NUL or invalid UTF-8 goes to the error queue; it
// is never a store call (PostgreSQL refuses it, which read as an outage).
func TestCancelOfAnImpossibleIDIsRejected(t *testing.T) {
	cancelsOfBadIDs(t, &fakeStore{rows: map[string]storage.Timeout{}})
}

// The same against the real PostgreSQL store: before, each such cancel
// failed there, armed the store breaker and was requeued, for ever.
func TestCancelOfAnImpossibleIDWithPostgres(t *testing.T) {
	url := pgtest.Require(t)
	st, err := postgres.Open(context.Background(), url, postgres.Options{Schema: pgtest.Schema(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	cancelsOfBadIDs(t, st)
	// The store is still fine with a valid cancel.
	if err := st.Cancel(context.Background(), "ok", storage.CancelOrdered); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("Cancel(ok) = %v, want ErrNotFound", err)
	}
}

func TestIntakeValidate(t *testing.T) {
	long := strings.Repeat("q", 256)
	for name, c := range map[string]struct {
		it   Intake
		want error
	}{
		"schedule":              {Intake{Op: OpSchedule, ID: "a", Destination: "q"}, nil},
		"schedule no id":        {Intake{Op: OpSchedule, Destination: "q"}, nil},
		"schedule long dest":    {Intake{Op: OpSchedule, Destination: long}, wire.ErrInvalidDestination},
		"schedule no dest":      {Intake{Op: OpSchedule, ID: "a"}, wire.ErrInvalidDestination},
		"schedule NUL id":       {Intake{Op: OpSchedule, ID: "a\x00", Destination: "q"}, wire.ErrInvalidID},
		"cancel":                {Intake{Op: OpCancel, CancelID: "a"}, nil},
		"cancel invalid UTF-8":  {Intake{Op: OpCancel, CancelID: "\xff"}, wire.ErrInvalidID},
		"cancel empty":          {Intake{Op: OpCancel}, wire.ErrInvalidID},
		"reject has no id rule": {Reject(errors.New("x")), nil},
	} {
		if err := c.it.Validate(); !errors.Is(err, c.want) || (c.want == nil) != (err == nil) {
			t.Errorf("%s: Validate() = %v, want %v", name, err, c.want)
		}
	}
}

// An OpReplace needs a group, and is held to OpSchedule's rules otherwise.
func TestValidateReplace(t *testing.T) {
	ok := Intake{Op: OpReplace, ID: "t/1", SagaID: "t", Destination: "a", DueAt: now0}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, edit := range map[string]func(*Intake){
		"no group":     func(it *Intake) { it.SagaID = "" },
		"bad group":    func(it *Intake) { it.SagaID = "a\x00b" },
		"bad id":       func(it *Intake) { it.ID = "\xff" },
		"no address":   func(it *Intake) { it.Destination = "" },
		"out of range": func(it *Intake) { it.DueAt = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC) },
	} {
		it := ok
		edit(&it)
		if err := it.Validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
