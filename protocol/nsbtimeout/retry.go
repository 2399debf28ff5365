package nsbtimeout

import (
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/errorqueue"
	"github.com/delaybridge/delaybridge/intake"
	"github.com/delaybridge/delaybridge/message"
	"github.com/delaybridge/delaybridge/wire"
)

// IsRetry says whether a delivery to E.Timeouts is the bridge's own error
// copy of a dispatch failure coming back, as ServicePulse retries it: it
// sends the copy to its NServiceBus.FailedQ (E.Timeouts) with the headers it
// had, less the failure headers (NServiceBus.FailedQ, NServiceBus.TimeOfFailure,
// NServiceBus.ExceptionInfo.*, NServiceBus.Retries*) and plus
// ServiceControl.Retry.* (Particular/ServiceControl
// src/ServiceControl/Recoverability/Retrying/HeaderFilter.cs, RetryProcessor.cs,
// Infrastructure/ReturnToSender.cs). Such a copy has x-delaybridge-stage:
// dispatch and, the bridge having dropped them before the forward, no
// due-time header; one that was given x-due-at or NServiceBus.Timeout.Expire
// again is an ordinary message to schedule at that time.
func IsRetry(h amqp.Table) bool {
	if errorqueue.Stage(h) != wire.StageDispatch {
		return false
	}
	for _, k := range []string{wire.HeaderDueAt, wire.HeaderNSBExpire} {
		if v, ok := h[k]; ok && v != nil {
			return false
		}
	}
	return true
}

// ParseRetry reads a dispatch failure's error copy as the message to send
// again, due at now: to where the failed forward went (x-delaybridge-exchange
// and -routing-key; on copies from before those headers, the destination
// headers), with its id, and without the headers the failure added or the
// due-time headers (a forward must not loop back into a delay). The
// ServiceControl.Retry.* headers stay: the receiving NServiceBus endpoint
// acknowledges the retry to ServiceControl with them. It is used for a
// copy coming back to E.Timeouts (IsRetry) and by the admin API's replay.
// An empty ID is the caller's to refuse or fill.
func ParseRetry(d *amqp.Delivery, now time.Time) intake.Intake {
	dest, err := ForwardedTo(d.Headers)
	if err != nil {
		return intake.Reject(err)
	}
	id, err := intake.ParseID(d)
	if err != nil {
		return intake.Reject(err)
	}
	p := message.FromDelivery(d)
	h := make(amqp.Table, len(p.Headers))
	for k, v := range p.Headers {
		if !errorqueue.FailureHeader(k) {
			h[k] = v
		}
	}
	p.Headers = h
	return intake.Intake{Op: intake.OpSchedule, ID: id, Destination: dest.Key, Exchange: dest.Exchange, DueAt: now,
		Msg: broker.Forwardable(p, wire.DueTimeHeaders)}
}

// ForwardedTo reads where a dispatch failure's forward went: the copy's
// x-delaybridge-exchange and -routing-key headers, or, on copies from
// before those headers, the destination headers as ingest reads them.
// Either way the destination passes the checks ingest applies.
func ForwardedTo(h amqp.Table) (wire.Destination, error) {
	if _, ok := h[wire.HeaderForwardRoutingKey]; !ok {
		return ParseDestination(h)
	}
	x, _, err := intake.HeaderString(h, wire.HeaderForwardExchange)
	if err != nil {
		return wire.Destination{}, err
	}
	key, _, err := intake.HeaderString(h, wire.HeaderForwardRoutingKey)
	if err != nil {
		return wire.Destination{}, err
	}
	d := wire.Destination{Exchange: x, Key: key}
	if err := d.Validate("header " + wire.HeaderForwardRoutingKey + "'s destination"); err != nil {
		return wire.Destination{}, err
	}
	return d, nil
}
