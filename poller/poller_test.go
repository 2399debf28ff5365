package poller

import (
	"context"
	"errors"
	"fmt"
	amqp "github.com/rabbitmq/amqp091-go"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/internal/logtest"
	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/storage/boltstore"
	"github.com/delaybridge/delaybridge/storage/faultstore"
	"github.com/delaybridge/delaybridge/wire"
)

type fakePublisher struct {
	mu     sync.Mutex
	tokens []wire.Token
	fail   error
	sent   chan struct{}
	closed int
	modes  []uint8 // each message's delivery mode
	// attempts counts Publish calls, failed ones too.
	attempts int
	// gone: its channel closed (IsClosed); Publish then fails.
	gone bool
}

func (p *fakePublisher) IsClosed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.gone
}

// lose closes its channel, as a lost connection does.
func (p *fakePublisher) lose() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.gone = true
	p.fail = fmt.Errorf("%w: %w", broker.ErrNotConfirmed, broker.ErrChannelClosed)
}

func (p *fakePublisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed++
	return nil
}

func (p *fakePublisher) Publish(_ context.Context, msgs []broker.Outgoing) []error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.attempts++
	res := make([]error, len(msgs))
	for i, m := range msgs {
		if p.fail != nil {
			res[i] = p.fail
			continue
		}
		toks, err := wire.DecodeTokens(m.Msg.Body)
		if err != nil {
			panic(err)
		}
		p.tokens = append(p.tokens, toks...)
		p.modes = append(p.modes, m.Msg.DeliveryMode)
	}
	select {
	case p.sent <- struct{}{}:
	default:
	}
	return res
}

func (p *fakePublisher) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.tokens)
}

func openStore(t *testing.T) *boltstore.Store {
	t.Helper()
	s, err := boltstore.Open(filepath.Join(t.TempDir(), "s.db"), boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func insert(t *testing.T, s *boltstore.Store, id string, due time.Time) {
	t.Helper()
	if _, err := s.Insert(context.Background(), []storage.Timeout{{ID: id, Destination: "q", DueAt: due, Message: []byte{1}}}); err != nil {
		t.Fatal(err)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testenv.WaitFor(t, 5*time.Second, what, cond)
}

func TestWakeInterruptsALongSleep(t *testing.T) {
	store := openStore(t)
	pub := &fakePublisher{sent: make(chan struct{}, 1)}
	p := New(store, source(pub), Options{Owner: "o", BatchSize: 10, LeaseDuration: time.Minute,
		PollInterval: time.Hour, Logger: zerolog.Nop()})
	insert(t, store, "later", time.Now().Add(time.Hour))
	testenv.Start(t, p.Run)
	waitFor(t, "the poller to sleep toward the hour", func() bool {
		return p.sleepUntil.Load() < int64(1<<62) && p.sleepUntil.Load() > time.Now().Add(30*time.Minute).UnixNano()
	})
	// A message due now arrives: without the wake the poller would sleep an hour.
	insert(t, store, "now", time.Now())
	p.Wake(time.Now())
	select {
	case <-pub.sent:
	case <-time.After(5 * time.Second):
		t.Fatal("Wake did not make the poller lease the new due message")
	}
	if pub.count() != 1 || pub.tokens[0].ID != "now" {
		t.Fatalf("tokens %+v", pub.tokens)
	}
}

// A Wake for a time after the one the poller sleeps toward is ignored: that
// sleep ends before it anyway. A running poller takes a wake off its channel
// at once and goes back to sleep, which would hide a wrong wake; so the
// poller is stopped while it sleeps, its state kept, and the channel then
// shows every wake sent. A Wake for an earlier time, which must wake, shows
// that the check sees one.
func TestWakeForALaterTimeDoesNotWake(t *testing.T) {
	store := openStore(t)
	pub := &fakePublisher{}
	p := New(store, source(pub), Options{Owner: "o", BatchSize: 10, LeaseDuration: time.Minute,
		PollInterval: time.Hour, Logger: zerolog.Nop()})
	soon := time.Now().Add(time.Hour)
	insert(t, store, "soon", soon)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	waitFor(t, "the poller to sleep toward the row", func() bool { return p.sleepUntil.Load() < int64(1<<62) })
	until := time.Unix(0, p.sleepUntil.Load())
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if until.Before(soon.Add(-time.Minute)) {
		t.Fatalf("the poller sleeps until %s, want about the row's due time %s", until, soon)
	}
	p.sleepUntil.Store(until.UnixNano()) // as while it slept, whatever Run left
	select {
	case <-p.wake:
	default:
	}

	for _, later := range []time.Time{until.Add(time.Nanosecond), until.Add(time.Second), soon.Add(time.Hour)} {
		p.Wake(later)
		if len(p.wake) != 0 {
			t.Fatalf("Wake(sleep end + %s) woke a poller sleeping until %s; a wake for a later time must be ignored",
				later.Sub(until), until.Format(time.RFC3339Nano))
		}
	}
	p.Wake(until.Add(-time.Millisecond))
	if len(p.wake) != 1 {
		t.Fatal("a Wake for a time before the sleep's end did not wake: the check above cannot see a wake")
	}
}

func TestSleepsUntilTheNextDueTimeNotThePollInterval(t *testing.T) {
	store := openStore(t)
	pub := &fakePublisher{}
	p := New(store, source(pub), Options{Owner: "o", BatchSize: 10, LeaseDuration: time.Minute,
		PollInterval: time.Hour, Logger: zerolog.Nop()})
	due := time.Now().Add(150 * time.Millisecond)
	insert(t, store, "a", due)
	testenv.Start(t, p.Run)
	waitFor(t, "the due message", func() bool { return pub.count() == 1 })
	if now := time.Now(); now.Before(due) {
		t.Fatalf("leased %s before due", due.Sub(now))
	}
}

func TestFullBatchesDrainWithoutSleeping(t *testing.T) {
	store := openStore(t)
	pub := &fakePublisher{}
	p := New(store, source(pub), Options{Owner: "o", BatchSize: 7, TokensPerMessage: 3, LeaseDuration: time.Minute,
		PollInterval: time.Hour, Logger: zerolog.Nop()})
	for i := range 50 {
		insert(t, store, fmt.Sprint(i), time.Now().Add(-time.Second))
	}
	testenv.Start(t, p.Run)
	waitFor(t, "all 50 handed over", func() bool { return pub.count() == 50 })
	seen := map[string]bool{}
	for _, tok := range pub.tokens {
		if seen[tok.ID] {
			t.Fatalf("%s handed over twice", tok.ID)
		}
		seen[tok.ID] = true
	}
}

// Hand-overs are persistent unless Options.Transient says otherwise.
func TestHandOverDeliveryMode(t *testing.T) {
	for _, transient := range []bool{false, true} {
		store := openStore(t)
		pub := &fakePublisher{}
		p := New(store, source(pub), Options{Owner: "o", BatchSize: 10, LeaseDuration: time.Minute,
			PollInterval: time.Hour, Transient: transient, Logger: zerolog.Nop()})
		insert(t, store, "a", time.Now().Add(-time.Second))
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- p.Run(ctx) }()
		waitFor(t, "the hand-over", func() bool { return pub.count() == 1 })
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		want := uint8(amqp.Persistent)
		if transient {
			want = amqp.Transient
		}
		pub.mu.Lock()
		if len(pub.modes) != 1 || pub.modes[0] != want {
			t.Errorf("Transient %v: delivery modes %v, want [%d]", transient, pub.modes, want)
		}
		pub.mu.Unlock()
	}
}

// A hand-over the broker did not confirm releases its leases at once: the
// row does not wait out its hour-long lease, it is leased and handed over
// again, and once Run has returned it is left unleased.
func TestUnpublishedLeasesAreReleased(t *testing.T) {
	store := openStore(t)
	pub := &fakePublisher{fail: fmt.Errorf("%w: boom", broker.ErrNotConfirmed)}
	p := New(store, source(pub), Options{Owner: "o", BatchSize: 10, LeaseDuration: time.Hour,
		PollInterval: time.Hour, Logger: zerolog.Nop()})
	insert(t, store, "a", time.Now().Add(-time.Second))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	waitFor(t, "a second hand-over of the released row", func() bool {
		pub.mu.Lock()
		defer pub.mu.Unlock()
		return pub.attempts >= 2
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	row, err := store.Get(context.Background(), "a")
	if err != nil || row.Lock != "" {
		t.Fatalf("lease kept after the dispatcher message failed (would wait an hour): %+v %v", row, err)
	}
}

func source(p Publisher) NewPublisher {
	return func(context.Context) (Publisher, error) { return p, nil }
}

// sequence opens pubs in turn, the last one for every later call.
func sequence(pubs ...Publisher) NewPublisher {
	var mu sync.Mutex
	return func(context.Context) (Publisher, error) {
		mu.Lock()
		defer mu.Unlock()
		pub := pubs[0]
		if len(pubs) > 1 {
			pubs = pubs[1:]
		}
		return pub, nil
	}
}

// leaseToTheCap runs a poller with MaxLeased 12 over 40 due rows of inner
// (served as store) and returns its publisher once the poller stopped at the
// cap.
func leaseToTheCap(t *testing.T, inner *boltstore.Store, store Store) *fakePublisher {
	t.Helper()
	pub := pollCapped(t, inner, store, 40, 12)
	waitFor(t, "the cap", func() bool { return pub.count() >= 12 })
	time.Sleep(100 * time.Millisecond)
	if n := pub.count(); n > 15 { // at most one batch past the cap
		t.Fatalf("leased %d with MaxLeased 12 and nothing dispatched", n)
	}
	return pub
}

func TestStopsLeasingAtMaxLeased(t *testing.T) {
	store := openStore(t)
	pub := leaseToTheCap(t, store, store)
	// Dispatching (removing) leased rows lets the poller go on.
	var refs []storage.Ref
	pub.mu.Lock()
	for _, tok := range pub.tokens {
		refs = append(refs, storage.Ref{ID: tok.ID, Lock: tok.Lock})
	}
	pub.mu.Unlock()
	if _, err := store.Remove(context.Background(), refs); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "more after the backlog shrank", func() bool { return pub.count() > 15 })
}

// MaxLeased caps this instance's own leases (storage.LeaseCounter): on a
// shared store, another instance's backlog does not stop it.
func TestMaxLeasedCountsOwnLeasesOnly(t *testing.T) {
	store := openStore(t)
	for i := range 30 {
		insert(t, store, fmt.Sprint(i), time.Now().Add(-time.Second))
	}
	if ls, err := store.Lease(context.Background(), "other", time.Time{}, 20, time.Hour); err != nil || len(ls) != 20 {
		t.Fatalf("the other instance leased %d (%v)", len(ls), err)
	}
	pub := &fakePublisher{}
	p := New(store, source(pub), Options{Owner: "me", BatchSize: 5, MaxLeased: 12, LeaseDuration: time.Hour,
		PollInterval: time.Hour, Logger: zerolog.Nop()})
	testenv.Start(t, p.Run)
	waitFor(t, "this instance's leases despite the other's 20", func() bool { return pub.count() == 10 })
}

// A store behind the fault-injecting wrapper, as in the bridge's own tests,
// brakes as the store does: the wrapper forwards LeasedBy.
func TestMaxLeasedThroughTheFaultStore(t *testing.T) {
	store := openStore(t)
	fs := faultstore.Wrap(store)
	leaseToTheCap(t, store, fs)
	if fs.Calls(faultstore.LeasedBy) == 0 {
		t.Fatal("LeasedBy was not called")
	}
}

// The poller counts its leases only when what it counted last plus what it
// leased since could reach the cap: far below it, once.
func TestMaxLeasedCountsOnlyNearTheCap(t *testing.T) {
	store := openStore(t)
	fs := faultstore.Wrap(store)
	pub := pollCapped(t, store, fs, 40, 1000)
	waitFor(t, "every row", func() bool { return pub.count() == 40 })
	if n := fs.Calls(faultstore.LeasedBy); n != 1 {
		t.Fatalf("LeasedBy called %d times for 8 leases of 5 under a cap of 1000, want 1", n)
	}
}

// A store that fails to count does not stop leasing: the cap is a brake.
func TestMaxLeasedCountFailing(t *testing.T) {
	store := openStore(t)
	fs := faultstore.Wrap(store)
	fs.Fail(faultstore.LeasedBy, errors.New("count failed"))
	pub := pollCapped(t, store, fs, 20, 5)
	waitFor(t, "every row despite the failing count", func() bool { return pub.count() == 20 })
}

// pollCapped inserts n due rows into inner and runs a poller with
// MaxLeased maxLeased over them (served as store); it returns the poller's
// publisher.
func pollCapped(t *testing.T, inner *boltstore.Store, store Store, n, maxLeased int) *fakePublisher {
	t.Helper()
	for i := range n {
		insert(t, inner, fmt.Sprint(i), time.Now().Add(-time.Second))
	}
	pub := &fakePublisher{}
	p := New(store, source(pub), Options{Owner: "o", BatchSize: 5, MaxLeased: maxLeased, LeaseDuration: time.Minute,
		PollInterval: time.Hour, Logger: zerolog.Nop()})
	testenv.Start(t, p.Run)
	return pub
}

// A publisher whose hand-over failed is closed, and the next one takes the
// released leases.
func TestAFailedPublisherIsClosed(t *testing.T) {
	store := openStore(t)
	insert(t, store, "a", time.Now().Add(-time.Second))
	failing := &fakePublisher{fail: fmt.Errorf("%w: boom", broker.ErrNotConfirmed)}
	next := &fakePublisher{}
	p := New(store, sequence(failing, next), Options{Owner: "o", BatchSize: 10, LeaseDuration: time.Hour, PollInterval: time.Hour, Logger: zerolog.Nop()})
	testenv.Start(t, p.Run)
	waitFor(t, "the next publisher to take the row", func() bool { return next.count() == 1 })
	failing.mu.Lock()
	defer failing.mu.Unlock()
	if failing.closed != 1 {
		t.Fatalf("the failed publisher was closed %d times, want once", failing.closed)
	}
}

// A publisher whose channel closed while it waited in its slot (the
// connection was lost between hand-overs) is replaced before the next
// hand-over, not published on: that hand-over would fail, its leases be
// released, and the poller pause, once per such publisher.
func TestAClosedPublisherIsReplacedBeforeUse(t *testing.T) {
	store := openStore(t)
	insert(t, store, "a", time.Now().Add(-time.Second))
	lost := &fakePublisher{}
	next := &fakePublisher{}
	p := New(store, sequence(lost, next), Options{Owner: "o", BatchSize: 10, LeaseDuration: time.Hour, PollInterval: time.Hour, Publishers: 1, Logger: zerolog.Nop()})
	testenv.Start(t, p.Run)
	waitFor(t, "the first hand-over", func() bool { return lost.count() == 1 })
	waitFor(t, "the poller to sleep", func() bool { return p.sleepUntil.Load() < int64(1<<62) })
	lost.lose()
	insert(t, store, "b", time.Now().Add(-time.Second))
	p.Wake(time.Now())
	waitFor(t, "the new publisher to hand the row over", func() bool { return next.count() == 1 })
	lost.mu.Lock()
	defer lost.mu.Unlock()
	if lost.attempts != 1 {
		t.Errorf("the closed publisher was published on %d times, want once (before its channel closed)", lost.attempts)
	}
	if lost.closed != 1 {
		t.Errorf("the closed publisher was closed %d times, want once", lost.closed)
	}
}

// A hand-over the broker failed under gives its leases back together
// (storage.ReleaseEach), not one store commit after another: here a store
// whose every Release takes 100 ms.
func TestAFailedHandOverReleasesItsLeasesTogether(t *testing.T) {
	inner := openStore(t)
	store := faultstore.Wrap(inner)
	const n = 20
	for i := range n {
		insert(t, inner, fmt.Sprint(i), time.Now().Add(-time.Second))
	}
	p := New(store, nil, Options{Owner: "o", BatchSize: n, TokensPerMessage: 3, LeaseDuration: time.Hour, Logger: zerolog.Nop()})
	leases, err := store.Lease(context.Background(), "o", time.Time{}, n, time.Hour)
	if err != nil || len(leases) != n {
		t.Fatalf("Lease = %d, %v", len(leases), err)
	}
	pub := &fakePublisher{}
	pub.lose()
	const each = 100 * time.Millisecond
	store.Delay(faultstore.Release, each)
	began := time.Now()
	if err := p.handOver(context.Background(), pub, leases); !errors.Is(err, broker.ErrChannelClosed) {
		t.Fatalf("handOver = %v, want the closed channel reported", err)
	}
	took := time.Since(began)
	if c := store.Calls(faultstore.Release); c != n {
		t.Fatalf("%d releases, want %d", c, n)
	}
	if again, err := inner.Lease(context.Background(), "o", time.Time{}, n+1, time.Hour); err != nil || len(again) != n {
		t.Fatalf("Lease after the failed hand-over = %d rows, %v; want all %d", len(again), err, n)
	}
	if took > n*each/4 {
		t.Errorf("the hand-over's %d releases took %s, want about one release's %s (they are released together)", n, took.Round(time.Millisecond), each)
	}
}

// Hand-overs in flight together when the connection is lost fail
// together: the poller pauses once for them, not once per hand-over.
func TestHandOversFailingTogetherPauseOnce(t *testing.T) {
	store := openStore(t)
	for i := range 10 {
		insert(t, store, fmt.Sprint(i), time.Now().Add(-time.Second))
	}
	logs := &logtest.Buffer{}
	failed := fmt.Errorf("%w: %w", broker.ErrNotConfirmed, broker.ErrChannelClosed)
	first := &blockingPublisher{entered: make(chan struct{}, 1), release: make(chan struct{})}
	second := &blockingPublisher{entered: make(chan struct{}, 1), release: make(chan struct{})}
	first.fail, second.fail = failed, failed
	next := &fakePublisher{}
	p := New(store, sequence(first, second, next), Options{Owner: "o", BatchSize: 5, LeaseDuration: time.Hour, PollInterval: time.Hour, Publishers: 2,
		Logger: zerolog.New(logs)})
	testenv.Start(t, p.Run)
	<-first.entered
	<-second.entered
	close(first.release)
	waitFor(t, "the first failure's warning", func() bool { return logs.CountMessage(handOverFailed) == 1 })
	close(second.release) // fails during the pause
	waitFor(t, "the released rows handed over again", func() bool { return next.count() == 10 })
	if n := logs.CountMessage(handOverFailed); n != 1 {
		t.Errorf("%d pauses (warnings) for two hand-overs that failed together, want 1", n)
	}
}

const handOverFailed = "handing over to the dispatcher failed; resuming on the next broker connection"

// blockingPublisher holds every Publish until release closes.
type blockingPublisher struct {
	fakePublisher
	entered chan struct{}
	release chan struct{}
}

func (p *blockingPublisher) Publish(ctx context.Context, msgs []broker.Outgoing) []error {
	p.entered <- struct{}{}
	<-p.release
	return p.fakePublisher.Publish(ctx, msgs)
}

// A hand-over waiting for its confirm (a broker fsync stall) does not hold
// up the next batch: it goes out on another publisher. And Run returns only
// once the stalled one is confirmed, having closed every publisher.
func TestHandOversDoNotWaitForEachOther(t *testing.T) {
	store := openStore(t)
	for i := range 10 {
		insert(t, store, fmt.Sprint(i), time.Now().Add(-time.Second))
	}
	stalled := &blockingPublisher{entered: make(chan struct{}, 1), release: make(chan struct{})}
	next := &fakePublisher{}
	var mu sync.Mutex
	opened := 0
	p := New(store, func(context.Context) (Publisher, error) {
		mu.Lock()
		defer mu.Unlock()
		opened++
		if opened == 1 {
			return stalled, nil
		}
		return next, nil
	}, Options{Owner: "o", BatchSize: 5, LeaseDuration: time.Hour, PollInterval: time.Hour, Publishers: 2, Logger: zerolog.Nop()})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	<-stalled.entered
	waitFor(t, "the second batch despite the first one's stalled confirm", func() bool { return next.count() == 5 })
	cancel()
	select {
	case err := <-done:
		t.Fatalf("Run returned (%v) with a hand-over unconfirmed", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(stalled.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if stalled.count() != 5 {
		t.Fatalf("the stalled hand-over carried %d tokens, want 5", stalled.count())
	}
	stalled.mu.Lock()
	next.mu.Lock()
	defer stalled.mu.Unlock()
	defer next.mu.Unlock()
	if stalled.closed != 1 || next.closed != 1 {
		t.Fatalf("publishers closed %d and %d times at shutdown, want once each", stalled.closed, next.closed)
	}
}
