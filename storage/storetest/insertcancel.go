package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/wire"
)

// The cases of storage.InsertCanceller: one commit of rows and AMQP
// cancels, in order, that must do what Insert and Cancel (CancelOrdered)
// do one by one.
func init() {
	tests = append(tests, []struct {
		name string
		fn   func(e *env)
	}{
		{"InsertAndCancelCancelThenSend", testInsertAndCancelCancelThenSend},
		{"InsertAndCancelSendThenCancel", testInsertAndCancelSendThenCancel},
		{"InsertAndCancelLeased", testInsertAndCancelLeased},
		{"InsertAndCancelNothing", testInsertAndCancelNothing},
		{"InsertAndCancelRedelivered", testInsertAndCancelRedelivered},
		{"InsertAndCancelOrder", testInsertAndCancelOrder},
		{"InsertAndCancelValidation", testInsertAndCancelValidation},
		{"InsertAndCancelConcurrent", testInsertAndCancelConcurrent},
		{"InsertAndCancelSchedule", testInsertAndCancelSchedule},
	}...)
}

// insertAndCancel calls InsertAndCancel and fails the test unless it
// answered each row and each cancel once.
func (e *env) insertAndCancel(ts []storage.Timeout, cancels ...storage.OrderedCancel) ([]storage.Outcome, []storage.CancelResult) {
	e.Helper()
	o, res, err := e.s.InsertAndCancel(e.ctx, ts, cancels)
	oneEach(e, "InsertAndCancel", len(ts), o, err)
	oneEach(e, "InsertAndCancel's cancels", len(cancels), res, err)
	return o, res
}

// expectResults fails unless the cancels' answers are want (Cancel's
// errors), every schedule unfound.
func (e *env) expectResults(got []storage.CancelResult, want ...error) {
	e.Helper()
	for i, r := range got {
		if !errors.Is(r.Err, want[i]) || r.ScheduleFound {
			e.Fatalf("cancel %d answered %+v, want %v", i, r, want[i])
		}
	}
}

// testInsertAndCancelCancelThenSend: a cancel, then a send of its id in
// the same call: the send is refused as Cancelled (the cancel's
// tombstone), the rows of other ids are stored, and the tombstone holds
// for later calls.
func testInsertAndCancelCancelThenSend(e *env) {
	ts := []storage.Timeout{newTimeout("a", at(time.Hour)), newTimeout("x", at(time.Hour)), newTimeout("b", at(time.Hour))}
	o, res := e.insertAndCancel(ts, storage.OrderedCancel{At: 1, ID: "x"})
	if want := []storage.Outcome{storage.Stored, storage.Cancelled, storage.Stored}; !slices.Equal(o, want) {
		e.Fatalf("outcomes %v, want %v", o, want)
	}
	e.expectResults(res, storage.ErrNotFound)
	e.get("a")
	e.get("b")
	e.expectMissing("x")
	e.expectRefused("x", true, "the cancel of a call left no tombstone")
}

// testInsertAndCancelSendThenCancel: a send, then a cancel of its id in
// the same call: as Insert then Cancel, the send is Stored and then
// removed (never delivered), with a pending send of the id from before,
// and the tombstone refuses the sends after it.
func testInsertAndCancelSendThenCancel(e *env) {
	e.sendsOf("x", 1, time.Hour, "")
	again := newTimeout("x", at(time.Hour))
	again.Fingerprint = []byte("send 2")
	later := newTimeout("x", at(time.Hour))
	later.Fingerprint = []byte("send 3")
	ts := []storage.Timeout{again, newTimeout("y", at(time.Hour)), later}
	o, res := e.insertAndCancel(ts, storage.OrderedCancel{At: 2, ID: "x"})
	if want := []storage.Outcome{storage.Stored, storage.Stored, storage.Cancelled}; !slices.Equal(o, want) {
		e.Fatalf("outcomes %v, want %v", o, want)
	}
	if ts[0].ID != wire.SendKey("x", 2) || ts[1].ID != "y" {
		e.Fatalf("keys set %q, %q; want %q, y", ts[0].ID, ts[1].ID, wire.SendKey("x", 2))
	}
	e.expectResults(res, nil)
	e.expectMissing("x")
	e.expectMissing(wire.SendKey("x", 2))
	e.get("y")
	if p, _, err := e.s.Stats(e.ctx); err != nil || p != 1 {
		e.Fatalf("Stats = %d pending, %v; want 1 (y)", p, err)
	}
	e.expectRefused("x", true, "the cancel of a call left no tombstone")
}

// testInsertAndCancelLeased: a cancel leaves the sends of its id that are
// being dispatched, as Cancel does: with every send leased it answers
// ErrLeased and leaves no tombstone (a later send in the call is stored
// as another send); with one of two leased it removes the other and
// leaves one.
func testInsertAndCancelLeased(e *env) {
	e.insertDue("l")
	e.leaseOne("l", time.Minute)
	after := newTimeout("l", at(time.Hour))
	after.Fingerprint = []byte("after")
	ts := []storage.Timeout{after}
	o, res := e.insertAndCancel(ts, storage.OrderedCancel{At: 0, ID: "l"})
	if o[0] != storage.Stored || ts[0].ID != wire.SendKey("l", 2) {
		e.Fatalf("a send after a cancel that came too late: %v under %q, want stored as send 2", o[0], ts[0].ID)
	}
	e.expectResults(res, storage.ErrLeased)
	e.get("l")
	e.get(wire.SendKey("l", 2))

	// Now one of the two sends is leased: the cancel removes the other.
	o, res = e.insertAndCancel([]storage.Timeout{newTimeout("m", at(time.Hour))}, storage.OrderedCancel{At: 1, ID: "l"})
	if o[0] != storage.Stored {
		e.Fatalf("m: %v", o[0])
	}
	e.expectResults(res, nil)
	e.get("l")
	e.expectMissing(wire.SendKey("l", 2))
	third := newTimeout("l", at(time.Hour))
	third.Fingerprint = []byte("third")
	if got := e.insertOutcomes(third); got[0] != storage.Cancelled {
		e.Fatalf("a send after the cancel = %v, want cancelled", got[0])
	}
}

// testInsertAndCancelNothing: a cancel that finds nothing answers
// ErrNotFound and leaves a tombstone for the window (CancelOrdered), as
// the AMQP cancel's Cancel did.
func testInsertAndCancelNothing(e *env) {
	_, res := e.insertAndCancel(nil, storage.OrderedCancel{At: 0, ID: "n"})
	e.expectResults(res, storage.ErrNotFound)
	e.clock.Set(at(window - time.Microsecond))
	e.expectRefused("n", true, "a cancel of nothing left no tombstone")
	e.clock.Set(at(window))
	e.expectRefused("n", false, "the id is still cancelled when the window has passed")
}

// testInsertAndCancelRedelivered: a call repeated (its answer lost, its
// deliveries requeued) changes nothing more: the send it removed stays
// removed (refused by the tombstone), its cancel finds nothing, and the
// repeat restarts the window as a repeated Cancel does.
func testInsertAndCancelRedelivered(e *env) {
	ts := func() []storage.Timeout {
		return []storage.Timeout{newTimeout("r", at(time.Hour)), newTimeout("s", at(time.Hour))}
	}
	o, res := e.insertAndCancel(ts(), storage.OrderedCancel{At: 1, ID: "r"})
	if !slices.Equal(o, []storage.Outcome{storage.Stored, storage.Stored}) {
		e.Fatalf("first call: %v", o)
	}
	e.expectResults(res, nil)
	e.clock.Set(at(window / 2))
	o, res = e.insertAndCancel(ts(), storage.OrderedCancel{At: 1, ID: "r"})
	if !slices.Equal(o, []storage.Outcome{storage.Cancelled, storage.Duplicate}) {
		e.Fatalf("repeated call: %v, want [cancelled duplicate]", o)
	}
	e.expectResults(res, storage.ErrNotFound)
	e.expectMissing("r")
	e.get("s")
	e.clock.Set(at(window + time.Minute))
	e.expectRefused("r", true, "the repeated cancel did not restart the window")
}

// testInsertAndCancelOrder: each cancel applies to the rows before it and
// not after: with a cancel of x between sends of x, the first is removed
// and the second refused; an id that only starts with x is left alone; a
// send repeated after a cancel of another id is a Duplicate of the first;
// cancels at one place apply in their order (the second of one id finds
// nothing), before the row there.
func testInsertAndCancelOrder(e *env) {
	ts := []storage.Timeout{newTimeout("x", at(time.Hour)), newTimeout("x2", at(time.Hour)), newTimeout("d", at(time.Hour)),
		newTimeout("x", at(time.Hour)), newTimeout("d", at(time.Hour)), newTimeout("y", at(time.Hour)), newTimeout("z", at(time.Hour))}
	ts[3].Fingerprint = []byte("another send")
	o, res := e.insertAndCancel(ts, storage.OrderedCancel{At: 2, ID: "x"}, storage.OrderedCancel{At: 6, ID: "y"},
		storage.OrderedCancel{At: 6, ID: "y"}, storage.OrderedCancel{At: 6, ID: "z"})
	want := []storage.Outcome{storage.Stored, storage.Stored, storage.Stored, storage.Cancelled, storage.Duplicate, storage.Stored,
		storage.Cancelled}
	if !slices.Equal(o, want) {
		e.Fatalf("outcomes %v, want %v", o, want)
	}
	e.expectResults(res, nil, nil, storage.ErrNotFound, storage.ErrNotFound)
	e.expectMissing("x")
	e.get("x2")
	e.get("d")
	e.expectMissing("y")
	e.expectMissing("z")
}

// testInsertAndCancelValidation: rows Insert refuses, and cancels out of
// order, out of range or of an id no row can have, fail the whole call
// before it changes anything.
func testInsertAndCancelValidation(e *env) {
	ok := newTimeout("ok", at(time.Hour))
	for name, tc := range map[string]struct {
		ts      []storage.Timeout
		cancels []storage.OrderedCancel
	}{
		"bad row":            {[]storage.Timeout{ok, newTimeout("", at(time.Hour))}, []storage.OrderedCancel{{At: 0, ID: "c"}}},
		"at past the rows":   {[]storage.Timeout{ok}, []storage.OrderedCancel{{At: 2, ID: "c"}}},
		"negative at":        {[]storage.Timeout{ok}, []storage.OrderedCancel{{At: -1, ID: "c"}}},
		"cancels unordered":  {[]storage.Timeout{ok}, []storage.OrderedCancel{{At: 1, ID: "c"}, {At: 0, ID: "d"}}},
		"empty cancelled id": {[]storage.Timeout{ok}, []storage.OrderedCancel{{At: 0, ID: ""}}},
		"a key for an id":    {[]storage.Timeout{ok}, []storage.OrderedCancel{{At: 0, ID: wire.SendKey("c", 2)}}},
		"NUL in schedule":    {[]storage.Timeout{ok}, []storage.OrderedCancel{{At: 0, ID: "c", Schedule: "amqp:\x00"}}},
	} {
		if _, _, err := e.s.InsertAndCancel(e.ctx, tc.ts, tc.cancels); err == nil {
			e.Fatalf("%s: InsertAndCancel succeeded", name)
		}
		e.expectMissing("ok")
		e.expectRefused("c", false, name+": a refused call left a tombstone")
		e.remove(storage.Ref{ID: "c"})
	}
}

// testInsertAndCancelConcurrent: cancels committed by InsertAndCancel meet
// inserts running at the same time as Cancel does: none is missed.
func testInsertAndCancelConcurrent(e *env) {
	RaceBatchCancelInsert(e.T, e.s, e.s, 100)
}

// RaceBatchCancelInsert is RaceCancelInsert with each cancel committed by
// InsertAndCancel, beside a row of its own, as ingest commits a batch
// holding cancels.
func RaceBatchCancelInsert(t testing.TB, ins, can storage.Store, n int) {
	t.Helper()
	raceCancelInsert(t, ins, batchCanceller{can}, n, "batch-race-", false)
}

// batchCanceller cancels through InsertAndCancel.
type batchCanceller struct{ storage.Store }

func (b batchCanceller) Cancel(ctx context.Context, id string, _ storage.CancelMode) error {
	_, res, err := b.InsertAndCancel(ctx, []storage.Timeout{newTimeout("beside-"+id, at(time.Hour))},
		[]storage.OrderedCancel{{At: 1, ID: id}})
	if err != nil {
		return err
	}
	return res[0].Err
}

// testInsertAndCancelSchedule: a cancel with a schedule ends it first, as
// CancelSchedule: its pending fire goes (a leased one stays), later puts
// of its name are refused by the cancel's tombstone, and a second cancel
// of it in the call finds it gone.
func testInsertAndCancelSchedule(e *env) {
	sc := scheduler(e)
	e.putSchedule(sc, newSchedule("amqp:s", at(10*time.Second)))
	e.putSchedule(sc, newSchedule("amqp:t", at(10*time.Second)))
	e.clock.Set(at(10 * time.Second))
	if fires := e.fireDue(sc, 0); len(fires) != 2 {
		e.Fatalf("fires = %+v", fires)
	}
	leased := storage.FireID("amqp:s", 1, at(10*time.Second))
	e.leaseFirst(leased)
	o, res := e.insertAndCancel([]storage.Timeout{newTimeout("u", at(time.Hour))},
		storage.OrderedCancel{At: 0, ID: "s", Schedule: "amqp:s"}, storage.OrderedCancel{At: 1, ID: "t", Schedule: "amqp:t"},
		storage.OrderedCancel{At: 1, ID: "t", Schedule: "amqp:t"})
	if o[0] != storage.Stored {
		e.Fatalf("u: %v", o[0])
	}
	want := []storage.CancelResult{{Err: storage.ErrNotFound, ScheduleFound: true}, {Err: storage.ErrNotFound, ScheduleFound: true},
		{Err: storage.ErrNotFound}}
	if fmt.Sprint(res) != fmt.Sprint(want) {
		e.Fatalf("results %+v, want %+v", res, want)
	}
	for _, k := range []string{"amqp:s", "amqp:t"} {
		if _, err := sc.GetSchedule(e.ctx, k); !errors.Is(err, storage.ErrScheduleNotFound) {
			e.Fatalf("GetSchedule(%s) after its cancel: %v", k, err)
		}
	}
	e.get(leased) // being dispatched: too late
	e.expectMissing(storage.FireID("amqp:t", 1, at(10*time.Second)))
	if _, err := sc.PutSchedule(e.ctx, newSchedule("amqp:s", at(time.Hour))); !errors.Is(err, storage.ErrScheduleCancelled) {
		e.Fatalf("PutSchedule after the cancel: %v, want ErrScheduleCancelled", err)
	}
}
