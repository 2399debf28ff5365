package broker

import (
	"context"
	"sync"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/budget"
)

// A budgeted consumer (ConsumeOptions.Budget) counts the body bytes of the
// deliveries it hands over against a byte budget, and gives them back when
// each delivery is settled (ack, nack or reject, multiple or not) or the
// session ends. It also sizes the consumer's prefetch to the bodies it sees:
// the amqp091-go client buffers every delivery the broker pushes, without
// limit, so only a prefetch count small enough for the message size bounds
// the bytes in that buffer. RabbitMQ does not implement prefetch-size, and a
// consumer's prefetch count is fixed when it starts (basic.qos with global
// false applies to new consumers only), so a new count takes a new consumer
// on the same channel: cancel, basic.qos, consume. The deliveries of the old
// consumer are handed over first, so the order is kept, and they can still
// be settled on the channel.

// prefetchFor is the prefetch count that keeps size-byte messages within
// total bytes: at least 1, at most max.
func prefetchFor(total, size int64, limit int) int {
	if size <= 0 {
		return limit
	}
	return int(max(1, min(total/size, int64(limit))))
}

// flow is one budgeted session: what its handed-over deliveries hold, and
// its current consumer.
type flow struct {
	b    *budget.Budget
	ch   *amqp.Channel
	opts ConsumeOptions

	heldMu sync.Mutex
	held   map[uint64]int64 // delivery tag → bytes acquired

	// mu guards the consumer; resize holds it through its broker calls,
	// which acks (heldMu) need not wait for.
	mu       sync.Mutex
	tag      string // the current consumer
	stopped  bool   // Session.Cancel was called: no new consumer
	prefetch int
	// seen and largest describe the deliveries since the current consumer
	// started: the prefetch grows once a whole window of them was small.
	seen    int
	largest int64
}

// initialPrefetch is the first consumer's prefetch: sized for messages of
// opts.ExpectedBytes, until the bodies seen say otherwise.
func initialPrefetch(opts ConsumeOptions) int {
	return prefetchFor(opts.Budget.Total(), int64(opts.ExpectedBytes), opts.Prefetch)
}

// settled gives back what the deliveries up to tag (multiple) or tag alone
// hold.
func (f *flow) settled(tag uint64, multiple bool) {
	f.heldMu.Lock()
	defer f.heldMu.Unlock()
	if !multiple {
		if n, ok := f.held[tag]; ok {
			delete(f.held, tag)
			f.b.Release(n)
		}
		return
	}
	for t, n := range f.held {
		if t <= tag {
			delete(f.held, t)
			f.b.Release(n)
		}
	}
}

// releaseAll gives back everything the session holds: it ended, and the
// channel's close returns the unsettled deliveries to the queue.
func (f *flow) releaseAll() {
	f.heldMu.Lock()
	defer f.heldMu.Unlock()
	for t, n := range f.held {
		delete(f.held, t)
		f.b.Release(n)
	}
}

// cancel is Session.Cancel: it cancels the current consumer and starts no
// other.
func (f *flow) cancel() {
	f.mu.Lock()
	f.stopped = true
	tag := f.tag
	f.mu.Unlock()
	_ = f.ch.Cancel(tag, false)
}

// acker settles on the channel and gives the bytes back.
type acker struct {
	ch amqp.Acknowledger
	f  *flow
}

func (a acker) Ack(tag uint64, multiple bool) error {
	err := a.ch.Ack(tag, multiple)
	a.f.settled(tag, multiple)
	return err
}

func (a acker) Nack(tag uint64, multiple, requeue bool) error {
	err := a.ch.Nack(tag, multiple, requeue)
	a.f.settled(tag, multiple)
	return err
}

func (a acker) Reject(tag uint64, requeue bool) error {
	err := a.ch.Reject(tag, requeue)
	a.f.settled(tag, false)
	return err
}

// run hands the deliveries of first, and of the consumers that replace it,
// to out, each once its bytes are acquired, until the consumers end (then
// it closes out) or ctx does.
func (f *flow) run(ctx context.Context, first <-chan amqp.Delivery, out chan<- amqp.Delivery) {
	cur := first
	var next <-chan amqp.Delivery // the new consumer while the old one drains
	for {
		var d amqp.Delivery
		var ok bool
		select {
		case <-ctx.Done():
			return
		case d, ok = <-cur:
		}
		if !ok {
			if next != nil {
				cur, next = next, nil
				continue
			}
			close(out) // the broker cancelled the consumer, or the channel closed
			return
		}
		n := int64(len(d.Body))
		if err := f.b.Acquire(ctx, n); err != nil {
			return // unsettled: back to the queue with the channel
		}
		f.heldMu.Lock()
		f.held[d.DeliveryTag] = n
		f.heldMu.Unlock()
		d.Acknowledger = acker{ch: d.Acknowledger, f: f}
		select {
		case <-ctx.Done():
			return
		case out <- d:
		}
		if next == nil {
			next = f.resize(n)
		}
	}
}

// resize notes a delivery of n bytes and, when the prefetch no longer fits
// the bodies seen, starts a consumer with one that does and cancels the
// current one; it returns the new consumer's deliveries, or nil. It shrinks
// at once when a body does not fit, and grows once a whole window of
// deliveries left room for twice as many.
func (f *flow) resize(n int64) <-chan amqp.Delivery {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seen++
	f.largest = max(f.largest, n)
	want := prefetchFor(f.b.Total(), f.largest, f.opts.Prefetch)
	switch {
	case f.stopped:
		return nil
	case want < f.prefetch:
	case want >= 2*f.prefetch && f.seen >= f.prefetch:
	default:
		return nil
	}
	// The old consumer is cancelled first: the broker sends cancel-ok after
	// its last delivery, so every delivery of the new one comes after all of
	// the old one's, in queue order (a cancel message applies to what came
	// before it). Then Qos, which applies to consumers started after it.
	// A failure means the channel is gone: the old consumer's deliveries end
	// and the session with them.
	if err := f.ch.Cancel(f.tag, false); err != nil {
		return nil
	}
	if err := f.ch.Qos(want, 0, false); err != nil {
		return nil
	}
	tag := "delaybridge-" + f.opts.Name + "-" + uuid.NewString()
	deliveries, err := f.ch.Consume(f.opts.Queue, tag, false, false, false, false, nil)
	if err != nil {
		return nil
	}
	f.opts.Logger.Debug().Str("queue", f.opts.Queue).Int("prefetch", want).Int64("largest_body", f.largest).
		Msg(f.opts.Name + ": prefetch resized to the message size")
	f.tag, f.prefetch, f.seen, f.largest = tag, want, 0, 0
	return deliveries
}
