// Package servicecontrol does what ServiceControl does to a failed message
// an operator retries from ServicePulse, for tests of the bridge's error
// copies.
package servicecontrol

import (
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"
)

// removedOnRetry are the prefixes of the headers ServiceControl drops from
// a message it retries (HeaderFilter.KeysToRemoveWhenRetryingAMessage).
var removedOnRetry = []string{"NServiceBus.Retries", "NServiceBus.FailedQ", "NServiceBus.TimeOfFailure", "NServiceBus.ExceptionInfo.", "ServiceControl.EditOf"}

// RetryHeaders are the headers ServiceControl sends a retried failed
// message back to its NServiceBus.FailedQ with: the failed message's
// headers less those removedOnRetry starts with, plus the retry headers
// RetryProcessor.ToTransportOperation sets and ReturnToSender.HandleMessage
// leaves (Particular/ServiceControl, src/ServiceControl/Recoverability/
// Retrying/). uniqueID is ServiceControl's id of the failed message.
func RetryHeaders(failed amqp.Table, uniqueID string) amqp.Table {
	h := amqp.Table{}
	for k, v := range failed {
		drop := false
		for _, prefix := range removedOnRetry {
			drop = drop || strings.HasPrefix(k, prefix)
		}
		if !drop {
			h[k] = v
		}
	}
	h["ServiceControl.Retry.UniqueMessageId"] = uniqueID
	h["ServiceControl.Retry.AcknowledgementQueue"] = "error"
	return h
}
