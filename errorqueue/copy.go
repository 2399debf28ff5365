// Package errorqueue owns the bridge's copies on the error queue
// (docs/contract.md §4): how a copy is made and what failure headers it
// carries, the form it takes when AMQP cannot carry it, the gate that paces
// copies while the queue refuses them, and how a copy is read back.
// Ingest, dispatch and the sweep of unreadable messages send through one
// Sender; the admin API and ingest's retries read copies with this package.
package errorqueue

import (
	"crypto/md5"
	"encoding/hex"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/wire"
)

// maxReasonHeaderSize caps the reason headers of an error copy.
const maxReasonHeaderSize = 4096

// Facts say why and where a message failed.
type Facts struct {
	Reason   string
	Stage    string // wire.StageIngest or wire.StageDispatch
	Attempts int    // dispatch failures so far
	FailedAt time.Time
	FailedQ  string // the queue the message came from: E.Timeouts
	// Forward, set at the dispatch stage, is where the failed forward
	// went: replay sends the copy there again, whatever headers or
	// intake source named it.
	Forward *wire.Destination
	// Processing names the endpoint and host that failed it.
	Processing Processing
}

// Processing is the endpoint and host an error copy names as the one that
// processed (and failed) the message, as NServiceBus does, so that
// ServicePulse lists the bridge's failures under the endpoint.
type Processing struct {
	Endpoint string // the bridge's endpoint E (its queues are E.Timeouts, ...)
	Machine  string // the host name
	// HostID is a GUID in .NET's "N" format (32 hex digits), stable for
	// the endpoint on the host, as NServiceBus's default host id is.
	HostID string
}

// NewProcessing returns the Processing of endpoint on machine.
func NewProcessing(endpoint, machine string) Processing {
	sum := md5.Sum([]byte(endpoint + "@" + machine))
	// A version-3 (name-based) UUID's bits, written without dashes.
	sum[6] = sum[6]&0x0f | 0x30
	sum[8] = sum[8]&0x3f | 0x80
	return Processing{Endpoint: endpoint, Machine: machine, HostID: hex.EncodeToString(sum[:])}
}

// Copy returns the message to put on the error queue: the same body,
// properties and headers plus the §4 headers, the bridge's own and the
// NServiceBus failure headers ServicePulse reads (wire). Exception headers
// the message already had (from an earlier failure elsewhere) are replaced
// as a whole, so none describes another failure. The input is not modified.
// user-id is dropped because the broker rejects a user-id that is not the
// publishing connection's own.
func Copy(p amqp.Publishing, f Facts) amqp.Publishing {
	h := make(amqp.Table, len(p.Headers)+16)
	for k, v := range p.Headers {
		if !strings.HasPrefix(k, wire.HeaderNSBExceptionInfoPrefix) {
			h[k] = v
		}
	}
	reason := f.Reason
	if len(reason) > maxReasonHeaderSize {
		reason = reason[:maxReasonHeaderSize]
	}
	h[wire.HeaderError] = reason
	h[wire.HeaderStage] = f.Stage
	h[wire.HeaderFailedAt] = f.FailedAt.UTC().Format(time.RFC3339Nano)
	h[wire.HeaderAttempts] = int32(f.Attempts)
	h[wire.HeaderNSBFailedQ] = f.FailedQ
	exType := wire.ExceptionTypeIngest
	if f.Stage == wire.StageDispatch {
		exType = wire.ExceptionTypeDispatch
	}
	h[wire.HeaderNSBExceptionType] = exType
	h[wire.HeaderNSBException] = reason
	h[wire.HeaderNSBExceptionSource] = wire.ExceptionSource
	// .NET's Exception.ToString() without frames: ServiceControl groups
	// such a failure as "<type>: No stacktrace".
	h[wire.HeaderNSBStackTrace] = exType + ": " + reason
	h[wire.HeaderNSBTimeOfFailure] = wire.FormatNSBTime(f.FailedAt)
	if pr := f.Processing; pr.Endpoint != "" {
		h[wire.HeaderNSBProcessingEndpoint] = pr.Endpoint
		h[wire.HeaderNSBProcessingMachine] = pr.Machine
		h[wire.HeaderNSBHostDisplayName] = pr.Machine
		h[wire.HeaderNSBHostID] = pr.HostID
	}
	if _, ok := h[wire.HeaderNSBMessageID]; !ok && p.MessageId != "" {
		// ServiceControl indexes a failed message's headers by it.
		h[wire.HeaderNSBMessageID] = p.MessageId
	}
	if f.Forward != nil {
		h[wire.HeaderForwardExchange] = f.Forward.Exchange
		h[wire.HeaderForwardRoutingKey] = f.Forward.Key
	}
	p.Headers = h
	p.UserId = ""
	return p
}
