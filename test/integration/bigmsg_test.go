package integration

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// TestLargeMessagesWithASmallBudget: with a byte budget (DELAYBRIDGE_MAX_INFLIGHT_BYTES)
// that admits one 4 MiB message at a time on each side (intake, dispatch),
// 40 of them, and two larger than the whole budget, all arrive intact,
// once, and none early: a budget slows large messages down, it never
// drops, dead-locks or duplicates them.
func TestLargeMessagesWithASmallBudget(t *testing.T) {
	t.Parallel()
	const n, size, oversized = 40, 4 << 20, 2
	b, conn, pub := startWithPublisher(t, map[string]string{"DELAYBRIDGE_MAX_INFLIGHT_BYTES": fmt.Sprint(8 << 20)})
	dest := "bigmsg-" + randomHex(4)
	c := declareAndConsume(t, conn, dest)

	sums := map[string][32]byte{}
	due := time.Now().Add(2 * time.Second).UTC()
	var msgs []amqp.Publishing
	for i := range n + oversized {
		body := make([]byte, size)
		if i >= n {
			body = make([]byte, 6<<20) // over the 4 MiB each side has
		}
		for j := 0; j+8 <= len(body); j += 4096 {
			binary.BigEndian.PutUint64(body[j:], uint64(i)<<32|uint64(j))
		}
		id := fmt.Sprintf("big-%d", i)
		at := due.Add(time.Duration(i) * 50 * time.Millisecond).Format(time.RFC3339Nano)
		sums[id] = sha256.Sum256(body)
		msgs = append(msgs, amqp.Publishing{MessageId: id, DeliveryMode: amqp.Persistent, Body: body,
			Headers: amqp.Table{"x-destination": dest, "x-due-at": at, "test-due": at}})
	}
	for i := 0; i < len(msgs); i += 10 {
		pub.PublishAll(b.TimeoutsQueue(), msgs[i:min(i+10, len(msgs))])
	}
	msgs = nil

	// A liveness bound only: 180 MiB through two broker hops and a store,
	// one message at a time, on a loaded machine.
	c.WaitFor(n+oversized, 5*time.Minute)
	got := byMessageID(c.Quiet(quietPeriod))
	for id, sum := range sums {
		as := got[id]
		switch {
		case len(as) == 0:
			t.Errorf("%s never arrived", id)
		case len(as) > 1:
			t.Errorf("%s arrived %d times", id, len(as))
		case sha256.Sum256(as[0].Body) != sum:
			t.Errorf("%s arrived with another body (%d bytes)", id, len(as[0].Body))
		}
		for _, a := range as {
			if early := dueOf(a).Sub(a.At); early > 0 {
				t.Errorf("%s arrived %v early", id, early)
			}
		}
	}
	if len(got) != len(sums) {
		t.Errorf("%d distinct messages arrived, want %d", len(got), len(sums))
	}
}

// dueOf is the due time a delivery was published with (the bridge drops
// x-due-at; test-due is a copy).
func dueOf(a arrival) time.Time {
	s, _ := a.Headers["test-due"].(string)
	due, _ := time.Parse(time.RFC3339Nano, s)
	return due
}
