package recurring

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/message"
	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/storage/boltstore"
	"github.com/delaybridge/delaybridge/storage/storetest"
	"github.com/delaybridge/delaybridge/wire"
)

var ctx = context.Background()

var t0 = time.Date(2026, 3, 29, 0, 59, 58, 0, time.UTC) // Berlin springs forward at 01:00 UTC

func setup(t *testing.T, expr, zone string) (*boltstore.Store, *storetest.Clock, *Firer, *[]time.Time) {
	t.Helper()
	clock := storetest.NewClock(t0)
	s, err := boltstore.Open(filepath.Join(t.TempDir(), "db"), boltstore.Options{Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	tmpl, err := message.Encode(nil, &amqp.Publishing{MessageId: "report", Body: []byte("hi"), Headers: amqp.Table{"h": "v"}})
	if err != nil {
		t.Fatal(err)
	}
	sc := storage.Schedule{Key: "amqp:report", Source: "amqp", Expr: expr, Zone: zone, Destination: "q", Message: tmpl,
		NextFireAt: t0.Add(2 * time.Second)}
	if _, err := s.PutSchedule(ctx, sc); err != nil {
		t.Fatal(err)
	}
	var woken []time.Time
	f := New(s, Options{Lead: 200 * time.Millisecond, Now: clock.Now, Wake: func(d time.Time) { woken = append(woken, d) }})
	return s, clock, f, &woken
}

// TestFirerOnTime: a lead before the fire time the firer stores the fire,
// due at the fire time, with the fire headers, wakes the poller for it and
// sleeps until a lead before the next one.
func TestFirerOnTime(t *testing.T) {
	s, clock, f, woken := setup(t, "* * * * * ?", "Europe/Berlin")
	clock.Set(t0.Add(time.Second + 850*time.Millisecond))
	wait, err := f.once(ctx)
	if err != nil {
		t.Fatal(err)
	}
	fireAt := t0.Add(2 * time.Second)
	if want := fireAt.Add(time.Second - 200*time.Millisecond).Sub(clock.Now()); wait != want {
		t.Fatalf("wait = %v, want %v (a lead before the next fire)", wait, want)
	}
	if len(*woken) != 1 || !(*woken)[0].Equal(fireAt) {
		t.Fatalf("poller woken for %v, want [%v]", *woken, fireAt)
	}
	id := storage.FireID("amqp:report", 1, fireAt)
	row, err := s.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if !row.DueAt.Equal(fireAt) {
		t.Fatalf("fire due at %v, want %v (never early)", row.DueAt, fireAt)
	}
	msg, err := message.Decode(row.Message)
	if err != nil {
		t.Fatal(err)
	}
	if msg.MessageId != id || string(msg.Body) != "hi" || msg.Headers["h"] != "v" ||
		msg.Headers[wire.HeaderFireTime] != "2026-03-29T01:00:00Z" || msg.Headers[wire.HeaderScheduleID] != "report" {
		t.Fatalf("fire message = %+v", msg)
	}
	// Nothing more is due until 0.2 s before the next second.
	if _, err := f.once(ctx); err != nil {
		t.Fatal(err)
	}
	if rows, _, _ := s.List(ctx, storage.ListFilter{Limit: 10}); len(rows) != 1 {
		t.Fatalf("rows = %v; want the one fire", rows)
	}
}

// TestFirerMisfire: after downtime of many fire times the firer stores one
// catch-up fire, due now, and continues from the next fire time after now.
func TestFirerMisfire(t *testing.T) {
	s, clock, f, _ := setup(t, "0 * * * * ?", "UTC")
	clock.Set(t0.Add(10*time.Minute + 30*time.Second))
	if _, err := f.once(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := f.once(ctx); err != nil {
		t.Fatal(err)
	}
	rows, _, err := s.List(ctx, storage.ListFilter{Limit: 100})
	if err != nil || len(rows) != 1 || !rows[0].DueAt.Equal(clock.Now()) {
		t.Fatalf("rows = %+v, %v; want one catch-up fire due now", rows, err)
	}
	sc, err := s.GetSchedule(ctx, "amqp:report")
	if err != nil || !sc.NextFireAt.Equal(time.Date(2026, 3, 29, 1, 11, 0, 0, time.UTC)) || sc.Misfires != 1 {
		t.Fatalf("schedule = %+v, %v", sc, err)
	}
}

// TestFirerBadSchedule: a schedule whose zone cannot be loaded ends, with
// the reason on it, and fires nothing.
func TestFirerBadSchedule(t *testing.T) {
	s, clock, f, _ := setup(t, "* * * * * ?", "Nowhere/Atlantis")
	clock.Set(t0.Add(2 * time.Second))
	if _, err := f.once(ctx); err != nil {
		t.Fatal(err)
	}
	sc, err := s.GetSchedule(ctx, "amqp:report")
	if err != nil || !sc.NextFireAt.IsZero() || sc.LastError == "" {
		t.Fatalf("schedule = %+v, %v", sc, err)
	}
}

// TestFirerRunClose: Run sleeps on the injected timer, fires when it
// fires, and returns on Close (twice is fine).
func TestFirerRunClose(t *testing.T) {
	s, clock, f, _ := setup(t, "* * * * * ?", "UTC")
	timers := make(chan chan time.Time, 10)
	f.opts.After = func(d time.Duration) <-chan time.Time {
		c := make(chan time.Time, 1)
		timers <- c
		return c
	}
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	first := <-timers // asleep: nothing due yet
	clock.Set(t0.Add(2 * time.Second))
	first <- clock.Now()
	<-timers // asleep again, after firing
	if _, err := s.Get(ctx, storage.FireID("amqp:report", 1, t0.Add(2*time.Second))); err != nil {
		t.Fatalf("fire after the timer: %v", err)
	}
	_ = f.Close()
	_ = f.Close()
	testenv.WaitNil(t, done, 10*time.Second, "Run to return after Close")
}
