// Package rebus serves Rebus's external timeout manager: endpoints configured
// with .Timeouts(t => t.UseExternalTimeoutManager("timeouts")) send every
// message they defer to that queue, and the bridge delivers it to its
// recipient when it is due. This package is the one home of that wire
// format (docs/contract.md §2.8).
//
// The facts it relies on, and where the framework's source states them:
//
//   - Header names: rebus-org/Rebus, Rebus/Messages/Headers.cs.
//   - Deferring sets rbs2-deferred-until to the due time and
//     rbs2-defer-recipient to the recipient (kept when the message has one
//     already, so a message deferred again goes back where it went before),
//     and increments rbs2-defer-count; the message keeps its rbs2-msg-id
//     when the current message is deferred again: rebus-org/Rebus,
//     Rebus/Bus/MessageExtensions.cs (SetDeferHeaders) and
//     Rebus/Bus/AdvancedRebusBus.cs (TransportMessageApi.Defer).
//   - The due time is DateTimeOffset.ToString("O"): rebus-org/Rebus,
//     Rebus/Extensions/DateTimeExtensions.cs (ToIso8601DateTimeOffset). For a
//     DateTimeOffset .NET writes yyyy-MM-ddTHH:mm:ss.fffffff±hh:mm, the clock
//     time at the offset with 7 fraction digits and the offset always in
//     numbers (dotnet/runtime, System.Private.CoreLib/src/System/Globalization/
//     DateTimeFormat.cs, TryFormatO). Rebus reads it back with
//     TryParseExact(…, "O", …, RoundtripKind) (ToDateTimeOffset), which takes
//     exactly 7 fraction digits, then Z, ±hh:mm or ±h:mm, or nothing, read as
//     the reader's local time (DateTimeParse.cs, ParseFormatO).
//   - Rebus.RabbitMq publishes every header as the UTF-8 bytes of its string
//     value (rebus-org/Rebus.RabbitMq, Rebus.RabbitMq/RabbitMq/
//     RabbitMqTransport.cs, CreateBasicProperties), which RabbitMQ.Client
//     writes as AMQP long strings, type 'S' (rabbitmq/rabbitmq-dotnet-client,
//     projects/RabbitMQ.Client/Impl/WireFormatting.Write.cs). The
//     message-id property is rbs2-msg-id (RabbitMqHeaders.MessageId).
//   - An address is a queue, sent to through the direct exchange (RebusDirect
//     unless configured: Rebus.RabbitMq/Config/RabbitMqOptionsBuilder.cs)
//     with the queue's name as routing key, or routingKey@exchange, split at
//     the last @, an empty exchange being the default exchange
//     (Rebus.RabbitMq/Internals/FullyQualifiedRoutingKey.cs, and
//     RabbitMqTransport.GetPublishInfo).
//   - Every endpoint binds its input queue to the direct exchange with its
//     name as routing key (RabbitMqTransport.BindInputQueue). A sender of a
//     point-to-point message, a deferred one included, first checks that
//     the queue exists (a passive declaration: it never creates it), and
//     binds it to the exchange with the routing key
//     (RabbitMqTransport.CheckQueueExistence). So the timeout manager queue
//     must exist before an endpoint defers anything. An endpoint whose input
//     queue it is declares it durable with the argument x-ha-policy=all
//     (Rebus.RabbitMq/Config/RabbitMqQueueOptionsBuilder.cs). Every
//     endpoint declares the direct exchange when it starts: durable, of type
//     direct, with the arguments its AddArgumentToDirectExchange(key, value)
//     calls gave, strings, none by default (RabbitMqTransport.DeclareExchanges,
//     Rebus.RabbitMq/Config/RabbitMqExchangeOptionsBuilder.cs). RabbitMQ
//     compares an exchange's alternate-exchange argument on every
//     declaration, so the bridge declares it with the same arguments.
//   - Rebus's own timeout manager stores a deferred message with
//     rbs2-deferred-until removed and every other header kept, and at the
//     due time sends it to rbs2-defer-recipient; a deferred message without
//     that header is an error (rebus-org/Rebus,
//     Rebus/Pipeline/Receive/HandleDeferredMessagesStep.cs).
package rebus

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/intake"
	"github.com/delaybridge/delaybridge/message"
	"github.com/delaybridge/delaybridge/wire"
)

// Rebus's headers (Rebus/Messages/Headers.cs).
const (
	HeaderMessageID      = "rbs2-msg-id"
	HeaderDeferredUntil  = "rbs2-deferred-until"
	HeaderDeferRecipient = "rbs2-defer-recipient"
)

// DefaultDirectExchange is Rebus.RabbitMq's direct exchange unless an
// endpoint configures another (RabbitMqOptionsBuilder.DefaultDirectExchangeName).
const DefaultDirectExchange = "RebusDirect"

// Options configure the Rebus intake.
type Options struct {
	// Queue is the timeout manager's address, as the endpoints name it.
	Queue string
	// DirectExchange is the endpoints' direct exchange.
	DirectExchange string
	// QueueType is the x-queue-type of Queue when the bridge declares it.
	QueueType string
	// DirectExchangeArgs are the arguments the endpoints declare
	// DirectExchange with (AddArgumentToDirectExchange), which the bridge
	// declares it with when it is missing.
	DirectExchangeArgs amqp.Table
}

// Sources is the intake of Queue; none when Queue is empty (the intake is
// off).
func (o Options) Sources() []intake.Source {
	if o.Queue == "" {
		return nil
	}
	return []intake.Source{{Name: "rebus", Queue: o.Queue, Parser: intake.ParserFunc(o.Parse)}}
}

// Topology is what the bridge declares for the intake: Queue and the direct
// exchange, each only when missing (the exchange as the endpoints declare
// it), and the binding the senders route by; and NServiceBus's conventional
// exchange of Queue, since the error copies of its messages name Queue in
// NServiceBus.FailedQ too, where ServiceControl sends them back
// (docs/contract.md §1). None when the intake is off.
func (o Options) Topology() []broker.ForeignQueue {
	if o.Queue == "" {
		return nil
	}
	return []broker.ForeignQueue{{
		Queue: o.Queue, QueueArgs: amqp.Table{amqp.QueueTypeArg: o.QueueType},
		Exchange: o.DirectExchange, ExchangeType: amqp.ExchangeDirect, ExchangeArgs: o.DirectExchangeArgs, RoutingKey: o.Queue,
	}, broker.ConventionalExchange(o.Queue)}
}

// Declare declares Topology.
func (o Options) Declare(conn *amqp.Connection) error {
	return broker.DeclareForeign(conn, o.Topology()...)
}

// Reserved is Queue: a message forwarded there would come straight back.
func (o Options) Reserved() []string {
	if o.Queue == "" {
		return nil
	}
	return []string{o.Queue}
}

// Routes is the direct exchange, where recipients are sent to: the
// configuration named it, so the allowed destinations need not.
func (o Options) Routes() []string {
	if o.Queue == "" {
		return nil
	}
	return []string{o.DirectExchange}
}

// Parse reads a deferred message: due at rbs2-deferred-until, for
// rbs2-defer-recipient, forwarded with rbs2-deferred-until removed and
// everything else as it came. Its id is deferID's.
func (o Options) Parse(d *amqp.Delivery, _ time.Time) intake.Intake {
	until, ok, err := intake.HeaderString(d.Headers, HeaderDeferredUntil)
	if err != nil {
		return intake.Reject(err)
	}
	if !ok {
		return intake.Reject(fmt.Errorf("no header %s: only messages Rebus defers belong on the timeout manager queue %q", HeaderDeferredUntil, o.Queue))
	}
	due, err := ParseTime(until)
	if err != nil {
		return intake.Reject(fmt.Errorf("header %s: %w", HeaderDeferredUntil, err))
	}
	recipient, ok, err := intake.HeaderString(d.Headers, HeaderDeferRecipient)
	if err != nil {
		return intake.Reject(err)
	}
	if !ok {
		return intake.Reject(fmt.Errorf("no header %s: a deferred message must name its recipient", HeaderDeferRecipient))
	}
	dest, err := o.Recipient(recipient)
	if err != nil {
		return intake.Reject(fmt.Errorf("header %s: %w", HeaderDeferRecipient, err))
	}
	id, err := deferID(d, recipient, until)
	if err != nil {
		return intake.Reject(err)
	}
	return intake.Intake{Op: intake.OpSchedule, ID: id, Exchange: dest.Exchange, Destination: dest.Key, DueAt: due,
		Msg: broker.Forwardable(message.FromDelivery(d), []string{HeaderDeferredUntil})}
}

// Recipient is where Rebus.RabbitMq sends the address a: a queue through
// the direct exchange, or routingKey@exchange split at the last @ (through
// the default exchange, so to the queue routingKey, when exchange is empty).
// An address that would come back to the timeout manager queue is refused.
func (o Options) Recipient(a string) (wire.Destination, error) {
	if a == "" {
		return wire.Destination{}, errors.New("it is empty")
	}
	d := wire.Destination{Exchange: o.DirectExchange, Key: a}
	if at := strings.LastIndexByte(a, '@'); at >= 0 {
		d = wire.Destination{Exchange: a[at+1:], Key: a[:at]}
	}
	if d.Exchange == "amq.default" {
		// The broker refuses publishes to that name (NOT_FOUND).
		return wire.Destination{}, fmt.Errorf("%q names exchange amq.default, which cannot be published to; write %s@ for the queue", a, d.Key)
	}
	if err := d.Validate(fmt.Sprintf("%q", a)); err != nil {
		return wire.Destination{}, err
	}
	if d == wire.Queue(o.Queue) || d == (wire.Destination{Exchange: o.DirectExchange, Key: o.Queue}) {
		return wire.Destination{}, fmt.Errorf("%q is the timeout manager queue itself", a)
	}
	return d, nil
}

// deferID names one deferral: the message's id (rbs2-msg-id, else the
// message-id property), its recipient and its due time as written. A
// message sent twice (a sender's retry, an outbox resend) has the same
// one, so it is stored once; a message deferred again, even to the same
// recipient, has a new due time. The recipient keeps apart the deferrals of
// one published event by several subscribers, whose due times can be equal
// on a coarse clock. Without an id, or when the three do not fit an id
// (wire.ValidateID), the bridge generates one: stored without duplicate
// suppression, and the message keeps its message-id property either way.
func deferID(d *amqp.Delivery, recipient, until string) (string, error) {
	msgID, _, err := intake.HeaderString(d.Headers, HeaderMessageID)
	if err != nil {
		return "", err
	}
	if strings.TrimSpace(msgID) == "" {
		msgID = d.MessageId
	}
	if strings.TrimSpace(msgID) != "" {
		if id := msgID + "/" + recipient + "/" + until; wire.ValidateID("id", id) == nil {
			return id, nil
		}
	}
	return uuid.NewString(), nil
}

// maxOffset is the largest offset a .NET DateTimeOffset can have.
const maxOffset = 14 * time.Hour

// ParseTime reads a due time as Rebus's own timeout manager does (.NET's
// "O" format, see the package comment: yyyy-MM-ddTHH:mm:ss.fffffff, then Z,
// ±hh:mm or ±h:mm), but refuses a time without an offset, which .NET would
// read in the local time zone of whichever host reads it: Rebus always
// writes one. Minutes of the offset past 59 are refused too.
func ParseTime(s string) (time.Time, error) {
	bad := fmt.Errorf("%q is not a .NET round-trip time such as 2026-11-24T13:45:30.1234567+01:00", wire.Clip(s))
	if len(s) < 27 || len(s) > 33 {
		return time.Time{}, bad
	}
	for i := range 27 {
		want := byte('0') // any digit
		switch i {
		case 4, 7:
			want = '-'
		case 10:
			want = 'T'
		case 13, 16:
			want = ':'
		case 19:
			want = '.'
		}
		if c := s[i]; want == '0' && !isDigit(c) || want != '0' && c != want {
			return time.Time{}, bad
		}
	}
	// Every field has its digits now; Parse checks their ranges.
	clock, err := time.Parse("2006-01-02T15:04:05", s[:19])
	if err != nil || clock.Year() < 1 {
		return time.Time{}, bad
	}
	ticks := 0 // of 100 ns
	for _, c := range s[20:27] {
		ticks = ticks*10 + int(c-'0')
	}
	var offset time.Duration
	switch zone := s[27:]; {
	case zone == "":
		return time.Time{}, fmt.Errorf("%q has no offset (Rebus writes one, such as +01:00)", s)
	case zone == "Z":
	case (zone[0] == '+' || zone[0] == '-') && (len(zone) == 5 || len(zone) == 6):
		h, m, ok := strings.Cut(zone[1:], ":")
		if !ok || len(m) != 2 || !isDigit(h[0]) || !isDigit(h[len(h)-1]) || !isDigit(m[0]) || !isDigit(m[1]) || m[0] > '5' {
			return time.Time{}, bad
		}
		hours := int(h[0] - '0')
		if len(h) == 2 {
			hours = hours*10 + int(h[1]-'0')
		}
		offset = time.Duration(hours)*time.Hour + time.Duration(m[0]-'0')*10*time.Minute + time.Duration(m[1]-'0')*time.Minute
		if offset > maxOffset {
			return time.Time{}, fmt.Errorf("%q: the offset is beyond ±14:00", s)
		}
		if zone[0] == '-' {
			offset = -offset
		}
	default:
		return time.Time{}, bad
	}
	return clock.Add(time.Duration(ticks)*100 - offset).UTC(), nil
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }
