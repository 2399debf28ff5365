package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// A message with more than 8,192 headers, or tables nested deeper
// than 32, is valid AMQP and the broker takes it, but amqp091-go refuses to
// read it and drops the connection, and the message comes back first,
// forever. The bridge must move it to the error queue with a reason, after a
// bounded number of attempts, and keep everything else flowing, without
// interrupting the dispatcher (docs/contract.md §4.5).
func TestUnreadableHeadersGoToTheErrorQueue(t *testing.T) {
	for _, queueType := range []string{"classic", "quorum"} {
		t.Run(queueType, func(t *testing.T) {
			t.Parallel()
			b := startBridge(t, map[string]string{"DELAYBRIDGE_QUEUE_TYPE": queueType})
			conn := dial(t)
			dest := b.Endpoint + ".dst"
			c := declareAndConsume(t, conn, dest)
			errs := consume(t, conn, b.ErrorQ)
			pub := newPublisher(t, conn)

			due := time.Now().Add(4 * time.Second)
			schedule := func(id string, h amqp.Table) amqp.Publishing {
				h["x-destination"] = dest
				h["x-due-at"] = due.UTC().Format(time.RFC3339Nano)
				return amqp.Publishing{MessageId: id, Body: []byte(id), DeliveryMode: amqp.Persistent, Headers: h}
			}
			// 8,193 headers in all, with the two the bridge needs.
			many := amqp.Table{}
			for i := range 8191 {
				many[fmt.Sprintf("h%05d", i)] = int32(i)
			}
			var deep any = "bottom"
			for range 33 {
				deep = amqp.Table{"n": deep}
			}
			var msgs []amqp.Publishing
			for i := range 20 {
				switch i {
				case 8:
					msgs = append(msgs, schedule("poison-many", many))
				case 14:
					msgs = append(msgs, schedule("poison-deep", amqp.Table{"deep": deep}))
				}
				msgs = append(msgs, schedule(fmt.Sprintf("valid-%02d", i), amqp.Table{}))
			}
			pub.PublishAll(b.TimeoutsQueue(), msgs)

			got := c.WaitFor(20, time.Until(due)+20*time.Second)
			seen := map[string]bool{}
			for _, a := range c.Quiet(500 * time.Millisecond) {
				id := a.MessageId
				if seen[id] || !strings.HasPrefix(id, "valid-") {
					t.Errorf("unexpected or duplicate delivery %q", id)
				}
				seen[id] = true
				if a.At.Before(due) {
					t.Errorf("%s delivered EARLY at %s, due %s", id, a.At.Format(time.RFC3339Nano), due.Format(time.RFC3339Nano))
				}
				if late := a.At.Sub(due); late > 3*time.Second {
					t.Errorf("%s delivered %s late", id, late)
				}
			}
			if len(got) < 20 {
				t.Fatalf("%d of 20 valid messages delivered", len(got))
			}

			copies := errs.WaitFor(2, 20*time.Second)
			reasons := map[string]*regexp.Regexp{
				// A quorum queue adds x-delivery-count to a redelivered message.
				"poison-many": regexp.MustCompile(`^message headers exceed what the AMQP client can read: 819[34] entries in one table \(limit 8192\)$`),
				"poison-deep": regexp.MustCompile(`^message headers exceed what the AMQP client can read: tables or arrays nested more than 32 levels deep \(limit 32\)$`),
			}
			for _, e := range errs.Quiet(500 * time.Millisecond) {
				re, ok := reasons[e.MessageId]
				if !ok {
					t.Errorf("unexpected error-queue copy %q: %v", e.MessageId, e.Headers["x-delaybridge-error"])
					continue
				}
				delete(reasons, e.MessageId)
				if reason := headerString(e.Headers, "x-delaybridge-error"); !re.MatchString(reason) {
					t.Errorf("%s: reason %q, want %s", e.MessageId, reason, re)
				}
				if headerString(e.Headers, "x-delaybridge-stage") != "ingest" || headerString(e.Headers, "NServiceBus.FailedQ") != b.TimeoutsQueue() {
					t.Errorf("%s: stage %q, FailedQ %q", e.MessageId, e.Headers["x-delaybridge-stage"], e.Headers["NServiceBus.FailedQ"])
				}
				// The original properties, byte for byte: its headers among them.
				raw, _ := e.Headers["x-delaybridge-original-properties"].([]byte)
				if !bytes.Contains(raw, []byte("x-destination")) || !bytes.Contains(raw, []byte(e.MessageId)) ||
					(e.MessageId == "poison-many" && !bytes.Contains(raw, []byte("h08190"))) {
					t.Errorf("%s: x-delaybridge-original-properties (%d bytes) is not the original content header", e.MessageId, len(raw))
				}
				if string(e.Body) != e.MessageId || e.DeliveryMode != amqp.Persistent {
					t.Errorf("%s: body %q, delivery-mode %d; want the original's", e.MessageId, e.Body, e.DeliveryMode)
				}
			}
			if len(copies) < 2 || len(reasons) > 0 {
				t.Errorf("missing error-queue copies: %v", reasons)
			}

			// Bounded: the ingest connection dropped at most once per
			// poison message, and the dispatcher's never.
			lost := map[string]int{}
			moved := 0
			for _, l := range bridgeLogLines(b.Stderr()) {
				switch l.Message {
				case "broker connection lost; reconnecting":
					name, _ := l.Fields["connection"].(string)
					role, _, _ := strings.Cut(strings.TrimPrefix(name, "delaybridge "), " ")
					lost[role]++
				case "dispatch interrupted; resuming on the next broker connection":
					t.Errorf("the dispatcher was interrupted: %s", l.Raw)
				case "unreadable message moved to the error queue":
					moved++
				}
			}
			if lost["ingest"] < 1 || lost["ingest"] > 2 || len(lost) != 1 {
				t.Errorf("lost connections by role %v; want the ingest connection once or twice, no other", lost)
			}
			if moved != 2 {
				t.Errorf("%d \"unreadable message moved to the error queue\" lines, want 2", moved)
			}
			if code, err := getReadyz(b.HTTPAddr); code != http.StatusOK {
				t.Errorf("/readyz answers %d (%v), want 200", code, err)
			}
			if n := scrape(t, b)[`delaybridge_error_queue_messages_total{stage="ingest"}`]; n != 2 {
				t.Errorf("delaybridge_error_queue_messages_total{stage=\"ingest\"} = %v, want 2", n)
			}
			if t.Failed() {
				out, _ := json.Marshal(lost)
				t.Logf("lost connections: %s", out)
			}
			b.Stop()
		})
	}
}

// A client publishing an unreadable message to E.TimeoutsDispatcher (which
// only the bridge should write to) costs the dispatcher one reconnect: the
// message ends on the error queue and forwarding goes on.
func TestUnreadableMessageOnTheDispatcherQueue(t *testing.T) {
	t.Parallel()
	b, conn, pub, dest, c := startWithDest(t)
	errs := consume(t, conn, b.ErrorQ)

	many := amqp.Table{}
	for i := range 8193 {
		many[fmt.Sprintf("h%05d", i)] = nil
	}
	pub.Publish(b.DispatcherQueue(), amqp.Publishing{MessageId: "poison-token", Body: []byte(`{"tokens":[]}`), Headers: many})
	due := time.Now().Add(time.Second)
	pub.Publish(b.TimeoutsQueue(), amqp.Publishing{MessageId: "after", Body: []byte("after"), Headers: amqp.Table{
		"x-destination": dest, "x-due-at": due.UTC().Format(time.RFC3339Nano)}})

	if got := c.WaitFor(1, 20*time.Second); got[0].MessageId != "after" || got[0].At.Before(due) {
		t.Errorf("delivered %q at %s, want \"after\" not before %s", got[0].MessageId, got[0].At, due)
	}
	e := errs.WaitFor(1, 20*time.Second)[0]
	if e.MessageId != "poison-token" || headerString(e.Headers, "NServiceBus.FailedQ") != b.DispatcherQueue() ||
		!strings.Contains(headerString(e.Headers, "x-delaybridge-error"), "8193 entries in one table (limit 8192)") {
		t.Errorf("error-queue copy %q from %q with reason %q", e.MessageId, e.Headers["NServiceBus.FailedQ"], e.Headers["x-delaybridge-error"])
	}
	lost := map[string]int{}
	for _, l := range bridgeLogLines(b.Stderr()) {
		if l.Message == "broker connection lost; reconnecting" {
			name, _ := l.Fields["connection"].(string)
			role, _, _ := strings.Cut(strings.TrimPrefix(name, "delaybridge "), " ")
			lost[role]++
		}
	}
	if lost["consume"] != 1 || len(lost) != 1 {
		t.Errorf("lost connections by role %v; want the dispatcher's (consume) once, no other", lost)
	}
	b.Stop()
}

// A replay pass reads the error queue, where any endpoint's copies land. One
// the AMQP client cannot read used to end every pass there: now each pass
// skips it with its reason and leaves it on the error queue, replays the
// valid copies around it, and no connection of the bridge is lost.
func TestReplayMeetsAnUnreadableCopy(t *testing.T) {
	t.Parallel()
	b := startBridge(t, map[string]string{"DELAYBRIDGE_ADMIN_TOKEN": adminToken, "DELAYBRIDGE_POLL_INTERVAL": "100ms"})
	conn := dial(t)
	dest := b.Endpoint + ".dst"
	c := declareAndConsume(t, conn, dest)
	pub := newPublisher(t, conn)
	many := amqp.Table{}
	for i := range 8193 {
		many[fmt.Sprintf("h%05d", i)] = nil
	}
	failure := func(id string) amqp.Publishing {
		return amqp.Publishing{MessageId: id, Body: []byte(id), Headers: amqp.Table{
			"x-destination": dest, hStage: "dispatch", hError: "failed", hNSBExcMsg: "failed",
			hNSBFailQ: b.TimeoutsQueue(), hAttempts: int32(6), hFailedAt: time.Now().UTC().Format(time.RFC3339Nano)}}
	}
	pub.Publish(b.ErrorQ, failure("before"))
	pub.Publish(b.ErrorQ, amqp.Publishing{MessageId: "poison-copy", Body: []byte("x"), Headers: many})
	pub.Publish(b.ErrorQ, failure("after"))

	type result struct {
		Replayed, Skipped int
		Details           []struct {
			MessageID string `json:"message_id"`
			Reason    string
		} `json:"skipped_messages"`
	}
	var delivered []string
	for pass, want := range [][]string{{"before", "after"}, {"again"}} {
		if pass == 1 {
			pub.Publish(b.ErrorQ, failure("again"))
		}
		code, out, errOut := runCLI(t, b, true, "replay-errors", "--json")
		var res result
		if err := json.Unmarshal([]byte(out), &res); code != 0 || err != nil {
			t.Fatalf("pass %d: exit %d: %s %s (%v)", pass+1, code, out, errOut, err)
		}
		if res.Replayed != len(want) || res.Skipped != 1 || len(res.Details) != 1 || res.Details[0].MessageID != "poison-copy" ||
			!strings.Contains(res.Details[0].Reason, "cannot read") {
			t.Fatalf("pass %d: %s; want %v replayed and the unreadable copy skipped", pass+1, out, want)
		}
		delivered = append(delivered, want...)
		got := c.WaitFor(len(delivered), 20*time.Second)
		for i, d := range got {
			if i >= len(delivered) || d.MessageId != delivered[i] {
				t.Errorf("pass %d: delivery %d is %q; want %v in all", pass+1, i, d.MessageId, delivered)
			}
		}
		// The held copy is back once the pass's connection closed.
		deadline := time.Now().Add(10 * time.Second)
		for queueDepth(t, conn, b.ErrorQ) != 1 {
			if time.Now().After(deadline) {
				t.Fatalf("pass %d: error queue holds %d messages, want the unreadable copy", pass+1, queueDepth(t, conn, b.ErrorQ))
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	for _, l := range bridgeLogLines(b.Stderr()) {
		if l.Message == "broker connection lost; reconnecting" {
			t.Errorf("the bridge lost a connection: %v", l.Fields["connection"])
		}
	}
	b.Stop()
}
