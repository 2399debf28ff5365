package errorqueue

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/wire"
)

// Failed is what a copy's headers say of its failure (docs/contract.md
// §4.1), as far as they can be read: a header that is missing, or of
// another type, reads as empty.
type Failed struct {
	Stage         string
	Reason        string
	ExceptionType string
	// FailedAt is zero when the header is missing or not RFC 3339.
	FailedAt time.Time
	Attempts int
}

// Describe reads the failure headers of a copy.
func Describe(h amqp.Table) Failed {
	f := Failed{Stage: Stage(h), Reason: text(h[wire.HeaderError]), ExceptionType: text(h[wire.HeaderNSBExceptionType])}
	if t, err := time.Parse(time.RFC3339Nano, text(h[wire.HeaderFailedAt])); err == nil {
		f.FailedAt = t
	}
	if n, ok := h[wire.HeaderAttempts].(int32); ok {
		f.Attempts = int(n)
	}
	return f
}

// Stage is the stage a copy failed at (wire.StageIngest, wire.StageDispatch),
// or "" when it names none.
func Stage(h amqp.Table) string { return text(h[wire.HeaderStage]) }

// Foreign says why a copy on the error queue, which other endpoints may
// share, is not a failure of the endpoint whose intake queue is
// timeoutsQueue (its NServiceBus.FailedQ), or "".
func Foreign(h amqp.Table, timeoutsQueue string) string {
	q, ok := h[wire.HeaderNSBFailedQ]
	if !ok || q == nil {
		return fmt.Sprintf("no %s header: not a failure of %s", wire.HeaderNSBFailedQ, timeoutsQueue)
	}
	if text(q) != timeoutsQueue {
		return fmt.Sprintf("a failure of another endpoint (%s=%s)", wire.HeaderNSBFailedQ, quoteClip(q))
	}
	return ""
}

// FailureHeader reports whether k is a header a copy carries about its
// failure: the bridge's own and NServiceBus's failure headers, which a
// message sent again from its copy must not keep.
func FailureHeader(k string) bool {
	return strings.HasPrefix(k, wire.HeaderPrefix) || strings.HasPrefix(k, wire.HeaderNSBExceptionInfoPrefix) ||
		k == wire.HeaderNSBFailedQ || k == wire.HeaderNSBTimeOfFailure
}

// text reads a header as text: a string, or a byte array as some clients
// send text.
func text(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case []byte:
		return string(v)
	}
	return ""
}

// quoteClip quotes a header value of any type for a reason, kept short.
func quoteClip(v any) string {
	s, ok := v.(string)
	if !ok {
		if b, isBytes := v.([]byte); isBytes {
			s = string(b)
		} else {
			return fmt.Sprintf("%T", v)
		}
	}
	const n = 64
	if len(s) > n {
		return strconv.Quote(s[:n]) + "…"
	}
	return strconv.Quote(s)
}
