package poller

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/storage/faultstore"
	"github.com/delaybridge/delaybridge/wire"
)

// While only a paused destination's rows are due, the poller sleeps toward
// its poll interval instead of spinning on rows it cannot lease (NextDue
// leaves them out); after Resume and a Wake it hands them over.
func TestPausedRowsDoNotSpinThePoller(t *testing.T) {
	inner := openStore(t)
	store := faultstore.Wrap(inner)
	for i := range 5 {
		insert(t, inner, fmt.Sprint("p", i), time.Now().Add(-time.Minute))
	}
	if _, err := inner.Pause(context.Background(), wire.Queue("q"), ""); err != nil {
		t.Fatal(err)
	}
	pub := &fakePublisher{}
	p := New(store, source(pub), Options{Owner: "o", BatchSize: 10, LeaseDuration: time.Minute,
		PollInterval: time.Hour, Logger: zerolog.Nop()})
	testenv.Start(t, p.Run)
	waitFor(t, "the poller to sleep toward its poll interval", func() bool {
		return p.sleepUntil.Load() < int64(1<<62) && p.sleepUntil.Load() > time.Now().Add(30*time.Minute).UnixNano()
	})
	leases := store.Calls(faultstore.Lease)
	time.Sleep(50 * time.Millisecond)
	if n := store.Calls(faultstore.Lease); n != leases || n > 2 {
		t.Fatalf("%d Lease calls while only paused rows are due (%d before the pause)", n, leases)
	}
	if pub.count() != 0 {
		t.Fatalf("handed over %d paused rows", pub.count())
	}
	if _, err := inner.Resume(context.Background(), wire.Queue("q")); err != nil {
		t.Fatal(err)
	}
	p.Wake(time.Now())
	waitFor(t, "the resumed rows", func() bool { return pub.count() == 5 })
}
