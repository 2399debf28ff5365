package wire

// Headers of recurring schedules on E.Timeouts (docs/contract.md §2.11).
const (
	// HeaderCron makes the message a recurring schedule: a cron
	// expression, 5 fields Unix or 6-7 fields Quartz (package cron). The
	// schedule is named by the message id; HeaderCancel with that id ends
	// it.
	HeaderCron = "x-delaybridge-cron"
	// HeaderTimeZone is the zone the expression is read in: an IANA name
	// or a Windows id.
	HeaderTimeZone = "x-delaybridge-timezone"
	// HeaderStart and HeaderEnd bound the fire times (RFC 3339); a fire
	// time equal to either fires.
	HeaderStart = "x-delaybridge-start"
	HeaderEnd   = "x-delaybridge-end"
	// HeaderMisfire is the misfire policy: Default, Skip or Send.
	HeaderMisfire = "x-delaybridge-misfire"
)

// ScheduleHeaders are the headers that make a schedule: a fire carries
// none of them, so it can never schedule again.
var ScheduleHeaders = []string{HeaderCron, HeaderTimeZone, HeaderStart, HeaderEnd, HeaderMisfire}

// Headers the bridge sets on each fire of a recurring schedule.
const (
	// HeaderFireTime is the fire time the message stands for, RFC 3339
	// with nanoseconds, UTC (for a late catch-up fire after downtime, the
	// missed fire time).
	HeaderFireTime = "x-delaybridge-fire-time"
	// HeaderScheduleID names the schedule: the message id it was created
	// with.
	HeaderScheduleID = "x-delaybridge-schedule-id"
)

// ScheduleSourceAMQP is the source of schedules made on E.Timeouts: their
// store key is ScheduleSourceAMQP + ":" + message id.
const ScheduleSourceAMQP = "amqp"

// ScheduleSourceMassTransit is the source of schedules made by MassTransit's
// ScheduleRecurringMessage (docs/contract.md §2.10): their store key is
// ScheduleSourceMassTransit + ":" + schedule group + "/" + schedule id.
const ScheduleSourceMassTransit = "mt"
