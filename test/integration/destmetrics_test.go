package integration

import (
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// TestDestinationMetrics: a bridge on bbolt with the per-destination series
// capped at 2 shows the two queues with the most pending messages, sums the
// third into the series with empty labels, counts the messages due within
// the minute, and counts forwards per destination; a bulk cancel shows at
// the next count.
func TestDestinationMetrics(t *testing.T) {
	t.Parallel()
	b, conn, pub := startWithPublisher(t, map[string]string{
		"DELAYBRIDGE_ADMIN_TOKEN":                  adminToken,
		"DELAYBRIDGE_POLL_INTERVAL":                "200ms",
		"DELAYBRIDGE_METRICS_MAX_DESTINATIONS":     "2",
		"DELAYBRIDGE_METRICS_DESTINATION_INTERVAL": "1s",
	})
	qa, qb, qc, qd := b.Endpoint+".a", b.Endpoint+".b", b.Endpoint+".c", b.Endpoint+".d"
	got := declareAndConsume(t, conn, qa)
	for _, q := range []string{qb, qc, qd} {
		declareQueue(t, conn, q)
	}
	deleteQueuesOnCleanup(t, qa, qb, qc, qd)
	var msgs []amqp.Publishing
	add := func(to string, n int, delay time.Duration) {
		for range n {
			msgs = append(msgs, amqp.Publishing{MessageId: fmt.Sprintf("%s-%d", to, len(msgs)), Body: []byte("x"),
				Headers: amqp.Table{"x-destination": to, "x-delay": int32(delay / time.Millisecond)}})
		}
	}
	add(qb, 3, time.Hour)
	add(qb, 1, 40*time.Second) // due within the minute
	add(qc, 2, time.Hour)
	add(qd, 1, time.Hour)
	add(qa, 2, 0) // forwarded at once
	pub.PublishAll(b.TimeoutsQueue(), msgs)
	got.WaitFor(2, livenessBound)

	series := func(name, dest string) string {
		return fmt.Sprintf(`delaybridge_destination_%s{destination=%q,exchange=""}`, name, dest)
	}
	waitMetrics(t, b, livenessBound, "the per-destination series", func(m map[string]float64) bool {
		return m[series("pending", qb)] == 4 && m[series("due_soon", qb)] == 1 &&
			m[series("pending", qc)] == 2 && m[series("due_soon", qc)] == 0 &&
			m[series("pending", "")] == 1 && // qd, past the cap
			m[series("dispatched_total", qa)] == 2
	})
	m := scrape(t, b)
	for _, s := range []string{series("pending", qa), series("pending", qd)} {
		if _, ok := m[s]; ok {
			t.Errorf("%s present: the cap is 2 and %s has nothing pending or is past it", s, s)
		}
	}
	// The counts follow a bulk cancel.
	mustCLI(t, b, "cancel", "--destination", qb)
	waitMetrics(t, b, livenessBound, "the counts after a bulk cancel", func(m map[string]float64) bool {
		_, stillB := m[series("pending", qb)]
		return !stillB && m[series("pending", qc)] == 2 && m[series("pending", qd)] == 1
	})
}
