package masstransit

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/cron"
	"github.com/delaybridge/delaybridge/intake"
	"github.com/delaybridge/delaybridge/message"
	"github.com/delaybridge/delaybridge/recurring"
	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/wire"
)

// The recurring fixtures (testdata/*recurring.json) are what MassTransit's
// Quartz tests schedule (tests/MassTransit.QuartzIntegration.Tests/
// Recurring_Specs.cs, MySchedule: every second, from 3 s after now for 7 s,
// its id the class's short name and its group the assembly's), sent by an
// endpoint on Windows (its zone a Windows id), enveloped as schedule.json.
const (
	recurringToken = "3c0b0000-5d3f-0015-b4c3-08dd0c8aa1b2"
	recurringID    = "Specifying_a_recurring_event+MySchedule"
	recurringGroup = "MassTransit.QuartzIntegration.Tests"
)

var (
	recurringKey  = "mt:" + recurringGroup + "/" + recurringID
	recurringSent = time.Date(2026, 11, 24, 12, 41, 0, 500000000, time.UTC)
)

// parseRecurring parses the ScheduleRecurringMessage fixture, edited by
// the pairs of old and new text in edits.
func parseRecurring(t *testing.T, edits ...string) intake.Intake {
	t.Helper()
	body := string(read(t, "recurring.json"))
	for i := 0; i+1 < len(edits); i += 2 {
		if !strings.Contains(body, edits[i]) {
			t.Fatalf("fixture has no %q", edits[i])
		}
		body = strings.Replace(body, edits[i], edits[i+1], 1)
	}
	return opts.Parse(delivery([]byte(body)), recurringSent)
}

// A ScheduleRecurringMessage makes the schedule of its group and id (the
// key Quartz's trigger has), in its zone (a Windows id read as Berlin's),
// from startTime to endTime, its first fire as Quartz's: the first fire
// time after startTime less a second, its fraction dropped
// (CronTriggerImpl.ComputeFirstFireTimeUtc, CronExpression.GetTimeAfter);
// the template forwards to the destination's exchange.
func TestParseScheduleRecurring(t *testing.T) {
	it := parseRecurring(t)
	if it.Op != intake.OpRecur {
		t.Fatalf("op %d, reason %q", it.Op, it.Reason)
	}
	if err := it.Validate(); err != nil {
		t.Fatal(err)
	}
	first := time.Date(2026, 11, 24, 12, 41, 3, 0, time.UTC) // 13:41:03.5+01:00, less a second, to the next second
	want := intake.Recurrence{Source: wire.ScheduleSourceMassTransit, Expr: "0/1 * * * * ?", Zone: "W. Europe Standard Time",
		Start: time.Date(2026, 11, 24, 12, 41, 3, 500000000, time.UTC), End: time.Date(2026, 11, 24, 12, 41, 10, 500000000, time.UTC),
		Misfire: cron.MisfireDefault, Description: "my description", Token: recurringToken, First: first}
	if diff := cmp.Diff(want, *it.Recur); diff != "" {
		t.Fatal(diff)
	}
	if it.ID != recurringGroup+"/"+recurringID || it.Exchange != "input_queue" || it.Destination != "" || !it.DueAt.Equal(first) {
		t.Fatalf("id %q, exchange %q, destination %q, due %s", it.ID, it.Exchange, it.Destination, it.DueAt)
	}
	if ScheduleKey(recurringGroup, recurringID) != recurringKey {
		t.Fatalf("key %q", ScheduleKey(recurringGroup, recurringID))
	}
	// Quartz's trigger name is the id with the prefix; a sender that
	// wrote it so names the same schedule. No group is Quartz's DEFAULT.
	if it := parseRecurring(t, `"scheduleId": "`, `"scheduleId": "Recurring.Trigger.`); it.ID != recurringGroup+"/"+recurringID {
		t.Fatalf("prefixed id: %+v", it)
	}
	if it := parseRecurring(t, `"scheduleGroup": "`+recurringGroup+`"`, `"scheduleGroup": null`); it.ID != "DEFAULT/"+recurringID {
		t.Fatalf("no group: %q %q", it.ID, it.Reason)
	}
	// The zone may be an IANA name; none at all is UTC.
	if it := parseRecurring(t, `"W. Europe Standard Time"`, `"Asia/Kolkata"`); it.Op != intake.OpRecur || it.Recur.Zone != "Asia/Kolkata" {
		t.Fatalf("IANA zone: %+v", it)
	}
	if it := parseRecurring(t, `"W. Europe Standard Time"`, `null`); it.Op != intake.OpRecur || it.Recur.Zone != "UTC" {
		t.Fatalf("no zone: %+v", it)
	}
	// No start and no end: from now on, forever.
	it = parseRecurring(t, `"2026-11-24T13:41:03.5+01:00"`, "null", `"2026-11-24T13:41:10.5+01:00"`, "null")
	if it.Op != intake.OpRecur || !it.Recur.Start.IsZero() || !it.Recur.End.IsZero() || !it.DueAt.Equal(recurringSent.Truncate(time.Second)) {
		t.Fatalf("unbounded: %+v", it)
	}
}

// misfirePolicy is a number by default, a name from a sender that writes
// enums as names.
func TestParseRecurringMisfirePolicy(t *testing.T) {
	for v, want := range map[string]cron.MisfirePolicy{"0": cron.MisfireDefault, "1": cron.MisfireSkip, "2": cron.MisfireSend,
		`"Default"`: cron.MisfireDefault, `"Skip"`: cron.MisfireSkip, `"Send"`: cron.MisfireSend, "null": cron.MisfireDefault} {
		it := parseRecurring(t, `"misfirePolicy": 0`, `"misfirePolicy": `+v)
		if it.Op != intake.OpRecur || it.Recur.Misfire != want {
			t.Errorf("misfirePolicy %s: %+v, want %v", v, it, want)
		}
	}
}

// Cancel-, Pause- and ResumeScheduledRecurringMessage control the schedule
// of their group and id, prefix or not.
func TestParseRecurringControls(t *testing.T) {
	for file, want := range map[string]intake.ScheduleControl{"cancel_recurring.json": intake.ScheduleCancel,
		"pause_recurring.json": intake.SchedulePause, "resume_recurring.json": intake.ScheduleResume} {
		body := string(read(t, file))
		for _, b := range []string{body, strings.Replace(body, `"scheduleId": "`, `"scheduleId": "Recurring.Trigger.`, 1)} {
			it := opts.Parse(delivery([]byte(b)), time.Now())
			if it.Op != intake.OpScheduleControl || it.Control != want || it.ScheduleKey != recurringKey {
				t.Fatalf("%s: %+v", file, it)
			}
			if err := it.Validate(); err != nil {
				t.Fatal(err)
			}
		}
		it := opts.Parse(delivery([]byte(strings.Replace(body, `"scheduleGroup": "`+recurringGroup+`"`, `"scheduleGroup": null`, 1))), time.Now())
		if it.ScheduleKey != "mt:DEFAULT/"+recurringID {
			t.Fatalf("%s without a group: %+v", file, it)
		}
		for name, edit := range map[string][2]string{
			"no id":    {`"scheduleId": "` + recurringID + `"`, `"scheduleId": null`},
			"empty id": {`"scheduleId": "` + recurringID + `"`, `"scheduleId": "Recurring.Trigger."`},
			"group":    {`"scheduleGroup": "` + recurringGroup + `"`, `"scheduleGroup": 5`},
		} {
			it := opts.Parse(delivery([]byte(strings.Replace(body, edit[0], edit[1], 1))), time.Now())
			if it.Op != intake.OpReject || !strings.Contains(it.Reason, "RecurringMessage: schedule") {
				t.Errorf("%s, %s: %+v", file, name, it)
			}
		}
	}
}

// Bad recurring schedules are refused with a reason.
func TestParseRecurringRefused(t *testing.T) {
	for name, c := range map[string]struct{ old, new, why string }{
		"unix cron":    {`"0/1 * * * * ?"`, `"* * * * *"`, `cronExpression "* * * * *" has 5 fields; Quartz's has 6 or 7`},
		"bad cron":     {`"0/1 * * * * ?"`, `"0/1 * * 32 * ?"`, "cron expression \"0/1 * * 32 * ?\""},
		"no cron":      {`"cronExpression": "0/1 * * * * ?"`, `"cronExpression": null`, "cronExpression is missing"},
		"zone":         {`"W. Europe Standard Time"`, `"Mars/Olympus"`, "time zone"},
		"zone number":  {`"W. Europe Standard Time"`, `1`, "timeZoneId is not a string"},
		"misfire":      {`"misfirePolicy": 0`, `"misfirePolicy": 7`, "misfirePolicy 7 is not a MissedEventPolicy"},
		"misfire name": {`"misfirePolicy": 0`, `"misfirePolicy": "Sometimes"`, "misfirePolicy"},
		"misfire bool": {`"misfirePolicy": 0`, `"misfirePolicy": true`, "neither a number nor a string"},
		"start":        {`"2026-11-24T13:41:03.5+01:00"`, `"soon"`, "startTime"},
		"over":         {`"2026-11-24T13:41:10.5+01:00"`, `"2026-11-24T13:00:00+01:00"`, "no fire time left"},
		"id":           {`"scheduleId": "` + recurringID + `"`, `"scheduleId": ""`, "scheduleId is missing, empty"},
		"schedule":     {`"schedule": {`, `"schedule": [1], "x": {`, "schedule: not a JSON object"},
		"description":  {`"my description"`, `{}`, "description is not a string"},
		"token":        {`"correlationId": "` + recurringToken + `"`, `"correlationId": "x"`, "the schedule token"},
		"destination":  {`"rabbitmq://localhost/input_queue"`, `"rabbitmq://localhost/quartz"`, "would come back"},
		"payload":      {`"payload": {`, `"payloads": {`, "payload is missing"},
		"payload type": {`"payloadType": [`, `"payloadTypes": [`, "payloadType is missing"},
	} {
		it := parseRecurring(t, c.old, c.new)
		if it.Op != intake.OpReject || !strings.Contains(it.Reason, c.why) || !strings.HasPrefix(it.Reason, "ScheduleRecurringMessage: ") {
			t.Errorf("%s: op %d, reason %q; want a refusal mentioning %q", name, it.Op, it.Reason, c.why)
		}
	}
}

// firedMessage stores the fixture's schedule as the ingester would and
// plans its fire at scheduled, the schedule's previous fire prev.
func firedMessage(t *testing.T, scheduled, prev time.Time) (storage.FirePlan, amqp.Publishing) {
	t.Helper()
	it := parseRecurring(t)
	enc, err := message.Encode(nil, &it.Msg)
	if err != nil {
		t.Fatal(err)
	}
	r := it.Recur
	s := storage.Schedule{Key: ScheduleKey(recurringGroup, recurringID), Source: r.Source, Expr: r.Expr, Zone: r.Zone, Start: r.Start,
		End: r.End, Misfire: int(r.Misfire), Token: r.Token, Exchange: it.Exchange, Message: enc, NextFireAt: scheduled, PrevFireAt: prev,
		Generation: 3}
	p := recurring.Plan(time.Minute, map[string]recurring.FireStamper{wire.ScheduleSourceMassTransit: opts})(&s, scheduled)
	if !p.Fire || p.Err != "" {
		t.Fatalf("plan %+v", p)
	}
	msg, err := message.Decode(p.Message)
	if err != nil {
		t.Fatal(err)
	}
	return p, msg
}

// Each fire is sent as Quartz's ScheduledMessageJob sends it: the
// ScheduleRecurringMessage's envelope turned into the payload's, with
// JobDataMessageContext's headers in its order (MT-Quartz-Sent the time of
// the send, set by Stamper), a message id of its own that a second copy
// of the fire shares (testdata/recurring_fire.json).
func TestRecurringFire(t *testing.T) {
	first := time.Date(2026, 11, 24, 12, 41, 4, 0, time.UTC)
	p, msg := firedMessage(t, first.Add(time.Second), first)
	if !p.Next.Equal(first.Add(2 * time.Second)) {
		t.Fatalf("next %s", p.Next)
	}
	mid := uuid.NewSHA1(fireNamespace, []byte(storage.FireID(recurringKey, 3, first.Add(time.Second)))).String()
	sent := first.Add(time.Second + 2345678*time.Nanosecond)
	out := Stamper{}.Stamp(msg, "", sent)
	wantHeaders := amqp.Table{"Tenant": "eu-1", HeaderSent: sent.Truncate(time.Second), HeaderScheduled: first.Add(time.Second),
		HeaderNextScheduled: first.Add(2 * time.Second), HeaderPreviousSent: first,
		HeaderTokenID: strings.ReplaceAll(recurringToken, "-", ""), HeaderScheduleID: recurringID, HeaderScheduleGroup: recurringGroup}
	if diff := cmp.Diff(wantHeaders, out.Headers); diff != "" {
		t.Fatal(diff)
	}
	if out.MessageId != mid || out.CorrelationId != "" || out.ContentType != ContentType || out.DeliveryMode != amqp.Persistent ||
		out.Expiration != "" {
		t.Fatalf("properties %+v", out)
	}
	want := strings.ReplaceAll(strings.TrimSpace(string(read(t, "recurring_fire.json"))), "MESSAGE-ID", mid)
	if string(out.Body) != want {
		t.Fatalf("envelope\n%s\nwant\n%s", out.Body, want)
	}
	// The same fire planned again (a store retrying its commit) is the
	// same message; the next fire has an id of its own.
	if _, again := firedMessage(t, first.Add(time.Second), first); again.MessageId != msg.MessageId || string(again.Body) != string(msg.Body) {
		t.Fatalf("a second plan of one fire differs: %q %q", again.MessageId, msg.MessageId)
	}
	if _, next := firedMessage(t, first.Add(2*time.Second), first.Add(time.Second)); next.MessageId == msg.MessageId {
		t.Fatal("two fires share a message id")
	}
}

// The first fire has no previous one, the last no next one: neither
// header is sent (JobDataMessageContext sets them only when Quartz has
// them).
func TestRecurringFireEnds(t *testing.T) {
	first := time.Date(2026, 11, 24, 12, 41, 4, 0, time.UTC)
	_, msg := firedMessage(t, first, time.Time{})
	if _, ok := msg.Headers[HeaderPreviousSent]; ok || strings.Contains(string(msg.Body), HeaderPreviousSent) {
		t.Fatalf("first fire has %s: %v", HeaderPreviousSent, msg.Headers)
	}
	if msg.Headers[HeaderNextScheduled] != first.Add(time.Second) {
		t.Fatalf("headers %v", msg.Headers)
	}
	last := time.Date(2026, 11, 24, 12, 41, 10, 0, time.UTC) // endTime is 12:41:10.5
	p, msg := firedMessage(t, last, last.Add(-time.Second))
	if !p.Next.IsZero() {
		t.Fatalf("next %s after the end", p.Next)
	}
	if _, ok := msg.Headers[HeaderNextScheduled]; ok || strings.Contains(string(msg.Body), HeaderNextScheduled) {
		t.Fatalf("last fire has %s: %v", HeaderNextScheduled, msg.Headers)
	}
}

// A template without the schedule's id is refused by StampFire: the
// schedule ends with the reason rather than fire a message Quartz would
// not send.
func TestRecurringFireCorrupt(t *testing.T) {
	msg := amqp.Publishing{Headers: amqp.Table{}, Body: []byte(`{}`)}
	s := storage.Schedule{Key: recurringKey, Token: recurringToken}
	if err := (FireStamper{}).StampFire(&s, &msg, recurring.Fire{}); err == nil || !strings.Contains(err.Error(), HeaderScheduleID) {
		t.Fatalf("err %v", err)
	}
	s.Token = "x"
	if err := (FireStamper{}).StampFire(&s, &msg, recurring.Fire{}); err == nil || !strings.Contains(err.Error(), "token") {
		t.Fatalf("err %v", err)
	}
	msg = amqp.Publishing{Headers: amqp.Table{HeaderScheduleID: "a", HeaderScheduleGroup: "b"}, Body: []byte(`[]`)}
	s.Token = recurringToken
	if err := (FireStamper{}).StampFire(&s, &msg, recurring.Fire{}); err == nil || !strings.Contains(err.Error(), "envelope") {
		t.Fatalf("err %v", err)
	}
}
