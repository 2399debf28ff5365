package integration

import (
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/internal/testenv"
)

// TestBrokerAlarmBlocksReadiness: a broker memory alarm blocks the bridge's
// publishing connection. While it lasts /readyz answers 503 naming the
// alarm, /metrics reports delaybridge_broker_blocked{connection="publish"} 1,
// and the due message waits; once it clears the message is delivered, never
// early, and /readyz is 200 again.
//
// Disruptive: the alarm blocks every publisher on the shared broker, of this
// package and of any other running at the time, for a few seconds, so it
// runs only in the serial step of scripts/test.sh (testenv.Disruptive).
func TestBrokerAlarmBlocksReadiness(t *testing.T) {
	testenv.Disruptive(t)
	requireRabbitmqctl(t)
	out, err := rabbitmqctl("eval", "vm_memory_monitor:get_vm_memory_high_watermark().")
	if err != nil {
		t.Fatalf("read the memory watermark: %v\n%s", err, out)
	}
	// An Erlang term: a fraction (0.4) or {absolute, Bytes}; it is given
	// back as it was read, whichever form the broker is configured with.
	watermark := strings.TrimSpace(out)
	restore := func() {
		if out, err := rabbitmqctl("eval", "vm_memory_monitor:set_vm_memory_high_watermark("+watermark+")."); err != nil {
			t.Errorf("restore the memory watermark %s: %v\n%s", watermark, err, out)
		}
	}
	t.Cleanup(restore) // also after a t.Fatal

	b := startBridge(t, map[string]string{"DELAYBRIDGE_ADMIN_TOKEN": adminToken})
	conn := dial(t)
	dest := b.Endpoint + ".dst"
	declareQueue(t, conn, dest)
	c := consume(t, conn, dest)
	pub := newPublisher(t, conn)
	// The first message makes the bridge's publishing connection a
	// publisher; the broker blocks only those.
	pub.Publish(b.TimeoutsQueue(), amqp.Publishing{MessageId: "before", Body: []byte("1"),
		Headers: amqp.Table{"x-destination": dest, "x-delay": int64(200)}})
	c.WaitFor(1, 10*time.Second)
	// The second waits far out until the alarm is known to be in effect:
	// rabbitmqctl can take seconds on a busy machine, and a forward that
	// left before the alarm took hold would never see it.
	pub.Publish(b.TimeoutsQueue(), amqp.Publishing{MessageId: "during", Body: []byte("2"),
		Headers: amqp.Table{"x-destination": dest, "x-delay": int64(time.Hour / time.Millisecond)}})
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		code, _, _ := runCLI(t, b, true, "show", "during")
		if code == 0 {
			break // stored
		}
		if time.Now().After(deadline) {
			t.Fatal("the second message was not stored within 20 s")
		}
	}

	if out, err := rabbitmqctl("set_vm_memory_high_watermark", "0.0000001"); err != nil {
		t.Fatalf("raise a memory alarm: %v\n%s", err, out)
	}
	alarmOn := time.Now()
	probe := awaitAlarm(t, 30*time.Second)
	t.Logf("the broker blocks publishers %s after the watermark was lowered", time.Since(alarmOn).Round(time.Millisecond))
	due := time.Now().Add(time.Second)
	// Over HTTP: AMQP publishing is blocked now.
	mustCLI(t, b, "reschedule", "during", "--at", due.UTC().Format(time.RFC3339Nano))
	deadline := time.Now().Add(20 * time.Second)
	for {
		code, _ := getReadyz(b.HTTPAddr)
		if code == 503 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz still %d 20 s after the rescheduled message fell due in a memory alarm", code)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("/readyz 503 %s after the alarm was raised", time.Since(alarmOn).Round(time.Millisecond))
	if !strings.Contains(b.Stderr(), "resource alarm") {
		t.Errorf("no log line says the broker blocks publishing")
	}
	if v, ok := scrape(t, b)[`delaybridge_broker_blocked{connection="publish"}`]; !ok || v != 1 {
		t.Errorf("delaybridge_broker_blocked{connection=\"publish\"} = %v (present: %v), want 1", v, ok)
	}
	if n := c.Count(); n != 1 {
		t.Fatalf("%d deliveries during the alarm, want only the first", n)
	}

	restore()
	probe.close()
	got := c.WaitFor(2, 30*time.Second)
	if got[1].MessageId != "during" || got[1].At.Before(due) {
		t.Fatalf("second delivery %q at %s, due %s", got[1].MessageId, got[1].At, due)
	}
	waitBridgeReadyAgain(t, b, 20*time.Second)
	if v := scrape(t, b)[`delaybridge_broker_blocked{connection="publish"}`]; v != 0 {
		t.Errorf("delaybridge_broker_blocked{connection=\"publish\"} = %v after the alarm, want 0", v)
	}
}

// alarmProbe is a connection that published during an alarm.
type alarmProbe struct{ conn *amqp.Connection }

// awaitAlarm returns once the broker blocks publishers: a connection of its
// own publishes and waits for connection.blocked.
func awaitAlarm(t *testing.T, timeout time.Duration) *alarmProbe {
	t.Helper()
	conn, err := amqp.Dial(testenv.AMQPURL(t))
	if err != nil {
		t.Fatal(err)
	}
	p := &alarmProbe{conn: conn}
	// A blocked connection cannot close until the alarm clears: never
	// wait for it here (restore, registered first, runs after this).
	t.Cleanup(func() { go p.close() })
	blocked := conn.NotifyBlocked(make(chan amqp.Blocking, 4))
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(timeout); ; {
		// To the default exchange with no such queue: dropped, but it
		// makes this connection a publisher the alarm blocks.
		_ = ch.Publish("", "alarm-probe-no-such-queue", false, false, amqp.Publishing{Body: []byte("probe")})
		select {
		case b := <-blocked:
			if b.Active {
				return p
			}
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("the broker did not block publishers %s after the memory watermark was lowered", timeout)
		}
	}
}

func (p *alarmProbe) close() { _ = p.conn.Close() }
