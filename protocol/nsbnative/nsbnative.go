package nsbnative

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/intake"
	"github.com/delaybridge/delaybridge/message"
	"github.com/delaybridge/delaybridge/wire"
	"github.com/delaybridge/delaybridge/wire/nsbdelay"
)

// Sources are the delay-level queues of the NServiceBus RabbitMQ
// transport's chains (package wire/nsbdelay), one source per queue. The
// endpoints' installers declare them, so each source waits for its queue,
// and the sources of a chain wait together for its level 00 queue, the last
// one the installer declares. A message taken from a level queue is stored
// for the time the chain would have delivered it and then published to the
// chain's delivery exchange with its routing key, which the destination's
// binding (#.<address>) matches whatever the key's digits, as at the end of
// the chain.
func Sources(chains ...nsbdelay.Chain) []intake.Source {
	var srcs []intake.Source
	for _, c := range chains {
		for k := nsbdelay.Levels - 1; k >= 0; k-- {
			srcs = append(srcs, intake.Source{
				Name: fmt.Sprintf("nsb-%s-level-%02d", c.Version, k), Queue: c.Level(k),
				MustExist: true, Gate: c.Level(0),
				Parser: intake.ParserFunc(func(d *amqp.Delivery, receivedAt time.Time) intake.Intake {
					return parseNSBNative(d, receivedAt, c, k)
				}),
			})
		}
	}
	return srcs
}

// parseNSBNative reads a message taken from level k's queue of chain c.
func parseNSBNative(d *amqp.Delivery, receivedAt time.Time, c nsbdelay.Chain, k int) intake.Intake {
	keyDelay, _, err := nsbdelay.ParseRoutingKey(d.RoutingKey)
	if err != nil {
		return intake.Reject(fmt.Errorf("%w, on queue %s", err, c.Level(k)))
	}
	due, err := nsbDue(d.Headers, receivedAt, c, k, keyDelay)
	if err != nil {
		return intake.Reject(err)
	}
	id, err := intake.ParseID(d)
	if err != nil {
		return intake.Reject(err)
	}
	return intake.Intake{Op: intake.OpSchedule, ID: id, Exchange: c.Delivery, Destination: d.RoutingKey, DueAt: due,
		Msg: broker.Forwardable(message.FromDelivery(d), nsbdelay.DeadLetterHeaders)}
}

// nsbDue is when chain c would deliver a message with routing key delay
// keyDelay that was taken from level k's queue at receivedAt. The chain
// reads only the key: from the moment the message entered level k's queue,
// it waits out that queue's 2^k s, then the key's digits below k. It entered
// no later than receivedAt and, unless the level is stuck, no earlier than
// 2^k s before, so the chain delivers between receivedAt plus the digits
// below k and receivedAt plus 2^k s more. Within those bounds the due time
// is, in order:
//
//   - after dead-lettering down the chain, the time of the last death
//     (x-death, the broker's clock, whole seconds; the end of that second,
//     so never early) plus what is left;
//   - for a message the transport's tools re-published with a key for
//     what was left of its delay (the delay header no longer matches the
//     key), NServiceBus.TimeSent plus the delay header, as the tools
//     computed it and the chain then delivers it;
//   - NServiceBus.DeliverAt, when the send that put the message on the
//     chain stamped it (nsbdelay.DeliverAtOfThisSend): the time the sender
//     asked for;
//   - otherwise the upper bound: what the key says is left from the moment
//     the message was taken. NServiceBus.TimeSent plus the key's delay is
//     no due time: a handler's sends are stamped when it sends and dispatched
//     when it is done, and the delay counts from the dispatch, so that sum is
//     early by the rest of the handler's time; nor is
//     NServiceBus.Retries.Timestamp plus it, which precedes the publish too.
//     Taken as it is published, the message is then due within the broker's
//     hop of when the chain would deliver it; taken from a level it waited
//     in (the bridge was down), that much later (docs/contract.md §2.9).
//
// A header that is present but unreadable is an error: it was not written
// by NServiceBus.
func nsbDue(h amqp.Table, receivedAt time.Time, c nsbdelay.Chain, k, keyDelay int) (time.Time, error) {
	below := keyDelay & (1<<k - 1)
	left := time.Duration(1<<k+below) * time.Second
	lo, hi := receivedAt.Add(time.Duration(below)*time.Second), receivedAt.Add(left)
	hint, err := nsbHint(h, c, k, keyDelay, left)
	if err != nil {
		return time.Time{}, err
	}
	switch {
	case hint.IsZero():
		return intake.InRange(nsbdelay.HeaderDelay, hi)
	case hint.Before(lo):
		hint = lo
	case hint.After(hi):
		hint = hi
	}
	return intake.InRange(nsbdelay.HeaderDelay, hint)
}

// nsbHint is nsbDue's due time before the bounds, or zero when nothing
// tells it.
func nsbHint(h amqp.Table, c nsbdelay.Chain, k, keyDelay int, left time.Duration) (time.Time, error) {
	if died, ok := lastChainDeath(h, c, k); ok {
		return died.Add(time.Second + left), nil
	}
	delay, hasDelay, err := nsbInt(h, nsbdelay.HeaderDelay)
	if err != nil {
		return time.Time{}, err
	}
	sent, err := nsbTime(h, nsbdelay.HeaderTimeSent)
	if err != nil {
		return time.Time{}, err
	}
	retried, err := nsbTime(h, nsbdelay.HeaderRetriesTimestamp)
	if err != nil {
		return time.Time{}, err
	}
	deliverAt, err := nsbTime(h, nsbdelay.HeaderDeliverAt)
	if err != nil {
		return time.Time{}, err
	}
	if hasDelay && keyDelayOf(delay) != keyDelay {
		if sent.IsZero() {
			return time.Time{}, nil
		}
		return sent.Add(time.Duration(delay) * time.Second), nil
	}
	if nsbdelay.DeliverAtOfThisSend(deliverAt, sent, retried) {
		return deliverAt, nil
	}
	return time.Time{}, nil
}

// keyDelayOf is the delay the key spells for a delay header's value
// (CalculateRoutingKey: negative is 0, only the low 28 bits count).
func keyDelayOf(delay int64) int {
	if delay < 0 {
		return 0
	}
	return int(delay & nsbdelay.MaxDelaySeconds)
}

// lastChainDeath is the time of the most recent x-death entry (the broker
// puts it first) from a level of chain c above k: when the message entered
// level k's queue. Entries of other queues say nothing about this chain.
func lastChainDeath(h amqp.Table, c nsbdelay.Chain, k int) (time.Time, bool) {
	deaths, _ := h["x-death"].([]any)
	for _, e := range deaths {
		entry, ok := e.(amqp.Table)
		if !ok {
			continue
		}
		q, _ := entry["queue"].(string)
		j, ok := c.LevelOf(q)
		if !ok {
			continue
		}
		at, ok := entry["time"].(time.Time)
		if !ok || j <= k {
			return time.Time{}, false
		}
		return at, true
	}
	return time.Time{}, false
}

// nsbInt reads a whole-number header: any AMQP integer, or a decimal string
// (the transport converts the value with Convert.ToInt32, which takes both).
func nsbInt(h amqp.Table, name string) (int64, bool, error) {
	v, ok := h[name]
	if !ok || v == nil {
		return 0, false, nil
	}
	if n, ok := intake.HeaderInteger(v); ok {
		return n, true, nil
	}
	switch v.(type) {
	case string, []byte:
		s, _, _ := intake.HeaderString(h, name)
		n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
		if err != nil {
			return 0, true, fmt.Errorf("header %s %q is not a whole number of seconds", name, wire.Clip(s))
		}
		return n, true, nil
	}
	return 0, true, fmt.Errorf("header %s must be a whole number of seconds, got %s", name, intake.TypeName(v))
}

// nsbTime reads a header in the NServiceBus wire format; zero when absent.
func nsbTime(h amqp.Table, name string) (time.Time, error) {
	if v, ok := h[name]; ok && v != nil {
		return intake.ParseNSBTimeHeader(name, v)
	}
	return time.Time{}, nil
}
