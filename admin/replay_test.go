package admin

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/ingest"
	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/message"
	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/storage/boltstore"
	"github.com/delaybridge/delaybridge/storage/postgres"
	"github.com/delaybridge/delaybridge/storage/postgres/pgtest"
	"github.com/delaybridge/delaybridge/wire"
)

// replayEnv is an endpoint on the test broker with an error queue of its own
// and a Replayer over store, with the rules the bridge builds.
type replayEnv struct {
	t        *testing.T
	ch       *amqp.Channel
	endpoint string
	errorQ   string
	rp       *Replayer
}

func newReplayEnv(t *testing.T, store storage.Store) *replayEnv {
	t.Helper()
	conn := testenv.DialAMQP(t)
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	e := &replayEnv{t: t, ch: ch, endpoint: "replay-test-" + uuid.NewString()[:8]}
	e.errorQ = e.endpoint + ".error"
	if _, err := ch.QueueDeclare(e.errorQ, false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = ch.QueueDelete(e.errorQ, false, false, false) })
	allowed, err := ingest.CompileGlobs([]string{"ok.*", e.endpoint + ".*", e.errorQ})
	if err != nil {
		t.Fatal(err)
	}
	e.rp = &Replayer{
		Conn: func(context.Context) (*amqp.Connection, error) { return conn, nil }, ErrorQueue: e.errorQ,
		TimeoutsQueue: wire.TimeoutsQueue(e.endpoint), Store: store, Now: func() time.Time { return t0 },
		Rules: ingest.Rules{MaxMessageBytes: 64, Allowed: allowed,
			Reserved: []string{wire.TimeoutsQueue(e.endpoint), wire.DispatcherQueue(e.endpoint), e.errorQ}},
	}
	return e
}

// dispatchCopy is what the bridge puts on the error queue for a dispatch
// failure of a message for dest (see errorqueue.Copy).
func (e *replayEnv) dispatchCopy(id, dest string) amqp.Publishing {
	return amqp.Publishing{MessageId: id, Body: []byte("body of " + id), Headers: amqp.Table{
		wire.HeaderDestination: dest, "custom": "kept",
		wire.HeaderError: "dispatch failed", wire.HeaderStage: wire.StageDispatch, wire.HeaderAttempts: int32(6),
		wire.HeaderFailedAt: t0.Format(time.RFC3339Nano), wire.HeaderNSBException: "dispatch failed",
		wire.HeaderNSBFailedQ: wire.TimeoutsQueue(e.endpoint),
	}}
}

// publish puts msgs on the error queue, confirmed, in order.
func (e *replayEnv) publish(msgs ...amqp.Publishing) {
	e.t.Helper()
	for _, m := range msgs {
		c, err := e.ch.PublishWithDeferredConfirmWithContext(context.Background(), "", e.errorQ, true, false, m)
		if err != nil {
			e.t.Fatal(err)
		}
		if ok, err := c.WaitContext(context.Background()); !ok || err != nil {
			e.t.Fatalf("publish %q: not confirmed (%v)", m.MessageId, err)
		}
	}
}

func (e *replayEnv) depth() int {
	e.t.Helper()
	q, err := e.ch.QueueDeclarePassive(e.errorQ, false, false, false, false, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	return q.Messages
}

// waitDepth waits until the error queue holds n ready messages (requeues
// come back asynchronously).
func (e *replayEnv) waitDepth(n int) {
	e.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for e.depth() != n {
		if time.Now().After(deadline) {
			e.t.Fatalf("error queue holds %d messages, want %d", e.depth(), n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func openBolt(t *testing.T) storage.Store {
	st, err := boltstore.Open(filepath.Join(t.TempDir(), "s.db"), boltstore.Options{Now: func() time.Time { return t0 }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func openPostgres(t *testing.T) storage.Store {
	url := pgtest.Require(t)
	st, err := postgres.Open(context.Background(), url, postgres.Options{Schema: pgtest.Schema(t), Now: func() time.Time { return t0 }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// Replay reads and checks a copy exactly as ingest reads and checks a
// message: no destination ingest would refuse (too long for a routing key,
// the bridge's own queues, the error queue, not allowed), no id it would
// refuse, no body over the limit, and only this endpoint's failures. Each
// refused copy is skipped with its reason and stays on the error queue; the
// valid ones are replayed; a second pass is the same.
func TestReplayChecksCopiesAsIngestDoes(t *testing.T) {
	store := openBolt(t)
	e := newReplayEnv(t, store)
	other := e.dispatchCopy("other-endpoint", "ok.other")
	other.Headers[wire.HeaderNSBFailedQ] = "someone-else.Timeouts"
	noFailedQ := e.dispatchCopy("no-failedq", "ok.nofq")
	delete(noFailedQ.Headers, wire.HeaderNSBFailedQ)
	big := e.dispatchCopy("too-big", "ok.big")
	big.Body = []byte(strings.Repeat("b", 65))
	nsbID := e.dispatchCopy("", "ok.nsb")
	nsbID.Headers[wire.HeaderNSBMessageID] = "nsb-7"
	nsbDest := e.dispatchCopy("nsb-dest", "")
	delete(nsbDest.Headers, wire.HeaderDestination)
	nsbDest.Headers[wire.HeaderNSBDestination] = "ok.nsbdest"
	badUTF8 := e.dispatchCopy("bad\xffid", "ok.utf8")
	skipped := map[string]string{ // message-id → what the reason says
		"long-dest":      "at most 255",
		"to-dispatcher":  "own queues",
		"to-timeouts":    "own queues",
		"to-error-queue": "own queues",
		"not-allowed":    "DELAYBRIDGE_ALLOWED_DESTINATIONS",
		"too-big":        "DELAYBRIDGE_MAX_MESSAGE_BYTES",
		"other-endpoint": `a failure of another endpoint (NServiceBus.FailedQ="someone-else.Timeouts")`,
		"no-failedq":     "no NServiceBus.FailedQ header",
		"bad\xffid":      "message-id property is not valid UTF-8",
		"ctl-dest":       "header x-destination contains control characters",
	}
	e.publish(
		e.dispatchCopy("long-dest", "ok."+strings.Repeat("d", 297)),
		e.dispatchCopy("to-dispatcher", wire.DispatcherQueue(e.endpoint)),
		e.dispatchCopy("to-timeouts", wire.TimeoutsQueue(e.endpoint)),
		e.dispatchCopy("to-error-queue", e.errorQ),
		e.dispatchCopy("not-allowed", "elsewhere"),
		big, other, noFailedQ, badUTF8,
		e.dispatchCopy("ctl-dest", "ok.a\x00b"),
		e.dispatchCopy("good", "ok.one"), nsbID, nsbDest,
	)
	for pass := 1; pass <= 2; pass++ {
		res, err := e.rp.Replay(context.Background(), 100)
		if err != nil {
			t.Fatalf("pass %d: %v (%+v)", pass, err, res)
		}
		wantReplayed := 3
		if pass == 2 {
			wantReplayed = 0
		}
		if res.Replayed != wantReplayed || res.Skipped != len(skipped) {
			t.Errorf("pass %d: replayed %d, skipped %d; want %d and %d: %+v", pass, res.Replayed, res.Skipped, wantReplayed, len(skipped), res.Details)
		}
		seen := map[string]bool{}
		for _, d := range res.Details {
			want, ok := skipped[d.MessageID]
			if !ok {
				t.Errorf("pass %d: %q skipped (%s)", pass, d.MessageID, d.Reason)
				continue
			}
			seen[d.MessageID] = true
			if !strings.Contains(d.Reason, want) {
				t.Errorf("pass %d: %q skipped for %q, want a reason saying %q", pass, d.MessageID, d.Reason, want)
			}
		}
		if len(seen) != len(skipped) {
			t.Errorf("pass %d: skipped %v, want every one of %d", pass, seen, len(skipped))
		}
		e.waitDepth(len(skipped))
	}
	for id, dest := range map[string]string{"good": "ok.one", "nsb-7": "ok.nsb", "nsb-dest": "ok.nsbdest"} {
		row, err := store.Get(context.Background(), id)
		if err != nil {
			t.Errorf("%q not replayed: %v", id, err)
			continue
		}
		if row.Destination != dest || !row.DueAt.Equal(t0) {
			t.Errorf("%q stored for %q due %s, want %q due now", id, row.Destination, row.DueAt, dest)
		}
		p, err := message.Decode(row.Message)
		if err != nil {
			t.Fatal(err)
		}
		if p.Headers["custom"] != "kept" || string(p.Body) != "body of "+p.MessageId {
			t.Errorf("%q: headers %v body %q", id, p.Headers, p.Body)
		}
		for k := range p.Headers {
			if strings.HasPrefix(k, wire.HeaderPrefix) || k == wire.HeaderNSBException || k == wire.HeaderNSBFailedQ {
				t.Errorf("%q stored with header %s", id, k)
			}
		}
	}
	rows, _, err := store.List(context.Background(), storage.ListFilter{Limit: 100})
	if err != nil || len(rows) != 3 {
		t.Errorf("store holds %d rows (%v), want the 3 replayed", len(rows), err)
	}
}

// One copy with an id no store may hold (NUL; PostgreSQL refuses it) used to
// fail the whole pass, and every later one: now it is skipped, the valid copy
// after it is replayed, and the next pass works.
func TestReplayOfAnImpossibleIDFailsNoPass(t *testing.T) {
	for name, open := range map[string]func(*testing.T) storage.Store{"bbolt": openBolt, "postgres": openPostgres} {
		t.Run(name, func(t *testing.T) {
			store := open(t)
			e := newReplayEnv(t, store)
			e.publish(e.dispatchCopy("nul\x00id", "ok.q"), e.dispatchCopy("valid", "ok.q"))
			res, err := e.rp.Replay(context.Background(), 100)
			if err != nil || res.Replayed != 1 || res.Skipped != 1 || len(res.Details) != 1 ||
				!strings.Contains(res.Details[0].Reason, "control characters") {
				t.Fatalf("first pass: %+v, %v; want valid replayed, the NUL id skipped", res, err)
			}
			if _, err := store.Get(context.Background(), "valid"); err != nil {
				t.Fatalf("valid not stored: %v", err)
			}
			e.waitDepth(1)
			e.publish(e.dispatchCopy("valid-2", "ok.q"))
			res, err = e.rp.Replay(context.Background(), 100)
			if err != nil || res.Replayed != 1 || res.Skipped != 1 {
				t.Fatalf("second pass: %+v, %v; want valid-2 replayed, the NUL id skipped again", res, err)
			}
			e.waitDepth(1)
		})
	}
}

func TestReplayNeedsTheTimeoutsQueue(t *testing.T) {
	rp := &Replayer{Conn: func(context.Context) (*amqp.Connection, error) { return nil, errors.New("not dialled") }}
	if _, err := rp.Replay(context.Background(), 1); err == nil || !strings.Contains(err.Error(), "TimeoutsQueue") {
		t.Fatalf("Replay without TimeoutsQueue: %v", err)
	}
}

// unreadableCopy has more headers than the AMQP client reads (8,193): the
// broker takes it, and the client drops its connection on it.
func unreadableCopy(id string) amqp.Publishing {
	h := amqp.Table{}
	for i := range 8193 {
		h[fmt.Sprintf("h%05d", i)] = nil
	}
	return amqp.Publishing{MessageId: id, Body: []byte("body of " + id), Headers: h}
}

// passConns makes e's replayer dial a connection of its own for each pass,
// as the bridge does (a copy the client cannot read drops it), and hold
// unreadable copies with hold.
func (e *replayEnv) passConns(hold func(ctx context.Context, queue string, limit int) (*broker.Held, error)) {
	url := testenv.AMQPURL(e.t)
	e.rp.Conn = func(context.Context) (*amqp.Connection, error) { return amqp.Dial(url) }
	e.rp.Release = func(c *amqp.Connection) { _ = c.Close() }
	e.rp.Hold = hold
}

func (e *replayEnv) holdOn(ctx context.Context, queue string, limit int) (*broker.Held, error) {
	return broker.HoldUnreadable(ctx, broker.HoldOptions{URLs: []string{testenv.AMQPURL(e.t)}, Name: "delaybridge replay test"}, queue, limit)
}

// A copy the AMQP client cannot read used to end every pass: now it is
// skipped with its reason and left on the error queue as it is, the valid
// copies around it are replayed, and the next pass does the same.
func TestReplaySkipsACopyTheClientCannotRead(t *testing.T) {
	store := openBolt(t)
	e := newReplayEnv(t, store)
	e.passConns(e.holdOn)
	e.publish(e.dispatchCopy("a", "ok.q"), unreadableCopy("poison"), e.dispatchCopy("b", "ok.q"))
	for pass, id := range []string{"", "c"} {
		if id != "" {
			e.publish(e.dispatchCopy(id, "ok.q"))
		}
		res, err := e.rp.Replay(context.Background(), 100)
		wantReplayed := 2
		if pass == 1 {
			wantReplayed = 1
		}
		if err != nil || res.Replayed != wantReplayed || res.Skipped != 1 || len(res.Details) != 1 ||
			res.Details[0].MessageID != "poison" || !strings.Contains(res.Details[0].Reason, "8193 entries in one table") ||
			!strings.Contains(res.Details[0].Reason, "left on the error queue") {
			t.Fatalf("pass %d: %+v, %v; want %d replayed and the unreadable copy skipped with its reason", pass+1, res, err, wantReplayed)
		}
		e.waitDepth(1)
	}
	for _, id := range []string{"a", "b", "c"} {
		if _, err := store.Get(context.Background(), id); err != nil {
			t.Errorf("%q not replayed: %v", id, err)
		}
	}
	// It is still there, still unreadable, and alone.
	held, err := e.holdOn(context.Background(), e.errorQ, 10)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release()
	if len(held.Unreadable) != 1 || held.Unreadable[0].MessageID != "poison" || held.Readable != 0 {
		t.Errorf("error queue holds %+v and %d readable copies; want the unreadable copy alone", held.Unreadable, held.Readable)
	}
}

// The pass after a hold reads no further than the copies the hold checked:
// with limit 3, the copy behind the first three stays for the next pass.
func TestReplayAfterAHoldKeepsToTheLimit(t *testing.T) {
	store := openBolt(t)
	e := newReplayEnv(t, store)
	e.passConns(e.holdOn)
	e.publish(e.dispatchCopy("a", "ok.q"), unreadableCopy("poison"), e.dispatchCopy("b", "ok.q"), unreadableCopy("poison-2"))
	res, err := e.rp.Replay(context.Background(), 3)
	if err != nil || res.Replayed != 2 || res.Skipped != 1 || res.Details[0].MessageID != "poison" {
		t.Fatalf("Replay(3) = %+v, %v; want a and b replayed, poison skipped", res, err)
	}
	e.waitDepth(2)
}

// When the unreadable copy cannot be held aside, the pass fails as before,
// having stored nothing, and says why.
func TestReplayWhenHoldingFails(t *testing.T) {
	refused := errors.New("hold refused")
	for name, hold := range map[string]func(context.Context, string, int) (*broker.Held, error){
		"error":      func(context.Context, string, int) (*broker.Held, error) { return nil, refused },
		"found none": func(context.Context, string, int) (*broker.Held, error) { return &broker.Held{Readable: 1}, nil },
	} {
		t.Run(name, func(t *testing.T) {
			store := openBolt(t)
			e := newReplayEnv(t, store)
			e.passConns(hold)
			e.publish(e.dispatchCopy("a", "ok.q"), unreadableCopy("poison"))
			res, err := e.rp.Replay(context.Background(), 100)
			if !errors.Is(err, errUnreadableCopy) || res.Replayed != 0 {
				t.Fatalf("Replay = %+v, %v; want nothing replayed and errUnreadableCopy", res, err)
			}
			if name == "error" && !errors.Is(err, refused) {
				t.Errorf("err %v does not say why holding failed", err)
			}
			if name == "found none" && !strings.Contains(err.Error(), "no unreadable copy") {
				t.Errorf("err %v does not say none was found", err)
			}
			if _, err := store.Get(context.Background(), "a"); !errors.Is(err, storage.ErrNotFound) {
				t.Errorf("a stored by a failed pass: %v", err)
			}
			e.waitDepth(2)
		})
	}
}

// A copy whose id has a send pending is another send of it, stored and
// acknowledged, and so is each copy of one id in a pass (docs/contract.md
// §2.4, §4.4): replay leaves none of them on the error queue. The same copy
// replayed again while its send is pending (its acknowledgement was lost)
// is a redelivery of that send: acknowledged, not stored twice.
func TestReplayOfAPendingIDIsAnotherSend(t *testing.T) {
	store := openBolt(t)
	e := newReplayEnv(t, store)
	if out, err := store.Insert(context.Background(), []storage.Timeout{{ID: "pending", Destination: "ok.q", DueAt: t0.Add(time.Hour),
		Message: []byte{1}, Fingerprint: []byte("the send before")}}); err != nil || out[0] != storage.Stored {
		t.Fatalf("insert = %v, %v", out, err)
	}
	second := e.dispatchCopy("twice", "ok.q")
	second.Headers[wire.HeaderFailedAt] = t0.Add(time.Minute).Format(time.RFC3339Nano)
	e.publish(e.dispatchCopy("pending", "ok.q"), e.dispatchCopy("twice", "ok.q"), second)
	res, err := e.rp.Replay(context.Background(), 100)
	if err != nil || res.Replayed != 3 || res.Skipped != 0 {
		t.Fatalf("Replay = %+v, %v; want the 3 copies replayed, none skipped", res, err)
	}
	e.waitDepth(0)
	for _, key := range []string{"pending", wire.SendKey("pending", 2), "twice", wire.SendKey("twice", 2)} {
		if _, err := store.Get(context.Background(), key); err != nil {
			t.Errorf("%q: %v; want it stored", key, err)
		}
	}

	e.publish(second) // replayed already, its send pending
	if res, err = e.rp.Replay(context.Background(), 100); err != nil || res.Replayed != 1 || res.Skipped != 0 {
		t.Fatalf("Replay of the copy again = %+v, %v; want it taken off the error queue", res, err)
	}
	e.waitDepth(0)
	if _, err := store.Get(context.Background(), wire.SendKey("twice", 3)); !errors.Is(err, storage.ErrNotFound) {
		t.Errorf("the copy replayed again was stored as send 3: %v", err)
	}
}
