package ingest

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/rs/zerolog"

	"github.com/delaybridge/delaybridge/broker/brokertest"
	"github.com/delaybridge/delaybridge/circuit"
	"github.com/delaybridge/delaybridge/intake"
	"github.com/delaybridge/delaybridge/internal/amqptest"
	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/storage/boltstore"
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

// newBreakerIngester is an ingester of testSource over store with a store
// breaker, which a message's own failure must leave disarmed.
func newBreakerIngester(store Store) (*Ingester, *circuit.Breaker) {
	breaker := circuit.New("store", time.Hour, circuit.Options{Now: func() time.Time { return now0 }})
	all, _ := CompileGlobs([]string{"*"})
	return New(nil, nil, store, Options{
		Sources: []intake.Source{testSource}, ErrorQueue: "error", MaxBatch: 100,
		Rules:        Rules{MaxMessageBytes: 1 << 20, Allowed: all, Reserved: []string{"e.Timeouts", "e.TimeoutsDispatcher"}},
		StoreBreaker: breaker,
		Now:          func() time.Time { return now0 }, Logger: zerolog.Nop(),
	}), breaker
}

// cancelsOfBadIDs runs one cancel of each bad id through ingest over store and
// checks that each is that message's failure: copied to the error queue with
// the reason and acked, with the store breaker untouched.
func cancelsOfBadIDs(t *testing.T, store Store) {
	t.Helper()
	in, breaker := newBreakerIngester(store)
	for id, want := range badCancelIDs {
		pub, a := &brokertest.Publisher{}, amqptest.New(t)
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
		if len(pub.Sent()) != 1 {
			t.Errorf("cancel %q: %d error copies, want 1", id, len(pub.Sent()))
			continue
		}
		h := pub.Sent()[0].Msg.Headers
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
	st := openPostgres(t)
	cancelsOfBadIDs(t, st)
	// The store is still fine with a valid cancel.
	if err := st.Cancel(context.Background(), "ok", storage.CancelOrdered); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("Cancel(ok) = %v, want ErrNotFound", err)
	}
}

// openPostgres opens a PostgreSQL store in a schema of the test's own.
func openPostgres(t *testing.T) *postgres.Store {
	t.Helper()
	st, err := postgres.Open(context.Background(), pgtest.Require(t), postgres.Options{Schema: pgtest.Schema(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func TestIntakeValidate(t *testing.T) {
	long := strings.Repeat("q", 256)
	for name, c := range map[string]struct {
		it   intake.Intake
		want error
	}{
		"schedule":              {intake.Intake{Op: intake.OpSchedule, ID: "a", Destination: "q"}, nil},
		"schedule no id":        {intake.Intake{Op: intake.OpSchedule, Destination: "q"}, nil},
		"schedule long dest":    {intake.Intake{Op: intake.OpSchedule, Destination: long}, wire.ErrInvalidDestination},
		"schedule no dest":      {intake.Intake{Op: intake.OpSchedule, ID: "a"}, wire.ErrInvalidDestination},
		"schedule NUL id":       {intake.Intake{Op: intake.OpSchedule, ID: "a\x00", Destination: "q"}, wire.ErrInvalidID},
		"cancel":                {intake.Intake{Op: intake.OpCancel, CancelID: "a"}, nil},
		"cancel invalid UTF-8":  {intake.Intake{Op: intake.OpCancel, CancelID: "\xff"}, wire.ErrInvalidID},
		"cancel empty":          {intake.Intake{Op: intake.OpCancel}, wire.ErrInvalidID},
		"reject has no id rule": {intake.Reject(errors.New("x")), nil},
	} {
		if err := c.it.Validate(); !errors.Is(err, c.want) || (c.want == nil) != (err == nil) {
			t.Errorf("%s: Validate() = %v, want %v", name, err, c.want)
		}
	}
}

// An intake.OpReplace needs a group, and is held to intake.OpSchedule's rules otherwise.
func TestValidateReplace(t *testing.T) {
	ok := intake.Intake{Op: intake.OpReplace, ID: "t/1", SagaID: "t", Destination: "a", DueAt: now0}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, edit := range map[string]func(*intake.Intake){
		"no group":     func(it *intake.Intake) { it.SagaID = "" },
		"bad group":    func(it *intake.Intake) { it.SagaID = "a\x00b" },
		"bad id":       func(it *intake.Intake) { it.ID = "\xff" },
		"no address":   func(it *intake.Intake) { it.Destination = "" },
		"out of range": func(it *intake.Intake) { it.DueAt = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC) },
	} {
		it := ok
		edit(&it)
		if err := it.Validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// Ingest refuses, before the store, everything storage.CheckInsert refuses
// (docs/contract.md §7): such a message is that message's failure, on the
// error queue, whichever store is configured, never a store error that
// requeues it. Each case is a row CheckInsert refuses whose intake Validate
// refuses first; at wire's limits a row passes both.
func TestValidateComesBeforeCheckInsert(t *testing.T) {
	var woke []time.Time
	in := newIngester(&fakeStore{}, nil, &woke)
	row := func(it intake.Intake) storage.Timeout {
		t.Helper()
		r, err := in.accept(&it, &amqp.Delivery{}, now0)
		if err != nil {
			t.Fatalf("accept(%+v): %v", it, err)
		}
		return r
	}
	max := strings.Repeat("i", wire.MaxIDBytes)
	for name, it := range map[string]intake.Intake{
		"longest id and saga id": {Op: intake.OpSchedule, ID: max, SagaID: max, Destination: strings.Repeat("q", wire.MaxDestinationBytes), DueAt: now0},
		"exchange":               {Op: intake.OpSchedule, ID: "a", Exchange: "x", DueAt: now0},
		"replace":                {Op: intake.OpReplace, ID: "a", SagaID: max, Destination: "q", DueAt: now0},
	} {
		if err := it.Validate(); err != nil {
			t.Fatalf("%s: Validate: %v", name, err)
		}
		if err := storage.CheckInsert([]storage.Timeout{row(it)}); err != nil {
			t.Errorf("%s: a valid intake's row is refused by the store: %v", name, err)
		}
	}
	over := strings.Repeat("i", storage.MaxStoredIDBytes+1)
	for name, it := range map[string]intake.Intake{
		"id holding the send separator": {Op: intake.OpSchedule, ID: wire.SendKey("a", 2), Destination: "q", DueAt: now0},
		"id over the store's limit":     {Op: intake.OpSchedule, ID: over, Destination: "q", DueAt: now0},
		"no destination":                {Op: intake.OpSchedule, ID: "a", DueAt: now0},
		"saga id with NUL":              {Op: intake.OpSchedule, ID: "a", SagaID: "s\x00", Destination: "q", DueAt: now0},
		"saga key over the limit":       {Op: intake.OpSchedule, ID: "a", SagaID: strings.Repeat("s", storage.MaxStoreKeyBytes), Destination: "q", DueAt: now0},
		"replace, group with NUL":       {Op: intake.OpReplace, ID: "a", SagaID: "s\x00", Destination: "q", DueAt: now0},
	} {
		if err := storage.CheckInsert([]storage.Timeout{row(it)}); err == nil {
			t.Fatalf("%s: storage.CheckInsert takes it; the case tests nothing", name)
		}
		if err := it.Validate(); err == nil {
			t.Errorf("%s: Validate takes what the store refuses", name)
		}
	}
}

// timeoutsNoStoreCanHold runs timeouts with a saga id no store can hold, and
// one whose id is a row key, through ingest over store: each is copied to
// the error queue with its reason and acked, the store breaker untouched,
// nothing stored.
func timeoutsNoStoreCanHold(t *testing.T, store Store) {
	t.Helper()
	in, breaker := newBreakerIngester(store)
	pub, a := &brokertest.Publisher{}, amqptest.New(t)
	keyID := nsbTimeout("")
	keyID[wire.HeaderNSBMessageID] = wire.SendKey("m", 2)
	ds := deliveries(a, nsbTimeout("s\x00"), nsbTimeout(strings.Repeat("s", 40000)), keyID)
	ds[2].MessageId = ""
	if err := in.take(pub, ds); err != nil {
		t.Fatal(err)
	}
	if s := breaker.State(); s != circuit.Disarmed {
		t.Errorf("store breaker %s: a bad message was taken for a store outage", s)
	}
	want := []string{"saga id contains control characters", "saga id is 40000 bytes", wire.HeaderNSBMessageID + " contains control characters"}
	if len(pub.Sent()) != len(want) {
		t.Fatalf("%d error copies, want %d", len(pub.Sent()), len(want))
	}
	for i, w := range want {
		if a.Outcome(uint64(i+1)) != amqptest.Acked {
			t.Errorf("delivery %d: %s, want acked after its error copy", i, a.Outcome(uint64(i+1)))
		}
		if r, _ := pub.Sent()[i].Msg.Headers[wire.HeaderError].(string); !strings.Contains(r, w) {
			t.Errorf("copy %d: reason %q, want it to say %q", i, r, w)
		}
	}
	if n, _, err := store.(storage.Stater).Stats(context.Background()); err != nil || n != 0 {
		t.Errorf("store holds %d timeouts (%v), want none", n, err)
	}
}

func TestTimeoutsNoStoreCanHoldWithBolt(t *testing.T) {
	s, err := boltstore.Open(filepath.Join(t.TempDir(), "store.db"), boltstore.Options{Now: func() time.Time { return now0 }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	timeoutsNoStoreCanHold(t, s)
}

// The same against PostgreSQL, whose Insert did not check saga ids before
// storage.CheckInsert: the outcome must not depend on the store.
func TestTimeoutsNoStoreCanHoldWithPostgres(t *testing.T) {
	st := openPostgres(t)
	timeoutsNoStoreCanHold(t, st)
}
