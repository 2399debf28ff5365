// Package nsbendpoint does on a broker what an NServiceBus endpoint on the
// RabbitMQ transport does for native delays: its installer's delay
// infrastructure, its queue's binding to the delivery exchange, and its
// delayed sends, with the exact headers and properties. Tests and the bench
// use it; the bridge never declares any of this (the endpoints' installers
// own it). The facts and their source files are listed in package
// wire/nsbdelay.
package nsbendpoint

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/wire"
	"github.com/delaybridge/delaybridge/wire/nsbdelay"
)

// Install declares chain c as the transport's installer does
// (DelayInfrastructure.Build): from level 27 down, each level's topic
// exchange, its queue and the binding between them; then each level's
// exchange-to-exchange binding to the next level down; then the delivery
// exchange and level 0's binding to it. All durable.
func Install(ch *amqp.Channel, c nsbdelay.Chain) error {
	for k := nsbdelay.Levels - 1; k >= 0; k-- {
		name := c.Level(k)
		if err := ch.ExchangeDeclare(name, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
			return fmt.Errorf("declare exchange %s: %w", name, err)
		}
		if _, err := ch.QueueDeclare(name, true, false, false, false, c.QueueArgs(k)); err != nil {
			return fmt.Errorf("declare queue %s: %w", name, err)
		}
		if err := ch.QueueBind(name, nsbdelay.QueueBinding(k), name, false, nil); err != nil {
			return fmt.Errorf("bind queue %s: %w", name, err)
		}
	}
	for k := nsbdelay.Levels - 1; k >= 1; k-- {
		if err := ch.ExchangeBind(c.Next(k), nsbdelay.SkipBinding(k), c.Level(k), false, nil); err != nil {
			return fmt.Errorf("bind %s to %s: %w", c.Level(k), c.Next(k), err)
		}
	}
	if err := ch.ExchangeDeclare(c.Delivery, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare exchange %s: %w", c.Delivery, err)
	}
	if err := ch.ExchangeBind(c.Delivery, nsbdelay.SkipBinding(0), c.Level(0), false, nil); err != nil {
		return fmt.Errorf("bind %s to %s: %w", c.Level(0), c.Delivery, err)
	}
	return nil
}

// Uninstall deletes chain c as the transport's TearDown does: the delivery
// exchange, then each level's queue and exchange. Each deletion has a
// channel of its own on conn, so one that fails does not stop the others;
// the errors are joined.
func Uninstall(conn *amqp.Connection, c nsbdelay.Chain) error {
	var errs []string
	do := func(what string, fn func(*amqp.Channel) error) {
		ch, err := conn.Channel()
		if err == nil {
			err = fn(ch)
			_ = ch.Close()
		}
		if err != nil {
			errs = append(errs, what+": "+err.Error())
		}
	}
	do("delete "+c.Delivery, func(ch *amqp.Channel) error { return ch.ExchangeDelete(c.Delivery, false, false) })
	for k := nsbdelay.Levels - 1; k >= 0; k-- {
		name := c.Level(k)
		do("delete queue "+name, func(ch *amqp.Channel) error { _, err := ch.QueueDelete(name, false, false, false); return err })
		do("delete exchange "+name, func(ch *amqp.Channel) error { return ch.ExchangeDelete(name, false, false) })
	}
	if errs != nil {
		return fmt.Errorf("uninstall %s: %s", c.Version, strings.Join(errs, "; "))
	}
	return nil
}

// Topology is one of the transport's two routing topologies, which differ in
// how an endpoint's queue hangs off the delivery exchange.
type Topology int

const (
	// Conventional: an exchange named after the queue (fanout, bound to
	// it), bound to the delivery exchange (ConventionalRoutingTopology).
	Conventional Topology = iota
	// Direct: the queue bound to the delivery exchange (DirectRoutingTopology).
	Direct
)

func (t Topology) String() string {
	if t == Direct {
		return "direct"
	}
	return "conventional"
}

// Bind hangs the existing queue address off chain c's delivery exchange as an
// endpoint of topology t does (Initialize, then BindToDelayInfrastructure
// with BindingKey(address)). In the conventional topology it declares the
// exchange named address, which the caller deletes.
func Bind(ch *amqp.Channel, c nsbdelay.Chain, t Topology, address string) error {
	key := nsbdelay.DeliveryBinding(address)
	if t == Direct {
		return ch.QueueBind(address, key, c.Delivery, false, nil)
	}
	if err := ch.ExchangeDeclare(address, amqp.ExchangeFanout, true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare exchange %s: %w", address, err)
	}
	if err := ch.QueueBind(address, "", address, false, nil); err != nil {
		return fmt.Errorf("bind queue %s: %w", address, err)
	}
	return ch.ExchangeBind(address, key, c.Delivery, false, nil)
}

// DelaySeconds is the delay a sender computes for a message due at due when
// dispatching at now: whole seconds, rounded up (Math.Ceiling), negative
// when due has passed (CalculateDelay). Delays past MaxDelaySeconds make the
// transport throw; here they are clamped.
func DelaySeconds(due, now time.Time) int {
	return int(min(math.Ceil(due.Sub(now).Seconds()), nsbdelay.MaxDelaySeconds))
}

// Send is one delayed message as an NServiceBus endpoint sends it.
type Send struct {
	MessageID string
	// Address is the destination queue.
	Address string
	// Delay is the header's value: what DelaySeconds computed at dispatch.
	Delay    int32
	TimeSent time.Time
	// Retried, when set, is NServiceBus.Retries.Timestamp: the message is
	// a delayed retry, sent with the failed message's headers (TimeSent
	// among them) by the recoverability pipeline.
	Retried time.Time
	// DeliverAt, when set, is NServiceBus.DeliverAt, which NServiceBus 7.7
	// and later stamp on a delayed send (the send's time plus
	// DelayDeliveryWith's delay, or DoNotDeliverBefore's time) and a delayed
	// retry keeps from the failed message
	// (AttachSenderRelatedInfoOnMessageBehavior). Zero: none, as NServiceBus
	// before 7.7 sends.
	DeliverAt time.Time
	Body      []byte
	// SeqNo is the channel's publish sequence number, which RabbitMQ.Client
	// adds as a header.
	SeqNo int64
	// Headers are further NServiceBus headers (strings), added to the
	// usual ones.
	Headers map[string]string
}

// Key returns the routing key and the level whose exchange the message is
// published to (ConfirmsAwareChannel.SendMessage).
func (s Send) Key() (key string, level int) { return nsbdelay.RoutingKey(int(s.Delay), s.Address) }

// Publishing is the message as the transport publishes it: the headers an
// NServiceBus 9 pipeline sets for a send (strings, written as AMQP long
// strings; NServiceBus.DeliverAt only when DeliverAt is set, to send also
// as NServiceBus before 7.7 does), the delay header (an AMQP int), the publish sequence number (an
// AMQP long), and the properties BasicPropertiesExtensions.Fill derives from
// the headers: message-id, persistent delivery, correlation-id, type (the
// first enclosed message type), content-type, reply-to.
func (s Send) Publishing() amqp.Publishing {
	const (
		contentType = "application/json"
		replyTo     = "Sales"
		types       = "Sales.Messages.OrderTimeout, Sales.Messages, Version=1.0.0.0, Culture=neutral, PublicKeyToken=null"
	)
	h := amqp.Table{
		"NServiceBus.MessageId":            s.MessageID,
		"NServiceBus.MessageIntent":        "Send",
		"NServiceBus.ConversationId":       "8f0e7c4a-6c1d-4a57-9b1e-b2a0015c2f31",
		"NServiceBus.CorrelationId":        s.MessageID,
		"NServiceBus.ReplyToAddress":       replyTo,
		"NServiceBus.OriginatingMachine":   "SALES-01",
		"NServiceBus.OriginatingEndpoint":  "Sales",
		"$.diagnostics.originating.hostid": "4c7f1f0a3b3e4a5c9d1e2f3a4b5c6d7e",
		"NServiceBus.ContentType":          contentType,
		"NServiceBus.EnclosedMessageTypes": types,
		"NServiceBus.Version":              "9.2.3",
		nsbdelay.HeaderTimeSent:            wire.FormatNSBTime(s.TimeSent),
		nsbdelay.HeaderDelay:               s.Delay,
		nsbdelay.HeaderPublishSeqNo:        s.SeqNo,
	}
	if !s.Retried.IsZero() {
		h["NServiceBus.Retries"] = "1"
		h[nsbdelay.HeaderRetriesTimestamp] = wire.FormatNSBTime(s.Retried)
	}
	if !s.DeliverAt.IsZero() {
		h[nsbdelay.HeaderDeliverAt] = wire.FormatNSBTime(s.DeliverAt)
	}
	for k, v := range s.Headers {
		h[k] = v
	}
	return amqp.Publishing{
		MessageId:     s.MessageID,
		DeliveryMode:  amqp.Persistent,
		CorrelationId: s.MessageID,
		Type:          types[:strings.IndexByte(types, ',')],
		ContentType:   contentType,
		ReplyTo:       replyTo,
		Headers:       h,
		Body:          s.Body,
	}
}

// Publish sends s on ch (in confirm mode) into chain c as the transport
// does: to the exchange of its first level, mandatory, and waits for the
// broker's confirm. The destination's binding is the caller's (Bind).
func Publish(ctx context.Context, ch *amqp.Channel, c nsbdelay.Chain, s Send) error {
	key, level := s.Key()
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, c.Level(level), key, true, false, s.Publishing())
	if err != nil {
		return fmt.Errorf("publish %s to %s: %w", s.MessageID, c.Level(level), err)
	}
	ok, err := dc.WaitContext(ctx)
	if err != nil || !ok {
		return fmt.Errorf("publish %s to %s: not confirmed (acked %v, %v)", s.MessageID, c.Level(level), ok, err)
	}
	return nil
}

// LockQueue is held, as an exclusive queue, by whoever uses the transport's
// names on a broker for a test or the bench: they are fixed, so two runs
// (other checkouts, CI, the bench) must never use them at the same time.
const LockQueue = "delaybridge-nsb-names-lock"

// ErrLocked means another connection holds LockQueue.
var ErrLocked = errors.New("another run holds " + LockQueue)

// TryLock takes LockQueue on a new connection from dial and returns it;
// closing it releases the lock.
func TryLock(dial func() (*amqp.Connection, error)) (*amqp.Connection, error) {
	conn, err := dial()
	if err != nil {
		return nil, err
	}
	ch, err := conn.Channel()
	if err == nil {
		_, err = ch.QueueDeclare(LockQueue, false, true, true, false, nil)
	}
	if err != nil {
		_ = conn.Close()
		var ae *amqp.Error
		if errors.As(err, &ae) && ae.Code == amqp.ResourceLocked {
			return nil, ErrLocked
		}
		return nil, fmt.Errorf("take %s: %w", LockQueue, err)
	}
	return conn, nil
}

// Lock waits until TryLock succeeds, or ctx ends.
func Lock(ctx context.Context, dial func() (*amqp.Connection, error)) (*amqp.Connection, error) {
	for {
		conn, err := TryLock(dial)
		if !errors.Is(err, ErrLocked) {
			return conn, err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for %s: %w", LockQueue, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}
