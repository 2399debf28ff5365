package integration

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// TestServicePulseRetry: a message the bridge moved to the error queue from
// the dispatch stage carries the failure headers ServiceControl imports and
// groups by, and retried as ServicePulse retries it (sent back to its
// NServiceBus.FailedQ, E.Timeouts, without the failure headers and without
// a due time) it is delivered to its destination.
func TestServicePulseRetry(t *testing.T) {
	t.Parallel()
	b, conn, pub := startWithPublisher(t, map[string]string{
		"DELAYBRIDGE_ADMIN_TOKEN": adminToken, "DELAYBRIDGE_NUMBER_OF_RETRIES": "0", "DELAYBRIDGE_POLL_INTERVAL": "100ms",
	})
	dest := b.Endpoint + ".orders" // not declared yet: the forward is unroutable
	deleteQueuesOnCleanup(t, dest)
	body := []byte(`{"OrderId":42}`)
	pub.Publish(b.TimeoutsQueue(), amqp.Publishing{MessageId: "sp-1", ContentType: "application/json", Body: body,
		Headers: amqp.Table{"x-destination": dest, "x-due-at": time.Now().UTC().Format(time.RFC3339Nano),
			"NServiceBus.MessageId": "sp-1", "NServiceBus.EnclosedMessageTypes": "Shop.OrderPlaced, Shop"}})

	deadline := time.Now().Add(livenessBound + 2*time.Second)
	for queueDepth(t, conn, b.ErrorQ) < 1 {
		if time.Now().After(deadline) {
			t.Fatalf("error queue has %d messages, want 1\n%s", queueDepth(t, conn, b.ErrorQ), tail(b.Stderr(), 20))
		}
		time.Sleep(100 * time.Millisecond)
	}

	// The admin view lists it, and leaves it where it is.
	var list struct {
		Errors []struct {
			ID, Stage, Destination string
			ExceptionType          string `json:"exception_type"`
		}
	}
	out := mustCLI(t, b, "errors", "ls", "--json")
	if err := json.Unmarshal([]byte(out), &list); err != nil || len(list.Errors) != 1 || list.Errors[0].ID != "sp-1" ||
		list.Errors[0].Stage != "dispatch" || list.Errors[0].Destination != dest || list.Errors[0].ExceptionType != "DelayBridge.DispatchFailedException" {
		t.Fatalf("errors ls: %s (%v)", out, err)
	}
	if n := queueDepth(t, conn, b.ErrorQ); n != 1 {
		t.Fatalf("error queue has %d messages after ls, want 1", n)
	}

	// ServiceControl consumes the error queue.
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	d, ok, err := ch.Get(b.ErrorQ, true)
	if err != nil || !ok {
		t.Fatalf("get the error copy: %v %v", ok, err)
	}
	host, _ := os.Hostname()
	wireTime := regexp.MustCompile(`^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}:\d{6} Z$`) // DateTimeOffsetHelper's format
	for k, want := range map[string]string{
		"NServiceBus.FailedQ":                     b.TimeoutsQueue(),
		"NServiceBus.MessageId":                   "sp-1",
		"NServiceBus.ExceptionInfo.ExceptionType": "DelayBridge.DispatchFailedException",
		"NServiceBus.ExceptionInfo.Source":        "delaybridge",
		"NServiceBus.ProcessingEndpoint":          b.Endpoint,
		"NServiceBus.ProcessingMachine":           host,
		"$.diagnostics.hostdisplayname":           host,
		"x-delaybridge-stage":                     "dispatch",
		"x-delaybridge-routing-key":               dest,
	} {
		if got := headerString(d.Headers, k); got != want {
			t.Errorf("error copy %s = %q, want %q", k, got, want)
		}
	}
	msg := headerString(d.Headers, "NServiceBus.ExceptionInfo.Message")
	if !strings.Contains(msg, "unroutable") || headerString(d.Headers, "NServiceBus.ExceptionInfo.StackTrace") != "DelayBridge.DispatchFailedException: "+msg {
		t.Errorf("exception message %q, stack trace %q", msg, headerString(d.Headers, "NServiceBus.ExceptionInfo.StackTrace"))
	}
	if tf := headerString(d.Headers, "NServiceBus.TimeOfFailure"); !wireTime.MatchString(tf) {
		t.Errorf("NServiceBus.TimeOfFailure %q is not in NServiceBus's wire format", tf)
	}
	if id := headerString(d.Headers, "$.diagnostics.hostid"); !regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(id) {
		t.Errorf("host id %q is not a GUID in the N format", id)
	}

	// The retry: ServiceControl's HeaderFilter drops these prefixes and
	// RetryProcessor/ReturnToSender add the retry headers; the message-id
	// is ServiceControl's own id for the failed message.
	h := amqp.Table{}
	for k, v := range d.Headers {
		drop := false
		for _, p := range []string{"NServiceBus.Retries", "NServiceBus.FailedQ", "NServiceBus.TimeOfFailure", "NServiceBus.ExceptionInfo.", "ServiceControl.EditOf"} {
			drop = drop || strings.HasPrefix(k, p)
		}
		if !drop {
			h[k] = v
		}
	}
	h["ServiceControl.Retry.UniqueMessageId"] = "0e7a5b1c-6f2d-4b8e-9d3a-1c2b3d4e5f60"
	h["ServiceControl.Retry.AcknowledgementQueue"] = "error"
	got := declareAndConsume(t, conn, dest)
	pub.Publish(b.TimeoutsQueue(), amqp.Publishing{MessageId: "FailedMessages/0e7a5b1c", ContentType: d.ContentType, Body: d.Body, Headers: h})

	a := got.WaitFor(1, livenessBound)[0]
	if string(a.Body) != string(body) || headerString(a.Headers, "NServiceBus.MessageId") != "sp-1" ||
		headerString(a.Headers, "ServiceControl.Retry.UniqueMessageId") == "" || headerString(a.Headers, "ServiceControl.Retry.AcknowledgementQueue") != "error" {
		t.Errorf("delivered %q with headers %v", a.Body, a.Headers)
	}
	for k := range a.Headers {
		if strings.HasPrefix(k, "x-delaybridge-") || strings.HasPrefix(k, "NServiceBus.ExceptionInfo.") || k == "x-due-at" {
			t.Errorf("delivered with %s", k)
		}
	}
	if extra := got.Quiet(quietPeriod); len(extra) != 1 {
		t.Errorf("%d deliveries to %s, want 1", len(extra), dest)
	}
	if n := queueDepth(t, conn, b.ErrorQ); n != 0 {
		t.Errorf("error queue has %d messages after the retry, want 0", n)
	}
}
