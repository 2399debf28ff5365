package bridge

// Against the real broker: failures do not storm, and a forward
// AMQP cannot encode fails alone.

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/message"
	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/wire"
)

// drain takes every message off q.
func (h *harness) drain(q string) []amqp.Delivery {
	h.t.Helper()
	ch, err := h.conn.Channel()
	if err != nil {
		h.t.Fatalf("open channel: %v", err)
	}
	defer ch.Close()
	var out []amqp.Delivery
	for {
		d, ok, err := ch.Get(q, true)
		if err != nil {
			h.t.Fatalf("get from %s: %v", q, err)
		}
		if !ok {
			return out
		}
		out = append(out, d)
	}
}

// waitReady waits up to d until q holds n messages.
func (h *harness) waitReady(q string, n int, d time.Duration) {
	h.t.Helper()
	deadline := time.Now().Add(d)
	for {
		got := h.ready(q)
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("%s holds %d messages after %s, want %d", q, got, d, n)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestUnroutableDestinationDoesNotStorm: 300 messages due to a queue that
// does not exist. Each reaches the error queue after its retries, the bridge
// publishes about one forward per message plus a probe per interval, and it
// writes a handful of warnings, not one per attempt.
func TestUnroutableDestinationDoesNotStorm(t *testing.T) {
	const msgs, retries = 300, 2
	h := newHarness(t, "storm", map[string]string{
		"DELAYBRIDGE_NUMBER_OF_RETRIES": fmt.Sprint(retries),
		"DELAYBRIDGE_LOG_LEVEL":         "debug", // the "forwarding" lines name each publish
	})
	missing := h.endpoint + ".missing"
	h.start()
	batch := make([]amqp.Publishing, 0, msgs)
	for _, id := range ids("storm", msgs) {
		batch = append(batch, amqp.Publishing{MessageId: id, DeliveryMode: amqp.Persistent, Body: []byte(id),
			Headers: amqp.Table{"x-destination": missing, "x-delay": int32(0)}})
	}
	start := time.Now()
	h.publish(batch...)
	h.waitReady(h.errorQueue, msgs, 90*time.Second)
	t.Logf("all %d on the error queue after %s", msgs, time.Since(start).Round(time.Millisecond))
	h.requireRunning("after the storm")

	copies := h.drain(h.errorQueue)
	seen := map[string]bool{}
	for _, d := range copies {
		seen[d.MessageId] = true
		if got := d.Headers[wire.HeaderAttempts]; got != int32(retries+1) {
			t.Errorf("copy of %s: attempts %v, want %d", d.MessageId, got, retries+1)
		}
	}
	if len(copies) != msgs || len(seen) != msgs {
		t.Errorf("%d copies of %d messages on the error queue, want %d of %d", len(copies), len(seen), msgs, msgs)
	}
	var publishes, warnings int
	for _, l := range h.logs.Lines() {
		if l["component"] != "dispatch" {
			continue
		}
		if l["message"] == "forwarding" {
			ids, _ := l["ids"].([]any)
			publishes += len(ids)
		}
		if l["level"] == "warn" {
			warnings++
		}
	}
	t.Logf("%d publish attempts and %d dispatch warnings for %d messages", publishes, warnings, msgs)
	// A first attempt publishes while nothing is known of the destination
	// yet, a last one always does, and the retries between cost a probe
	// per second.
	if publishes < 1 || publishes > 2*msgs+60 {
		t.Errorf("%d publish attempts to the missing queue; want at most %d", publishes, 2*msgs+60)
	}
	if warnings > 20 {
		t.Errorf("%d dispatch warnings; want the failures summarised per destination", warnings)
	}
}

// TestUnencodableForwardFailsAlone: a stored message whose destination is
// over 255 bytes (a replayed error copy, say) cannot be encoded by the AMQP
// client. It is counted and moved to the error queue, and the forwards in
// the same window are confirmed and removed: the publish connection is not
// closed under them.
func TestUnencodableForwardFailsAlone(t *testing.T) {
	h := newHarness(t, "unencodable", map[string]string{"DELAYBRIDGE_NUMBER_OF_RETRIES": "0"})
	now := time.Now()
	good := ids("good", 20)
	var rows []storage.Timeout
	add := func(id, dest string) {
		enc, err := message.Encode(nil, &amqp.Publishing{MessageId: id, Body: []byte("body of " + id),
			Headers: amqp.Table{"x-destination": dest}})
		if err != nil {
			t.Fatal(err)
		}
		rows = append(rows, storage.Timeout{ID: id, Destination: dest, DueAt: now, ReceivedAt: now, Message: enc})
	}
	for i, id := range good {
		if i == len(good)/2 {
			add("too-long", strings.Repeat("q", 300))
		}
		add(id, h.dest)
	}
	if _, err := h.inner.Insert(context.Background(), rows); err != nil {
		t.Fatal(err)
	}
	h.start()
	c := h.collect(h.dest)
	c.waitAll(t, good, 15*time.Second)
	h.waitReady(h.errorQueue, 1, 15*time.Second)
	h.requireRunning("after the unencodable forward")
	c.exactlyOnce(t, good)

	copies := h.drain(h.errorQueue)
	if len(copies) != 1 || copies[0].MessageId != "too-long" {
		t.Fatalf("error queue: %d copies %v; want the one too-long", len(copies), copies)
	}
	if r, _ := copies[0].Headers[wire.HeaderError].(string); !strings.Contains(r, "routing key is 300 bytes") {
		t.Errorf("reason %q", r)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		pending, _, err := h.inner.Stats(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if pending == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d messages still pending; every one was confirmed or moved", pending)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, l := range h.logs.Lines() {
		if msg, _ := l["message"].(string); strings.Contains(msg, "connection") && l["component"] == "broker" && l["level"] != "info" {
			t.Errorf("broker connection trouble during the test: %v", l)
		}
		if e, _ := l["error"].(string); strings.Contains(e, "not confirmed") {
			t.Errorf("a forward lost its confirm: %v", l)
		}
	}
}
