package broker

import (
	"maps"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Error-queue headers of contract §4.
const (
	HeaderError         = "x-delaybridge-error"
	HeaderStage         = "x-delaybridge-stage"
	HeaderFailedAt      = "x-delaybridge-failed-at"
	HeaderAttempts      = "x-delaybridge-attempts"
	HeaderNSBException  = "NServiceBus.ExceptionInfo.Message"
	HeaderNSBFailedQ    = "NServiceBus.FailedQ"
	StageIngest         = "ingest"
	StageDispatch       = "dispatch"
	maxReasonHeaderSize = 4096
)

// ErrorFacts say why and where a message failed.
type ErrorFacts struct {
	Reason   string
	Stage    string // StageIngest or StageDispatch
	Attempts int    // dispatch failures so far
	FailedAt time.Time
	FailedQ  string // the queue the message came from: E.Timeouts
}

// ErrorCopy returns the message to put on the error queue: the same body,
// properties and headers plus the §4 headers. The input is not modified.
// user-id is dropped because the broker rejects a user-id that is not the
// publishing connection's own.
func ErrorCopy(p amqp.Publishing, f ErrorFacts) amqp.Publishing {
	h := make(amqp.Table, len(p.Headers)+6)
	maps.Copy(h, p.Headers)
	reason := f.Reason
	if len(reason) > maxReasonHeaderSize {
		reason = reason[:maxReasonHeaderSize]
	}
	h[HeaderError] = reason
	h[HeaderStage] = f.Stage
	h[HeaderFailedAt] = f.FailedAt.UTC().Format(time.RFC3339Nano)
	h[HeaderAttempts] = int32(f.Attempts)
	h[HeaderNSBException] = reason
	h[HeaderNSBFailedQ] = f.FailedQ
	p.Headers = h
	p.UserId = ""
	return p
}

// Forwardable returns the message as the bridge forwards it: without the
// due-time headers (so it cannot loop back into a delay) and without user-id.
func Forwardable(p amqp.Publishing, dropHeaders []string) amqp.Publishing {
	if p.Headers != nil {
		h := make(amqp.Table, len(p.Headers))
		maps.Copy(h, p.Headers)
		for _, k := range dropHeaders {
			delete(h, k)
		}
		p.Headers = h
	}
	p.UserId = ""
	return p
}
