package integration

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// publishDue publishes n messages with ids prefix-00.. to dest, due at due.
func publishDue(pub *publisher, timeoutsQueue, prefix, dest string, n int, due time.Time) {
	var msgs []amqp.Publishing
	for i := range n {
		msgs = append(msgs, amqp.Publishing{MessageId: fmt.Sprintf("%s-%02d", prefix, i), Body: []byte(prefix),
			Headers: amqp.Table{"x-destination": dest, "x-due-at": due.UTC().Format(time.RFC3339Nano)}})
	}
	pub.PublishAll(timeoutsQueue, msgs)
}

// pausedRows lists bridge b's pending timeouts (ls --json --all) and
// returns how many there are and how many of them are shown paused.
func pausedRows(t *testing.T, b *bridgeProc) (all, paused int) {
	t.Helper()
	var page struct {
		Timeouts []struct {
			ID     string `json:"id"`
			Paused bool   `json:"paused"`
		}
	}
	out := mustCLI(t, b, "ls", "--json", "--all")
	if err := json.Unmarshal([]byte(out), &page); err != nil {
		t.Fatalf("ls --json: %v: %s", err, out)
	}
	for _, r := range page.Timeouts {
		if r.Paused {
			paused++
		}
	}
	return len(page.Timeouts), paused
}

// waitRows waits until bridge b lists want pending timeouts.
func waitRows(t *testing.T, b *bridgeProc, want int) {
	t.Helper()
	deadline := time.Now().Add(livenessBound)
	for {
		n, _ := pausedRows(t, b)
		if n == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d timeouts pending, want %d", n, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestPauseHoldsAcrossRestart: messages for a paused destination are held
// past their due time (listed as paused, shown on the status page and in
// delaybridge_destination_paused) while another destination's, due at the
// same time, are delivered; messages stored while it is paused are held
// too; the pause survives a restart on the same bbolt file; after resume
// every one is delivered exactly once.
func TestPauseHoldsAcrossRestart(t *testing.T) {
	t.Parallel()
	b := startBridge(t, map[string]string{"DELAYBRIDGE_ADMIN_TOKEN": adminToken, "DELAYBRIDGE_POLL_INTERVAL": "200ms",
		"DELAYBRIDGE_METRICS_DESTINATION_INTERVAL": "1s"})
	conn := dial(t)
	pub := newPublisher(t, conn)
	dest, other := b.Endpoint+".paused", b.Endpoint+".open"
	got := declareAndConsume(t, conn, dest)
	control := declareAndConsume(t, conn, other)
	deleteQueuesOnCleanup(t, dest, other)

	// Due a few seconds out: time to store them and pause before they are
	// due, on a loaded machine too.
	due := time.Now().Add(5 * time.Second)
	publishDue(pub, b.TimeoutsQueue(), "held", dest, 20, due)
	publishDue(pub, b.TimeoutsQueue(), "ctl", other, 5, due)
	waitRows(t, b, 25)
	if out := mustCLI(t, b, "pause", dest, "--by", "it"); out != "paused "+dest+"\n" {
		t.Fatalf("pause: %q", out)
	}
	if time.Now().After(due) {
		t.Fatalf("the pause landed after the messages were due (a loaded machine?); cannot tell held from delivered")
	}
	// Stored while paused, due at once: held as well.
	publishDue(pub, b.TimeoutsQueue(), "late", dest, 5, time.Now())

	control.WaitFor(5, livenessBound+time.Until(due))
	time.Sleep(time.Until(due.Add(quietPeriod)))
	if n := got.Count(); n != 0 {
		t.Fatalf("%d messages delivered to the paused destination", n)
	}
	waitRows(t, b, 25)
	if all, paused := pausedRows(t, b); all != 25 || paused != 25 {
		t.Fatalf("ls: %d pending, %d shown paused; want 25 and 25", all, paused)
	}
	if page := httpGet(t, b, "/"); !strings.Contains(page, ">paused<") {
		t.Error("the status page shows no paused row")
	}
	metric := fmt.Sprintf(`delaybridge_destination_paused{destination=%q,exchange=""} 1`, dest)
	deadline := time.Now().Add(livenessBound)
	for !strings.Contains(httpGet(t, b, "/metrics"), metric) {
		if time.Now().After(deadline) {
			t.Fatalf("/metrics has no %s", metric)
		}
		time.Sleep(200 * time.Millisecond)
	}

	// A restart on the same file keeps the pause.
	b.Stop()
	b = b.Restart(nil)
	if out := mustCLI(t, b, "paused"); !strings.Contains(out, dest) || !strings.Contains(out, "it") {
		t.Fatalf("paused after a restart: %q", out)
	}
	got.Quiet(quietPeriod)
	if n := got.Count(); n != 0 {
		t.Fatalf("%d messages delivered to the paused destination after a restart", n)
	}
	if all, paused := pausedRows(t, b); all != 25 || paused != 25 {
		t.Fatalf("ls after a restart: %d pending, %d shown paused; want 25 and 25", all, paused)
	}

	if out := mustCLI(t, b, "resume", dest); out != "resumed "+dest+"\n" {
		t.Fatalf("resume: %q", out)
	}
	got.WaitFor(25, livenessBound)
	arrivals := got.Quiet(quietPeriod)
	ids := byMessageID(arrivals)
	if len(arrivals) != 25 || len(ids) != 25 {
		t.Fatalf("after resume: %d deliveries of %d ids, want 25 of 25", len(arrivals), len(ids))
	}
	for i := range 20 {
		if len(ids[fmt.Sprintf("held-%02d", i)]) != 1 {
			t.Fatalf("held-%02d delivered %d times", i, len(ids[fmt.Sprintf("held-%02d", i)]))
		}
	}
	waitRows(t, b, 0)
	if out := mustCLI(t, b, "paused"); out != "no destination is paused\n" {
		t.Fatalf("paused after resume: %q", out)
	}
}

// TestPauseAcrossPostgresInstances: a pause made through one of two
// bridges sharing a PostgreSQL schema holds on both (neither delivers), and
// a resume through the other delivers every message exactly once.
func TestPauseAcrossPostgresInstances(t *testing.T) {
	t.Parallel()
	pg := requirePostgres(t)
	shared, endpoint, _ := pg.sharedEnv(t, map[string]string{"DELAYBRIDGE_ADMIN_TOKEN": adminToken, "DELAYBRIDGE_POLL_INTERVAL": "200ms"})
	b1, b2 := execBridge(t, bridgeEnv(t, shared)), execBridge(t, bridgeEnv(t, shared))
	b1.waitReady(30 * time.Second)
	b2.waitReady(30 * time.Second)
	conn := dial(t)
	pub := newPublisher(t, conn)
	dest, other := endpoint+".paused", endpoint+".open"
	got := declareAndConsume(t, conn, dest)
	control := declareAndConsume(t, conn, other)
	deleteQueuesOnCleanup(t, dest, other)

	mustCLI(t, b1, "pause", dest)
	// Stored by either instance (they share E.Timeouts), due at once.
	now := time.Now()
	publishDue(pub, endpoint+".Timeouts", "held", dest, 30, now)
	publishDue(pub, endpoint+".Timeouts", "ctl", other, 5, now)
	control.WaitFor(5, livenessBound)
	waitRows(t, b2, 30)
	got.Quiet(quietPeriod)
	if n := got.Count(); n != 0 {
		t.Fatalf("%d messages delivered to the destination paused through the other instance", n)
	}
	if all, paused := pausedRows(t, b2); all != 30 || paused != 30 {
		t.Fatalf("ls on the other instance: %d pending, %d shown paused; want 30 and 30", all, paused)
	}
	mustCLI(t, b2, "resume", dest)
	got.WaitFor(30, livenessBound)
	arrivals := got.Quiet(quietPeriod)
	if ids := byMessageID(arrivals); len(arrivals) != 30 || len(ids) != 30 {
		t.Fatalf("after resume: %d deliveries of %d ids, want 30 of 30", len(arrivals), len(ids))
	}
	waitRows(t, b1, 0)
}
