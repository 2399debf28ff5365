// Package recurring fires the recurring schedules of the store
// (docs/contract.md §2.11): the Firer wakes at the next fire time, a lead
// ahead, and has the store turn each due schedule's fire into an ordinary
// timeout row, which the poller and dispatcher forward as a one-shot. Plan
// decides each fire with package cron.
package recurring

import (
	"fmt"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/cron"
	"github.com/delaybridge/delaybridge/message"
	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/wire"
)

// Plan returns the planner of the bridge's schedules: cron.Decide on the
// schedule's expression, zone, window and misfire policy, a fire time
// missed by more than threshold being a misfire. An on-time fire is due at
// its fire time (stored ahead by the firer's lead, never forwarded early);
// a catch-up fire after a misfire is due at once. Each fire's message is
// the template with the fire headers stamped in: by the FireStamper of the
// schedule's source in stampers, FireMessage's headers for any other.
func Plan(threshold time.Duration, stampers map[string]FireStamper) storage.Planner {
	return func(s *storage.Schedule, now time.Time) storage.FirePlan {
		spec, err := cron.Parse(s.Expr)
		if err != nil {
			return storage.FirePlan{Err: fmt.Sprintf("cron expression %q: %v", s.Expr, err)}
		}
		loc, err := cron.LoadLocation(s.Zone)
		if err != nil {
			return storage.FirePlan{Err: fmt.Sprintf("time zone %q: %v", s.Zone, err)}
		}
		d := cron.Decide(spec, loc, cron.Window{Start: s.Start, End: s.End}, cron.MisfirePolicy(s.Misfire), s.NextFireAt, now, threshold)
		p := storage.FirePlan{Fire: d.Fire, Scheduled: d.Scheduled.UTC(), Misfired: d.Misfired, Next: d.Next.UTC(), Prev: d.Previous.UTC()}
		if d.Next.IsZero() {
			p.Next = time.Time{}
		}
		if d.Previous.IsZero() {
			p.Prev = time.Time{}
		}
		if !d.Fire {
			return p
		}
		p.DueAt = p.Scheduled
		if d.Misfired && now.After(p.DueAt) {
			p.DueAt = now
		}
		if st, ok := stampers[s.Source]; ok {
			p.Message, err = stampFire(st, s, Fire{ID: storage.FireID(s.Key, s.Generation, p.Scheduled), Scheduled: p.Scheduled,
				Next: p.Next, Prev: s.PrevFireAt})
		} else {
			p.Message, err = FireMessage(s, p.Scheduled)
		}
		if err != nil {
			return storage.FirePlan{Err: err.Error()}
		}
		return p
	}
}

// Fire is what a FireStamper learns of one fire.
type Fire struct {
	// ID is the fire's row key (storage.FireID): it names this fire and no
	// other.
	ID string
	// Scheduled is the fire time this fire stands for; Next the
	// schedule's fire time after it (zero when there is none); Prev the
	// one before (the schedule's PrevFireAt; zero on its first fire).
	Scheduled, Next, Prev time.Time
}

// FireStamper writes a source's own fire headers into a copy of the
// schedule's template, so that each fire looks as that source's scheduler
// sends it; the wire format stays in the source's package (say
// protocol/masstransit). It must be pure, as the Planner is.
type FireStamper interface {
	StampFire(s *storage.Schedule, msg *amqp.Publishing, f Fire) error
}

// stampFire is the message of the fire f of s, stamped by st.
func stampFire(st FireStamper, s *storage.Schedule, f Fire) ([]byte, error) {
	msg, err := message.Decode(s.Message)
	if err != nil {
		return nil, fmt.Errorf("stored message of schedule %q is corrupt: %w", s.Key, err)
	}
	if err := st.StampFire(s, &msg, f); err != nil {
		return nil, fmt.Errorf("schedule %q: stamp its fire: %w", s.Key, err)
	}
	enc, err := message.Encode(nil, &msg)
	if err != nil {
		return nil, fmt.Errorf("schedule %q: encode its fire: %w", s.Key, err)
	}
	return enc, nil
}

// ScheduleName is the name a schedule was given: its key without the
// source ("amqp:<message id>" -> the message id).
func ScheduleName(key string) string {
	if _, name, ok := strings.Cut(key, ":"); ok {
		return name
	}
	return key
}

// FireMessage is the message of s's fire at scheduled: the template with
// wire.HeaderFireTime and wire.HeaderScheduleID set and, as message id, the
// fire's row key (storage.FireID), which names this fire and no other: a
// consumer that drops repeated message ids drops a second copy of one fire
// (docs/contract.md §3.3) and never a later fire.
func FireMessage(s *storage.Schedule, scheduled time.Time) ([]byte, error) {
	msg, err := message.Decode(s.Message)
	if err != nil {
		return nil, fmt.Errorf("stored message of schedule %q is corrupt: %w", s.Key, err)
	}
	h := make(map[string]any, len(msg.Headers)+2)
	for k, v := range msg.Headers {
		h[k] = v
	}
	h[wire.HeaderFireTime] = scheduled.UTC().Format(time.RFC3339Nano)
	h[wire.HeaderScheduleID] = ScheduleName(s.Key)
	msg.Headers = h
	msg.MessageId = storage.FireID(s.Key, s.Generation, scheduled)
	enc, err := message.Encode(nil, &msg)
	if err != nil {
		return nil, fmt.Errorf("schedule %q: encode its fire: %w", s.Key, err)
	}
	return enc, nil
}
