package cron

import (
	"testing"
	"time"
)

func TestMisfirePolicyToQuartz(t *testing.T) {
	// MassTransit's ScheduleMessageConsumer: Skip -> DoNothing, Send -> FireAndProceed
	// (FireOnceNow), Default -> nothing set (SmartPolicy, which a CronTrigger treats as FireOnceNow).
	want := map[MisfirePolicy]QuartzMisfireInstruction{MisfireDefault: QuartzSmartPolicy, MisfireSkip: QuartzDoNothing, MisfireSend: QuartzFireOnceNow}
	for p, q := range want {
		if got := p.QuartzInstruction(); got != q {
			t.Errorf("%v -> %d, want %d", p, got, q)
		}
	}
	if QuartzSmartPolicy.effective() != QuartzFireOnceNow {
		t.Error("smart policy of a cron trigger is not FireOnceNow")
	}
}

func TestParseMisfirePolicy(t *testing.T) {
	for in, want := range map[string]MisfirePolicy{"": MisfireDefault, "Default": MisfireDefault, "skip": MisfireSkip, "SEND": MisfireSend, "0": MisfireDefault, "1": MisfireSkip, "2": MisfireSend} {
		got, err := ParseMisfirePolicy(in)
		if err != nil || got != want {
			t.Errorf("ParseMisfirePolicy(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"3", "FireNow", "-1"} {
		if _, err := ParseMisfirePolicy(bad); err == nil {
			t.Errorf("ParseMisfirePolicy(%q) accepted", bad)
		}
	}
	if MisfirePolicy(7).String() != "MisfirePolicy(7)" || MisfireSend.String() != "Send" {
		t.Error("String")
	}
}

func TestNextInWindow(t *testing.T) {
	s, _ := Parse("0 0 * * * ?") // hourly
	start := utc(t, "2026-04-01T10:00:00Z")
	end := utc(t, "2026-04-01T12:00:00Z")
	w := Window{Start: start, End: end}
	// before Start: Start itself fires (as CronTrigger: search from Start - 1 s).
	if got := s.NextIn(utc(t, "2026-04-01T00:00:00Z"), time.UTC, w); !got.Equal(start) {
		t.Errorf("before start: %s, want %s", got, start)
	}
	// a fire time equal to End fires; after End nothing does.
	if got := s.NextIn(utc(t, "2026-04-01T11:00:00Z"), time.UTC, w); !got.Equal(end) {
		t.Errorf("at end: %s, want %s", got, end)
	}
	if got := s.NextIn(end, time.UTC, w); !got.IsZero() {
		t.Errorf("after end: %s, want none", got)
	}
	if got := s.NextIn(utc(t, "2026-04-01T11:30:00Z"), time.UTC, Window{End: utc(t, "2026-04-01T11:59:59Z")}); !got.IsZero() {
		t.Errorf("next past end: %s, want none", got)
	}
	if got := s.NextIn(utc(t, "2026-04-01T11:30:00Z"), time.UTC, Window{}); !got.Equal(end) {
		t.Errorf("unbounded: %s, want %s", got, end)
	}
}

// A start with a fraction of a second counts from its whole second, as
// Quartz's CronTriggerImpl drops the fraction: the fire time of that
// second fires once, and the one after it is the next second's.
func TestNextInStartFraction(t *testing.T) {
	s, _ := Parse("* * * * * ?") // every second
	w := Window{Start: utc(t, "2026-04-01T10:00:00.5Z")}
	first := utc(t, "2026-04-01T10:00:00Z")
	if got := s.NextIn(utc(t, "2026-04-01T09:00:00Z"), time.UTC, w); !got.Equal(first) {
		t.Errorf("first: %s, want %s", got, first)
	}
	if got, want := s.NextIn(first, time.UTC, w), first.Add(time.Second); !got.Equal(want) {
		t.Errorf("after the first: %s, want %s", got, want)
	}
}

func TestDecide(t *testing.T) {
	s, _ := Parse("0 0/10 * * * ?") // every 10 minutes
	due := utc(t, "2026-04-01T10:00:00Z")
	// on time (within the threshold): fire the due time, next is due + 10 min.
	d := Decide(s, time.UTC, Window{}, MisfireSkip, due, due.Add(30*time.Second), DefaultMisfireThreshold)
	if !d.Fire || d.Misfired || !d.Scheduled.Equal(due) || !d.Previous.Equal(due) || !d.Next.Equal(utc(t, "2026-04-01T10:10:00Z")) {
		t.Errorf("on time: %+v", d)
	}
	// down for 2 h 5 min: Default and Send fire once now, standing for the first
	// missed time, then continue after now.
	now := utc(t, "2026-04-01T12:05:07.5Z")
	for _, p := range []MisfirePolicy{MisfireDefault, MisfireSend} {
		d = Decide(s, time.UTC, Window{}, p, due, now, DefaultMisfireThreshold)
		if !d.Fire || !d.Misfired || !d.Scheduled.Equal(due) || !d.Previous.Equal(utc(t, "2026-04-01T12:05:07Z")) || !d.Next.Equal(utc(t, "2026-04-01T12:10:00Z")) {
			t.Errorf("%v after downtime: %+v", p, d)
		}
	}
	// Skip: no fire, next after now.
	d = Decide(s, time.UTC, Window{}, MisfireSkip, due, now, DefaultMisfireThreshold)
	if d.Fire || !d.Misfired || !d.Previous.IsZero() || !d.Next.Equal(utc(t, "2026-04-01T12:10:00Z")) {
		t.Errorf("skip after downtime: %+v", d)
	}
	// the end passed during the downtime: nothing fires, the schedule is over.
	w := Window{End: utc(t, "2026-04-01T11:00:00Z")}
	d = Decide(s, time.UTC, w, MisfireSend, due, now, DefaultMisfireThreshold)
	if d.Fire || !d.Next.IsZero() {
		t.Errorf("send after end: %+v", d)
	}
	// the last on-time fire leaves no next when End comes first.
	d = Decide(s, time.UTC, Window{End: utc(t, "2026-04-01T10:05:00Z")}, MisfireDefault, due, due, DefaultMisfireThreshold)
	if !d.Fire || !d.Next.IsZero() {
		t.Errorf("last fire: %+v", d)
	}
}
