package status

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/storage/storetest"
)

// The schedules section lists each schedule with its state and next fire
// (escaped, never its message), says when only the first page is shown,
// shows a store error, says when there are none, and is absent without
// Options.Schedules.
func TestSchedulesSection(t *testing.T) {
	clk := storetest.NewClock(t0)
	evil := `<script>alert(1)</script>`
	var next string
	var fail error
	var rows []storage.Schedule
	h := New(Options{Now: clk.Now, Schedules: func(_ context.Context, after string, limit int) ([]storage.Schedule, string, error) {
		if after != "" || limit != ScheduleRows {
			t.Errorf("asked for schedules after %q, limit %d", after, limit)
		}
		return rows, next, fail
	}})
	page := get(t, h)
	mustContain(t, page, `id="schedules"`, "No recurring schedules.")

	rows = []storage.Schedule{
		{Key: "amqp:tick", Expr: "*/5 * * * * ?", Zone: "Europe/Berlin", Destination: "orders", NextFireAt: clk.Now().Add(5 * time.Second),
			Fires: 12, Misfires: 1, Message: []byte("SECRET-BODY")},
		{Key: "amqp:" + evil, Expr: "0 9 * * MON", Zone: "UTC", Exchange: "x", Destination: "k", NextFireAt: clk.Now().Add(-time.Minute), Paused: true},
		{Key: "admin:over", Expr: "0 0 1 1 ? 2020", Zone: "UTC", Destination: "q", LastError: "cron expression has no fire time left"},
	}
	next = "admin:over"
	page = get(t, h)
	mustContain(t, page, `id="schedule-rows"`, "amqp:tick", "*/5 * * * * ?", "Europe/Berlin", "2026-11-21T20:00:05Z", "in 5s",
		">12<", ">1<", "badge ok\">active", "badge warn\">paused", "1m overdue", "badge bad\">ended", "cron expression has no fire time left",
		"amqp:&lt;script&gt;", "only the first 25 in key order are shown")
	if strings.Contains(page, evil) || strings.Contains(page, "SECRET-BODY") {
		t.Error("the schedules section shows an unescaped key or a message")
	}

	fail = errors.New("store down")
	mustContain(t, get(t, h), "Schedules unavailable: store down")

	if page := get(t, New(Options{Now: clk.Now})); strings.Contains(page, `id="schedules"`) {
		t.Error("a schedules section without Options.Schedules")
	}
}
