// Package wire is the one home of delaybridge's wire format: the queue names
// of an endpoint, the headers clients set, the headers the bridge puts on
// error-queue copies, and the dispatcher token that the poller hands to the
// dispatcher. docs/contract.md describes them for users; every package that
// reads or writes them takes the names from here.
package wire

import (
	"encoding/json"
	"fmt"
)

// Queue names of an endpoint (docs/contract.md §1).

// TimeoutsQueue is where clients publish messages to delay.
func TimeoutsQueue(endpoint string) string { return endpoint + ".Timeouts" }

// DispatcherQueue carries lease tokens from the poller to the dispatcher.
func DispatcherQueue(endpoint string) string { return endpoint + ".TimeoutsDispatcher" }

// DelayedRoute is the routing exchange of the delayed exchange name
// (docs/contract.md §2.7): consumers bind there, and the bridge forwards
// there what publishers sent to name.
func DelayedRoute(name string) string { return name + DelayedRouteSuffix }

// DelayedRouteSuffix ends every delayed exchange's routing exchange.
const DelayedRouteSuffix = ".route"

// Headers a client sets on E.Timeouts (docs/contract.md §2).
const (
	// HeaderDestination names the queue to deliver to.
	HeaderDestination = "x-destination"
	// HeaderDestinationExchange names an exchange to deliver to, instead
	// of a queue; HeaderDestinationRoutingKey is the routing key to publish
	// with (default empty).
	HeaderDestinationExchange   = "x-destination-exchange"
	HeaderDestinationRoutingKey = "x-destination-routing-key"
	// HeaderNSBDestination is the NServiceBus timeout manager's destination.
	HeaderNSBDestination = "NServiceBus.Timeout.RouteExpiredTimeoutTo"
	// HeaderNSBReplyTo is NServiceBus's reply-to address; its timeout
	// manager delivers there when HeaderNSBDestination is absent.
	HeaderNSBReplyTo = "NServiceBus.ReplyToAddress"
	// HeaderDueAt is the due time, RFC 3339 (or an AMQP timestamp).
	HeaderDueAt = "x-due-at"
	// HeaderNSBExpire is the NServiceBus timeout manager's due time.
	HeaderNSBExpire = "NServiceBus.Timeout.Expire"
	// HeaderDelay is a delay in milliseconds from receipt, as the
	// delayed-message-exchange plugin's clients send it.
	HeaderDelay = "x-delay"
	// HeaderNSBMessageID is NServiceBus's message id, used when the
	// message-id property is empty.
	HeaderNSBMessageID = "NServiceBus.MessageId"
	// HeaderNSBSagaID is the saga a message belongs to: stored with a
	// timeout, and the saga whose timeouts HeaderNSBClearTimeouts cancels.
	HeaderNSBSagaID = "NServiceBus.SagaId"
	// HeaderNSBClearTimeouts (any value; NServiceBus writes "True") asks to
	// cancel every pending timeout of the saga HeaderNSBSagaID names.
	HeaderNSBClearTimeouts = "NServiceBus.ClearTimeouts"
	// HeaderCancel asks to cancel the pending message with this id.
	HeaderCancel = "x-delaybridge-cancel"
)

// What NServiceBus's timeout manager sets on a timeout it dispatches
// (docs/contract.md §3.2): Particular/NServiceBus,
// src/NServiceBus.Core/DelayedDelivery/TimeoutManager/DispatchTimeoutBehavior.cs
// in 6.x and 7.x, src/NServiceBus.Core/Timeout/Core/TimeoutData.cs
// (ToTransportMessage) in 4.x and 5.x: NServiceBus.TimeSent the time of the
// dispatch, in the wire format (FormatNSBTime), and
// NServiceBus.RelatedToTimeoutId the id it stored the timeout under.
const (
	HeaderNSBTimeSent           = "NServiceBus.TimeSent"
	HeaderNSBRelatedToTimeoutID = "NServiceBus.RelatedToTimeoutId"
	// HeaderNSBTimeoutStamp marks a stored NServiceBus timeout until the
	// dispatcher sets those two headers when it forwards it.
	HeaderNSBTimeoutStamp = "x-delaybridge-nsb-timeout"
)

// DueTimeHeaders are removed before forwarding so a forwarded message can
// never loop back into a delay.
var DueTimeHeaders = []string{HeaderDueAt, HeaderNSBExpire, HeaderDelay}

// Headers the bridge adds to error-queue copies (docs/contract.md §4). The
// NServiceBus ones let ServiceControl and ServicePulse show them.
const (
	HeaderError        = "x-delaybridge-error"
	HeaderStage        = "x-delaybridge-stage"
	HeaderFailedAt     = "x-delaybridge-failed-at"
	HeaderAttempts     = "x-delaybridge-attempts"
	HeaderNSBException = "NServiceBus.ExceptionInfo.Message"
	HeaderNSBFailedQ   = "NServiceBus.FailedQ"
	// HeaderForwardExchange and HeaderForwardRoutingKey, on dispatch
	// failures, are the exchange ("" for the default exchange) and routing
	// key the failed forward was published with.
	HeaderForwardExchange   = "x-delaybridge-exchange"
	HeaderForwardRoutingKey = "x-delaybridge-routing-key"

	// HeaderPrefix starts every header the bridge itself sets.
	HeaderPrefix = "x-delaybridge-"
)

// The NServiceBus failure headers (docs/contract.md §4.1) that ServiceControl
// reads to import, group and retry a failed message. Names from
// Particular/NServiceBus src/NServiceBus.Core/Recoverability/Faults/FaultsHeaderKeys.cs
// (ExceptionInfo.*, TimeOfFailure) and src/NServiceBus.Core/Headers.cs (the
// processing host, set by CreateFaultMetadataExtractor in
// Recoverability/RecoverabilityComponent.cs). ServiceControl
// (Particular/ServiceControl src/ServiceControl/Operations/FailedMessageFactory.cs)
// requires NServiceBus.FailedQ and NServiceBus.MessageId, parses
// TimeOfFailure with DateTimeOffsetHelper (FormatNSBTime), and groups by
// exception type and the first stack frame
// (Recoverability/Grouping/Groupers/ExceptionTypeAndStackTraceFailureClassifier.cs).
const (
	HeaderNSBExceptionType   = "NServiceBus.ExceptionInfo.ExceptionType"
	HeaderNSBExceptionSource = "NServiceBus.ExceptionInfo.Source"
	HeaderNSBStackTrace      = "NServiceBus.ExceptionInfo.StackTrace"
	// HeaderNSBExceptionInfoPrefix starts every exception header
	// (InnerExceptionType, HelpLink, Data.* too): a copy carries only the
	// bridge's own, and a retry strips them all, as ServiceControl does.
	HeaderNSBExceptionInfoPrefix = "NServiceBus.ExceptionInfo."
	HeaderNSBTimeOfFailure       = "NServiceBus.TimeOfFailure"
	HeaderNSBProcessingEndpoint  = "NServiceBus.ProcessingEndpoint"
	HeaderNSBProcessingMachine   = "NServiceBus.ProcessingMachine"
	HeaderNSBHostID              = "$.diagnostics.hostid"
	HeaderNSBHostDisplayName     = "$.diagnostics.hostdisplayname"
)

// Exception types the bridge names in HeaderNSBExceptionType, one per
// stage, so that ServicePulse groups its failures by what went wrong.
const (
	ExceptionTypeIngest   = "DelayBridge.InvalidMessageException"
	ExceptionTypeDispatch = "DelayBridge.DispatchFailedException"
	// ExceptionSource is HeaderNSBExceptionSource (.NET's Exception.Source:
	// the component that failed).
	ExceptionSource = "delaybridge"
)

// Stages named in HeaderStage.
const (
	StageIngest   = "ingest"
	StageDispatch = "dispatch"
)

// Token names one leased timeout in a dispatcher message: ID is its row
// key (SendKey).
type Token struct {
	ID   string `json:"id"`
	Lock string `json:"lock"`
}

// tokenBatch is the body of a dispatcher message.
type tokenBatch struct {
	Tokens []Token `json:"tokens"`
}

// TokenContentType is the content type of dispatcher messages.
const TokenContentType = "application/json"

// EncodeTokens returns the body of a dispatcher message carrying toks.
func EncodeTokens(toks []Token) ([]byte, error) {
	body, err := json.Marshal(tokenBatch{Tokens: toks})
	if err != nil {
		return nil, fmt.Errorf("wire: encode tokens: %w", err)
	}
	return body, nil
}

// DecodeTokens reads the tokens of a dispatcher message. Only the bridge
// writes them, so a token whose id is no row key (ValidateKey) makes the
// message not one of ours: an error, never an id for the store (PostgreSQL
// refuses NUL with an error that reads as an outage).
func DecodeTokens(body []byte) ([]Token, error) {
	var b tokenBatch
	if err := json.Unmarshal(body, &b); err != nil {
		return nil, fmt.Errorf("wire: decode tokens: %w", err)
	}
	for i, t := range b.Tokens {
		if err := ValidateKey("token id", t.ID); err != nil {
			return nil, fmt.Errorf("wire: decode tokens: token %d: %w", i, err)
		}
	}
	return b.Tokens, nil
}

// Lease is a token as the dispatcher reads it: the token, and the message id
// of its row key (KeyID), the id an error-queue copy of the row carries.
type Lease struct {
	Token
	MessageID string
}

// DecodeLeases reads the tokens of a dispatcher message as DecodeTokens
// does, each with the message id of its key.
func DecodeLeases(body []byte) ([]Lease, error) {
	toks, err := DecodeTokens(body)
	if err != nil {
		return nil, err
	}
	ls := make([]Lease, len(toks))
	for i, t := range toks {
		ls[i] = Lease{Token: t, MessageID: KeyID(t.ID)}
	}
	return ls, nil
}
