package ingest

import (
	"errors"
	"slices"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/rs/zerolog"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/broker/brokertest"
	"github.com/delaybridge/delaybridge/errorqueue"
	"github.com/delaybridge/delaybridge/internal/amqptest"
	"github.com/delaybridge/delaybridge/metrics"
	"github.com/delaybridge/delaybridge/wire"
)

type recorder struct {
	ingested, duplicates int
	errorQueued          map[string]int
	dropped              map[string]int
	commits              int
}

func (r *recorder) Ingested(n int)             { r.ingested += n }
func (r *recorder) DuplicatesSuppressed(n int) { r.duplicates += n }
func (r *recorder) Dropped(reason string, n int) {
	if r.dropped == nil {
		r.dropped = map[string]int{}
	}
	r.dropped[reason] += n
}
func (r *recorder) ErrorQueued(stage string, n int) {
	if r.errorQueued == nil {
		r.errorQueued = map[string]int{}
	}
	r.errorQueued[stage] += n
}
func (r *recorder) ObserveIngestCommit(time.Duration) { r.commits++ }

func TestMetrics(t *testing.T) {
	store, pub, s := &fakeStore{}, &brokertest.Publisher{}, amqptest.New(t)
	var woke []time.Time
	in := newIngester(store, pub, &woke)
	rec := &recorder{}
	in.opts.Metrics = rec
	in.opts.Errors = errorqueue.New(errorqueue.Options{Queue: "error", Metrics: rec, Now: in.opts.Now, Logger: zerolog.Nop()})
	good := amqp.Table{wire.HeaderDestination: "a", wire.HeaderDelay: int32(1)}
	b := deliveries(s, good, good, amqp.Table{}, good, good)
	b[3].MessageId, b[3].Body = "m0", b[0].Body // a redelivery of the first
	b[4].MessageId = "m0"                       // another send of its id
	if err := in.take(pub, b); err != nil {
		t.Fatal(err)
	}
	if rec.ingested != 3 || rec.duplicates != 1 || rec.dropped[DropDuplicate] != 1 || rec.errorQueued[wire.StageIngest] != 1 || rec.commits != 1 {
		t.Errorf("%+v; want 3 ingested, 1 duplicate (dropped as such), 1 error-queued at ingest, 1 commit", rec)
	}

	// Nothing is counted for a failed commit or an unconfirmed copy.
	store.fail, pub.Outcome = errors.New("disk on fire"), brokertest.Always(broker.ErrNacked)
	if err := in.take(pub, deliveries(amqptest.New(t), good)); err != nil {
		t.Fatal(err)
	}
	store.fail = nil
	if err := in.take(pub, deliveries(amqptest.New(t), amqp.Table{})); err != nil {
		t.Fatal(err)
	}
	if rec.ingested != 3 || rec.errorQueued[wire.StageIngest] != 1 || rec.commits != 1 {
		t.Errorf("%+v after failures; want the counts unchanged", rec)
	}
}

// The reasons ingest drops for are the label values the metrics declare.
func TestDropReasonsDeclared(t *testing.T) {
	for _, r := range []string{DropDuplicate, DropCancelled, DropReplaced} {
		if !slices.Contains(metrics.DropReasons, r) {
			t.Errorf("drop reason %q is not in metrics.DropReasons %v", r, metrics.DropReasons)
		}
	}
	if len(metrics.DropReasons) != 3 {
		t.Errorf("metrics.DropReasons = %v, want the 3 reasons of ingest", metrics.DropReasons)
	}
}
