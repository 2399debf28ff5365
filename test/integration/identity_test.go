package integration

import (
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// TestRedeliveryWhilePendingIsDropped: a message that repeats a pending
// one exactly (its id, properties, headers and body: a publisher's repeat
// after a lost confirm) is not stored a second time; another send with the
// same id is (docs/contract.md §2.4), and so is the repeat once the first
// was delivered.
func TestRedeliveryWhilePendingIsDropped(t *testing.T) {
	t.Parallel()
	b, conn, pub := startWithPublisher(t, nil)

	type variant struct {
		name string
		// first is the message; other another send with its id.
		first, other amqp.Publishing
	}
	idHeader := func(id string) amqp.Table { return amqp.Table{"NServiceBus.MessageId": id} }
	variants := []variant{
		{name: "message-id",
			first: amqp.Publishing{MessageId: "dup-prop"},
			other: amqp.Publishing{MessageId: "dup-prop"}},
		{name: "nsb-message-id-header",
			first: amqp.Publishing{Headers: idHeader("dup-nsb")},
			other: amqp.Publishing{Headers: idHeader("dup-nsb")}},
		{name: "property-then-header",
			// Identity is message-id, else NServiceBus.MessageId: both are "dup-mixed".
			first: amqp.Publishing{MessageId: "dup-mixed"},
			other: amqp.Publishing{Headers: idHeader("dup-mixed")}},
	}
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			t.Parallel()
			dest := b.Endpoint + ".dst." + v.name
			c := declareAndConsume(t, conn, dest)
			withDue := func(p amqp.Publishing, due time.Time, body string) amqp.Publishing {
				h := amqp.Table{}
				for k, val := range p.Headers {
					h[k] = val
				}
				h["x-destination"] = dest
				h["x-due-at"] = due.UTC().Format(time.RFC3339Nano)
				p.Headers = h
				p.Body = []byte(body)
				return p
			}
			firstDue, otherDue := time.Now().Add(2500*time.Millisecond), time.Now().Add(500*time.Millisecond)
			first := withDue(v.first, firstDue, "first")
			pub.Publish(b.TimeoutsQueue(), first)
			pub.Publish(b.TimeoutsQueue(), first) // the repeat: dropped
			pub.Publish(b.TimeoutsQueue(), withDue(v.other, otherDue, "other"))

			c.WaitFor(2, livenessBound)
			got := c.Quiet(quietPeriod)
			if len(got) != 2 || string(got[0].Body) != "other" || string(got[1].Body) != "first" {
				t.Fatalf("got %d deliveries (%s), want other, then first: the repeat dropped, the other send delivered", len(got), bodies(got))
			}
			if got[0].At.Before(otherDue) || got[1].At.Before(firstDue) {
				t.Errorf("delivered EARLY: %s (due %s), %s (due %s)", got[0].At.Format(time.RFC3339Nano), otherDue.Format(time.RFC3339Nano),
					got[1].At.Format(time.RFC3339Nano), firstDue.Format(time.RFC3339Nano))
			}

			// Delivered: the repeat is a send of its own now.
			againDue := time.Now().Add(300 * time.Millisecond)
			first.Headers["x-due-at"] = againDue.UTC().Format(time.RFC3339Nano)
			first.Body = []byte("again")
			pub.Publish(b.TimeoutsQueue(), first)
			c.WaitFor(3, livenessBound)
			got = c.Quiet(quietPeriod)
			if len(got) != 3 {
				t.Fatalf("got %d deliveries (%s), want 3 after re-sending a delivered id", len(got), bodies(got))
			}
			if string(got[2].Body) != "again" {
				t.Errorf("third delivery body %q, want %q", got[2].Body, "again")
			}
			if got[2].At.Before(againDue) {
				t.Errorf("re-sent message delivered EARLY")
			}
		})
	}

	t.Run("different-ids-same-header", func(t *testing.T) {
		t.Parallel()
		// message-id wins over NServiceBus.MessageId: different message-ids
		// with the same header are two messages.
		dest := b.Endpoint + ".dst.distinct"
		c := declareAndConsume(t, conn, dest)
		for _, id := range []string{"distinct-1", "distinct-2"} {
			pub.Publish(b.TimeoutsQueue(), amqp.Publishing{MessageId: id, Body: []byte(id), Headers: amqp.Table{
				"x-destination": dest, "x-delay": int32(500), "NServiceBus.MessageId": "shared",
			}})
		}
		c.WaitFor(2, livenessBound)
		if got := c.Quiet(quietPeriod); len(got) != 2 {
			t.Fatalf("got %d deliveries (%s), want 2", len(got), bodies(got))
		}
	})
}

func bodies(as []arrival) []string {
	out := make([]string, len(as))
	for i, a := range as {
		out[i] = string(a.Body)
	}
	return out
}

// TestNeverEarlyMixedLoad: 2,000 messages with due times spread over the
// next five seconds (millisecond precision) each arrive exactly once and
// none before its due time (docs/contract.md §3).
func TestNeverEarlyMixedLoad(t *testing.T) {
	t.Parallel()
	const n = 2000
	b, conn, pub := startWithPublisher(t, map[string]string{"DELAYBRIDGE_POLL_INTERVAL": "250ms"})
	dest := b.Endpoint + ".dst"
	c := declareAndConsume(t, conn, dest)

	start := time.Now()
	due := make(map[string]time.Time, n)
	msgs := make([]amqp.Publishing, n)
	for i := range msgs {
		id := "load-" + strconv.Itoa(i)
		d := start.Add(300*time.Millisecond + time.Duration(rand.IntN(4700))*time.Millisecond).UTC().Truncate(time.Millisecond)
		// Interleave a few messages due in the past and exactly now.
		switch i % 97 {
		case 0:
			d = start.Add(-time.Second).UTC().Truncate(time.Millisecond)
		}
		due[id] = d
		msgs[i] = amqp.Publishing{MessageId: id, Body: []byte(id), Headers: amqp.Table{
			"x-destination": dest, "x-due-at": d.Format("2006-01-02T15:04:05.000Z07:00"),
		}}
	}
	pub.PublishAll(b.TimeoutsQueue(), msgs)
	t.Logf("published %d messages in %s", n, time.Since(start).Round(time.Millisecond))

	c.WaitUntil(30*time.Second, "every message once", func(got []arrival) bool { return len(distinct(got)) >= n })
	got := c.Quiet(quietPeriod)
	checkDeliveries(t, got, due, false)
	var worst time.Duration
	for _, a := range got {
		worst = max(worst, a.At.Sub(due[a.MessageId]))
	}
	t.Logf("latest delivery was %s after its due time", worst.Round(time.Millisecond))
}

// distinct maps message-id to delivery count.
func distinct(got []arrival) map[string]int {
	m := map[string]int{}
	for _, a := range got {
		m[a.MessageId]++
	}
	return m
}

// checkDeliveries asserts that every id in due arrived, none before its due
// time, nothing unknown arrived, and (unless dupsAllowed) none twice. It
// returns the number of duplicate deliveries.
func checkDeliveries(t *testing.T, got []arrival, due map[string]time.Time, dupsAllowed bool) int {
	t.Helper()
	counts := distinct(got)
	var lost, early, dups, unknown int
	for id := range due {
		if counts[id] == 0 {
			lost++
			if lost <= 5 {
				t.Errorf("message %s (due %s) never arrived", id, due[id].Format(time.RFC3339Nano))
			}
		}
	}
	for _, a := range got {
		d, ok := due[a.MessageId]
		if !ok {
			unknown++
			t.Errorf("unexpected delivery with message-id %q", a.MessageId)
			continue
		}
		if a.At.Before(d) {
			early++
			if early <= 5 {
				t.Errorf("message %s delivered EARLY by %s (arrived %s, due %s)", a.MessageId, d.Sub(a.At),
					a.At.Format(time.RFC3339Nano), d.Format(time.RFC3339Nano))
			}
		}
	}
	for id, c := range counts {
		if c > 1 {
			dups += c - 1
			if !dupsAllowed && dups <= 5 {
				t.Errorf("message %s delivered %d times, want exactly once", id, c)
			}
		}
	}
	if lost+early+unknown > 0 || (dups > 0 && !dupsAllowed) {
		t.Errorf("of %d messages: %d lost, %d early, %d duplicate deliveries, %d unknown", len(due), lost, early, dups, unknown)
	}
	return dups
}
