package bench

import (
	"context"
	"encoding/json"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/protocol/masstransit"
)

// stepMassTransit is the punctuality workload as MassTransit endpoints
// schedule messages with a bridge as their message scheduler
// (DELAYBRIDGE_MASSTRANSIT_QUEUE): each a ScheduleMessage envelope sent to
// the scheduler's queue through its exchange, as UseMessageScheduler sends,
// for a destination queue bound to the exchange of its name, where the
// bridge sends the payload. The bench's headers ride in the AMQP headers,
// which the forward keeps. MassTransit's own scheduler (Quartz, Hangfire)
// runs in a .NET host, which the bench cannot run.
func (b *bencher) stepMassTransit(ctx context.Context) error {
	sched := b.name(StepMassTransit, "quartz")
	b.reg.queue(sched) // the bridge declares both; the contracts' exchanges are shared, so left alone
	b.reg.exchange(sched)
	res, err := b.protocolStep(ctx, protocolRun{
		step: StepMassTransit,
		env:  map[string]string{"DELAYBRIDGE_MASSTRANSIT_QUEUE": sched},
		bind: func(dest string) error {
			// MassTransit's RabbitMQ transport sends to queue:dest through
			// a fanout exchange of that name bound to the queue.
			if err := b.declareExchange(dest, amqp.ExchangeFanout); err != nil {
				return err
			}
			return b.bindQueue(dest, "", dest)
		},
		build: func(_ *bridgeProc, dest string, seq int, due time.Time) outgoing {
			msg, _ := mtSchedule(uuid.New(), due, sched, dest, b.body, seq)
			return outgoing{exchange: sched, msg: msg}
		},
	})
	if res != nil {
		b.res.MassTransit = res
	}
	return err
}

// mtEnvelope is MassTransit's JSON envelope (JsonMessageEnvelope), its
// properties in that order, as System.Text.Json writes them.
type mtEnvelope struct {
	MessageID          string         `json:"messageId"`
	RequestID          *string        `json:"requestId"`
	CorrelationID      *string        `json:"correlationId"`
	ConversationID     string         `json:"conversationId"`
	InitiatorID        *string        `json:"initiatorId"`
	SourceAddress      string         `json:"sourceAddress"`
	DestinationAddress string         `json:"destinationAddress"`
	ResponseAddress    *string        `json:"responseAddress"`
	FaultAddress       *string        `json:"faultAddress"`
	MessageType        []string       `json:"messageType"`
	Message            mtSchedulePart `json:"message"`
	ExpirationTime     *string        `json:"expirationTime"`
	SentTime           string         `json:"sentTime"`
	Headers            map[string]any `json:"headers"`
	Host               map[string]any `json:"host"`
}

// mtSchedulePart is ScheduleMessage's body (ScheduleMessageCommand).
type mtSchedulePart struct {
	CorrelationID string   `json:"correlationId"`
	ScheduledTime string   `json:"scheduledTime"`
	PayloadType   []string `json:"payloadType"`
	Destination   string   `json:"destination"`
	Payload       any      `json:"payload"`
}

// mtSchedule is message seq as a MassTransit endpoint sends a
// ScheduleMessage for the payload body (base64 in a JSON object) due at due
// to queue dest, to the scheduler queue sched: token the schedule's
// correlationId, scheduledTime in UTC with .NET's 7 fractional digits, the
// destination the endpoint's full address. It returns the publishing and
// the due time as written (100 ns ticks), which is its bench-due.
func mtSchedule(token uuid.UUID, due time.Time, sched, dest string, body []byte, seq int) (amqp.Publishing, time.Time) {
	due = due.UTC().Truncate(100)
	now := time.Now().UTC()
	const addr = "rabbitmq://localhost/"
	id := uuid.NewString()
	env := mtEnvelope{
		MessageID: id, ConversationID: id, SourceAddress: addr + "bench_sender", DestinationAddress: addr + sched,
		MessageType: []string{"urn:message:" + masstransit.ExchangeSchedule},
		Message: mtSchedulePart{
			CorrelationID: token.String(), ScheduledTime: due.Format("2006-01-02T15:04:05.0000000Z"),
			PayloadType: []string{"urn:message:Bench.Contracts:Due"}, Destination: addr + dest,
			Payload: map[string]any{"seq": seq, "data": body},
		},
		SentTime: now.Format("2006-01-02T15:04:05.0000000Z"),
		Headers:  map[string]any{hdrDue: due.UnixNano(), hdrSeq: seq},
		Host:     map[string]any{"machineName": "bench", "processName": "delaybridge-bench", "massTransitVersion": "8.3.4.0"},
	}
	data, err := json.Marshal(env)
	if err != nil {
		panic(err) // a fixed shape of strings, numbers and bytes: cannot fail
	}
	return amqp.Publishing{
		MessageId: id, ContentType: masstransit.ContentType, DeliveryMode: amqp.Persistent,
		Headers: amqp.Table{hdrDue: due.UnixNano(), hdrSeq: int64(seq)},
		Body:    data,
	}, due
}
