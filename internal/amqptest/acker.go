// Package amqptest holds test doubles for AMQP consumers.
package amqptest

import (
	"fmt"
	"sort"
	"sync"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Outcome is how a delivery was settled.
type Outcome int

// Outcomes of a delivery.
const (
	Unsettled Outcome = iota
	Acked
	Requeued // nack or reject with requeue
	Dropped  // nack or reject without requeue
)

func (o Outcome) String() string {
	return [...]string{"unsettled", "acked", "requeued", "dropped"}[o]
}

// Acker is a channel's acknowledger as the broker sees it: a multiple ack or
// nack settles every outstanding delivery up to its tag, and a tag settled
// twice is an error (a channel-level PRECONDITION_FAILED on a real broker).
// At the end of the test it fails the test unless every delivery it handed
// out was settled exactly once.
type Acker struct {
	t        testing.TB
	mu       sync.Mutex
	next     uint64
	outcomes map[uint64]Outcome
	multiple []uint64 // tags of multiple acks, in order
	errs     []string
}

// New returns an Acker that checks its deliveries when t ends.
func New(t testing.TB) *Acker {
	a := &Acker{t: t, outcomes: map[uint64]Outcome{}}
	t.Cleanup(a.check)
	return a
}

// Deliver gives d the next delivery tag on this channel and this acknowledger.
func (a *Acker) Deliver(d amqp.Delivery) amqp.Delivery {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.next++
	d.DeliveryTag = a.next
	d.Acknowledger = a
	a.outcomes[a.next] = Unsettled
	return d
}

// Ack implements amqp.Acknowledger.
func (a *Acker) Ack(tag uint64, multiple bool) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if multiple {
		a.multiple = append(a.multiple, tag)
	}
	return a.settle(tag, multiple, Acked)
}

// Nack implements amqp.Acknowledger.
func (a *Acker) Nack(tag uint64, multiple, requeue bool) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	o := Dropped
	if requeue {
		o = Requeued
	}
	return a.settle(tag, multiple, o)
}

// Reject implements amqp.Acknowledger.
func (a *Acker) Reject(tag uint64, requeue bool) error { return a.Nack(tag, false, requeue) }

func (a *Acker) settle(tag uint64, multiple bool, o Outcome) error {
	cur, known := a.outcomes[tag]
	switch {
	case !known:
		a.errs = append(a.errs, fmt.Sprintf("tag %d settled (%s) but never delivered", tag, o))
		return fmt.Errorf("unknown delivery tag %d", tag)
	case cur != Unsettled:
		a.errs = append(a.errs, fmt.Sprintf("tag %d settled twice: %s, then %s", tag, cur, o))
		return fmt.Errorf("delivery tag %d already settled", tag)
	}
	a.outcomes[tag] = o
	if multiple {
		for t, cur := range a.outcomes {
			if t < tag && cur == Unsettled {
				a.outcomes[t] = o
			}
		}
	}
	return nil
}

// Outcome returns how tag was settled so far.
func (a *Acker) Outcome(tag uint64) Outcome {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.outcomes[tag]
}

// Multiple returns the tags of the multiple acks, in order.
func (a *Acker) Multiple() []uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]uint64(nil), a.multiple...)
}

// Problems lists double or unknown settlements and deliveries left
// unsettled; empty when every delivery was settled exactly once.
func (a *Acker) Problems() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := append([]string(nil), a.errs...)
	var open []uint64
	for t, o := range a.outcomes {
		if o == Unsettled {
			open = append(open, t)
		}
	}
	sort.Slice(open, func(i, j int) bool { return open[i] < open[j] })
	for _, t := range open {
		out = append(out, fmt.Sprintf("tag %d never settled", t))
	}
	return out
}

func (a *Acker) check() {
	for _, p := range a.Problems() {
		a.t.Errorf("amqptest: %s", p)
	}
}
