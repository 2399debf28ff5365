// Package masstransit serves MassTransit's message scheduler: endpoints
// configured with cfg.UseMessageScheduler(new Uri("queue:quartz")) send
// ScheduleMessage and CancelScheduledMessage to that queue (with
// cfg.UsePublishMessageScheduler() they publish them), and the bridge does
// what MassTransit's Quartz scheduler would: at the scheduled time it sends
// the payload to its destination. The recurring contracts make and control
// recurring schedules (recurring.go). This package is the one home of that
// wire format (docs/contract.md §2.10). Paths are in MassTransit/MassTransit.
//
// The facts it relies on, and where the framework's source states them:
//
//   - The contracts and their fields: src/MassTransit.Abstractions/
//     Contracts/Scheduling/ScheduleMessage.cs (correlationId: the token,
//     scheduledTime in UTC, payloadType, destination, payload),
//     CancelScheduledMessage.cs (correlationId, timestamp, tokenId) and
//     ScheduleRecurringMessage.cs. The token is the ScheduleMessage's
//     correlationId (src/MassTransit/Scheduling/ScheduleMessageCommand.cs);
//     a local scheduledTime is converted to UTC before sending.
//   - Sending them: src/MassTransit/Scheduling/EndpointScheduleMessageProvider.cs
//     (send to the scheduler's address) and PublishScheduleMessageProvider.cs
//     (publish). A message's type is "urn:message:" + namespace + ":" + name
//     (src/MassTransit.Abstractions/MessageUrn.cs); RabbitMQ publishes it to
//     the fanout exchange named namespace:name (src/Transports/
//     MassTransit.RabbitMqTransport/RabbitMqTransport/
//     RabbitMqMessageNameFormatter.cs), and sends to a queue through the
//     fanout exchange of the queue's name, with an empty routing key
//     (RabbitMqSendTransportContext.cs, RabbitMqEndpointAddress.cs).
//   - The envelope: src/MassTransit/Serialization/JsonMessageEnvelope.cs,
//     written by System.Text.Json in camelCase and read case-insensitively
//     (SystemTextJsonMessageSerializer.cs), content type
//     application/vnd.masstransit+json.
//   - What the Quartz scheduler sends: src/Scheduling/
//     MassTransit.QuartzIntegration/QuartzIntegration/ScheduleMessageConsumer.cs
//     wraps the payload in the ScheduleMessage's own envelope (its ids,
//     addresses, sentTime, expirationTime, headers and host) with messageType
//     = payloadType, and keeps the ScheduleMessage's message id, correlation
//     id, expiration time, headers and RabbitMQ transport properties in the
//     job data. ScheduledMessageJob.cs sends it to destination with those
//     (ForwardScheduledMessagePipe; the envelope is updated by
//     JsonMessageEnvelope.Update in src/MassTransit/Serialization/
//     JsonMessageEnvelope.cs: destinationAddress, ids, expirationTime,
//     headers), time to live = expirationTime - now. JobDataMessageContext.cs
//     adds MT-Quartz-Sent (FireTimeUtc: when the trigger fired),
//     MT-Quartz-Scheduled (ScheduledFireTimeUtc), MT-Quartz-NextScheduled
//     and MT-Quartz-PreviousSent only when the trigger has them (a one-shot
//     trigger has neither: quartznet src/Quartz/Impl/RAMJobStore.cs
//     TriggersFired, Impl/Triggers/SimpleTriggerImpl.cs Triggered),
//     MT-Scheduling-TokenId (the token, Guid "N"), MT-Quartz-ScheduleId (the
//     trigger's name: the token, "N") and MT-Quartz-ScheduleGroup (Quartz's
//     "DEFAULT"), as DateTimeOffset and string values; the names are in
//     src/MassTransit.Abstractions/MessageHeaders.cs.
//   - The RabbitMQ send (src/Transports/MassTransit.RabbitMqTransport/
//     RabbitMqTransport/RabbitMqSendTransportContext.cs): content type,
//     headers (DateTimeOffset as an AMQP timestamp in whole seconds,
//     AmqpTimestampExtensions.cs), persistent, message id and correlation id
//     (Guid "D"), expiration in milliseconds (1 s when not positive); no
//     timestamp property. App id, priority, reply-to, type, user id and a
//     non-empty routing key of the ScheduleMessage come along
//     (RabbitMqReceiveContext.GetTransportProperties,
//     RabbitMqMessageSendContext.ReadPropertiesFrom); the bridge drops the
//     user id, which the broker checks against its own user.
//   - A schedule whose token is scheduled already replaces it (the trigger
//     keyed by the token is unscheduled first: ScheduleMessageConsumer), and
//     a cancel unschedules the token's trigger (CancelScheduledMessageConsumer.cs).
//   - Addresses: rabbitmq://host[:port]/[vhost/]name (the last path
//     segment, QueryStringExtensions.ParseHostPathAndEntityName),
//     queue:name and exchange:name, query options after ?
//     (RabbitMqEndpointAddress.cs). Each names the exchange a send goes to;
//     the name "*" asks for a made-up temporary name, which is refused.
//     MassTransit writes the normalised address as destinationAddress and
//     declares what the query options ask for; the bridge keeps the address
//     as written and declares nothing (docs/contract.md §2.10).
package masstransit

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/intake"
	"github.com/delaybridge/delaybridge/message"
	"github.com/delaybridge/delaybridge/wire"
)

// ContentType is the JSON envelope's.
const ContentType = "application/vnd.masstransit+json"

// The scheduling contracts' exchanges, where publishing them routes
// (RabbitMqMessageNameFormatter: namespace:name).
const (
	ExchangeSchedule        = "MassTransit.Scheduling:ScheduleMessage"
	ExchangeCancel          = "MassTransit.Scheduling:CancelScheduledMessage"
	ExchangeRecurring       = "MassTransit.Scheduling:ScheduleRecurringMessage"
	ExchangeCancelRecurring = "MassTransit.Scheduling:CancelScheduledRecurringMessage"
)

// urnPrefix starts a message type URN (MessageUrn: urn:message:namespace:name).
const urnPrefix = "urn:message:"

// The headers the scheduler adds (MessageHeaders.cs).
const (
	HeaderTokenID       = "MT-Scheduling-TokenId"
	HeaderSent          = "MT-Quartz-Sent"
	HeaderScheduled     = "MT-Quartz-Scheduled"
	HeaderScheduleID    = "MT-Quartz-ScheduleId"
	HeaderScheduleGroup = "MT-Quartz-ScheduleGroup"
	// scheduleGroup is Quartz's default trigger group, the group of the
	// trigger ScheduleMessageConsumer creates (new TriggerKey(name)).
	scheduleGroup = "DEFAULT"
)

// Options configure the MassTransit intake.
type Options struct {
	// Queue is the scheduler's queue, as the endpoints address it.
	Queue string
}

// Sources is the intake of Queue; none when Queue is empty (the intake is
// off).
func (o Options) Sources() []intake.Source {
	if o.Queue == "" {
		return nil
	}
	return []intake.Source{{Name: "masstransit", Queue: o.Queue, Parser: intake.ParserFunc(o.Parse)}}
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

// Routes: none; the destinations are exchanges the allowed patterns decide
// on (docs/contract.md §2.10).
func (Options) Routes() []string { return nil }

// Stamp is Stamper's, whether the intake is on or not: rows stored while
// it was on are stamped even after it is turned off.
func (Options) Stamp(msg amqp.Publishing, id string, sentAt time.Time) amqp.Publishing {
	return Stamper{}.Stamp(msg, id, sentAt)
}

// boundExchanges are the exchanges the intake queue is bound to: the
// queue's own, for sends to queue:Queue, and the contracts' for publishes.
func (o Options) boundExchanges() []string {
	return []string{o.Queue, ExchangeSchedule, ExchangeCancel, ExchangeRecurring, ExchangeCancelRecurring,
		ExchangePauseRecurring, ExchangeResumeRecurring}
}

// Topology is what the bridge declares for the intake: Queue and each
// exchange, each only when missing, and their bindings. Each is declared
// as MassTransit declares it, since its senders declare them again on every
// channel (ConfigureRabbitMqTopologyFilter) and RabbitMQ refuses a
// declaration whose x-queue-type or alternate-exchange differs: the queue
// durable with no arguments at all, as a send to queue:Queue declares it
// (RabbitMqEndpointAddress: durable, not auto-delete, bound; RabbitMqSendSettings:
// empty QueueArguments), so a quorum DELAYBRIDGE_QUEUE_TYPE does not apply
// to it; the exchanges durable fanout without arguments
// (RabbitMqSendSettings.GetBrokerTopology, RabbitMqMessagePublishTopology).
// MassTransit binds a contract's exchange to the endpoint's exchange;
// binding it to the queue as well delivers each message once all the same
// (a queue gets one copy of a publish however many routes lead to it). None
// when the intake is off.
func (o Options) Topology() []broker.ForeignQueue {
	if o.Queue == "" {
		return nil
	}
	var fs []broker.ForeignQueue
	for _, x := range o.boundExchanges() {
		fs = append(fs, broker.ForeignQueue{Queue: o.Queue, Exchange: x, ExchangeType: amqp.ExchangeFanout})
	}
	return fs
}

// field is one member of a JSON object, in the order it came.
type field struct {
	name string
	raw  json.RawMessage
}

// members reads a JSON object's members in order.
func members(raw []byte) ([]field, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, errors.New("not a JSON object")
	}
	var fs []field
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, err
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, err
		}
		fs = append(fs, field{name: t.(string), raw: v})
	}
	if _, err := dec.Token(); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err == nil {
		return nil, errors.New("text after the JSON object")
	}
	return fs, nil
}

// get returns the member name, matched without regard to case as
// MassTransit reads (PropertyNameCaseInsensitive); nil when absent or null.
func get(fs []field, name string) json.RawMessage {
	if v := member(fs, name); string(v) != "null" {
		return v
	}
	return nil
}

// member is get with null kept as written.
func member(fs []field, name string) json.RawMessage {
	for _, f := range fs {
		if strings.EqualFold(f.name, name) {
			return f.raw
		}
	}
	return nil
}

// envelopeFields are JsonMessageEnvelope's properties, in its order.
var envelopeFields = []string{"messageId", "requestId", "correlationId", "conversationId", "initiatorId", "sourceAddress",
	"destinationAddress", "responseAddress", "faultAddress", "messageType", "message", "expirationTime", "sentTime", "headers", "host"}

// Parse reads a scheduler message: a ScheduleMessage replaces whatever its
// token has pending by its payload, a CancelScheduledMessage cancels it; a
// ScheduleRecurringMessage creates or replaces a recurring schedule, and
// Cancel-, Pause- and ResumeScheduledRecurringMessage control it
// (recurring.go); anything else is refused.
func (o Options) Parse(d *amqp.Delivery, now time.Time) intake.Intake {
	ct, _, _ := strings.Cut(d.ContentType, ";")
	if strings.TrimSpace(ct) != ContentType {
		return intake.Reject(fmt.Errorf("content type %q: the MassTransit scheduler queue %q takes MassTransit's JSON envelopes (%s)", d.ContentType, o.Queue, ContentType))
	}
	env, err := members(d.Body)
	if err != nil {
		return intake.Reject(fmt.Errorf("the body is not a MassTransit envelope: %w", err))
	}
	var types []string
	if raw := get(env, "messageType"); raw == nil || json.Unmarshal(raw, &types) != nil || len(types) == 0 {
		return intake.Reject(errors.New("the envelope's messageType is missing or not a list of message types"))
	}
	msg, err := members(get(env, "message"))
	if err != nil {
		return intake.Reject(fmt.Errorf("the envelope's message: %w", err))
	}
	switch {
	case slices.Contains(types, urnPrefix+ExchangeSchedule):
		return o.schedule(d, env, msg)
	case slices.Contains(types, urnPrefix+ExchangeCancel):
		token, err := guid(msg, "tokenId")
		if err != nil {
			return intake.Reject(fmt.Errorf("CancelScheduledMessage: %w", err))
		}
		return intake.Intake{Op: intake.OpCancelSaga, SagaID: token.String()}
	case slices.Contains(types, urnPrefix+ExchangeRecurring):
		return o.recurringSchedule(d, env, msg, now)
	}
	for _, c := range controls {
		if slices.Contains(types, urnPrefix+c.exchange) {
			return control(c.exchange, c.control, msg)
		}
	}
	return intake.Reject(fmt.Errorf("message types %q: the MassTransit scheduler queue takes ScheduleMessage, CancelScheduledMessage, "+
		"ScheduleRecurringMessage, CancelScheduledRecurringMessage, PauseScheduledRecurringMessage and ResumeScheduledRecurringMessage only", types))
}

// schedule reads a ScheduleMessage and builds what the scheduler sends.
func (o Options) schedule(d *amqp.Delivery, env, msg []field) intake.Intake {
	token, err := guid(msg, "correlationId")
	if err != nil {
		return intake.Reject(fmt.Errorf("ScheduleMessage: %w (the schedule token)", err))
	}
	var at string
	if raw := get(msg, "scheduledTime"); raw == nil || json.Unmarshal(raw, &at) != nil {
		return intake.Reject(errors.New("ScheduleMessage: scheduledTime is missing or not a string"))
	}
	due, err := ParseTime(at)
	if err != nil {
		return intake.Reject(fmt.Errorf("ScheduleMessage: scheduledTime: %w", err))
	}
	t, err := o.target(msg)
	if err != nil {
		return intake.Reject(fmt.Errorf("ScheduleMessage: %w", err))
	}
	payloadType, destRaw, payload, x := t.payloadType, t.dest, t.payload, t.exchange
	body, err := envelope(env, destRaw, payloadType, payload, scheduledHeaders(token, due))
	if err != nil {
		return intake.Reject(fmt.Errorf("ScheduleMessage: %w", err))
	}
	out, err := forward(d, env, body, scheduledHeaders(token, due))
	if err != nil {
		return intake.Reject(fmt.Errorf("ScheduleMessage: %w", err))
	}
	// A new id each time: the group (the token) is what repeats, and
	// OpReplace needs an id the group's cancel did not tombstone.
	return intake.Intake{Op: intake.OpReplace, ID: token.String() + "/" + uuid.NewString(), SagaID: token.String(),
		Exchange: x, Destination: d.RoutingKey, DueAt: due, Msg: out}
}

// target is where a scheduler message's payload goes, and the payload.
type target struct {
	payloadType, dest, payload json.RawMessage
	exchange                   string
}

// target reads payloadType, destination and payload of a ScheduleMessage
// or ScheduleRecurringMessage (their members of one name and meaning).
func (o Options) target(msg []field) (target, error) {
	t := target{payloadType: get(msg, "payloadType"), dest: get(msg, "destination"), payload: get(msg, "payload")}
	var pts []string
	if t.payloadType == nil || json.Unmarshal(t.payloadType, &pts) != nil || len(pts) == 0 {
		return t, errors.New("payloadType is missing or not a list of message types")
	}
	var dest string
	if t.dest == nil || json.Unmarshal(t.dest, &dest) != nil {
		return t, errors.New("destination is missing or not a string")
	}
	x, err := o.Exchange(dest)
	if err != nil {
		return t, fmt.Errorf("destination: %w", err)
	}
	t.exchange = x
	if t.payload == nil {
		return t, errors.New("payload is missing")
	}
	return t, nil
}

// forward is the send of the job ScheduleMessageConsumer or
// ScheduleRecurringMessage's consumer stores for the scheduler message d
// with envelope env: body as built by envelope, with the scheduler's
// headers add. Stamper finishes it when it is sent.
func forward(d *amqp.Delivery, env []field, body []byte, add []header) (amqp.Publishing, error) {
	// The job's send (ScheduledMessageJob.ForwardScheduledMessagePipe,
	// RabbitMqSendTransportContext.Send): the envelope's ids as message and
	// correlation id, persistent, the content type of the serializer, the
	// scheduler message's app id, priority, reply-to, type and routing key
	// carried over (RabbitMqReceiveContext.GetTransportProperties,
	// RabbitMqMessageSendContext.ReadPropertiesFrom); its user id is not
	// (the broker checks it against the bridge's user).
	in := message.FromDelivery(d)
	out := broker.Forwardable(amqp.Publishing{Headers: in.Headers, AppId: in.AppId, Priority: in.Priority, ReplyTo: in.ReplyTo,
		Type: in.Type, MessageId: in.MessageId, ContentType: ContentType, DeliveryMode: amqp.Persistent}, nil)
	if id, err := guid(env, "messageId"); err == nil {
		out.MessageId = id.String()
	}
	if id, err := guid(env, "correlationId"); err == nil {
		out.CorrelationId = id.String()
	}
	if out.Headers == nil {
		out.Headers = amqp.Table{}
	}
	for _, h := range add {
		out.Headers[h.name] = h.amqp
	}
	// Stamper finishes it when it is sent: the fire time, and the time to
	// live left of the envelope's expirationTime.
	var exp string
	if raw := get(env, "expirationTime"); raw != nil {
		if json.Unmarshal(raw, &exp) != nil {
			return amqp.Publishing{}, errors.New("the envelope's expirationTime is not a string")
		}
		if _, err := ParseTime(exp); err != nil {
			return amqp.Publishing{}, fmt.Errorf("the envelope's expirationTime: %w", err)
		}
	}
	out.Headers[stampHeader] = exp
	out.Body = body
	return out, nil
}

// header is one header the scheduler adds, as JSON in the envelope and as
// an AMQP header value.
type header struct {
	name string
	json string
	amqp any
}

// scheduledHeaders are the headers ScheduledMessageJob adds to a one-shot
// schedule's send (JobDataMessageContext.GetHeaders), in its order. The
// fire time is the scheduled time until Stamper sets the time of the send.
// A one-shot trigger has neither a previous nor a next fire time, so
// MT-Quartz-PreviousSent and MT-Quartz-NextScheduled are absent. System.Text.Json
// writes a DateTimeOffset as ISO 8601 with trailing zeros of the fraction
// dropped; RabbitMQ's send writes it as an AMQP timestamp (seconds).
func scheduledHeaders(token uuid.UUID, due time.Time) []header {
	n := strings.ReplaceAll(token.String(), "-", "")
	at := timeHeader(HeaderScheduled, due)
	return []header{
		sentHeader(due),
		at,
		{HeaderTokenID, quote(n), n},
		{HeaderScheduleID, quote(n), n},
		{HeaderScheduleGroup, quote(scheduleGroup), scheduleGroup},
	}
}

func sentHeader(at time.Time) header { return timeHeader(HeaderSent, at) }

// timeHeader is a DateTimeOffset header: ISO 8601 in UTC with a +00:00
// offset and 100 ns ticks, trailing zeros dropped, in JSON; whole seconds
// since the epoch as an AMQP timestamp (AmqpTimestampExtensions).
func timeHeader(name string, at time.Time) header {
	at = at.UTC().Truncate(100)
	return header{name, quote(at.Format("2006-01-02T15:04:05.9999999") + "+00:00"), at.Truncate(time.Second)}
}

func quote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// envelope is the ScheduleMessage's envelope turned into the payload's:
// JsonMessageEnvelope's properties in its order, each as the sender wrote
// it (null included, absent left out), with destinationAddress, messageType and message replaced and the
// scheduler's headers set (over a header of the same name, ignoring case,
// as its dictionary does).
func envelope(env []field, dest, payloadType, payload json.RawMessage, add []header) ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for _, name := range envelopeFields {
		var v json.RawMessage
		switch name {
		case "destinationAddress":
			v = dest
		case "messageType":
			v = payloadType
		case "message":
			v = payload
		case "headers":
			hs, err := headers(get(env, name), add)
			if err != nil {
				return nil, err
			}
			v = hs
		default:
			v = member(env, name)
		}
		if v == nil {
			continue
		}
		if b.Len() > 1 {
			b.WriteByte(',')
		}
		b.WriteString(quote(name))
		b.WriteByte(':')
		if err := json.Compact(&b, v); err != nil {
			return nil, err
		}
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// headers is the envelope's headers object with add set.
func headers(raw json.RawMessage, add []header) (json.RawMessage, error) {
	var fs []field
	if raw != nil {
		var err error
		if fs, err = members(raw); err != nil {
			return nil, fmt.Errorf("the envelope's headers: %w", err)
		}
	}
	for _, h := range add {
		i := slices.IndexFunc(fs, func(f field) bool { return strings.EqualFold(f.name, h.name) })
		if i < 0 {
			fs = append(fs, field{name: h.name, raw: json.RawMessage(h.json)})
			continue
		}
		fs[i].raw = json.RawMessage(h.json)
	}
	return object(fs), nil
}

// object writes fs as a JSON object, in order.
func object(fs []field) []byte {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, f := range fs {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(quote(f.name))
		b.WriteByte(':')
		b.Write(f.raw)
	}
	b.WriteByte('}')
	return b.Bytes()
}

// guid reads the Guid member name.
func guid(fs []field, name string) (uuid.UUID, error) {
	var s string
	raw := get(fs, name)
	if raw == nil || json.Unmarshal(raw, &s) != nil {
		return uuid.UUID{}, fmt.Errorf("%s is missing or not a string", name)
	}
	// .NET's Guid parser takes the 32 digits bare, with hyphens, or in
	// braces or parentheses; uuid.Parse takes the first three of those.
	id, err := uuid.Parse(strings.TrimSuffix(strings.TrimPrefix(s, "("), ")"))
	if err != nil {
		return uuid.UUID{}, fmt.Errorf("%s %q is not a Guid", name, wire.Clip(s))
	}
	return id, nil
}

// Exchange is the exchange a send to the MassTransit address a goes to
// (RabbitMqEndpointAddress): the last path segment of a rabbitmq, rabbitmqs,
// amqp or amqps address, or the name of queue:name or exchange:name, query
// options ignored. Host and virtual host are not checked: the bridge
// forwards on its own broker connection. An address of the scheduler's own
// queue or of a contract's exchange is refused: it would come back.
func (o Options) Exchange(a string) (string, error) {
	u, err := url.Parse(a)
	if err != nil {
		return "", fmt.Errorf("%q is not an address: %w", wire.Clip(a), err)
	}
	var name string
	switch strings.ToLower(u.Scheme) {
	case "rabbitmq", "rabbitmqs", "amqp", "amqps":
		p := u.EscapedPath()
		name = p[strings.LastIndexByte(p, '/')+1:]
	case "queue", "exchange":
		name = u.Opaque
		if name == "" {
			name = strings.TrimPrefix(u.EscapedPath(), "/")
		}
	default:
		return "", fmt.Errorf("%q: the address scheme %q is not a RabbitMQ one (rabbitmq, rabbitmqs, amqp, amqps, queue, exchange)", wire.Clip(a), u.Scheme)
	}
	if name, err = url.PathUnescape(name); err != nil {
		return "", fmt.Errorf("%q: %w", wire.Clip(a), err)
	}
	if name == "" {
		return "", fmt.Errorf("%q names no queue or exchange", wire.Clip(a))
	}
	if name == "*" {
		// RabbitMqEndpointAddress: a new name for each address, an entity
		// only the sending bus would declare.
		return "", fmt.Errorf("%q asks for a temporary entity named by the sender; the bridge cannot create it", wire.Clip(a))
	}
	if err := (wire.Destination{Exchange: name}).Validate(fmt.Sprintf("%q", wire.Clip(a))); err != nil {
		return "", err
	}
	if slices.Contains(o.boundExchanges(), name) {
		return "", fmt.Errorf("%q is the scheduler queue's own exchange %q: it would come back", wire.Clip(a), name)
	}
	return name, nil
}

// ParseTime reads scheduledTime as System.Text.Json writes a DateTime: ISO
// 8601, Z for a UTC one, an offset for a local one converted, nothing for
// an unspecified one, which MassTransit documents as UTC and is read so
// (Quartz would read it in its host's time zone).
func ParseTime(s string) (time.Time, error) {
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05.999999999"} {
		if t, err := time.Parse(layout, s); err == nil {
			// .NET keeps 100 ns ticks.
			return t.UTC().Truncate(100), nil
		}
	}
	return time.Time{}, fmt.Errorf("%q is not an ISO 8601 time such as 2026-11-24T12:45:30.1234567Z", wire.Clip(s))
}

// stampHeader marks a stored forward as this package's until it is sent;
// its value is the envelope's expirationTime as written, or empty.
const stampHeader = "x-delaybridge-masstransit-stamp"

// Stamper sets what MassTransit's Quartz job sets when its trigger fires
// (dispatch.Stamper): MT-Quartz-Sent to the time of the send
// (IJobExecutionContext.FireTimeUtc), in the envelope's headers and the
// AMQP headers, and the AMQP expiration to the time left until the
// envelope's expirationTime, at least a second
// (ScheduledMessageJob: TimeToLive = ExpirationTime - now;
// RabbitMqSendTransportContext: milliseconds, 1 s when not positive).
// Messages not marked by Parse are returned as they are.
type Stamper struct{}

// Stamp implements dispatch.Stamper.
func (Stamper) Stamp(msg amqp.Publishing, _ string, sentAt time.Time) amqp.Publishing {
	exp, ok := msg.Headers[stampHeader].(string)
	if !ok {
		return msg
	}
	hs := make(amqp.Table, len(msg.Headers))
	for k, v := range msg.Headers {
		if k != stampHeader {
			hs[k] = v
		}
	}
	sent := sentHeader(sentAt)
	if body, err := stampBody(msg.Body, sent); err == nil {
		// Parse wrote the body: it parses. Should it not, the scheduled
		// time it carries stands.
		hs[sent.name] = sent.amqp
		msg.Body = body
	}
	msg.Headers = hs
	msg.Expiration = ""
	if t, err := ParseTime(exp); exp != "" && err == nil {
		ttl := t.Sub(sentAt)
		if ttl <= 0 {
			ttl = time.Second
		}
		msg.Expiration = fmt.Sprint(ttl.Round(time.Millisecond).Milliseconds())
	}
	return msg
}

// stampBody sets the header h in the envelope body, its members kept in
// order.
func stampBody(body []byte, h header) ([]byte, error) {
	fs, err := members(body)
	if err != nil {
		return nil, err
	}
	for i, f := range fs {
		if strings.EqualFold(f.name, "headers") {
			if fs[i].raw, err = headers(f.raw, []header{h}); err != nil {
				return nil, err
			}
		}
	}
	return object(fs), nil
}
