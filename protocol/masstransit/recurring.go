package masstransit

// MassTransit's recurring scheduler (docs/contract.md §2.10, §2.11). Paths
// are in MassTransit/MassTransit unless said otherwise.
//
//   - The contracts: src/MassTransit.Abstractions/Contracts/Scheduling/
//     ScheduleRecurringMessage.cs (correlationId, schedule, payloadType,
//     destination, payload), RecurringSchedule.cs (timeZoneId, startTime,
//     endTime, scheduleId, scheduleGroup, cronExpression, description,
//     misfirePolicy), MissedEventPolicy.cs (Default 0, Skip 1, Send 2: a
//     number unless the sender's serializer writes enums as names), and
//     Cancel-, Pause- and ResumeScheduledRecurringMessage.cs
//     (correlationId, timestamp, scheduleId, scheduleGroup). They are
//     published (PublishRecurringMessageScheduler.cs) or sent to the
//     scheduler's queue (EndpointRecurringMessageScheduler.cs).
//   - What Quartz does with them (src/Scheduling/MassTransit.QuartzIntegration/
//     QuartzIntegration/): ScheduleMessageConsumer.cs keys the trigger
//     "Recurring.Trigger." + scheduleId in group scheduleGroup (Quartz's
//     TriggerKey: "DEFAULT" when null), reads timeZoneId as an IANA or
//     Windows id (the Quartz host's zone when empty), starts at startTime,
//     ends at endTime, and replaces a trigger of that key; Cancel- and
//     PauseScheduledMessageConsumer.cs and ResumeScheduledMessageConsumer.cs
//     add the prefix when the id lacks it; a missing trigger is no error.
//     The job stores no MessageId for a recurring trigger, and its token is
//     the ScheduleRecurringMessage's correlationId.
//   - Each fire (ScheduledMessageJob.cs, JobDataMessageContext.GetHeaders):
//     MT-Quartz-Sent, MT-Quartz-Scheduled, MT-Quartz-NextScheduled (when
//     there is a next fire), MT-Quartz-PreviousSent (when there was one),
//     MT-Scheduling-TokenId, MT-Quartz-ScheduleId (the trigger's name
//     without the prefix) and MT-Quartz-ScheduleGroup, in that order.

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/cron"
	"github.com/delaybridge/delaybridge/intake"
	"github.com/delaybridge/delaybridge/recurring"
	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/wire"
)

// The recurring contracts' exchanges (RabbitMqMessageNameFormatter).
const (
	ExchangePauseRecurring  = "MassTransit.Scheduling:PauseScheduledRecurringMessage"
	ExchangeResumeRecurring = "MassTransit.Scheduling:ResumeScheduledRecurringMessage"
)

// The headers only a recurring fire has (MessageHeaders.cs).
const (
	HeaderNextScheduled = "MT-Quartz-NextScheduled"
	HeaderPreviousSent  = "MT-Quartz-PreviousSent"
)

// recurringTriggerPrefix starts the name of a recurring schedule's Quartz
// trigger (QuartzConstants.cs).
const recurringTriggerPrefix = "Recurring.Trigger."

// controls are the recurring controls' message types and what each does.
var controls = []struct {
	exchange string
	control  intake.ScheduleControl
}{
	{ExchangeCancelRecurring, intake.ScheduleCancel},
	{ExchangePauseRecurring, intake.SchedulePause},
	{ExchangeResumeRecurring, intake.ScheduleResume},
}

// contractName is the name of the contract behind exchange x
// (namespace:name), for reasons.
func contractName(x string) string {
	_, n, _ := strings.Cut(x, ":")
	return n
}

// ScheduleKey is the store key of MassTransit's recurring schedule id in
// group (storage.Schedule.Key): the trigger's key, the prefix dropped and
// the group "DEFAULT" when empty, so that a schedule and its cancel name one
// key whichever way the id was written.
func ScheduleKey(group, id string) string {
	return storage.ScheduleKey(wire.ScheduleSourceMassTransit, scheduleName(group, id))
}

// scheduleName is ScheduleKey without the source.
func scheduleName(group, id string) string {
	if group == "" {
		group = scheduleGroup
	}
	return group + "/" + strings.TrimPrefix(id, recurringTriggerPrefix)
}

// scheduleRef reads scheduleId and scheduleGroup of o (a RecurringSchedule
// or a control message).
func scheduleRef(o []field) (id, group string, err error) {
	raw := get(o, "scheduleId")
	if raw == nil || json.Unmarshal(raw, &id) != nil || strings.TrimPrefix(id, recurringTriggerPrefix) == "" {
		return "", "", errors.New("scheduleId is missing, empty or not a string")
	}
	if raw := get(o, "scheduleGroup"); raw != nil && json.Unmarshal(raw, &group) != nil {
		return "", "", errors.New("scheduleGroup is not a string")
	}
	return strings.TrimPrefix(id, recurringTriggerPrefix), group, nil
}

// control reads a Cancel-, Pause- or ResumeScheduledRecurringMessage.
func control(exchange string, c intake.ScheduleControl, msg []field) intake.Intake {
	id, group, err := scheduleRef(msg)
	if err != nil {
		return intake.Reject(fmt.Errorf("%s: %w", contractName(exchange), err))
	}
	return intake.Intake{Op: intake.OpScheduleControl, ScheduleKey: ScheduleKey(group, id), Control: c}
}

// recurringSchedule reads a ScheduleRecurringMessage: it creates or
// replaces the schedule of its id and group, each fire sending the payload
// to its destination as the Quartz job sends it.
func (o Options) recurringSchedule(d *amqp.Delivery, env, msg []field, now time.Time) intake.Intake {
	const what = "ScheduleRecurringMessage"
	token, err := guid(msg, "correlationId")
	if err != nil {
		return intake.Reject(fmt.Errorf("%s: %w (the schedule token)", what, err))
	}
	sched, err := members(get(msg, "schedule"))
	if err != nil {
		return intake.Reject(fmt.Errorf("%s: schedule: %w", what, err))
	}
	r, id, group, err := recurrence(sched, now)
	if err != nil {
		return intake.Reject(fmt.Errorf("%s: schedule: %w", what, err))
	}
	r.Token = token.String()
	t, err := o.target(msg)
	if err != nil {
		return intake.Reject(fmt.Errorf("%s: %w", what, err))
	}
	// The template of every fire: FireStamper sets the fire's times and
	// message id, Stamper MT-Quartz-Sent and the time to live.
	add := recurringHeaders(token, id, group, recurring.Fire{Scheduled: r.First})
	body, err := envelope(env, t.dest, t.payloadType, t.payload, add)
	if err != nil {
		return intake.Reject(fmt.Errorf("%s: %w", what, err))
	}
	out, err := forward(d, env, body, add)
	if err != nil {
		return intake.Reject(fmt.Errorf("%s: %w", what, err))
	}
	return intake.Intake{Op: intake.OpRecur, ID: scheduleName(group, id), Exchange: t.exchange, Destination: d.RoutingKey,
		DueAt: r.First, Msg: out, Recur: r}
}

// recurrence reads a RecurringSchedule.
func recurrence(s []field, now time.Time) (r *intake.Recurrence, id, group string, err error) {
	if id, group, err = scheduleRef(s); err != nil {
		return nil, "", "", err
	}
	var expr, zone, desc string
	if raw := get(s, "cronExpression"); raw == nil || json.Unmarshal(raw, &expr) != nil {
		return nil, "", "", errors.New("cronExpression is missing or not a string")
	}
	// Quartz's CronExpression only: seconds first, an optional year.
	if n := len(strings.Fields(expr)); n != 6 && n != 7 {
		return nil, "", "", fmt.Errorf("cronExpression %q has %d fields; Quartz's has 6 or 7 (seconds first, an optional year)", wire.Clip(expr), n)
	}
	if raw := get(s, "timeZoneId"); raw != nil && json.Unmarshal(raw, &zone) != nil {
		return nil, "", "", errors.New("timeZoneId is not a string")
	}
	if raw := get(s, "description"); raw != nil && json.Unmarshal(raw, &desc) != nil {
		return nil, "", "", errors.New("description is not a string")
	}
	start, err := optionalTime(s, "startTime")
	if err != nil {
		return nil, "", "", err
	}
	end, err := optionalTime(s, "endTime")
	if err != nil {
		return nil, "", "", err
	}
	mp, err := misfirePolicy(get(s, "misfirePolicy"))
	if err != nil {
		return nil, "", "", err
	}
	// An empty zone is Quartz's host's local one; the bridge has none that
	// means anything to the sender, and reads UTC (docs/contract.md §2.10).
	if r, err = intake.NewRecurrence(expr, zone, start, end, mp, now); err != nil {
		return nil, "", "", err
	}
	r.Source, r.Description = wire.ScheduleSourceMassTransit, desc
	return r, id, group, nil
}

// optionalTime reads a DateTimeOffset member; absent or null is zero.
func optionalTime(s []field, name string) (time.Time, error) {
	raw := get(s, name)
	if raw == nil {
		return time.Time{}, nil
	}
	var v string
	if json.Unmarshal(raw, &v) != nil {
		return time.Time{}, fmt.Errorf("%s is not a string", name)
	}
	t, err := ParseTime(v)
	if err != nil {
		return time.Time{}, fmt.Errorf("%s: %w", name, err)
	}
	return t, nil
}

// misfirePolicy reads MissedEventPolicy: a number (System.Text.Json's
// default for an enum) or its name; absent is Default.
func misfirePolicy(raw json.RawMessage) (cron.MisfirePolicy, error) {
	if raw == nil {
		return cron.MisfireDefault, nil
	}
	var n int
	if json.Unmarshal(raw, &n) == nil {
		p := cron.MisfirePolicy(n)
		if p != cron.MisfireDefault && p != cron.MisfireSkip && p != cron.MisfireSend {
			return 0, fmt.Errorf("misfirePolicy %d is not a MissedEventPolicy (0 Default, 1 Skip, 2 Send)", n)
		}
		return p, nil
	}
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return 0, fmt.Errorf("misfirePolicy %s is neither a number nor a string", wire.Clip(string(raw)))
	}
	p, err := cron.ParseMisfirePolicy(s)
	if err != nil {
		return 0, fmt.Errorf("misfirePolicy: %w", err)
	}
	return p, nil
}

// recurringHeaders are the headers of a recurring fire f
// (JobDataMessageContext.GetHeaders), in its order; MT-Quartz-Sent is the
// scheduled time until Stamper sets the time of the send.
func recurringHeaders(token uuid.UUID, id, group string, f recurring.Fire) []header {
	if group == "" {
		group = scheduleGroup
	}
	n := strings.ReplaceAll(token.String(), "-", "")
	hs := []header{sentHeader(f.Scheduled), timeHeader(HeaderScheduled, f.Scheduled)}
	if !f.Next.IsZero() {
		hs = append(hs, timeHeader(HeaderNextScheduled, f.Next))
	}
	if !f.Prev.IsZero() {
		hs = append(hs, timeHeader(HeaderPreviousSent, f.Prev))
	}
	return append(hs, header{HeaderTokenID, quote(n), n}, header{HeaderScheduleID, quote(id), id},
		header{HeaderScheduleGroup, quote(group), group})
}

// ScheduleSource is the source of the schedules this package makes.
func (Options) ScheduleSource() string { return wire.ScheduleSourceMassTransit }

// StampFire is FireStamper's, whether the intake is on or not.
func (Options) StampFire(s *storage.Schedule, msg *amqp.Publishing, f recurring.Fire) error {
	return FireStamper{}.StampFire(s, msg, f)
}

// fireNamespace names the message ids of fires (uuid.NewSHA1): a fire's
// id is a function of its row key, so a second copy of one fire
// (docs/contract.md §3.3) carries the same id, and no other fire does.
var fireNamespace = uuid.MustParse("6d2f5a3e-1c5b-5e0a-9a53-4d6173735472")

// FireStamper writes each fire of a MassTransit recurring schedule as the
// Quartz job sends it (recurring.FireStamper): the envelope's and the AMQP
// headers of the fire, and a message id of its own in both, as Quartz's
// recurring trigger gives each fire a new one.
type FireStamper struct{}

// StampFire implements recurring.FireStamper.
func (FireStamper) StampFire(s *storage.Schedule, msg *amqp.Publishing, f recurring.Fire) error {
	token, err := uuid.Parse(s.Token)
	if err != nil {
		return fmt.Errorf("token %q: %w", s.Token, err)
	}
	// The template carries the id and group as written (a group may hold
	// the "/" of the key).
	id, ok1 := msg.Headers[HeaderScheduleID].(string)
	group, ok2 := msg.Headers[HeaderScheduleGroup].(string)
	if !ok1 || !ok2 {
		return fmt.Errorf("the stored message lacks %s or %s", HeaderScheduleID, HeaderScheduleGroup)
	}
	mid := uuid.NewSHA1(fireNamespace, []byte(f.ID))
	hs := recurringHeaders(token, id, group, f)
	body, err := stampFireBody(msg.Body, quote(mid.String()), hs)
	if err != nil {
		return fmt.Errorf("the stored envelope: %w", err)
	}
	t := make(amqp.Table, len(msg.Headers)+len(hs))
	for k, v := range msg.Headers {
		if !isRecurringHeader(k) {
			t[k] = v
		}
	}
	for _, h := range hs {
		t[h.name] = h.amqp
	}
	msg.Headers, msg.Body, msg.MessageId = t, body, mid.String()
	return nil
}

// recurringHeaderNames are the headers recurringHeaders may set.
var recurringHeaderNames = []string{HeaderSent, HeaderScheduled, HeaderNextScheduled, HeaderPreviousSent,
	HeaderTokenID, HeaderScheduleID, HeaderScheduleGroup}

func isRecurringHeader(name string) bool {
	return slices.ContainsFunc(recurringHeaderNames, func(n string) bool { return strings.EqualFold(n, name) })
}

// stampFireBody sets the envelope's messageId to id and its scheduler
// headers to hs, in their order after the sender's own, other members kept
// in order.
func stampFireBody(body []byte, id string, hs []header) ([]byte, error) {
	fs, err := members(body)
	if err != nil {
		return nil, err
	}
	for i := range fs {
		switch {
		case strings.EqualFold(fs[i].name, "messageId"):
			fs[i].raw = json.RawMessage(id)
		case strings.EqualFold(fs[i].name, "headers"):
			old, err := members(fs[i].raw)
			if err != nil {
				return nil, fmt.Errorf("headers: %w", err)
			}
			old = slices.DeleteFunc(old, func(f field) bool { return isRecurringHeader(f.name) })
			if fs[i].raw, err = headers(object(old), hs); err != nil {
				return nil, err
			}
		}
	}
	return object(fs), nil
}
