// Package nsbtimeout serves E.Timeouts (docs/contract.md §2): messages that
// name their destination and due time in headers, the bridge's own
// (x-destination, x-due-at, x-delay) or those NServiceBus endpoints send
// their timeout manager, which one parser reads together since either may
// name the destination and the due time of one message (parse.go);
// cancels (x-delaybridge-cancel) and NServiceBus's requests to clear a
// saga's timeouts; recurring schedules (x-delaybridge-cron, recurring.go);
// dispatch failures retried from ServicePulse (retry.go); and the headers
// NServiceBus's timeout manager adds to a forward (Stamper, below).
package nsbtimeout

import (
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/wire"
)

// NServiceBus's timeout manager forwards a timeout with two headers of its
// own (wire.HeaderNSBTimeSent, wire.HeaderNSBRelatedToTimeoutID): sagas,
// auditing and ServiceControl read the time a message was sent from
// NServiceBus.TimeSent, which for a timeout is when the timeout manager
// sent it. The bridge sets both when it forwards a message whose due time
// was NServiceBus.Timeout.Expire (ParseHeaders marks it), so an endpoint sees what its own timeout
// manager would have sent (docs/contract.md §3.2). The message id is left
// as it came: the 5.x timeout manager sent the NServiceBus.MessageId header
// as the message-id property (TransportMessage.Id), the 7.x one the id of
// its own dispatch request, and every NServiceBus receiver takes a
// message's id from that header first (IncomingMessage in 6.x and 7.x,
// TransportMessage.Id in 5.x), which the forward keeps.

// Stamper sets what NServiceBus's timeout manager sets when it
// dispatches a timeout (dispatch.Stamper): NServiceBus.TimeSent to the time
// of the forward, NServiceBus.RelatedToTimeoutId to the id the bridge
// stored it under. Messages not marked at ingest are returned as they are.
type Stamper struct{}

// Stamp implements dispatch.Stamper.
func (Stamper) Stamp(msg amqp.Publishing, id string, sentAt time.Time) amqp.Publishing {
	if _, ok := msg.Headers[wire.HeaderNSBTimeoutStamp]; !ok {
		return msg
	}
	hs := make(amqp.Table, len(msg.Headers)+1)
	for k, v := range msg.Headers {
		if k != wire.HeaderNSBTimeoutStamp {
			hs[k] = v
		}
	}
	hs[wire.HeaderNSBTimeSent] = wire.FormatNSBTime(sentAt)
	hs[wire.HeaderNSBRelatedToTimeoutID] = id
	msg.Headers = hs
	return msg
}
