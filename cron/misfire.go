package cron

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// MisfirePolicy is MassTransit's MissedEventPolicy (the misfirePolicy of a
// RecurringSchedule): what to do with a fire time that passed while the
// scheduler could not fire it. The numbers are the enum's values.
type MisfirePolicy int

const (
	MisfireDefault MisfirePolicy = 0 // the scheduler's default: Quartz's smart policy
	MisfireSkip    MisfirePolicy = 1 // drop missed fires, wait for the next fire time
	MisfireSend    MisfirePolicy = 2 // fire once now, then continue the schedule
)

func (p MisfirePolicy) String() string {
	switch p {
	case MisfireDefault:
		return "Default"
	case MisfireSkip:
		return "Skip"
	case MisfireSend:
		return "Send"
	}
	return "MisfirePolicy(" + strconv.Itoa(int(p)) + ")"
}

// ParseMisfirePolicy reads a policy as MassTransit serializes the enum: its
// name (any case) or its number. An empty string is Default.
func ParseMisfirePolicy(s string) (MisfirePolicy, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "default", "0":
		return MisfireDefault, nil
	case "skip", "1":
		return MisfireSkip, nil
	case "send", "2":
		return MisfireSend, nil
	}
	return 0, fmt.Errorf("cron: misfire policy %q: want Default, Skip or Send", s)
}

// QuartzMisfireInstruction is a CronTrigger misfire instruction of Quartz
// (MisfireInstruction and MisfireInstruction.CronTrigger), by value.
type QuartzMisfireInstruction int

const (
	QuartzSmartPolicy QuartzMisfireInstruction = 0 // for a CronTrigger the same as FireOnceNow
	QuartzFireOnceNow QuartzMisfireInstruction = 1
	QuartzDoNothing   QuartzMisfireInstruction = 2
)

// QuartzInstruction is the instruction MassTransit's Quartz integration gives
// the CronTrigger it builds (ScheduleMessageConsumer: Skip ->
// WithMisfireHandlingInstructionDoNothing, Send ->
// WithMisfireHandlingInstructionFireAndProceed, which sets FireOnceNow;
// Default sets nothing, leaving SmartPolicy).
func (p MisfirePolicy) QuartzInstruction() QuartzMisfireInstruction {
	switch p {
	case MisfireSkip:
		return QuartzDoNothing
	case MisfireSend:
		return QuartzFireOnceNow
	}
	return QuartzSmartPolicy
}

// effective resolves SmartPolicy as CronTriggerImpl.UpdateAfterMisfire does.
func (q QuartzMisfireInstruction) effective() QuartzMisfireInstruction {
	if q == QuartzSmartPolicy {
		return QuartzFireOnceNow
	}
	return q
}

// DefaultMisfireThreshold is how late a fire may be and still count as on
// time: Quartz's ADO.NET job store default (the RAM store uses 5 s).
const DefaultMisfireThreshold = time.Minute

// Window bounds a recurring schedule: RecurringSchedule's startTime and
// endTime. A zero Start or End is unbounded. As Quartz's CronTrigger, a fire
// time equal to Start or End fires.
type Window struct {
	Start, End time.Time
}

// NextIn is Next limited to w, as CronTriggerImpl.GetFireTimeAfter: before
// Start the search begins just before Start; at or after End, or when the
// next fire time is after End, there is none (zero Time). Start counts in
// whole seconds, its fraction dropped, as CronTriggerImpl's StartTimeUtc
// setter drops it: otherwise a fire time in Start's second would come
// after itself again (a start of 10:00:00.5 would make 10:00:00 the next
// fire time after 10:00:00).
func (s Schedule) NextIn(after time.Time, loc *time.Location, w Window) time.Time {
	if start := w.Start.Truncate(time.Second); !w.Start.IsZero() && start.After(after) {
		after = start.Add(-time.Second)
	}
	if !w.End.IsZero() && !after.Before(w.End) {
		return time.Time{}
	}
	t := s.Next(after, loc)
	if !w.End.IsZero() && t.After(w.End) {
		return time.Time{}
	}
	return t
}

// Decision is what a scheduler does with a due fire time.
type Decision struct {
	// Fire says whether to fire now.
	Fire bool
	// Scheduled is the fire time this fire stands for, what Quartz reports as
	// ScheduledFireTimeUtc (MT-Quartz-Scheduled): the due time, also when a
	// misfire is fired late (Quartz.NET 3.19 keeps the missed time there).
	Scheduled time.Time
	// Misfired says the due time was more than the threshold ago.
	Misfired bool
	// Next is the fire time to store after this one; zero when the schedule
	// is over.
	Next time.Time
	// Previous is what the fire after this one reports as the previous fire
	// time (Quartz's PreviousFireTimeUtc, MT-Quartz-PreviousSent): the due
	// time, or, for a misfire fired late, the moment it fired, since Quartz
	// moves the trigger's fire time to now before firing. Zero when nothing
	// fires.
	Previous time.Time
}

// Decide applies the misfire policy to a stored fire time due at due, seen at
// now. On time (now - due <= threshold) it fires due. Misfired, FireOnceNow
// (Default, Send) fires once now and Skip fires nothing; either way the next
// fire time is the first after now, so missed fires are never replayed one by
// one. Unlike Quartz, which may fire once after endTime when a misfire is
// handled, nothing fires after w.End.
func Decide(s Schedule, loc *time.Location, w Window, p MisfirePolicy, due, now time.Time, threshold time.Duration) Decision {
	if now.Sub(due) <= threshold {
		return Decision{Fire: true, Scheduled: due, Previous: due, Next: s.NextIn(due, loc, w)}
	}
	now = now.Truncate(time.Second)
	d := Decision{Misfired: true, Next: s.NextIn(now, loc, w)}
	if p.QuartzInstruction().effective() == QuartzFireOnceNow && (w.End.IsZero() || !now.After(w.End)) {
		d.Fire, d.Scheduled, d.Previous = true, due, now
	}
	return d
}
