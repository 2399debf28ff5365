package integration

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// TestDestinationErrorQueueIsRefused: x-destination naming the error queue
// is refused at ingest like the bridge's other queues (docs/contract.md
// §2.2): its copy there is an ingest failure with a reason, not a forward
// that would read as a failure without one.
func TestDestinationErrorQueueIsRefused(t *testing.T) {
	t.Parallel()
	b, conn, pub := startWithPublisher(t, map[string]string{"DELAYBRIDGE_POLL_INTERVAL": "100ms"})
	errs := consume(t, conn, b.ErrorQ)
	before := time.Now()
	pub.Publish(b.TimeoutsQueue(), amqp.Publishing{MessageId: "to-error", Body: []byte("x"),
		Headers: amqp.Table{"x-destination": b.ErrorQ, "x-delay": int32(0)}})
	got := errs.WaitFor(1, livenessBound)
	checkErrorHeaders(t, got[0].Headers, "ingest", 0, b.TimeoutsQueue(), []string{"own queues"}, before)
	if extra := errs.Quiet(quietPeriod); len(extra) != 1 {
		t.Errorf("%d messages on the error queue, want the one ingest copy", len(extra))
	}
}

// TestErrorQueueOwnQueueIsRefused: DELAYBRIDGE_ERROR_QUEUE naming E.Timeouts
// (where one bad message loops for ever) or E.TimeoutsDispatcher stops the
// bridge at start with exit code 2 and one line naming the variable.
func TestErrorQueueOwnQueueIsRefused(t *testing.T) {
	t.Parallel()
	requireBroker(t)
	for _, suffix := range []string{".Timeouts", ".TimeoutsDispatcher"} {
		t.Run(strings.TrimPrefix(suffix, "."), func(t *testing.T) {
			t.Parallel()
			ep := uniqueEndpoint(t)
			// Should it start after all, its queues go at the end.
			deleteQueuesOnCleanup(t, ep+".Timeouts", ep+".TimeoutsDispatcher")
			p := execBridge(t, bridgeEnv(t, map[string]string{"DELAYBRIDGE_ENDPOINT": ep, "DELAYBRIDGE_ERROR_QUEUE": ep + suffix}))
			code := p.Wait(20 * time.Second)
			stderr := p.Stderr()
			if code != 2 {
				t.Errorf("exit code %d, want 2", code)
			}
			lines := strings.Split(strings.TrimRight(stderr, "\n"), "\n")
			if len(lines) != 1 || !strings.Contains(stderr, "DELAYBRIDGE_ERROR_QUEUE") {
				t.Errorf("stderr must be one line naming DELAYBRIDGE_ERROR_QUEUE:\n%s", stderr)
			}
		})
	}
}

// TestAdminCLIDotIDs: the ids "." and ".." reach the admin API through the
// CLI (escaped, so that no router cleans them away as dot-segments).
func TestAdminCLIDotIDs(t *testing.T) {
	t.Parallel()
	b, conn, pub := startWithPublisher(t, map[string]string{"DELAYBRIDGE_ADMIN_TOKEN": adminToken})
	dest := b.Endpoint + ".dots"
	declareQueue(t, conn, dest)
	due := time.Now().Add(time.Hour).UTC().Format(time.RFC3339Nano)
	for _, id := range []string{".", ".."} {
		pub.Publish(b.TimeoutsQueue(), amqp.Publishing{MessageId: id, Body: []byte("body of " + id),
			Headers: amqp.Table{"x-destination": dest, "x-due-at": due}})
	}
	deadline := time.Now().Add(livenessBound)
	for len(listIDs(t, b)) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("the timeouts never showed in ls: %v", listIDs(t, b))
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, id := range []string{".", ".."} {
		var shown struct {
			ID          string `json:"id"`
			Destination string `json:"destination"`
		}
		if out := mustCLI(t, b, "show", "--json", id); json.Unmarshal([]byte(out), &shown) != nil || shown.ID != id || shown.Destination != dest {
			t.Errorf("show %q: %s", id, out)
		}
	}
	mustCLI(t, b, "cancel", "..")
	ids := listIDs(t, b)
	if _, ok := ids[".."]; ok {
		t.Error(`".." still listed after cancel`)
	}
	if _, ok := ids["."]; !ok {
		t.Error(`cancelling ".." took "." too`)
	}
	mustCLI(t, b, "cancel", ".")
	if n := len(listIDs(t, b)); n != 0 {
		t.Errorf("%d timeouts left after both cancels", n)
	}
}

// TestReplaySkipsForeignAndReservedCopies: replay-errors on a shared error
// queue replays only this endpoint's failures, and checks destinations with
// ingest's rules (the bridge's own queues, the error queue included).
func TestReplaySkipsForeignAndReservedCopies(t *testing.T) {
	t.Parallel()
	b, conn, pub := startWithPublisher(t, map[string]string{"DELAYBRIDGE_ADMIN_TOKEN": adminToken})
	copyFor := func(id, dest, failedQ string) amqp.Publishing {
		return amqp.Publishing{MessageId: id, Body: []byte(id), Headers: amqp.Table{
			"x-destination": dest, hStage: "dispatch", hError: "failed", hNSBExcMsg: "failed",
			hNSBFailQ: failedQ, hAttempts: int32(6), hFailedAt: time.Now().UTC().Format(time.RFC3339Nano),
		}}
	}
	pub.PublishAll(b.ErrorQ, []amqp.Publishing{
		copyFor("foreign", b.Endpoint+".dst", "another-endpoint.Timeouts"),
		copyFor("to-dispatcher", b.DispatcherQueue(), b.TimeoutsQueue()),
		copyFor("to-error", b.ErrorQ, b.TimeoutsQueue()),
		copyFor("long", strings.Repeat("q", 300), b.TimeoutsQueue()),
	})
	out := mustCLI(t, b, "replay-errors", "--json")
	var res struct {
		Replayed, Skipped int
		Details           []struct {
			MessageID string `json:"message_id"`
			Reason    string `json:"reason"`
		} `json:"skipped_messages"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil || res.Replayed != 0 || res.Skipped != 4 {
		t.Fatalf("replay-errors: %s (%v)", out, err)
	}
	want := map[string]string{"foreign": "another endpoint", "to-dispatcher": "own queues", "to-error": "own queues", "long": "at most 255"}
	for _, d := range res.Details {
		if !strings.Contains(d.Reason, want[d.MessageID]) {
			t.Errorf("%s skipped for %q, want a reason saying %q", d.MessageID, d.Reason, want[d.MessageID])
		}
	}
	deadline := time.Now().Add(livenessBound)
	for queueDepth(t, conn, b.ErrorQ) != 4 {
		if time.Now().After(deadline) {
			t.Fatalf("error queue holds %d, want the 4 copies back", queueDepth(t, conn, b.ErrorQ))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !b.Running() {
		t.Fatalf("bridge exited with code %d", b.Wait(0))
	}
}
