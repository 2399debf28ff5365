package errorqueue

import (
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/wire"
)

// A copy reads back as what it was made of; other endpoints' copies and
// copies of no endpoint say so.
func TestCopyReadsBack(t *testing.T) {
	at := time.Date(2026, 11, 23, 12, 0, 0, 500, time.UTC)
	c := Copy(amqp.Publishing{MessageId: "m", Headers: amqp.Table{"keep": "me"}},
		Facts{Reason: "nack", Stage: wire.StageDispatch, Attempts: 6, FailedAt: at, FailedQ: "E.Timeouts"})
	got := Describe(c.Headers)
	want := Failed{Stage: wire.StageDispatch, Reason: "nack", ExceptionType: wire.ExceptionTypeDispatch, FailedAt: at, Attempts: 6}
	if got != want {
		t.Errorf("Describe = %+v, want %+v", got, want)
	}
	if why := Foreign(c.Headers, "E.Timeouts"); why != "" {
		t.Errorf("own copy read as foreign: %s", why)
	}
	if why := Foreign(c.Headers, "F.Timeouts"); why != `a failure of another endpoint (NServiceBus.FailedQ="E.Timeouts")` {
		t.Errorf("another endpoint's copy: %q", why)
	}
	if why := Foreign(amqp.Table{}, "E.Timeouts"); why != "no NServiceBus.FailedQ header: not a failure of E.Timeouts" {
		t.Errorf("a copy of no endpoint: %q", why)
	}
	long := amqp.Table{wire.HeaderNSBFailedQ: []byte(strings.Repeat("q", 100))}
	if why := Foreign(long, "E.Timeouts"); !strings.HasSuffix(why, strings.Repeat("q", 64)+`"…)`) || strings.Contains(why, strings.Repeat("q", 65)) {
		t.Errorf("a long queue name is not clipped: %q", why)
	}
	// Text sent as byte arrays reads as text; other types read as empty.
	if f := Describe(amqp.Table{wire.HeaderStage: []byte("ingest"), wire.HeaderError: int32(1)}); f.Stage != "ingest" || f.Reason != "" {
		t.Errorf("Describe = %+v", f)
	}
	var failure []string
	for k := range c.Headers {
		if FailureHeader(k) {
			failure = append(failure, k)
		}
	}
	if FailureHeader("keep") || FailureHeader(wire.HeaderNSBMessageID) || len(failure) != len(c.Headers)-2 {
		t.Errorf("failure headers %v of %v; want all but keep and %s", failure, c.Headers, wire.HeaderNSBMessageID)
	}
}
