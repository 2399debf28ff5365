package status

import (
	"context"
	"strconv"
	"time"

	"github.com/delaybridge/delaybridge/admin"
)

// The recurring schedules section (docs/contract.md §2.11, §6.4): the first
// ScheduleRows schedules in key order, each with its next fire.

// ScheduleRows is how many schedules the page lists.
const ScheduleRows = 25

// ScheduleRow is one recurring schedule.
type ScheduleRow struct {
	Key, Cron, Zone, Destination string
	// State is active, paused or ended (admin.ScheduleState); Class its
	// badge's colour.
	State, Class string
	// NextFire is the next fire time (UTC), "" when there is none; In
	// words it from now, Late when it is past (the firer is behind, or
	// the schedule is paused).
	NextFire, In    string
	Late            bool
	Fires, Misfires int64
	LastError       string
}

// schedules fills the section from Options.Schedules.
func (h *Handler) schedules(ctx context.Context, p *page, now time.Time) {
	if h.opts.Schedules == nil {
		return
	}
	p.HaveSchedules = true
	rows, next, err := h.opts.Schedules(ctx, "", ScheduleRows)
	if err != nil {
		p.SchedulesErr = "Schedules unavailable: " + err.Error()
		return
	}
	if next != "" {
		p.SchedulesMore = "only the first " + strconv.Itoa(ScheduleRows) + " in key order are shown"
	}
	for i := range rows {
		s := &rows[i]
		r := ScheduleRow{Key: s.Key, Cron: s.Expr, Zone: s.Zone, Destination: s.Dest().String(), State: admin.ScheduleState(s),
			Fires: s.Fires, Misfires: s.Misfires, LastError: s.LastError}
		switch r.State {
		case "active":
			r.Class = "ok"
		case "paused":
			r.Class = "warn"
		default:
			r.Class = "bad"
		}
		if !s.NextFireAt.IsZero() {
			r.NextFire = s.NextFireAt.UTC().Format(time.RFC3339)
			r.In, r.Late = relative(s.NextFireAt, now)
		}
		p.Schedules = append(p.Schedules, r)
	}
}
