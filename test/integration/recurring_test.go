package integration

import (
	"sort"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/wire"
)

// Recurring schedules over AMQP (docs/contract.md §2.11).

// scheduleMsg is a message that makes a schedule every second named id.
func scheduleMsg(id, dest string, extra amqp.Table) amqp.Publishing {
	h := amqp.Table{wire.HeaderDestination: dest, wire.HeaderCron: "* * * * * ?", wire.HeaderTimeZone: "Europe/Berlin"}
	for k, v := range extra {
		h[k] = v
	}
	return amqp.Publishing{MessageId: id, Body: []byte("tick"), Headers: h}
}

// fireTimes reads each arrival's fire time, failing the test on one that
// is missing, of another schedule, or arrived before its fire time.
func fireTimes(t *testing.T, got []arrival, id string) []time.Time {
	t.Helper()
	var out []time.Time
	for _, a := range got {
		ft, err := time.Parse(time.RFC3339Nano, headerString(a.Headers, wire.HeaderFireTime))
		if err != nil {
			t.Fatalf("fire without a readable %s: %v (headers %v)", wire.HeaderFireTime, err, a.Headers)
		}
		if s := headerString(a.Headers, wire.HeaderScheduleID); s != id {
			t.Fatalf("fire of schedule %q, want %q", s, id)
		}
		if _, ok := a.Headers[wire.HeaderCron]; ok {
			t.Fatalf("fire carries %s: it could schedule again", wire.HeaderCron)
		}
		if a.At.Before(ft) {
			t.Fatalf("fire for %s arrived early, at %s", ft.Format(time.RFC3339Nano), a.At.Format(time.RFC3339Nano))
		}
		out = append(out, ft)
	}
	return out
}

// once fails the test when a fire time arrived twice.
func once(t *testing.T, fts []time.Time) {
	t.Helper()
	seen := map[time.Time]bool{}
	for _, ft := range fts {
		if seen[ft] {
			t.Fatalf("fire time %s arrived twice", ft.Format(time.RFC3339))
		}
		seen[ft] = true
	}
}

// TestRecurringOverAMQP: a schedule every second made on E.Timeouts fires
// each second, never early, never twice; across a restart of the bridge
// (bbolt) the fire times missed by more than the misfire threshold give one
// catch-up fire, not a burst; x-delaybridge-cancel with its id ends it. A
// schedule with a bad expression or zone goes to the error queue with the
// reason.
func TestRecurringOverAMQP(t *testing.T) {
	b := startBridge(t, map[string]string{"DELAYBRIDGE_MISFIRE_THRESHOLD": "2s"})
	conn := dial(t)
	dest := b.Endpoint + ".ticks"
	deleteQueuesOnCleanup(t, dest)
	ticks := declareAndConsume(t, conn, dest)
	errs := consume(t, conn, b.ErrorQ)
	pub := newPublisher(t, conn)

	pub.Publish(b.TimeoutsQueue(), scheduleMsg("bad-cron", dest, amqp.Table{wire.HeaderCron: "* * * *"}))
	pub.Publish(b.TimeoutsQueue(), scheduleMsg("bad-zone", dest, amqp.Table{wire.HeaderTimeZone: "Mars/Olympus"}))
	bad := errs.WaitFor(2, 20*time.Second)
	for _, a := range bad {
		reason := headerString(a.Headers, wire.HeaderError)
		if !strings.Contains(reason, wire.HeaderCron) && !strings.Contains(reason, wire.HeaderTimeZone) {
			t.Fatalf("error copy of %s: reason %q names neither header", a.MessageId, reason)
		}
	}

	const id = "every-second"
	pub.Publish(b.TimeoutsQueue(), scheduleMsg(id, dest, nil))
	got := ticks.WaitFor(4, 30*time.Second)
	before := fireTimes(t, got, id)
	once(t, before)
	sort.Slice(before, func(i, j int) bool { return before[i].Before(before[j]) })
	for i := 1; i < len(before); i++ {
		if d := before[i].Sub(before[i-1]); d != time.Second {
			t.Fatalf("fire times %v: %s apart, want every second", before, d)
		}
	}

	b.Stop()
	time.Sleep(6 * time.Second) // about six fire times missed, by more than 2 s
	n := ticks.Count()
	var last time.Time // the last fire time forwarded before the stop
	for _, ft := range fireTimes(t, ticks.All(), id) {
		if ft.After(last) {
			last = ft
		}
	}
	b = b.Restart(nil)
	restarted := time.Now()
	got = ticks.WaitUntil(30*time.Second, "four fires after the restart", func(got []arrival) bool { return len(got) >= n+4 })
	all := fireTimes(t, got, id)
	once(t, all)
	// Fire times of the downtime: the catch-up fire (Default policy), and
	// at most one more stored before the stop and forwarded after it; a
	// burst would bring one for every second.
	var missed int
	for _, ft := range all {
		if ft.After(last) && ft.Before(restarted) {
			missed++
		}
	}
	if missed < 1 || missed > 2 {
		t.Fatalf("%d fires for the fire times after %s and before the restart at %s, want the one catch-up fire (at most one more stored before the stop): %v",
			missed, last.Format(time.RFC3339Nano), restarted.Format(time.RFC3339Nano), all)
	}

	pub.Publish(b.TimeoutsQueue(), amqp.Publishing{Headers: amqp.Table{wire.HeaderCancel: id}})
	cancelled := time.Now()
	got = ticks.Quiet(4 * time.Second)
	all = fireTimes(t, got, id)
	once(t, all)
	for _, ft := range all {
		// A fire stored or leased a lookahead before the cancel may still go.
		if ft.After(cancelled.Add(1500 * time.Millisecond)) {
			t.Fatalf("fire for %s after the cancel at %s", ft.Format(time.RFC3339Nano), cancelled.Format(time.RFC3339Nano))
		}
	}
}

// TestRecurringTwoPostgresInstances: two bridges on one PostgreSQL schema
// fire a schedule every second once per fire time.
func TestRecurringTwoPostgresInstances(t *testing.T) {
	pg := requirePostgres(t)
	env, endpoint, _ := pg.sharedEnv(t, nil)
	b1 := startBridge(t, env)
	_ = startBridge(t, env)
	conn := dial(t)
	dest := endpoint + ".ticks"
	deleteQueuesOnCleanup(t, dest)
	ticks := declareAndConsume(t, conn, dest)
	pub := newPublisher(t, conn)

	const id = "shared-every-second"
	pub.Publish(b1.TimeoutsQueue(), scheduleMsg(id, dest, nil))
	got := ticks.WaitFor(8, 30*time.Second)
	pub.Publish(b1.TimeoutsQueue(), amqp.Publishing{Headers: amqp.Table{wire.HeaderCancel: id}})
	got = ticks.Quiet(3 * time.Second)
	fts := fireTimes(t, got, id)
	once(t, fts)
	if len(fts) < 8 {
		t.Fatalf("%d fires, want at least 8", len(fts))
	}
}
