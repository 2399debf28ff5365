package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/intake"
)

// Headers the bench puts on every message so the consumer can compute
// lateness and spot duplicates; the bridge forwards headers unchanged.
const (
	hdrDue = "bench-due" // int64 unix nanoseconds of the due time
	hdrSeq = "bench-seq" // int64 index of the message in its workload
)

// registry remembers every queue and exchange the bench declared (or had a
// bridge declare) so the teardown deletes them all.
type registry struct {
	mu        sync.Mutex
	queues    []string
	exchanges []string
}

func (r *registry) queue(name string)    { r.add(&r.queues, name) }
func (r *registry) exchange(name string) { r.add(&r.exchanges, name) }

func (r *registry) add(names *[]string, name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !slices.Contains(*names, name) {
		*names = append(*names, name)
	}
}

// outgoing is one message to publish.
type outgoing struct {
	exchange, key string
	msg           amqp.Publishing
}

// pubResult describes one publishAll.
type pubResult struct {
	Start, End time.Time
	Published  int
	Nacked     int
	Returned   int
}

func (p pubResult) rate() float64 { return rate(p.Published, p.End.Sub(p.Start)) }

// publishAll publishes n messages as fast as the broker confirms them: one
// confirm-mode channel per worker (workers spread over the publish
// connections), each keeping up to window publishes unconfirmed. build(i) is
// called for i = 0..n-1 just before message i is published (so it can read
// the clock). Messages are mandatory; returns are counted.
func (b *bencher) publishAll(ctx context.Context, n int, build func(i int) outgoing) (pubResult, error) {
	var next atomic.Int64
	return b.publishFrom(ctx, n, func() (int, bool) {
		i := int(next.Add(1) - 1)
		return i, i < n
	}, build)
}

// publishFrom is publishAll with the indexes handed out by take, which
// blocks until the next may go (a pacer) and returns false when there is
// none left.
func (b *bencher) publishFrom(ctx context.Context, n int, take func() (int, bool), build func(i int) outgoing) (pubResult, error) {
	workers := max(b.opts.Publishers, 1)
	window := max(b.opts.ConfirmWindow, 1)
	var nacked, returned, published atomic.Int64
	res := pubResult{Start: time.Now()}
	errc := make(chan error, workers)
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		conn := b.pubConns[w%len(b.pubConns)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			errc <- func() error {
				ch, err := conn.Channel()
				if err != nil {
					return fmt.Errorf("open publish channel: %w", err)
				}
				defer ch.Close()
				if err := ch.Confirm(false); err != nil {
					return fmt.Errorf("confirm mode: %w", err)
				}
				rets := ch.NotifyReturn(make(chan amqp.Return, 64))
				retDone := make(chan struct{})
				go func() {
					defer close(retDone)
					for range rets {
						returned.Add(1)
					}
				}()
				defer func() { _ = ch.Close(); <-retDone }()
				pending := make([]*amqp.DeferredConfirmation, 0, window)
				settle := func(dc *amqp.DeferredConfirmation) error {
					ok, err := dc.WaitContext(ctx)
					if err != nil {
						return err
					}
					if !ok {
						nacked.Add(1)
					}
					return nil
				}
				for {
					i, ok := take()
					if !ok || ctx.Err() != nil {
						break
					}
					o := build(i)
					dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, o.exchange, o.key, true, false, o.msg)
					if err != nil {
						return fmt.Errorf("publish: %w", err)
					}
					published.Add(1)
					b.published.Add(1)
					pending = append(pending, dc)
					if len(pending) >= window {
						if err := settle(pending[0]); err != nil {
							return err
						}
						pending = pending[1:]
					}
				}
				for _, dc := range pending {
					if err := settle(dc); err != nil {
						return err
					}
				}
				return ctx.Err()
			}()
		}()
	}
	wg.Wait()
	close(errc)
	res.End = time.Now()
	res.Published, res.Nacked, res.Returned = int(published.Load()), int(nacked.Load()), int(returned.Load())
	var errs []error
	for err := range errc {
		if err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return res, err
	}
	if res.Nacked > 0 || res.Returned > 0 {
		return res, fmt.Errorf("%d of %d publishes nacked and %d returned as unroutable", res.Nacked, n, res.Returned)
	}
	return res, nil
}

// collector consumes a destination queue and records, for every message of
// one workload, when it arrived relative to its due time.
//
// It consumes with autoAck: the broker hands each message over as soon as it
// is routed, with no prefetch window that the consumer's ack cadence could
// fill and so hold back deliveries. The arrival time is read first thing
// after the delivery comes off the channel, before any other work. Nothing is
// lost by autoAck here: the bench only records timestamps.
type collector struct {
	ch   *amqp.Channel
	tags []string
	done chan struct{} // closed when every expected message arrived
	exit chan struct{} // closed when the consume loop ended

	// check, when set, tells whether the first delivery of message seq came
	// as it should (exchange, routing key, headers); see mismatched.
	check func(seq int, d *amqp.Delivery) bool

	mu         sync.Mutex
	n          int
	want       int  // distinct messages that close done (n unless expect lowered it)
	doneClosed bool // done is closed
	got        []bool
	arrived    []int64 // by seq: when it first arrived (unix ns), 0 if not
	late       []time.Duration
	dues       []int64 // due time (unix ns) of late[i]
	distinct   int
	early      int
	dups       int
	foreign    int
	mismatched int
	last       time.Time
}

func (b *bencher) collect(queue string, n int) (*collector, error) {
	return b.collectChecked(queue, n, nil)
}

// declareAndCollect declares queue (durable, classic) and collects n
// messages from it.
func (b *bencher) declareAndCollect(queue string, n int) (*collector, error) {
	if err := b.declareQueue(queue, nil); err != nil {
		return nil, err
	}
	return b.collect(queue, n)
}

// collectChecked is collect with a check of every message's first delivery.
func (b *bencher) collectChecked(queue string, n int, check func(seq int, d *amqp.Delivery) bool) (*collector, error) {
	return b.collectQueues([]string{queue}, n, check)
}

// collectQueues is collectChecked over several queues, one consumer each on
// one channel: the n messages of the workload may come from any of them.
func (b *bencher) collectQueues(queues []string, n int, check func(seq int, d *amqp.Delivery) bool) (*collector, error) {
	ch, err := b.consConn.Channel()
	if err != nil {
		return nil, fmt.Errorf("open consume channel: %w", err)
	}
	c := &collector{
		ch: ch, done: make(chan struct{}), exit: make(chan struct{}), check: check,
		n: n, want: n, got: make([]bool, n), arrived: make([]int64, n), late: make([]time.Duration, 0, n),
	}
	var loops sync.WaitGroup
	for _, queue := range queues {
		tag := "bench-" + queue
		deliveries, err := ch.Consume(queue, tag, true, false, false, false, nil)
		if err != nil {
			_ = ch.Close()
			loops.Wait()
			return nil, fmt.Errorf("consume %s: %w", queue, err)
		}
		c.tags = append(c.tags, tag)
		loops.Add(1)
		go func() {
			defer loops.Done()
			c.loop(deliveries)
		}()
	}
	go func() {
		loops.Wait()
		close(c.exit)
	}()
	return c, nil
}

func (c *collector) loop(deliveries <-chan amqp.Delivery) {
	for d := range deliveries {
		now := time.Now()
		due, okDue := headerInt(d.Headers, hdrDue)
		seq, okSeq := headerInt(d.Headers, hdrSeq)
		c.mu.Lock()
		switch {
		case !okDue || !okSeq || seq < 0 || seq >= int64(c.n):
			c.foreign++
		case c.got[seq]:
			c.dups++
		default:
			c.got[seq] = true
			c.arrived[seq] = now.UnixNano()
			c.distinct++
			if c.check != nil && !c.check(int(seq), &d) {
				c.mismatched++
			}
			l := now.Sub(time.Unix(0, due))
			if l < 0 {
				c.early++
			}
			c.late = append(c.late, l)
			c.dues = append(c.dues, due)
			c.last = now
			c.checkDone()
		}
		c.mu.Unlock()
	}
}

// checkDone closes done once want messages arrived; callers hold mu.
func (c *collector) checkDone() {
	if !c.doneClosed && c.distinct >= c.want {
		c.doneClosed = true
		close(c.done)
	}
}

// expect lowers the messages wait waits for to m (of n), when only m were
// published.
func (c *collector) expect(m int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.want = min(m, c.n)
	c.checkDone()
}

// wait returns true when every message arrived before deadline.
func (c *collector) wait(ctx context.Context, deadline time.Time) bool {
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-c.done:
		return true
	case <-t.C:
	case <-ctx.Done():
	}
	return false
}

// stop cancels the consumer and returns the summary. A short pause first
// catches duplicates that arrive right after the last message.
func (c *collector) stop(linger time.Duration) (Lateness, time.Time) {
	time.Sleep(linger)
	for _, tag := range c.tags {
		_ = c.ch.Cancel(tag, false)
	}
	_ = c.ch.Close()
	<-c.exit
	c.mu.Lock()
	defer c.mu.Unlock()
	l := Summarize(slices.Clone(c.late))
	l.BySecond = bySecond(c.dues, c.late)
	l.Expected, l.Received, l.Missing = c.n, c.distinct, c.n-c.distinct
	l.Early, l.Duplicates, l.Foreign, l.Mismatched = c.early, c.dups, c.foreign, c.mismatched
	return l, c.last
}

// samples returns, after stop, the lateness of every distinct message
// received and when each message (by seq) arrived.
func (c *collector) samples() (late []time.Duration, arrived []int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.late), slices.Clone(c.arrived)
}

func (c *collector) received() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.distinct
}

// headerInt reads header name as the bridge reads an integer header.
func headerInt(h amqp.Table, name string) (int64, bool) { return intake.HeaderInteger(h[name]) }

// ackingConsumer consumes queue with manual acks (prefetch 1000, a multiple
// ack every 100 deliveries) until n messages arrived, like a real consumer
// that must not lose messages. It reports the time the n-th arrived.
func (b *bencher) ackingConsumer(queue string, n int) (done <-chan time.Time, stop func(), err error) {
	ch, err := b.consConn.Channel()
	if err != nil {
		return nil, nil, fmt.Errorf("open consume channel: %w", err)
	}
	if err := ch.Qos(1000, 0, false); err != nil {
		_ = ch.Close()
		return nil, nil, fmt.Errorf("qos: %w", err)
	}
	tag := "bench-ack-" + queue
	deliveries, err := ch.Consume(queue, tag, false, false, false, false, nil)
	if err != nil {
		_ = ch.Close()
		return nil, nil, fmt.Errorf("consume %s: %w", queue, err)
	}
	out := make(chan time.Time, 1)
	exit := make(chan struct{})
	go func() {
		defer close(exit)
		count := 0
		for d := range deliveries {
			count++
			if count%100 == 0 || count == n {
				_ = d.Ack(true)
			}
			if count == n {
				out <- time.Now()
			}
		}
	}()
	stop = func() {
		_ = ch.Cancel(tag, false)
		_ = ch.Close()
		<-exit
	}
	return out, stop, nil
}

// queueDepth is the number of ready messages in queue (unacknowledged ones
// are not counted by AMQP).
func (b *bencher) queueDepth(queue string) (int, error) {
	var q amqp.Queue
	err := b.withAdmin(func(ch *amqp.Channel) (err error) {
		q, err = ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		return err
	})
	return q.Messages, err
}

// declareQueue declares a durable classic queue and registers it.
func (b *bencher) declareQueue(name string, args amqp.Table) error {
	if args == nil {
		args = amqp.Table{}
	}
	if _, ok := args["x-queue-type"]; !ok {
		args["x-queue-type"] = "classic"
	}
	if err := b.withAdmin(func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclare(name, true, false, false, false, args)
		return err
	}); err != nil {
		return fmt.Errorf("declare queue %s: %w", name, err)
	}
	b.reg.queue(name)
	return nil
}

// declareExchange declares a durable exchange and registers it.
func (b *bencher) declareExchange(name, kind string) error {
	if err := b.withAdmin(func(ch *amqp.Channel) error {
		return ch.ExchangeDeclare(name, kind, true, false, false, false, nil)
	}); err != nil {
		return fmt.Errorf("declare exchange %s: %w", name, err)
	}
	b.reg.exchange(name)
	return nil
}

// bindQueue binds queue to exchange with key.
func (b *bencher) bindQueue(queue, key, exchange string) error {
	if err := b.withAdmin(func(ch *amqp.Channel) error { return ch.QueueBind(queue, key, exchange, false, nil) }); err != nil {
		return fmt.Errorf("bind %s to %s: %w", queue, exchange, err)
	}
	return nil
}

// deleteQueue deletes a queue of the run before the teardown does.
func (b *bencher) deleteQueue(name string) error {
	if err := b.withAdmin(func(ch *amqp.Channel) error {
		_, err := ch.QueueDelete(name, false, false, false)
		return err
	}); err != nil {
		return fmt.Errorf("delete queue %s: %w", name, err)
	}
	return nil
}

// withAdmin runs f on the channel for declarations, holding adminMu. An
// error from f drops the channel: a failed AMQP method closes it.
func (b *bencher) withAdmin(f func(ch *amqp.Channel) error) error {
	b.adminMu.Lock()
	defer b.adminMu.Unlock()
	ch, err := b.adminChannel()
	if err != nil {
		return err
	}
	if err := f(ch); err != nil {
		b.admin = nil
		return err
	}
	return nil
}

// adminChannel returns the channel for declarations; callers hold adminMu.
func (b *bencher) adminChannel() (*amqp.Channel, error) {
	if b.admin != nil && !b.admin.IsClosed() {
		return b.admin, nil
	}
	ch, err := b.adminConn.Channel()
	if err != nil {
		return nil, fmt.Errorf("open admin channel: %w", err)
	}
	b.admin = ch
	return ch, nil
}
