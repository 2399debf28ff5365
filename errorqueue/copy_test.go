package errorqueue

import (
	"maps"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/wire"
)

// The header names and formats are NServiceBus's and ServiceControl's
// (sources in wire/wire.go); the literals here are written out, not taken
// from wire, so a renamed constant fails the test.
func TestErrorCopyHeaders(t *testing.T) {
	at := time.Date(2026, 11, 23, 20, 19, 6, 123456789, time.FixedZone("CET", 3600))
	p := amqp.Publishing{MessageId: "m-1", UserId: "guest", Body: []byte("body"), Headers: amqp.Table{
		"keep": "me",
		// Stale exception headers of an earlier failure elsewhere go.
		"NServiceBus.ExceptionInfo.InnerExceptionType": "System.Exception",
		"NServiceBus.ExceptionInfo.Data.Key":           "v",
	}}
	in := maps.Clone(p.Headers)
	dest := wire.Destination{Exchange: "", Key: "orders"}
	got := Copy(p, Facts{Reason: "dispatch to \"orders\" failed 4 times: nack", Stage: wire.StageDispatch, Attempts: 4,
		FailedAt: at, FailedQ: "E.Timeouts", Forward: &dest, Processing: NewProcessing("E", "host-1")})
	want := amqp.Table{
		"keep":                                    "me",
		"x-delaybridge-error":                     "dispatch to \"orders\" failed 4 times: nack",
		"x-delaybridge-stage":                     "dispatch",
		"x-delaybridge-failed-at":                 "2026-11-23T19:19:06.123456789Z",
		"x-delaybridge-attempts":                  int32(4),
		"x-delaybridge-exchange":                  "",
		"x-delaybridge-routing-key":               "orders",
		"NServiceBus.FailedQ":                     "E.Timeouts",
		"NServiceBus.MessageId":                   "m-1",
		"NServiceBus.ExceptionInfo.ExceptionType": "DelayBridge.DispatchFailedException",
		"NServiceBus.ExceptionInfo.Message":       "dispatch to \"orders\" failed 4 times: nack",
		"NServiceBus.ExceptionInfo.Source":        "delaybridge",
		"NServiceBus.ExceptionInfo.StackTrace":    "DelayBridge.DispatchFailedException: dispatch to \"orders\" failed 4 times: nack",
		"NServiceBus.TimeOfFailure":               "2026-11-23 19:19:06:123456 Z",
		"NServiceBus.ProcessingEndpoint":          "E",
		"NServiceBus.ProcessingMachine":           "host-1",
		"$.diagnostics.hostdisplayname":           "host-1",
		"$.diagnostics.hostid":                    NewProcessing("E", "host-1").HostID,
	}
	if !maps.Equal(got.Headers, want) {
		t.Errorf("headers\n got %v\nwant %v", got.Headers, want)
	}
	if got.UserId != "" || string(got.Body) != "body" || got.MessageId != "m-1" {
		t.Errorf("properties %+v", got)
	}
	if !maps.Equal(p.Headers, in) {
		t.Errorf("input modified: %v", p.Headers)
	}
	// ServiceControl parses the host id with Guid.TryParse: 32 hex digits.
	if id := NewProcessing("E", "host-1").HostID; len(id) != 32 || id == NewProcessing("F", "host-1").HostID {
		t.Errorf("host id %q", id)
	}

	// Ingest stage: its own type, no forward, no processing when unset, and
	// an NServiceBus.MessageId the message had is kept.
	got = Copy(amqp.Publishing{MessageId: "prop", Headers: amqp.Table{"NServiceBus.MessageId": "nsb"}},
		Facts{Reason: "no due time", Stage: wire.StageIngest, FailedAt: at, FailedQ: "E.Timeouts"})
	for k, v := range map[string]any{"NServiceBus.ExceptionInfo.ExceptionType": "DelayBridge.InvalidMessageException",
		"NServiceBus.MessageId": "nsb", "x-delaybridge-attempts": int32(0)} {
		if got.Headers[k] != v {
			t.Errorf("ingest copy %s = %v, want %v", k, got.Headers[k], v)
		}
	}
	for _, k := range []string{"x-delaybridge-routing-key", "NServiceBus.ProcessingEndpoint", "$.diagnostics.hostid"} {
		if _, ok := got.Headers[k]; ok {
			t.Errorf("ingest copy has %s", k)
		}
	}
}
