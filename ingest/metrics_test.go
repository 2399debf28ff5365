package ingest

import (
	"errors"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/internal/amqptest"
	"github.com/delaybridge/delaybridge/wire"
)

type recorder struct {
	ingested, duplicates int
	errorQueued          map[string]int
	commits              int
}

func (r *recorder) Ingested(n int)             { r.ingested += n }
func (r *recorder) DuplicatesSuppressed(n int) { r.duplicates += n }
func (r *recorder) ErrorQueued(stage string, n int) {
	if r.errorQueued == nil {
		r.errorQueued = map[string]int{}
	}
	r.errorQueued[stage] += n
}
func (r *recorder) ObserveIngestCommit(time.Duration) { r.commits++ }

func TestMetrics(t *testing.T) {
	store, pub, s := &fakeStore{}, &fakePublisher{}, amqptest.New(t)
	var woke []time.Time
	in := newIngester(store, pub, &woke)
	rec := &recorder{}
	in.opts.Metrics = rec
	good := amqp.Table{wire.HeaderDestination: "a", wire.HeaderDelay: int32(1)}
	b := deliveries(s, good, good, amqp.Table{}, good)
	b[3].MessageId = "m0" // a duplicate of the first
	if err := in.take(pub, b); err != nil {
		t.Fatal(err)
	}
	if rec.ingested != 2 || rec.duplicates != 1 || rec.errorQueued[wire.StageIngest] != 1 || rec.commits != 1 {
		t.Errorf("%+v; want 2 ingested, 1 duplicate, 1 error-queued at ingest, 1 commit", rec)
	}

	// Nothing is counted for a failed commit or an unconfirmed copy.
	store.fail, pub.fail = errors.New("disk on fire"), broker.ErrNacked
	if err := in.take(pub, deliveries(amqptest.New(t), good)); err != nil {
		t.Fatal(err)
	}
	store.fail = nil
	if err := in.take(pub, deliveries(amqptest.New(t), amqp.Table{})); err != nil {
		t.Fatal(err)
	}
	if rec.ingested != 2 || rec.errorQueued[wire.StageIngest] != 1 || rec.commits != 1 {
		t.Errorf("%+v after failures; want the counts unchanged", rec)
	}
}
