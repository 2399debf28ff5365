package ingest

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/broker/brokertest"
	"github.com/delaybridge/delaybridge/intake"
	"github.com/delaybridge/delaybridge/internal/amqptest"
	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/storage/boltstore"
	"github.com/delaybridge/delaybridge/storage/faultstore"
)

// groupSource reads a body "replace|G" as a replacement of group G by a
// message for queue "a", and "clear|G" as a cancel of group G; ids are
// the deliveries' message-ids. It stands for MassTransit's ScheduleMessage
// and CancelScheduledMessage.
var groupSource = intake.Source{Name: "groups", Queue: "q", Parser: intake.ParserFunc(parseGroups)}

func parseGroups(d *amqp.Delivery, now time.Time) intake.Intake {
	op, group, _ := strings.Cut(string(d.Body), "|")
	if op == "clear" {
		return intake.Intake{Op: intake.OpCancelSaga, SagaID: group}
	}
	return intake.Intake{Op: intake.OpReplace, ID: d.MessageId, SagaID: group, Destination: "a", DueAt: now.Add(time.Hour),
		Msg: amqp.Publishing{MessageId: d.MessageId, Body: d.Body}}
}

// replaceStore is a real bbolt store that counts its writes by kind, and
// fails ReplaceGroups while fail is set.
type replaceStore struct {
	*boltstore.Store
	mu                             sync.Mutex
	replaces, inserts, sagaCancels int
	groups                         [][]string
	fail                           error
}

func newReplaceStore(t *testing.T, now func() time.Time) *replaceStore {
	t.Helper()
	s, err := boltstore.Open(filepath.Join(t.TempDir(), "store.db"), boltstore.Options{Now: now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return &replaceStore{Store: s}
}

func (s *replaceStore) ReplaceGroups(ctx context.Context, groups []string, ts []storage.Timeout) ([]storage.Outcome, int, int, error) {
	s.mu.Lock()
	s.replaces++
	s.groups = append(s.groups, slices.Clone(groups))
	fail := s.fail
	s.mu.Unlock()
	if fail != nil {
		return nil, 0, 0, fail
	}
	return s.Store.ReplaceGroups(ctx, groups, ts)
}

func (s *replaceStore) Insert(ctx context.Context, ts []storage.Timeout) ([]storage.Outcome, error) {
	s.mu.Lock()
	s.inserts++
	s.mu.Unlock()
	return s.Store.Insert(ctx, ts)
}

func (s *replaceStore) CancelSaga(ctx context.Context, saga string) (int, int, error) {
	s.mu.Lock()
	s.sagaCancels++
	s.mu.Unlock()
	return s.Store.CancelSaga(ctx, saga)
}

func (s *replaceStore) counts() (replaces, inserts, sagaCancels int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.replaces, s.inserts, s.sagaCancels
}

// pendingByGroup lists the pending ids of each group.
func (s *replaceStore) pendingByGroup(t *testing.T) map[string][]string {
	t.Helper()
	rows, _, err := s.List(context.Background(), storage.ListFilter{Limit: 10000})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for _, r := range rows {
		out[r.SagaID] = append(out[r.SagaID], r.ID)
	}
	for _, ids := range out {
		slices.Sort(ids)
	}
	return out
}

// groupDeliveries hands out one delivery per body, with message-ids m0, m1...
func groupDeliveries(a *amqptest.Acker, bodies ...string) []amqp.Delivery {
	out := make([]amqp.Delivery, len(bodies))
	for i, b := range bodies {
		out[i] = a.Deliver(amqp.Delivery{MessageId: fmt.Sprint("m", i), Body: []byte(b)})
	}
	return out
}

// The replaces of a batch, of distinct groups, are one commit: the
// groups' earlier messages go, the new ones are stored, other groups keep
// theirs; a cancel of a group at the end of the batch applies after that
// commit; every delivery is acked once, after it. When
// the commit fails, every delivery is requeued and the cancel is not
// applied.
func TestReplacesShareOneCommit(t *testing.T) {
	now := func() time.Time { return now0 }
	store, pub, s := newReplaceStore(t, now), &brokertest.Publisher{}, amqptest.New(t)
	old := []storage.Timeout{
		{ID: "old-g1", SagaID: "g1", Destination: "a", DueAt: now0.Add(time.Hour)},
		{ID: "old-g2", SagaID: "g2", Destination: "a", DueAt: now0.Add(time.Hour)},
		{ID: "keep-h", SagaID: "h", Destination: "a", DueAt: now0.Add(time.Hour)},
		{ID: "plain", Destination: "a", DueAt: now0.Add(time.Hour)},
	}
	if _, err := store.Store.Insert(context.Background(), old); err != nil {
		t.Fatal(err)
	}
	var woke []time.Time
	in := newIngester(store, pub, &woke)
	handle := func(ds []amqp.Delivery) {
		t.Helper()
		handleAll(t, in, groupSource, pub, ds)
	}
	handle(groupDeliveries(s, "replace|g1", "replace|g2", "replace|g3", "clear|g3"))
	if r, i, c := store.counts(); r != 1 || i != 0 || c != 1 {
		t.Fatalf("%d ReplaceGroups, %d Insert, %d CancelSaga; want one commit of the replaces, then the cancel", r, i, c)
	}
	if g := store.groups[0]; !slices.Equal(g, []string{"g1", "g2", "g3"}) {
		t.Fatalf("groups replaced %v, want g1, g2, g3", g)
	}
	want := map[string][]string{"g1": {"m0"}, "g2": {"m1"}, "h": {"keep-h"}, "": {"plain"}}
	if got := store.pendingByGroup(t); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("pending %v, want %v", got, want)
	}
	for tag := uint64(1); tag <= 4; tag++ {
		if o := s.Outcome(tag); o != amqptest.Acked {
			t.Fatalf("delivery %d is %s, want acked", tag, o)
		}
	}
	if len(woke) != 1 || len(pub.Sent()) != 0 {
		t.Fatalf("%d wakes, %d error copies; want 1, 0", len(woke), len(pub.Sent()))
	}

	// A failed commit: everything requeued, the cancel after it too.
	store.fail = errors.New("disk")
	s2 := amqptest.New(t)
	handle(groupDeliveries(s2, "replace|g1", "replace|h", "clear|g2"))
	for tag := uint64(1); tag <= 3; tag++ {
		if o := s2.Outcome(tag); o != amqptest.Requeued {
			t.Fatalf("delivery %d after a failed commit is %s, want requeued", tag, o)
		}
	}
	if _, _, c := store.counts(); c != 1 {
		t.Fatalf("the cancel after a failed commit was applied (%d CancelSaga)", c)
	}
	if got := store.pendingByGroup(t); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("pending after a failed commit %v, want %v", got, want)
	}
}

// A replace whose group an earlier message of the batch belongs to does
// not fit the batch (it starts the next), nor does a replace after a
// cancel, or a cancel after a replace; any other message fits. A replace
// does not end its batch; a saga's cancel does.
func TestReplaceFitsAndEndsBatch(t *testing.T) {
	var woke []time.Time
	with := newIngester(newReplaceStore(t, nil), nil, &woke)
	e := func(op intake.Op, group string) entry {
		return entry{intake: intake.Intake{Op: op, SagaID: group}}
	}
	batch := []entry{e(intake.OpReplace, "g1"), e(intake.OpSchedule, "s"), e(intake.OpReject, "g3")}
	cancelled := []entry{e(intake.OpSchedule, "s"), e(intake.OpCancel, ""), e(intake.OpSchedule, "")}
	for _, c := range []struct {
		batch []entry
		e     entry
		fits  bool
	}{
		{batch, e(intake.OpReplace, "g2"), true},
		{batch, e(intake.OpReplace, "g1"), false},
		{batch, e(intake.OpReplace, "s"), false},
		{batch, e(intake.OpReplace, "g3"), true}, // a rejection stores nothing
		{batch, e(intake.OpSchedule, "g1"), true},
		{batch, e(intake.OpCancelSaga, "g1"), true},
		{batch, e(intake.OpCancel, ""), false},
		{cancelled, e(intake.OpReplace, "g1"), false},
		{cancelled, e(intake.OpCancel, ""), true},
		{cancelled, e(intake.OpSchedule, "s"), true},
	} {
		if got := with.fits(c.batch, &c.e); got != c.fits {
			t.Errorf("fits(%v %q) after %d entries = %v, want %v", c.e.intake.Op, c.e.intake.SagaID, len(c.batch), got, c.fits)
		}
	}
	if intake.OpReplace.EndsBatch() || intake.OpCancel.EndsBatch() {
		t.Error("a replace and a cancel must not end their batch")
	}
	if !intake.OpCancelSaga.EndsBatch() {
		t.Error("a saga's cancel must end its batch")
	}
}

// Over the real broker: a stream of replaces of ten groups, each group
// replaced again and again, then a cancel of one group and a replace of it
// after the cancel, comes out as if applied one by one (each group holds
// its last message; the cancelled group only the one after the cancel), in
// fewer commits than replaces, and nothing is left unacknowledged.
func TestReplacesBatchOverAMQP(t *testing.T) {
	ach := testChannel(t)
	q := "ingest-replace-test-" + uuid.NewString()[:8]
	declareTestQueues(t, ach, q)
	store := newReplaceStore(t, nil)
	const groups, rounds = 10, 8
	var bodies []string
	last := map[string]string{}
	for i := range groups * rounds {
		g := fmt.Sprint("g", i%groups)
		bodies = append(bodies, "replace|"+g)
		last[g] = fmt.Sprint("r", i)
	}
	bodies = append(bodies, "clear|g3", "replace|g3")
	last["g3"] = fmt.Sprint("r", len(bodies)-1)
	for i, b := range bodies {
		if err := ach.PublishWithContext(context.Background(), "", q, true, false,
			amqp.Publishing{MessageId: fmt.Sprint("r", i), Body: []byte(b)}); err != nil {
			t.Fatal(err)
		}
	}
	src := groupSource
	src.Queue = q
	stop := runIngester(t, store, &brokertest.Publisher{}, Options{Sources: []intake.Source{src}, Prefetch: 200, MaxBatch: 100, Linger: 200 * time.Millisecond})
	want := map[string][]string{}
	for g, id := range last {
		want[g] = []string{id}
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		got := store.pendingByGroup(t)
		_, _, c := store.counts()
		if fmt.Sprint(got) == fmt.Sprint(want) && c > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pending %v after %d CancelSaga, want %v after 1", got, c, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// A last message, stored only once every earlier batch was settled
	// (one session takes a batch after the other): stopping then cannot cut
	// off the acknowledgement of the batch that made the state above.
	if err := ach.PublishWithContext(context.Background(), "", q, true, false,
		amqp.Publishing{MessageId: "sentinel", Body: []byte("replace|sentinel")}); err != nil {
		t.Fatal(err)
	}
	for len(store.pendingByGroup(t)["sentinel"]) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the sentinel was not stored")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	replaces := len(bodies) // the cancel's place taken by the sentinel
	if r, i, c := store.counts(); r >= replaces || i != 0 || c != 1 {
		t.Errorf("%d ReplaceGroups, %d Insert and %d CancelSaga for %d replaces and a cancel; want fewer commits than replaces, and the cancel",
			r, i, c, replaces)
	}
	for _, g := range store.groups {
		if len(slices.Compact(slices.Sorted(slices.Values(g)))) != len(g) {
			t.Errorf("one commit replaced a group twice: %v", g)
		}
	}
	// Left in the queue: the sentinel at most.
	for {
		m, ok, err := ach.Get(q, true)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		if m.MessageId != "sentinel" {
			t.Errorf("%s still holds %s: a delivery was not acknowledged", q, m.MessageId)
		}
	}
}

// Through the fault-injecting store, as the bridge's tests run it: a batch
// of replaces commits with ReplaceGroups, which fails with Insert's fault
// (every delivery requeued, nothing stored, no Insert tried), and commits
// once healed.
func TestReplacesFailWithInsertFaults(t *testing.T) {
	inner := newReplaceStore(t, func() time.Time { return now0 })
	fs := faultstore.Wrap(inner.Store)
	fs.FailInsert(errors.New("disk full"))
	pub := &brokertest.Publisher{}
	var woke []time.Time
	in := newIngester(fs, pub, &woke)
	s := amqptest.New(t)
	handleAll(t, in, groupSource, pub, groupDeliveries(s, "replace|g1", "replace|g2"))
	for tag := uint64(1); tag <= 2; tag++ {
		if o := s.Outcome(tag); o != amqptest.Requeued {
			t.Fatalf("delivery %d is %s after a failed commit, want requeued", tag, o)
		}
	}
	if r, i := fs.Calls(faultstore.ReplaceGroups), fs.Calls(faultstore.Insert); r != 1 || i != 0 {
		t.Fatalf("%d ReplaceGroups, %d Insert; want the batch's one ReplaceGroups", r, i)
	}
	if got := inner.pendingByGroup(t); len(got) != 0 {
		t.Fatalf("pending after a failed commit: %v", got)
	}
	fs.Heal()
	s2 := amqptest.New(t)
	handleAll(t, in, groupSource, pub, groupDeliveries(s2, "replace|g1", "replace|g2"))
	if o1, o2 := s2.Outcome(1), s2.Outcome(2); o1 != amqptest.Acked || o2 != amqptest.Acked {
		t.Fatalf("deliveries %s, %s once healed; want acked", o1, o2)
	}
	want := map[string][]string{"g1": {"m0"}, "g2": {"m1"}}
	if got := inner.pendingByGroup(t); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("pending once healed %v, want %v", got, want)
	}
	if fs.Calls(faultstore.ReplaceGroups) != 2 || fs.Calls(faultstore.Insert) != 0 || len(pub.Sent()) != 0 {
		t.Fatalf("%d ReplaceGroups, %d Insert, %d error copies; want 2, 0, 0",
			fs.Calls(faultstore.ReplaceGroups), fs.Calls(faultstore.Insert), len(pub.Sent()))
	}
}
