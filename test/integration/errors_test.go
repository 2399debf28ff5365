package integration

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/intake"
)

// Error-queue headers of docs/contract.md §4.
const (
	hError     = "x-delaybridge-error"
	hStage     = "x-delaybridge-stage"
	hFailedAt  = "x-delaybridge-failed-at"
	hAttempts  = "x-delaybridge-attempts"
	hNSBExcMsg = "NServiceBus.ExceptionInfo.Message"
	hNSBFailQ  = "NServiceBus.FailedQ"
)

// The NServiceBus failure headers of §4.1 (names from NServiceBus's
// FaultsHeaderKeys and Headers).
const (
	hNSBExcType  = "NServiceBus.ExceptionInfo.ExceptionType"
	hNSBTimeFail = "NServiceBus.TimeOfFailure"
	hNSBMsgID    = "NServiceBus.MessageId"
)

var errorHeaders = []string{hError, hStage, hFailedAt, hAttempts, hNSBExcMsg, hNSBFailQ,
	hNSBExcType, "NServiceBus.ExceptionInfo.Source", "NServiceBus.ExceptionInfo.StackTrace", hNSBTimeFail,
	"NServiceBus.ProcessingEndpoint", "NServiceBus.ProcessingMachine", "$.diagnostics.hostid", "$.diagnostics.hostdisplayname"}

// checkErrorHeaders asserts the §4 headers of an error-queue copy.
func checkErrorHeaders(t *testing.T, h amqp.Table, stage string, attempts int64, failedQ string, reasonHints []string, notBefore time.Time) {
	t.Helper()
	if got := headerString(h, hStage); got != stage {
		t.Errorf("%s = %v, want %q", hStage, h[hStage], stage)
	}
	if n, ok := intake.HeaderInteger(h[hAttempts]); !ok || n != attempts {
		t.Errorf("%s = %v (%T), want integer %d", hAttempts, h[hAttempts], h[hAttempts], attempts)
	}
	if got := headerString(h, hNSBFailQ); got != failedQ {
		t.Errorf("%s = %v, want %q", hNSBFailQ, h[hNSBFailQ], failedQ)
	}
	reason := headerString(h, hError)
	if strings.TrimSpace(reason) == "" {
		t.Errorf("%s is empty or missing (%v)", hError, h[hError])
	} else if len(reasonHints) > 0 {
		found := false
		for _, hint := range reasonHints {
			if strings.Contains(strings.ToLower(reason), strings.ToLower(hint)) {
				found = true
			}
		}
		if !found {
			t.Errorf("%s = %q does not mention any of %q", hError, reason, reasonHints)
		}
	}
	if strings.TrimSpace(headerString(h, hNSBExcMsg)) == "" {
		t.Errorf("%s is empty or missing (%v)", hNSBExcMsg, h[hNSBExcMsg])
	}
	wantType := map[string]string{"ingest": "DelayBridge.InvalidMessageException", "dispatch": "DelayBridge.DispatchFailedException"}[stage]
	if got := headerString(h, hNSBExcType); got != wantType {
		t.Errorf("%s = %v, want %q", hNSBExcType, h[hNSBExcType], wantType)
	}
	failedAt := headerString(h, hFailedAt)
	ts, err := time.Parse(time.RFC3339Nano, failedAt)
	if err != nil {
		t.Errorf("%s = %v is not RFC 3339: %v", hFailedAt, h[hFailedAt], err)
	} else if want := ts.UTC().Format("2006-01-02 15:04:05:") + fmt.Sprintf("%06d Z", ts.Nanosecond()/1000); headerString(h, hNSBTimeFail) != want {
		t.Errorf("%s = %v, want %q (NServiceBus's wire format of %s)", hNSBTimeFail, h[hNSBTimeFail], want, failedAt)
	} else if ts.Before(notBefore.Add(-time.Second)) || ts.After(time.Now().Add(time.Second)) {
		t.Errorf("%s = %s is not between the publish (%s) and now", hFailedAt, failedAt, notBefore.Format(time.RFC3339Nano))
	}
}

// TestInvalidInputGoesToErrorQueue: every message the bridge cannot accept
// is moved to the error queue at once with its body, properties and headers
// and the §4 headers; the bridge keeps running and E.Timeouts is left empty.
func TestInvalidInputGoesToErrorQueue(t *testing.T) {
	t.Parallel()
	ep := uniqueEndpoint(t)
	allowed := "allowed." + ep
	b, conn, pub := startWithPublisher(t, map[string]string{
		"DELAYBRIDGE_ENDPOINT":             ep,
		"DELAYBRIDGE_MAX_MESSAGE_BYTES":    "1024",
		"DELAYBRIDGE_ALLOWED_DESTINATIONS": "allowed.*, " + ep + ".*",
		"DELAYBRIDGE_MAX_DELAY":            "1h",
	})
	errs := consume(t, conn, b.ErrorQ)
	valid := declareAndConsume(t, conn, allowed)
	inFuture := time.Now().Add(time.Minute).UTC().Format(time.RFC3339Nano)

	cases := []struct {
		name    string
		headers amqp.Table
		body    []byte
		hints   []string // the reason mentions at least one
	}{
		{name: "missing-destination", headers: amqp.Table{"x-delay": int32(0)}, hints: []string{"destination"}},
		{name: "missing-due-time", headers: amqp.Table{"x-destination": allowed}, hints: []string{"due"}},
		{name: "unparsable-x-due-at", headers: amqp.Table{"x-destination": allowed, "x-due-at": "tomorrow at noon"}, hints: []string{"x-due-at"}},
		{name: "x-due-at-without-offset", headers: amqp.Table{"x-destination": allowed, "x-due-at": "2026-11-21T20:00:00"}, hints: []string{"x-due-at"}},
		{name: "nsb-expire-wrong-format", headers: amqp.Table{"x-destination": allowed, "NServiceBus.Timeout.Expire": inFuture}, hints: []string{"NServiceBus.Timeout.Expire"}},
		{name: "x-delay-decimal", headers: amqp.Table{"x-destination": allowed, "x-delay": amqp.Decimal{Scale: 1, Value: 15000}}, hints: []string{"x-delay"}},
		{name: "x-delay-decimal-string", headers: amqp.Table{"x-destination": allowed, "x-delay": "1500.5"}, hints: []string{"x-delay"}},
		{name: "x-delay-non-numeric", headers: amqp.Table{"x-destination": allowed, "x-delay": "soon"}, hints: []string{"x-delay"}},
		{name: "x-delay-bool", headers: amqp.Table{"x-destination": allowed, "x-delay": true}, hints: []string{"x-delay"}},
		{name: "empty-x-destination", headers: amqp.Table{"x-destination": "", "x-delay": int32(0)}, hints: []string{"x-destination", "destination"}},
		{name: "empty-nsb-destination", headers: amqp.Table{"NServiceBus.Timeout.RouteExpiredTimeoutTo": "", "x-delay": int32(0)}, hints: []string{"RouteExpiredTimeoutTo", "destination"}},
		{name: "destination-not-a-string", headers: amqp.Table{"x-destination": int32(5), "x-delay": int32(0)}, hints: []string{"x-destination", "destination"}},
		{name: "body-too-large", headers: amqp.Table{"x-destination": allowed, "x-delay": int32(0)}, body: bytes.Repeat([]byte{0xAB}, 1025),
			hints: []string{"MAX_MESSAGE_BYTES", "too large", "too big", "size"}},
		{name: "destination-not-allowed", headers: amqp.Table{"x-destination": "forbidden." + ep, "x-delay": int32(0)},
			hints: []string{"ALLOWED_DESTINATIONS", "not allowed"}},
		{name: "beyond-max-delay-x-delay", headers: amqp.Table{"x-destination": allowed, "x-delay": int64(2 * time.Hour / time.Millisecond)},
			hints: []string{"MAX_DELAY", "max delay", "too far"}},
		{name: "beyond-max-delay-x-due-at", headers: amqp.Table{"x-destination": allowed, "x-due-at": time.Now().Add(3 * time.Hour).UTC().Format(time.RFC3339)},
			hints: []string{"MAX_DELAY", "max delay", "too far"}},
		{name: "destination-dispatcher-queue", headers: amqp.Table{"x-destination": b.DispatcherQueue(), "x-delay": int32(0)},
			hints: []string{b.DispatcherQueue(), "own queue", "reserved"}},
		{name: "destination-timeouts-queue", headers: amqp.Table{"x-destination": b.TimeoutsQueue(), "x-delay": int32(0)},
			hints: []string{b.TimeoutsQueue(), "own queue", "reserved"}},
	}

	stamp := time.Unix(time.Now().Unix(), 0)
	sent := map[string]amqp.Publishing{}
	before := time.Now()
	for _, c := range cases {
		h := amqp.Table{"case": c.name, "custom-int": int64(7), "custom-table": amqp.Table{"k": "v"}}
		for k, v := range c.headers {
			h[k] = v
		}
		body := c.body
		if body == nil {
			body = []byte("body of " + c.name + " \x00\xff")
		}
		p := amqp.Publishing{
			MessageId: "invalid-" + c.name, Headers: h, Body: body,
			ContentType: "application/octet-stream", ContentEncoding: "gzip", DeliveryMode: amqp.Persistent,
			Priority: 3, CorrelationId: "corr-" + c.name, ReplyTo: "replies", Expiration: "600000",
			Timestamp: stamp, Type: "bad.input", AppId: "integration-test",
		}
		sent[p.MessageId] = p
		pub.Publish(b.TimeoutsQueue(), p)
	}
	// A valid message after the bad ones is still delivered.
	pub.Publish(b.TimeoutsQueue(), amqp.Publishing{MessageId: "valid-after", Body: []byte("ok"),
		Headers: amqp.Table{"x-destination": allowed, "x-delay": int32(200)}})

	errs.WaitFor(len(cases), livenessBound)
	valid.WaitFor(1, livenessBound)
	got := errs.Quiet(quietPeriod)
	byID := byMessageID(got)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			id := "invalid-" + c.name
			as := byID[id]
			if len(as) != 1 {
				t.Fatalf("%d copies on the error queue, want exactly 1", len(as))
			}
			d, s := as[0], sent[id]
			checkErrorHeaders(t, d.Headers, "ingest", 0, b.TimeoutsQueue(), c.hints, before)
			t.Logf("reason: %s", headerString(d.Headers, hError))
			orig := amqp.Table{}
			for k, v := range d.Headers {
				orig[k] = v
			}
			for _, k := range errorHeaders {
				delete(orig, k)
			}
			if _, ok := s.Headers[hNSBMsgID]; !ok && headerString(orig, hNSBMsgID) == s.MessageId {
				delete(orig, hNSBMsgID) // added for ServiceControl (§4.1)
			}
			if diff := cmp.Diff(s.Headers, orig); diff != "" {
				t.Errorf("original headers not kept (-sent, +error queue minus §4 headers):\n%s", diff)
			}
			if !bytes.Equal(d.Body, s.Body) {
				t.Errorf("body changed: got %d bytes %q, sent %d bytes", len(d.Body), tail(string(d.Body), 40), len(s.Body))
			}
			gotP := []any{d.ContentType, d.ContentEncoding, d.DeliveryMode, d.Priority, d.CorrelationId, d.ReplyTo,
				d.Expiration, d.Timestamp, d.Type, d.AppId}
			wantP := []any{s.ContentType, s.ContentEncoding, s.DeliveryMode, s.Priority, s.CorrelationId, s.ReplyTo,
				s.Expiration, s.Timestamp, s.Type, s.AppId}
			if diff := cmp.Diff(wantP, gotP); diff != "" {
				t.Errorf("properties not kept (-sent, +error queue):\n%s", diff)
			}
		})
	}
	for id, as := range byID {
		if _, ok := sent[id]; !ok {
			t.Errorf("unexpected message %q (%d copies) on the error queue: %s", id, len(as), headerString(as[0].Headers, hError))
		}
	}
	if got := valid.Quiet(0); len(got) != 1 || got[0].MessageId != "valid-after" {
		t.Errorf("valid message after the invalid ones: got %d deliveries, want 1", len(got))
	}

	// Nothing left behind: no ready message, and after a graceful stop
	// (which requeues whatever is still unacknowledged) still none.
	waitQueueEmpty(t, conn, b.TimeoutsQueue(), 5*time.Second)
	if !b.Running() {
		t.Fatalf("the bridge exited (code %d) after being fed invalid input", b.Wait(0))
	}
	b.Stop()
	if n := queueDepth(t, conn, b.TimeoutsQueue()); n != 0 {
		t.Errorf("%s holds %d messages after the bridge stopped: deliveries were left unacknowledged", b.TimeoutsQueue(), n)
	}
	if n := errs.Count(); n != len(cases) {
		t.Errorf("error queue received %d messages in total, want %d", n, len(cases))
	}

	// An invalid message with nothing valid after it must be acknowledged
	// too (not merely covered by a later multiple-ack).
	b2 := b.Restart(nil)
	pub.Publish(b2.TimeoutsQueue(), amqp.Publishing{MessageId: "invalid-last", Body: []byte("last"),
		Headers: amqp.Table{"x-delay": int32(0)}})
	errs.WaitUntil(livenessBound, "invalid-last on the error queue", func(got []arrival) bool {
		return len(got) > 0 && got[len(got)-1].MessageId == "invalid-last"
	})
	time.Sleep(500 * time.Millisecond)
	b2.Stop()
	if n := queueDepth(t, conn, b2.TimeoutsQueue()); n != 0 {
		t.Errorf("%s holds %d messages after the bridge stopped: the invalid message was copied to the error queue but never acknowledged", b2.TimeoutsQueue(), n)
	}
	if n := errs.Quiet(0); len(n) != len(cases)+1 {
		t.Errorf("error queue received %d messages in total, want %d", len(n), len(cases)+1)
	}
}

// TestUnroutableDestination: a forward the broker returns (no such queue) is
// retried with a backoff of at least 1 s and, after
// DELAYBRIDGE_NUMBER_OF_RETRIES retries, moved to the error queue with
// stage=dispatch and attempts = retries+1 (docs/contract.md §3, §4).
func TestUnroutableDestination(t *testing.T) {
	t.Parallel()
	for _, retries := range []int{1, 0, 2} {
		t.Run(fmt.Sprintf("retries=%d", retries), func(t *testing.T) {
			t.Parallel()
			// A short poll interval, so that only the retry backoff (not the
			// poller's sleep) can hold a retry back.
			b, conn, pub := startWithPublisher(t, map[string]string{
				"DELAYBRIDGE_NUMBER_OF_RETRIES": fmt.Sprint(retries),
				"DELAYBRIDGE_POLL_INTERVAL":     "100ms",
			})
			errs := consume(t, conn, b.ErrorQ)
			okDest := b.Endpoint + ".dst"
			ok := declareAndConsume(t, conn, okDest)
			missing := b.Endpoint + ".no-such-queue"

			before := time.Now()
			due := before.Add(500 * time.Millisecond).UTC()
			body := []byte("unroutable \x00\x01\xfe\xff body")
			pub.Publish(b.TimeoutsQueue(), amqp.Publishing{
				MessageId: "unroutable-1", CorrelationId: "c-1", ContentType: "application/x-bin", Body: body,
				Headers: amqp.Table{"x-destination": missing, "x-due-at": due.Format(time.RFC3339Nano), "custom": "kept"},
			})
			// A routable message alongside is not held up by the failing one.
			pub.Publish(b.TimeoutsQueue(), amqp.Publishing{MessageId: "routable-1", Body: []byte("fine"),
				Headers: amqp.Table{"x-destination": okDest, "x-due-at": due.Format(time.RFC3339Nano)}})

			ok.WaitFor(1, livenessBound)
			errs.WaitFor(1, livenessBound+time.Duration(1<<retries)*time.Second)
			got := errs.Quiet(quietPeriod + time.Second)
			if len(got) != 1 {
				t.Fatalf("%d messages on the error queue, want exactly 1", len(got))
			}
			d := got[0]
			checkErrorHeaders(t, d.Headers, "dispatch", int64(retries+1), b.TimeoutsQueue(),
				[]string{"unroutable", "NO_ROUTE", "312"}, before)
			t.Logf("reason: %s; on the error queue %s after due", headerString(d.Headers, hError), d.At.Sub(due).Round(time.Millisecond))
			if !bytes.Equal(d.Body, body) {
				t.Errorf("body changed: %q, want %q", d.Body, body)
			}
			if d.MessageId != "unroutable-1" || d.CorrelationId != "c-1" || d.ContentType != "application/x-bin" {
				t.Errorf("properties not kept: message-id %q correlation-id %q content-type %q", d.MessageId, d.CorrelationId, d.ContentType)
			}
			if headerString(d.Headers, "custom") != "kept" || headerString(d.Headers, "x-destination") != missing {
				t.Errorf("original headers not kept: %v", d.Headers)
			}
			// Retries back off 1s, 2s, 4s…: with r retries the copy cannot
			// exist before due + (2^r - 1) seconds.
			minWait := time.Duration(1<<retries-1) * time.Second
			if earliest := due.Add(minWait); d.At.Before(earliest) {
				t.Errorf("on the error queue at %s, only %s after due: %d retries with backoff 1s, 2s… need at least %s",
					d.At.Format(time.RFC3339Nano), d.At.Sub(due), retries, minWait)
			}
			if a := ok.All(); len(a) != 1 || a[0].At.Before(due) {
				t.Errorf("routable message alongside: %d deliveries (want 1, not early)", len(a))
			}
			if !b.Running() {
				t.Fatalf("bridge exited with code %d", b.Wait(0))
			}
		})
	}
}

// TestDestinationRejectsForward: a forward the broker nacks (the destination
// queue is full and rejects publishes) is a dispatch failure like an
// unroutable one: retried, then moved to the error queue.
func TestDestinationRejectsForward(t *testing.T) {
	t.Parallel()
	b, conn, pub := startWithPublisher(t, map[string]string{"DELAYBRIDGE_NUMBER_OF_RETRIES": "1", "DELAYBRIDGE_POLL_INTERVAL": "100ms"})
	errs := consume(t, conn, b.ErrorQ)
	full := b.Endpoint + ".full"
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(full, false, false, false, false, amqp.Table{
		"x-max-length": int32(0), "x-overflow": "reject-publish",
	}); err != nil {
		t.Fatalf("declare %s: %v", full, err)
	}
	_ = ch.Close()
	deleteQueuesOnCleanup(t, full)

	before := time.Now()
	due := before.Add(300 * time.Millisecond).UTC()
	pub.Publish(b.TimeoutsQueue(), amqp.Publishing{MessageId: "rejected-1", Body: []byte("no room"),
		Headers: amqp.Table{"x-destination": full, "x-due-at": due.Format(time.RFC3339Nano)}})
	errs.WaitFor(1, livenessBound+2*time.Second)
	got := errs.Quiet(quietPeriod)
	if len(got) != 1 {
		t.Fatalf("%d messages on the error queue, want exactly 1", len(got))
	}
	d := got[0]
	checkErrorHeaders(t, d.Headers, "dispatch", 2, b.TimeoutsQueue(), nil, before)
	t.Logf("reason: %s", headerString(d.Headers, hError))
	if string(d.Body) != "no room" || d.MessageId != "rejected-1" {
		t.Errorf("error copy body %q message-id %q", d.Body, d.MessageId)
	}
	if d.At.Before(due.Add(time.Second)) {
		t.Errorf("on the error queue %s after due; one retry needs at least 1s", d.At.Sub(due))
	}
}
