package integration

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// The error queue refusing copies must not stall intake, storm or
// lose anything (docs/contract.md §4.1).

// errorQueueLoad deletes the bridge's error queue, declares it again with
// args unless they are nil, then publishes invalid messages (no due time)
// and valid ones due at once to a destination queue, and waits for the
// valid ones there. It returns a channel on conn.
func errorQueueLoad(t *testing.T, conn *amqp.Connection, b *bridgeProc, args amqp.Table, invalid, valid int) *amqp.Channel {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDelete(b.ErrorQ, false, false, false); err != nil {
		t.Fatal(err)
	}
	if args != nil {
		if _, err := ch.QueueDeclare(b.ErrorQ, true, false, false, false, args); err != nil {
			t.Fatal(err)
		}
	}
	dest := b.Endpoint + ".dst"
	c := declareAndConsume(t, conn, dest)
	var msgs []amqp.Publishing
	for i := range invalid {
		msgs = append(msgs, amqp.Publishing{MessageId: fmt.Sprintf("bad-%02d", i), Body: []byte("no due time"),
			Headers: amqp.Table{"x-destination": dest}})
	}
	for i := range valid {
		msgs = append(msgs, amqp.Publishing{MessageId: fmt.Sprintf("ok-%02d", i), Body: []byte("ok"),
			Headers: amqp.Table{"x-destination": dest, "x-delay": int64(0)}})
	}
	newPublisher(t, conn).PublishAll(b.TimeoutsQueue(), msgs)
	c.WaitFor(valid, 30*time.Second)
	return ch
}

// readyz returns /readyz's status and body.
func readyz(t *testing.T, b *bridgeProc) (int, string) {
	t.Helper()
	resp, body := request(t, b, http.MethodGet, "/readyz", false)
	return resp.StatusCode, body
}

// waitUntil polls cond every 100 ms, failing the test after timeout.
func waitUntil(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %s for %s", timeout, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func countLines(b *bridgeProc, msg string) int {
	n := 0
	for _, l := range bridgeLogLines(b.Stderr()) {
		if l.Message == msg {
			n++
		}
	}
	return n
}

const (
	msgPerCopyFailure = "could not move invalid message to the error queue; requeued"
	msgRedeclared     = "the error queue was missing (a copy came back as unroutable); declared it again"
	msgFirstRefusal   = "the error queue refuses copies; the messages stay where they are and are tried again with backoff (further refusals are summarised once per interval)"
)

// An error queue deleted while the bridge runs is declared again, as at
// start (a quorum queue here: the same arguments), and the invalid messages
// land there; the valid ones are delivered meanwhile.
func TestDeletedErrorQueueIsDeclaredAgain(t *testing.T) {
	t.Parallel()
	b := startBridge(t, map[string]string{"DELAYBRIDGE_QUEUE_TYPE": "quorum"})
	conn := dial(t)
	const invalid, valid = 10, 3
	ch := errorQueueLoad(t, conn, b, nil, invalid, valid)

	waitUntil(t, 30*time.Second, "the invalid messages on the error queue", func() bool {
		q, err := ch.QueueDeclarePassive(b.ErrorQ, true, false, false, false, nil)
		if err != nil {
			// Not there yet; the refusal closed the channel.
			if ch, err = conn.Channel(); err != nil {
				t.Fatal(err)
			}
			return false
		}
		return q.Messages == invalid
	})
	// Declared as at start: durable, quorum.
	if _, err := ch.QueueDeclare(b.ErrorQ, true, false, false, false, amqp.Table{amqp.QueueTypeArg: "quorum"}); err != nil {
		t.Errorf("the error queue was declared again with other arguments: %v", err)
	}
	errs := consume(t, conn, b.ErrorQ)
	seen := map[string]int{}
	for _, d := range errs.WaitFor(invalid, 20*time.Second) {
		seen[d.MessageId]++
	}
	if len(seen) != invalid {
		t.Errorf("copies on the error queue: %v, want each of %d invalid messages once", seen, invalid)
	}
	if n := countLines(b, msgRedeclared); n != 1 {
		t.Errorf("%d lines saying the error queue was declared again, want 1", n)
	}
	if n := countLines(b, msgPerCopyFailure); n != 0 {
		t.Errorf("%d lines, one per refused copy; want none", n)
	}
	if code, body := readyz(t, b); code != http.StatusOK {
		t.Errorf("/readyz %d %s", code, body)
	}
	b.Stop()
}

// A full error queue (x-overflow reject-publish) makes the bridge hold the
// invalid messages on E.Timeouts and try their copies again with backoff:
// the valid messages behind them are delivered, /readyz and a gauge say
// what is wrong, the log says it once rather than once per message, and
// once the queue has room every invalid message lands on it exactly once.
func TestFullErrorQueueHoldsInvalidMessages(t *testing.T) {
	t.Parallel()
	b := startBridge(t, map[string]string{"DELAYBRIDGE_PREFETCH": "20"})
	conn := dial(t)
	const invalid, valid = 15, 5
	// An operator's limit, set after start (the bridge declares the queue
	// without one).
	errorQueueLoad(t, conn, b, amqp.Table{amqp.QueueTypeArg: "classic", "x-max-length": int32(2), "x-overflow": "reject-publish"},
		invalid, valid)

	var body string
	waitUntil(t, 30*time.Second, "/readyz to report the refusing error queue", func() bool {
		var code int
		code, body = readyz(t, b)
		return code == http.StatusServiceUnavailable && strings.Contains(body, "refuses copies")
	})
	if !strings.Contains(body, b.ErrorQ) || !strings.Contains(body, "nack") {
		t.Errorf("/readyz: %s", body)
	}
	if v := scrape(t, b)["delaybridge_error_queue_refusing"]; v != 1 {
		t.Errorf("delaybridge_error_queue_refusing = %v, want 1", v)
	}
	if n := countLines(b, msgFirstRefusal); n != 1 {
		t.Errorf("%d lines saying the error queue refuses copies, want 1", n)
	}
	if n := countLines(b, msgPerCopyFailure); n != 0 {
		t.Errorf("%d lines, one per refused copy; want none", n)
	}

	errs := consume(t, conn, b.ErrorQ)
	got := errs.WaitFor(invalid, 2*time.Minute)
	seen := map[string]int{}
	for _, d := range got {
		seen[d.MessageId]++
	}
	if len(seen) != invalid || len(got) != invalid {
		t.Errorf("copies on the error queue: %v, want each of %d invalid messages once", seen, invalid)
	}
	waitUntil(t, time.Minute, "/readyz 200 again", func() bool { code, _ := readyz(t, b); return code == http.StatusOK })
	if v := scrape(t, b)["delaybridge_error_queue_refusing"]; v != 0 {
		t.Errorf("delaybridge_error_queue_refusing = %v after the queue took every copy, want 0", v)
	}
	waitQueueEmpty(t, conn, b.TimeoutsQueue(), 10*time.Second)
	if extra := errs.Quiet(quietPeriod); len(extra) != invalid {
		t.Errorf("%d copies in all, want %d", len(extra), invalid)
	}
	b.Stop()
}
