package integration

import (
	"bufio"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// scrape GETs /metrics and returns every sample keyed by its series as
// written in the text format: `name` or `name{label="value",...}`.
func scrape(t testing.TB, b *bridgeProc) map[string]float64 {
	t.Helper()
	resp, body := request(t, b, http.MethodGet, "/metrics", false)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %s", resp.Status)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Fatalf("GET /metrics: Content-Type %q, want the Prometheus text format", ct)
	}
	samples := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			t.Fatalf("GET /metrics: malformed line %q", line)
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("GET /metrics: malformed value in %q: %v", line, err)
		}
		samples[line[:i]] = v
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("GET /metrics: read: %v", err)
	}
	return samples
}

// waitMetrics scrapes until cond holds for the samples and returns them; it
// fails the test after timeout, listing the delaybridge_ samples last seen.
func waitMetrics(t testing.TB, b *bridgeProc, timeout time.Duration, what string, cond func(map[string]float64) bool) map[string]float64 {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		m := scrape(t, b)
		if cond(m) {
			return m
		}
		if time.Now().After(deadline) {
			t.Fatalf("waited %s for %s; last scrape:\n%s", timeout, what, ours(m))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// ours lists the delaybridge_ samples, sorted, one per line.
func ours(m map[string]float64) string {
	var lines []string
	for k, v := range m {
		if strings.HasPrefix(k, "delaybridge_") {
			lines = append(lines, fmt.Sprintf("%s %v", k, v))
		}
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

// TestMetrics: GET /metrics (docs/contract.md §6) reports what the bridge did, exactly:
// messages stored, forwarded, refused at ingest, failed at dispatch and moved
// to the error queue, a duplicate suppressed; the store back at zero pending;
// one lateness observation per forward; breakers disarmed; both broker
// connections up.
func TestMetrics(t *testing.T) {
	t.Parallel()
	b, conn, pub := startWithPublisher(t, map[string]string{
		"DELAYBRIDGE_NUMBER_OF_RETRIES": "0",
		"DELAYBRIDGE_POLL_INTERVAL":     "100ms",
	})
	dest := b.Endpoint + ".dst"
	got := declareAndConsume(t, conn, dest)
	errs := consume(t, conn, b.ErrorQ)

	// Before anything happened: every series there, at zero.
	m := scrape(t, b)
	for _, s := range []string{
		"delaybridge_messages_ingested_total",
		"delaybridge_messages_dispatched_total",
		"delaybridge_dispatch_failures_total",
		"delaybridge_duplicates_suppressed_total",
		`delaybridge_messages_dropped_total{reason="duplicate"}`,
		`delaybridge_messages_dropped_total{reason="cancelled"}`,
		`delaybridge_messages_dropped_total{reason="replaced"}`,
		`delaybridge_error_queue_messages_total{stage="ingest"}`,
		`delaybridge_error_queue_messages_total{stage="dispatch"}`,
		"delaybridge_pending",
		"delaybridge_leased",
		"delaybridge_lateness_seconds_count",
	} {
		if v, ok := m[s]; !ok || v != 0 {
			t.Errorf("at start %s = %v (present %v), want 0", s, v, ok)
		}
	}
	if _, ok := m["delaybridge_next_due_seconds"]; ok {
		t.Errorf("delaybridge_next_due_seconds present with nothing pending")
	}

	delayed := func(id, to string, ms int, body string) amqp.Publishing {
		return amqp.Publishing{MessageId: id, Body: []byte(body),
			Headers: amqp.Table{"x-destination": to, "x-delay": int32(ms)}}
	}
	pub.PublishAll(b.TimeoutsQueue(), []amqp.Publishing{
		delayed("good-1", dest, 200, "one"),
		delayed("good-2", dest, 300, "two"),
		delayed("dup", dest, 2000, "first"),
		delayed("unroutable", b.Endpoint+".no-such-queue", 0, "lost"),
		{MessageId: "invalid", Body: []byte("no destination"), Headers: amqp.Table{"x-delay": int32(0)}},
	})
	// The duplicate, a repeat of the very same publish, must find the
	// first copy pending: publish it once that is stored, while it waits
	// for its due time.
	// One scrape reads its series concurrently: the counter can see the
	// commit that a store read begun a moment earlier did not, so the
	// next-due series is waited for too, not taken from the first scrape
	// that counts the commit.
	m = waitMetrics(t, b, livenessBound, "4 messages stored and 1 refused, next due known", func(m map[string]float64) bool {
		_, due := m["delaybridge_next_due_seconds"]
		return m["delaybridge_messages_ingested_total"] == 4 && m[`delaybridge_error_queue_messages_total{stage="ingest"}`] == 1 && due
	})
	if v, ok := m["delaybridge_next_due_seconds"]; !ok || v > 2 {
		t.Errorf("with 'dup' due within 2 s, delaybridge_next_due_seconds = %v (present %v)", v, ok)
	}
	pub.Publish(b.TimeoutsQueue(), delayed("dup", dest, 2000, "first"))

	got.WaitFor(3, livenessBound)
	errs.WaitFor(2, livenessBound)
	deliveries := got.Quiet(300 * time.Millisecond)
	bodies := map[string]string{}
	for _, d := range deliveries {
		bodies[d.MessageId] = string(d.Body)
	}
	if len(deliveries) != 3 || bodies["dup"] != "first" {
		t.Fatalf("destination got %d deliveries %v; want good-1, good-2 and 'dup' once", len(deliveries), bodies)
	}

	// The counters move after the broker confirmed and the store removed:
	// wait for the last step, then everything must be exact.
	m = waitMetrics(t, b, 5*time.Second, "3 dispatched and nothing pending", func(m map[string]float64) bool {
		return m["delaybridge_messages_dispatched_total"] == 3 &&
			m[`delaybridge_error_queue_messages_total{stage="dispatch"}`] == 1 &&
			m["delaybridge_pending"] == 0 && m["delaybridge_leased"] == 0
	})
	want := map[string]float64{
		"delaybridge_messages_ingested_total":                      4,
		"delaybridge_duplicates_suppressed_total":                  1,
		`delaybridge_messages_dropped_total{reason="duplicate"}`:   1,
		`delaybridge_messages_dropped_total{reason="cancelled"}`:   0,
		"delaybridge_messages_dispatched_total":                    3,
		"delaybridge_dispatch_failures_total":                      1,
		`delaybridge_error_queue_messages_total{stage="ingest"}`:   1,
		`delaybridge_error_queue_messages_total{stage="dispatch"}`: 1,
		"delaybridge_stale_tokens_total":                           0,
		"delaybridge_pending":                                      0,
		"delaybridge_leased":                                       0,
		"delaybridge_lateness_seconds_count":                       3,
		`delaybridge_circuit_breaker_state{breaker="store"}`:       0,
		`delaybridge_circuit_breaker_state{breaker="fetch"}`:       0,
		`delaybridge_circuit_breaker_state{breaker="dispatch"}`:    0,
		`delaybridge_broker_connected{connection="consume"}`:       1,
		`delaybridge_broker_connected{connection="publish"}`:       1,
	}
	for s, w := range want {
		if v, ok := m[s]; !ok || v != w {
			t.Errorf("%s = %v (present %v), want %v", s, v, ok, w)
		}
	}
	if _, ok := m["delaybridge_next_due_seconds"]; ok {
		t.Errorf("delaybridge_next_due_seconds present with nothing pending")
	}
	// Punctual forwards: none of the three was a second late.
	if v := m[`delaybridge_lateness_seconds_bucket{le="1"}`]; v != 3 {
		t.Errorf("lateness: %v of 3 forwards confirmed within 1 s of due", v)
	}
	// Three forwards and the returned one were each confirmed.
	if v := m["delaybridge_dispatch_confirm_seconds_count"]; v != 4 {
		t.Errorf("delaybridge_dispatch_confirm_seconds_count = %v, want 4", v)
	}
	// Two batches at least (the duplicate came alone).
	if v := m["delaybridge_ingest_commit_seconds_count"]; v < 2 {
		t.Errorf("delaybridge_ingest_commit_seconds_count = %v, want at least 2", v)
	}
	if v := m["delaybridge_poll_lease_seconds_count"]; v < 1 {
		t.Errorf("delaybridge_poll_lease_seconds_count = %v, want at least 1", v)
	}
	build := false
	for k, v := range m {
		if strings.HasPrefix(k, "delaybridge_build_info{") && v == 1 {
			build = true
		}
	}
	if !build {
		t.Error("delaybridge_build_info missing")
	}
	for _, s := range []string{"go_goroutines", "process_resident_memory_bytes"} {
		if _, ok := m[s]; !ok {
			t.Errorf("standard series %s missing", s)
		}
	}
	if t.Failed() {
		t.Logf("last scrape:\n%s", ours(m))
	}
}
