package bench

import (
	"context"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/wire"
)

// stepNSBTimeouts is the punctuality workload as NServiceBus 3–7 endpoints
// defer messages to their timeout manager: sent to E.Timeouts with
// NServiceBus.Timeout.Expire and NServiceBus.Timeout.RouteExpiredTimeoutTo
// (TimeoutManagerRoutingStrategy), which the bridge serves with no setting
// of its own. NServiceBus's own timeout manager runs inside a .NET
// endpoint, which the bench cannot run.
func (b *bencher) stepNSBTimeouts(ctx context.Context) error {
	res, err := b.protocolStep(ctx, protocolRun{
		step: StepNSBTimeouts,
		bind: func(string) error { return nil }, // sent through the default exchange
		build: func(p *bridgeProc, dest string, seq int, due time.Time) outgoing {
			msg, _ := nsbTimeout(dest+"-"+strconv.Itoa(seq), dest, due, time.Now(), b.body, seq)
			return outgoing{key: p.timeoutsQueue(), msg: msg}
		},
	})
	if res != nil {
		b.res.NSBTimeouts = res
	}
	return err
}

// nsbTimeout is message seq deferred by an NServiceBus 5–7 endpoint to its
// timeout manager, due at due for queue dest: every NServiceBus header a
// string, the properties derived from them (as the integration test's saga
// timeout, without the saga). It returns the publishing and the due time
// as written (whole microseconds), which is its bench-due.
func nsbTimeout(id, dest string, due, sent time.Time, body []byte, seq int) (amqp.Publishing, time.Time) {
	due = due.UTC().Truncate(time.Microsecond)
	const (
		replyTo = "Sales"
		types   = "Sales.Messages.OrderTimeout, Sales.Messages, Version=1.0.0.0, Culture=neutral, PublicKeyToken=null"
	)
	return amqp.Publishing{
		MessageId: id, CorrelationId: id, DeliveryMode: amqp.Persistent,
		Type: "Sales.Messages.OrderTimeout", ContentType: "application/json", ReplyTo: replyTo,
		Headers: amqp.Table{
			"NServiceBus.MessageId":            id,
			"NServiceBus.CorrelationId":        id,
			"NServiceBus.MessageIntent":        "Send",
			"NServiceBus.Version":              "7.8.4",
			"NServiceBus.TimeSent":             wire.FormatNSBTime(sent),
			"NServiceBus.ContentType":          "application/json",
			"NServiceBus.EnclosedMessageTypes": types,
			"NServiceBus.ConversationId":       "8f0e7c4a-6c1d-4a57-9b1e-b2a0015c2f31",
			"NServiceBus.OriginatingEndpoint":  replyTo,
			"NServiceBus.OriginatingMachine":   "SALES-01",
			"NServiceBus.ReplyToAddress":       replyTo,
			wire.HeaderNSBExpire:               wire.FormatNSBTime(due),
			wire.HeaderNSBDestination:          dest,
			hdrDue:                             due.UnixNano(),
			hdrSeq:                             int64(seq),
		},
		Body: body,
	}, due
}
