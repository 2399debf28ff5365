package ingest

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/intake"
	"github.com/delaybridge/delaybridge/message"
	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/wire"
)

// Recurring schedules over AMQP (docs/contract.md §2.11): a parser's intake.OpRecur
// creates or replaces the schedule it names; a cancel of that id ends it
// (cancel in ingest.go calls cancelSchedule).

// acceptRecurring checks a schedule against the rules (its first fire time
// as the due time) and builds it.
func (in *Ingester) acceptRecurring(it *intake.Intake, d *amqp.Delivery, now time.Time) (storage.Schedule, error) {
	if _, ok := in.store.(storage.Scheduler); !ok {
		return storage.Schedule{}, errors.New("this store cannot keep recurring schedules")
	}
	if err := in.opts.Rules.Check(intake.Parsed{ID: it.ID, Destination: it.Dest(), DueAt: it.DueAt}, len(d.Body), now); err != nil {
		return storage.Schedule{}, err
	}
	enc, err := message.Encode(nil, &it.Msg)
	if err != nil {
		return storage.Schedule{}, fmt.Errorf("headers cannot be stored: %w", err)
	}
	r := it.Recur
	return storage.Schedule{Key: storage.ScheduleKey(wire.ScheduleSourceAMQP, it.ID), Source: wire.ScheduleSourceAMQP,
		Expr: r.Expr, Zone: r.Zone, Start: r.Start, End: r.End, Misfire: int(r.Misfire),
		Destination: it.Destination, Exchange: it.Exchange, Message: enc, NextFireAt: r.First}, nil
}

// putSchedule stores e's schedule and acks e, or returns the pause to take
// when the store failed (e stays requeued).
func (in *Ingester) putSchedule(ctx context.Context, e *entry) time.Duration {
	sc := in.store.(storage.Scheduler) // acceptRecurring refused the message otherwise
	got, err := sc.PutSchedule(context.WithoutCancel(ctx), e.sched)
	if err != nil {
		pause := in.opts.StoreBreaker.Failure(err)
		in.log.Error().Err(err).Str("schedule", e.sched.Key).Dur("retry_in", pause).Msg("storing a recurring schedule failed; requeued")
		return pause
	}
	in.opts.StoreBreaker.Success()
	e.outcome = ack
	in.log.Info().Str("schedule", got.Key).Int64("generation", got.Generation).Str("cron", got.Expr).Str("zone", got.Zone).
		Time("first_fire", got.NextFireAt).Msg("recurring schedule stored")
	if in.opts.ScheduleWake != nil {
		in.opts.ScheduleWake()
	}
	return 0
}

// cancelSchedule ends the AMQP schedule named id, if the store keeps
// schedules: found says whether there was one.
func (in *Ingester) cancelSchedule(ctx context.Context, id string) (found bool, err error) {
	sc, ok := in.store.(storage.Scheduler)
	if !ok {
		return false, nil
	}
	return sc.CancelSchedule(context.WithoutCancel(ctx), storage.ScheduleKey(wire.ScheduleSourceAMQP, id))
}
