package integration

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/internal/testenv"
)

// MassTransit's recurring scheduler (docs/contract.md §2.10, §2.11):
// ScheduleRecurringSend and its cancel, pause and resume, sent to the
// scheduler queue or published to the contracts' exchanges, as
// PublishRecurringMessageScheduler and EndpointRecurringMessageScheduler
// send them (protocol/masstransit/recurring.go names the files).

const (
	mtRecurringX       = "MassTransit.Scheduling:ScheduleRecurringMessage"
	mtPauseRecurringX  = "MassTransit.Scheduling:PauseScheduledRecurringMessage"
	mtResumeRecurringX = "MassTransit.Scheduling:ResumeScheduledRecurringMessage"
	mtCancelRecurringX = "MassTransit.Scheduling:CancelScheduledRecurringMessage"
)

// mtRecurring is a ScheduleRecurringMessage of a schedule id in group,
// every second in Berlin (a Windows id, as .NET on Windows sends it),
// starting now, token its correlationId.
func mtRecurring(msgID, token, id, group, cronExpr, destination, payload string) amqp.Publishing {
	now := time.Now().In(time.FixedZone("", 3600))
	message := `{
    "correlationId": "` + token + `",
    "schedule": {
      "timeZoneId": "W. Europe Standard Time",
      "startTime": "` + now.Format("2006-01-02T15:04:05.9999999-07:00") + `",
      "endTime": null,
      "scheduleId": "` + id + `",
      "scheduleGroup": "` + group + `",
      "cronExpression": "` + cronExpr + `",
      "description": "every second",
      "misfirePolicy": 0
    },
    "payloadType": ["urn:message:Billing.Contracts:Tick"],
    "destination": "` + destination + `",
    "payload": ` + payload + `
  }`
	return amqp.Publishing{MessageId: msgID, ContentType: mtContentType, DeliveryMode: amqp.Persistent,
		Headers: amqp.Table{"Tenant": "eu-1"}, Body: []byte(mtEnvelope(msgID, "urn:message:"+mtRecurringX, "rabbitmq://localhost/quartz", message))}
}

// mtRecurringControl is a Cancel-, Pause- or ResumeScheduledRecurringMessage
// (exchange x names which) of id in group.
func mtRecurringControl(msgID, x, id, group string) amqp.Publishing {
	message := `{
    "correlationId": "` + msgID + `",
    "timestamp": "` + mtSentTime + `",
    "scheduleId": "` + id + `",
    "scheduleGroup": "` + group + `"
  }`
	return amqp.Publishing{MessageId: msgID, ContentType: mtContentType, DeliveryMode: amqp.Persistent,
		Body: []byte(mtEnvelope(msgID, "urn:message:"+x, "rabbitmq://localhost/"+x, message))}
}

// mtFire is one fire as the destination saw it.
type mtFire struct {
	arrival
	scheduled, next, prev time.Time
	payload               string
}

// mtFires checks each arrival is a fire of the schedule id in group with
// token: through exchange, the envelope's headers the AMQP ones (times as
// AMQP timestamps, whole seconds), MT-Quartz-Sent between the fire time
// and the arrival, never early, each with a message id of its own in both
// the property and the envelope, and MT-Quartz-PreviousSent on every fire
// but the first of the schedule.
func mtFires(t *testing.T, got []arrival, exchange, token, id, group string, first bool) []mtFire {
	t.Helper()
	var out []mtFire
	ids := map[string]bool{}
	for i, a := range got {
		var env struct {
			MessageID          string            `json:"messageId"`
			DestinationAddress string            `json:"destinationAddress"`
			MessageType        []string          `json:"messageType"`
			Message            json.RawMessage   `json:"message"`
			Headers            map[string]string `json:"headers"`
		}
		if err := json.Unmarshal(a.Body, &env); err != nil {
			t.Fatalf("fire %d: %v: %s", i, err, a.Body)
		}
		if a.Exchange != exchange || a.RoutingKey != "" || a.ContentType != mtContentType || a.DeliveryMode != amqp.Persistent {
			t.Fatalf("fire %d through %q key %q, %q mode %d", i, a.Exchange, a.RoutingKey, a.ContentType, a.DeliveryMode)
		}
		if env.MessageID != a.MessageId || ids[a.MessageId] || len(a.MessageId) != 36 {
			t.Fatalf("fire %d: message id %q, envelope's %q (each fire has one of its own)", i, a.MessageId, env.MessageID)
		}
		ids[a.MessageId] = true
		if env.DestinationAddress != "queue:"+exchange || len(env.MessageType) != 1 || env.MessageType[0] != "urn:message:Billing.Contracts:Tick" {
			t.Fatalf("fire %d envelope: %s", i, a.Body)
		}
		h := env.Headers
		if h["Tenant"] != "eu-1" || h["MT-Scheduling-TokenId"] != strings.ReplaceAll(token, "-", "") || h["MT-Quartz-ScheduleId"] != id ||
			h["MT-Quartz-ScheduleGroup"] != group {
			t.Fatalf("fire %d envelope headers %v", i, h)
		}
		f := mtFire{arrival: a, payload: string(env.Message)}
		times := map[string]*time.Time{"MT-Quartz-Scheduled": &f.scheduled, "MT-Quartz-NextScheduled": &f.next, "MT-Quartz-PreviousSent": &f.prev}
		var sent time.Time
		times["MT-Quartz-Sent"] = &sent
		for name, p := range times {
			s, ok := h[name]
			if !ok {
				continue
			}
			v, err := time.Parse(time.RFC3339Nano, s)
			if err != nil || !strings.HasSuffix(s, "+00:00") {
				t.Fatalf("fire %d: %s %q: %v", i, name, s, err)
			}
			*p = v
			if at, ok := a.Headers[name].(time.Time); !ok || !at.Equal(v.Truncate(time.Second)) {
				t.Fatalf("fire %d: AMQP %s %v, envelope's %s", i, name, a.Headers[name], s)
			}
		}
		for _, name := range []string{"Tenant", "MT-Scheduling-TokenId", "MT-Quartz-ScheduleId", "MT-Quartz-ScheduleGroup"} {
			if headerString(a.Headers, name) != h[name] {
				t.Fatalf("fire %d: AMQP %s %v, envelope's %q", i, name, a.Headers[name], h[name])
			}
		}
		if len(a.Headers) != len(h) {
			t.Fatalf("fire %d: AMQP headers %v, envelope's %v", i, a.Headers, h)
		}
		switch {
		case f.scheduled.IsZero() || f.scheduled.Nanosecond() != 0:
			t.Fatalf("fire %d: MT-Quartz-Scheduled %s is not a whole second", i, f.scheduled)
		case a.At.Before(f.scheduled) || sent.Before(f.scheduled) || sent.After(a.At):
			t.Fatalf("fire %d for %s sent %s arrived %s: early", i, f.scheduled, sent, a.At)
		case !f.next.After(f.scheduled):
			t.Fatalf("fire %d for %s: MT-Quartz-NextScheduled %s", i, f.scheduled, f.next)
		case (i == 0 && first) != f.prev.IsZero():
			t.Fatalf("fire %d for %s: MT-Quartz-PreviousSent %s (only the schedule's first fire has none)", i, f.scheduled, f.prev)
		case i > 0 && !f.scheduled.After(out[i-1].scheduled):
			t.Fatalf("fire %d for %s after a fire for %s: a fire time twice, or out of order", i, f.scheduled, out[i-1].scheduled)
		}
		out = append(out, f)
	}
	return out
}

// A bridge with DELAYBRIDGE_MASSTRANSIT_QUEUE keeps MassTransit's recurring
// schedules: a ScheduleRecurringMessage fires every second, each fire as
// Quartz sends it; a pause (published, Quartz's trigger name) stops the
// fires, a resume (sent) starts them again with one catch-up fire for the
// missed ones (misfire policy Default, threshold 1 s), a second
// ScheduleRecurringMessage of the id and group replaces the schedule, and a
// cancel ends it. A bad schedule goes to the error queue with a reason. On
// a vhost of its own: the contracts' exchanges are shared by every
// scheduler on a vhost.
func TestMassTransitRecurring(t *testing.T) {
	t.Parallel()
	vhostURL, _ := testenv.Vhost(t)
	conn, err := amqp.Dial(vhostURL)
	if err != nil {
		t.Fatalf("dial the test's vhost: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	const q, billing, id, group = "quartz", "billing", "Ticks", "Billing.Service"
	b := startBridge(t, map[string]string{
		"DELAYBRIDGE_AMQP_URL": vhostURL, "DELAYBRIDGE_ENDPOINT": "bridge", "DELAYBRIDGE_MASSTRANSIT_QUEUE": q,
		"DELAYBRIDGE_POLL_INTERVAL": "100ms", "DELAYBRIDGE_MISFIRE_THRESHOLD": "1s",
	})
	pub := newPublisher(t, conn)
	errs := consume(t, conn, b.ErrorQ)
	declareExchange(t, conn, billing, amqp.ExchangeFanout)
	billingC := bindAndConsume(t, conn, billing, billing, "", nil)

	token := func(i int) string { return fmt.Sprintf("3c0b0000-5d3f-0015-b4c3-%012d", i) }
	msgID := func(i int) string { return fmt.Sprintf("3c0b0000-5d3f-0015-b2c3-%012d", i) }
	start := time.Now()

	// ScheduleRecurringSend through the scheduler queue's exchange.
	pub.PublishTo(q, "", mtRecurring(msgID(1), token(1), id, group, "* * * * * ?", "queue:"+billing, `{"n":1}`))
	fires := mtFires(t, billingC.WaitFor(3, livenessBound), billing, token(1), id, group, true)
	for _, f := range fires {
		if f.payload != `{"n":1}` {
			t.Fatalf("payload %s", f.payload)
		}
	}

	// PauseScheduledRecurringSend publishes; Quartz's trigger name names
	// the schedule too. Once the pause is taken in and what was being
	// forwarded has arrived, nothing more.
	pub.PublishTo(mtPauseRecurringX, "", mtRecurringControl(msgID(2), mtPauseRecurringX, "Recurring.Trigger."+id, group))
	waitQueueEmpty(t, conn, q, livenessBound)
	time.Sleep(time.Second) // a fire leased before the pause is delivered (docs/contract.md §2.11)
	paused := billingC.Count()
	pausedAt := time.Now()
	if n := len(billingC.Quiet(2 * time.Second)); n != paused {
		t.Fatalf("%d fires while paused", n-paused)
	}

	// ResumeScheduledRecurringSend sent to the scheduler queue: the missed
	// fire times give one catch-up fire, then it goes on.
	pub.PublishTo(q, "", mtRecurringControl(msgID(3), mtResumeRecurringX, id, group))
	got := billingC.WaitFor(paused+3, livenessBound)
	fires = mtFires(t, got, billing, token(1), id, group, true)
	missed := 0
	for _, f := range fires[paused:] {
		if f.scheduled.Before(pausedAt) {
			missed++
		}
	}
	if missed > 1 {
		t.Fatalf("%d fires for fire times missed while paused; want at most one catch-up fire", missed)
	}

	// Scheduled again with the same id and group: replaced, a new token
	// and payload.
	n := billingC.Count()
	pub.PublishTo(mtRecurringX, "", mtRecurring(msgID(4), token(4), id, group, "* * * * * ?", "queue:"+billing, `{"n":4}`))
	got = billingC.WaitUntil(livenessBound, "fires of the new schedule", func(got []arrival) bool {
		return len(got) >= n+2 && strings.Contains(string(got[len(got)-2].Body), `"message":{"n":4}`)
	})
	var replaced []arrival
	late := 0
	for _, a := range got[n:] {
		if strings.Contains(string(a.Body), `"message":{"n":4}`) {
			replaced = append(replaced, a)
		} else if len(replaced) > 0 {
			late++ // being forwarded when the schedule was replaced
		}
	}
	if late > 1 {
		t.Fatalf("%d fires of the replaced schedule after the new one's first", late)
	}
	mtFires(t, replaced, billing, token(4), id, group, true)

	// CancelScheduledRecurringSend: no fire after it is taken in and what
	// was being forwarded has arrived.
	pub.PublishTo(mtCancelRecurringX, "", mtRecurringControl(msgID(5), mtCancelRecurringX, id, group))
	waitQueueEmpty(t, conn, q, livenessBound)
	time.Sleep(time.Second)
	cancelled := billingC.Count()
	if n := len(billingC.Quiet(2 * time.Second)); n != cancelled {
		t.Fatalf("%d fires after the cancel", n-cancelled)
	}

	// Refused at once, with a reason.
	pub.PublishTo(q, "", mtRecurring("bad-cron", token(6), "Bad", group, "* * * * *", "queue:"+billing, `{}`),
		mtRecurring("bad-destination", token(7), "Bad", group, "* * * * * ?", "queue:"+q, `{}`),
		mtRecurringControl("bad-pause", mtPauseRecurringX, "", group))
	refusedAtIngest(t, errs.WaitFor(3, livenessBound), q, start, map[string]string{
		"bad-cron":        "has 5 fields; Quartz's has 6 or 7",
		"bad-destination": "would come back",
		"bad-pause":       "PauseScheduledRecurringMessage: scheduleId is missing, empty",
	})
	if n := len(errs.All()); n != 3 {
		t.Errorf("%d copies on the error queue, want 3", n)
	}
	if !b.Running() {
		t.Fatalf("bridge exited with code %d", b.Wait(0))
	}
}
