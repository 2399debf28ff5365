// Package nsbdelay is the wire format of the NServiceBus RabbitMQ transport's
// native delays: the names, arguments and bindings of its delay
// infrastructure, the routing keys its senders compute and the headers they
// set. Every fact comes from the transport's source, Particular/NServiceBus.RabbitMQ:
//
//   - src/NServiceBus.Transport.RabbitMQ/DelayedDelivery/DelayInfrastructure.cs
//     (v2; its version before tag 7.0.0 for v1): the names, 28 levels, the
//     queue arguments, the bindings (Build) and the routing key
//     (CalculateRoutingKey).
//   - src/NServiceBus.Transport.RabbitMQ/Sending/BasicPropertiesExtensions.cs
//     (Fill): the delay header, an int, in whole seconds rounded up.
//   - src/NServiceBus.Transport.RabbitMQ/Connection/ConfirmsAwareChannel.cs
//     (SendMessage): a delayed message goes to the exchange of the level of
//     its delay's highest set bit, mandatory.
//   - src/NServiceBus.Transport.RabbitMQ/Receiving/MessageConverter.cs: the
//     headers a receiving endpoint drops.
//   - src/NServiceBus.Transport.RabbitMQ.CommandLine/Commands/Delays/DelayCommandHelpers.cs:
//     the transport's own tools (delays migrate, delays transfer) take a
//     pending message's due time as NServiceBus.TimeSent plus the delay
//     header, and re-publish it with a routing key for what is left.
//
// And from NServiceBus itself (Particular/NServiceBus, src/NServiceBus.Core/):
//
//   - Pipeline/Outgoing/AttachSenderRelatedInfoOnMessageBehavior.cs stamps
//     NServiceBus.TimeSent, and (from 7.7) NServiceBus.DeliverAt, when a
//     message is sent, each only when the message does not carry it yet.
//     A handler's sends are dispatched together when the handler is done,
//     and only then does the transport compute the delay (BasicPropertiesExtensions
//     .Fill: DelayDeliveryWith's delay, or DoNotDeliverBefore's time less
//     the dispatch time), so TimeSent plus the delay is early by the rest
//     of the handler's time.
//   - Recoverability/DelayedRetry.cs (DelayedRetryExecutor.cs in 7.x) sends
//     a delayed retry with the failed message's headers, TimeSent and any
//     DeliverAt among them, and a fresh NServiceBus.Retries.Timestamp
//     (DelayedRetriesHeaderExtensions.SetDelayedDeliveryTimestamp).
//
// The delay travels in the routing key, 28 binary digits (2^27 first) then
// the destination address. Each level k is a topic exchange and a queue of
// the same name; the queue holds messages for 2^k seconds (x-message-ttl)
// and dead-letters them to level k-1's exchange (level 0's to the delivery
// exchange). An exchange routes a key whose digit for 2^k is 1 into its queue
// and one whose digit is 0 on to the next exchange down. Dead-lettering keeps
// the routing key, so the key spells the whole delay wherever the message is;
// what is left of it is the rest of the current level's TTL plus the digits
// below. The delivery exchange routes #.<address> to the destination, a
// binding each endpoint makes for its own queue.
package nsbdelay

import (
	"errors"
	"fmt"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/wire"
)

// Levels is the number of delay levels (MaxNumberOfBitsToUse).
const Levels = 28

// MaxDelaySeconds is the longest delay the routing key can spell (MaxDelayInSeconds).
const MaxDelaySeconds = 1<<Levels - 1

// Headers an NServiceBus sender sets and the transport's tools read.
const (
	// HeaderDelay is the delay in whole seconds, an AMQP int (signed 32
	// bits): Math.Ceiling of the delay at dispatch, negative when a
	// DoNotDeliverBefore had passed (DelayInfrastructure.DelayHeader).
	HeaderDelay = "NServiceBus.Transport.RabbitMQ.DelayInSeconds"
	// HeaderTimeSent is when the sender's pipeline sent the message, in
	// the NServiceBus wire format (wire.ParseNSBTime). A delayed retry
	// keeps the failed message's, which can be much older than the retry.
	HeaderTimeSent = wire.HeaderNSBTimeSent
	// HeaderRetriesTimestamp is when NServiceBus dispatched a delayed
	// retry, in the same format (Headers.DelayedRetriesTimestamp).
	HeaderRetriesTimestamp = "NServiceBus.Retries.Timestamp"
	// HeaderDeliverAt is when the sender asked the message to be
	// delivered, in the same format (Headers.DeliverAt, NServiceBus 7.7 and
	// later): the time of the send plus DelayDeliveryWith's delay, or
	// DoNotDeliverBefore's time. A delayed retry carries the failed
	// message's, which is no longer its own (DeliverAtOfThisSend).
	HeaderDeliverAt = "NServiceBus.DeliverAt"
	// HeaderPublishSeqNo is the publish sequence number RabbitMQ.Client 7
	// adds to every message a channel with confirmation tracking publishes
	// (an AMQP long), as the transport's channels do
	// (rabbitmq/rabbitmq-dotnet-client, Constants.PublishSequenceNumberHeader).
	HeaderPublishSeqNo = "x-dotnet-pub-seq-no"
)

// DeadLetterHeaders are the headers the broker adds along the chain, not the
// sender: dead-lettering's (x-death and x-first-death-* since RabbitMQ 3.x,
// x-last-death-* since 3.13; rabbit_dead_letter.erl) and the delivery count
// a quorum queue adds to a redelivered message (x-delivery-count). The
// transport drops the first four on receipt (MessageConverter) and
// x-delivery-count after reading it.
var DeadLetterHeaders = []string{
	"x-death",
	"x-first-death-exchange", "x-first-death-queue", "x-first-death-reason",
	"x-last-death-exchange", "x-last-death-queue", "x-last-death-reason",
	"x-delivery-count",
}

// Chain names one delay infrastructure.
type Chain struct {
	// Version names the chain in logs: "v2" or "v1".
	Version string
	// LevelPrefix followed by the level in two digits names each level's
	// exchange and queue.
	LevelPrefix string
	// Delivery is the exchange level 0 dead-letters to.
	Delivery string
	// Quorum: v2's quorum queues with at-least-once dead-lettering; else
	// v1's classic lazy queues.
	Quorum bool
}

// The transport's chains: v2 since transport 7, v1 before.
var (
	V2 = Chain{Version: "v2", LevelPrefix: "nsb.v2.delay-level-", Delivery: "nsb.v2.delay-delivery", Quorum: true}
	V1 = Chain{Version: "v1", LevelPrefix: "nsb.delay-level-", Delivery: "nsb.delay-delivery"}
)

// Level is the name of level k's exchange and queue (LevelName: two digits).
func (c Chain) Level(k int) string { return fmt.Sprintf("%s%02d", c.LevelPrefix, k) }

// Next is where level k's queue dead-letters, and where its exchange routes
// a key whose digit for 2^k is 0: level k-1's exchange, or the delivery
// exchange.
func (c Chain) Next(k int) string {
	if k == 0 {
		return c.Delivery
	}
	return c.Level(k - 1)
}

// QueueArgs are the arguments of level k's queue as the installer declares it.
func (c Chain) QueueArgs(k int) amqp.Table {
	args := amqp.Table{
		"x-message-ttl":          int64(1<<k) * 1000,
		"x-dead-letter-exchange": c.Next(k),
	}
	if c.Quorum {
		args["x-queue-type"] = "quorum"
		args["x-dead-letter-strategy"] = "at-least-once"
		args["x-overflow"] = "reject-publish"
	} else {
		args["x-queue-mode"] = "lazy"
	}
	return args
}

// QueueBinding binds level k's exchange to its queue: the digit for 2^k
// (word 27-k of the key) is 1.
func QueueBinding(k int) string { return strings.Repeat("*.", Levels-1-k) + "1.#" }

// SkipBinding binds level k's exchange to Next(k): the digit for 2^k is 0.
func SkipBinding(k int) string { return strings.Repeat("*.", Levels-1-k) + "0.#" }

// DeliveryBinding binds the delivery exchange to the queue (or, in the
// conventional routing topology, the exchange) named address (BindingKey).
func DeliveryBinding(address string) string { return "#." + address }

// RoutingKey is the key a sender computes for a delay of delaySeconds to
// address, and the level whose exchange it publishes to: that of the highest
// set bit, 0 for no delay. A negative delay is 0; only the low 28 bits count.
func RoutingKey(delaySeconds int, address string) (key string, startLevel int) {
	delaySeconds = max(delaySeconds, 0)
	var sb strings.Builder
	sb.Grow(2*Levels + len(address))
	found := false
	for k := Levels - 1; k >= 0; k-- {
		if delaySeconds&(1<<k) != 0 {
			sb.WriteString("1.")
			if !found {
				startLevel, found = k, true
			}
		} else {
			sb.WriteString("0.")
		}
	}
	sb.WriteString(address)
	return sb.String(), startLevel
}

// keyPrefix is the length of the key's digits and their dots.
const keyPrefix = 2 * Levels

// ErrRoutingKey is wrapped by ParseRoutingKey's errors.
var ErrRoutingKey = errors.New("not an NServiceBus delay routing key (28 binary digits, each followed by a dot, then the destination address)")

// ParseRoutingKey reads the delay the key spells and its destination address
// (the transport's tools take the address from character 56 on).
func ParseRoutingKey(key string) (delaySeconds int, address string, err error) {
	if len(key) <= keyPrefix {
		return 0, "", fmt.Errorf("routing key %q is %w", wire.ClipTo(key, 80), ErrRoutingKey)
	}
	for i := 0; i < Levels; i++ {
		digit, dot := key[2*i], key[2*i+1]
		if (digit != '0' && digit != '1') || dot != '.' {
			return 0, "", fmt.Errorf("routing key %q is %w", wire.ClipTo(key, 80), ErrRoutingKey)
		}
		delaySeconds = delaySeconds<<1 | int(digit-'0')
	}
	return delaySeconds, key[keyPrefix:], nil
}

// LevelOf returns the level whose queue is named queue on chain c, and
// whether it is one.
func (c Chain) LevelOf(queue string) (int, bool) {
	rest, ok := strings.CutPrefix(queue, c.LevelPrefix)
	if !ok || len(rest) != 2 || rest[0] < '0' || rest[0] > '9' || rest[1] < '0' || rest[1] > '9' {
		return 0, false
	}
	k := int(rest[0]-'0')*10 + int(rest[1]-'0')
	return k, k < Levels
}

// DeliverAtOfThisSend reports whether a message's NServiceBus.DeliverAt,
// deliverAt, was stamped by the send that put it on the chain, given its
// NServiceBus.TimeSent and NServiceBus.Retries.Timestamp (zero when absent).
// A send stamps both times at once, and the transport delays a message
// only while its time is ahead of the dispatch (the delay is at least a
// second), so DeliverAt is after TimeSent. A delayed retry is sent with
// the failed message's headers, an earlier send's DeliverAt among them, and
// a retries timestamp of its own; that DeliverAt was due before the
// message was received, failed and retried, so it is not after the
// timestamp, while one stamped for the retry is (the stamp, then the
// routing that stamps DeliverAt, NServiceBus 8 and later).
func DeliverAtOfThisSend(deliverAt, timeSent, retried time.Time) bool {
	if deliverAt.IsZero() {
		return false
	}
	if !timeSent.IsZero() && !deliverAt.After(timeSent) {
		return false
	}
	return retried.IsZero() || deliverAt.After(retried)
}
