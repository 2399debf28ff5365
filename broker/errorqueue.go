package broker

import (
	"maps"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/wire"
)

// maxReasonHeaderSize caps the reason headers of an error copy.
const maxReasonHeaderSize = 4096

// ErrorFacts say why and where a message failed.
type ErrorFacts struct {
	Reason   string
	Stage    string // wire.StageIngest or wire.StageDispatch
	Attempts int    // dispatch failures so far
	FailedAt time.Time
	FailedQ  string // the queue the message came from: E.Timeouts
	// Forward, set at the dispatch stage, is where the failed forward
	// went: replay sends the copy there again, whatever headers or
	// intake source named it.
	Forward *wire.Destination
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
	h[wire.HeaderError] = reason
	h[wire.HeaderStage] = f.Stage
	h[wire.HeaderFailedAt] = f.FailedAt.UTC().Format(time.RFC3339Nano)
	h[wire.HeaderAttempts] = int32(f.Attempts)
	h[wire.HeaderNSBException] = reason
	h[wire.HeaderNSBFailedQ] = f.FailedQ
	if f.Forward != nil {
		h[wire.HeaderForwardExchange] = f.Forward.Exchange
		h[wire.HeaderForwardRoutingKey] = f.Forward.Key
	}
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
