package cron

import (
	"testing"
	"time"
)

// utc parses an RFC 3339 time; expected fire times below are written out by
// hand from the zones' rules (2026: Berlin changes at 01:00Z on 29 Mar and
// 25 Oct; New York at 07:00Z on 8 Mar and 06:00Z on 1 Nov; Lord Howe, a
// 30-minute shift, at 15:00Z on 4 Apr and 15:30Z on 3 Oct; Adelaide, a
// +9:30/+10:30 zone, at 16:30Z on 4 Apr and 3 Oct).
func utc(t *testing.T, s string) time.Time {
	t.Helper()
	v, err := time.Parse(time.RFC3339, s)
	if err != nil {
		t.Fatal(err)
	}
	return v.UTC()
}

type fireCase struct {
	name, expr, zone, after string
	want                    []string // the next len(want) fire times, UTC
}

func runFireCases(t *testing.T, cases []fireCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, err := Parse(c.expr)
			if err != nil {
				t.Fatalf("Parse(%q): %v", c.expr, err)
			}
			loc, err := LoadLocation(c.zone)
			if err != nil {
				t.Fatal(err)
			}
			got := s.NextN(utc(t, c.after), loc, len(c.want))
			if len(got) != len(c.want) {
				t.Fatalf("%q in %s after %s: got %d fire times %v, want %v", c.expr, c.zone, c.after, len(got), got, c.want)
			}
			for i, w := range c.want {
				if !got[i].Equal(utc(t, w)) {
					t.Errorf("%q in %s after %s: fire %d = %s (%s), want %s",
						c.expr, c.zone, c.after, i, got[i].UTC().Format(time.RFC3339), got[i].In(loc).Format("2006-01-02 15:04:05 -07:00"), w)
				}
			}
		})
	}
}

func TestSpringForward(t *testing.T) {
	runFireCases(t, []fireCase{
		// 02:30 does not exist on 29 Mar: it fires once at 03:30 CEST (shifted by the gap).
		{"berlin daily 02:30", "0 30 2 * * ?", "Europe/Berlin", "2026-03-28T12:00:00Z",
			[]string{"2026-03-29T01:30:00Z", "2026-03-30T00:30:00Z"}},
		{"berlin daily 02:30 unix", "30 2 * * *", "Europe/Berlin", "2026-03-28T12:00:00Z",
			[]string{"2026-03-29T01:30:00Z", "2026-03-30T00:30:00Z"}},
		// hourly at :30: 01:30 CET, then 02:30 (gap) -> 03:30 CEST, which fires once, then 04:30.
		{"berlin hourly", "0 30 * * * ?", "Europe/Berlin", "2026-03-29T00:00:00Z",
			[]string{"2026-03-29T00:30:00Z", "2026-03-29T01:30:00Z", "2026-03-29T02:30:00Z"}},
		// every minute: 01:59 CET, then the gap's minutes collapse into one fire at 03:00 CEST.
		{"berlin every minute", "0 * * * * ?", "Europe/Berlin", "2026-03-29T00:58:00Z",
			[]string{"2026-03-29T00:59:00Z", "2026-03-29T01:00:00Z", "2026-03-29T01:01:00Z"}},
		{"new york daily 02:30", "0 30 2 * * ?", "America/New_York", "2026-03-07T12:00:00Z",
			[]string{"2026-03-08T07:30:00Z", "2026-03-09T06:30:00Z"}},
		{"new york windows id", "30 2 * * *", "Eastern Standard Time", "2026-03-07T12:00:00Z",
			[]string{"2026-03-08T07:30:00Z", "2026-03-09T06:30:00Z"}},
		// Lord Howe skips 02:00-02:30 (+10:30 -> +11): 02:15 fires at 02:45 +11.
		{"lord howe 30-minute gap", "0 15 2 * * ?", "Australia/Lord_Howe", "2026-10-03T00:00:00Z",
			[]string{"2026-10-03T15:45:00Z", "2026-10-04T15:15:00Z"}},
		// Adelaide skips 02:00-03:00 (+9:30 -> +10:30): 02:30 fires at 03:30 +10:30.
		{"adelaide half-hour zone gap", "0 30 2 * * ?", "Australia/Adelaide", "2026-10-03T00:00:00Z",
			[]string{"2026-10-03T17:00:00Z", "2026-10-04T16:00:00Z"}},
		{"adelaide windows id", "0 30 2 * * ?", "Cen. Australia Standard Time", "2026-10-03T00:00:00Z",
			[]string{"2026-10-03T17:00:00Z", "2026-10-04T16:00:00Z"}},
	})
}

func TestFallBack(t *testing.T) {
	runFireCases(t, []fireCase{
		// a fixed time in the repeated hour fires once, at its first (summer time) occurrence.
		{"berlin daily 02:30", "0 30 2 * * ?", "Europe/Berlin", "2026-10-24T12:00:00Z",
			[]string{"2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"}},
		{"berlin daily 02:30 unix", "30 2 * * *", "W. Europe Standard Time", "2026-10-24T12:00:00Z",
			[]string{"2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"}},
		// a search that starts inside the second pass takes the second occurrence.
		{"berlin daily 02:30 from second pass", "0 30 2 * * ?", "Europe/Berlin", "2026-10-25T01:10:00Z",
			[]string{"2026-10-25T01:30:00Z", "2026-10-26T01:30:00Z"}},
		// an interval schedule fires through both passes: every real half hour.
		{"berlin every 30 minutes", "0 0/30 * * * ?", "Europe/Berlin", "2026-10-24T23:00:00Z",
			[]string{"2026-10-24T23:30:00Z", "2026-10-25T00:00:00Z", "2026-10-25T00:30:00Z",
				"2026-10-25T01:00:00Z", "2026-10-25T01:30:00Z", "2026-10-25T02:00:00Z"}},
		{"berlin hourly", "0 0 * * * ?", "Europe/Berlin", "2026-10-24T22:30:00Z",
			[]string{"2026-10-24T23:00:00Z", "2026-10-25T00:00:00Z", "2026-10-25T01:00:00Z", "2026-10-25T02:00:00Z"}},
		{"berlin hourly unix", "0 * * * *", "Europe/Berlin", "2026-10-24T22:30:00Z",
			[]string{"2026-10-24T23:00:00Z", "2026-10-25T00:00:00Z", "2026-10-25T01:00:00Z", "2026-10-25T02:00:00Z"}},
		{"new york daily 01:30", "0 30 1 * * ?", "America/New_York", "2026-10-31T12:00:00Z",
			[]string{"2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"}},
		// every 20 minutes within hour 1: both passes of 01:xx, then the next day.
		{"new york every 20 minutes in hour 1", "*/20 1 * * *", "America/New_York", "2026-11-01T04:50:00Z",
			[]string{"2026-11-01T05:00:00Z", "2026-11-01T05:20:00Z", "2026-11-01T05:40:00Z",
				"2026-11-01T06:00:00Z", "2026-11-01T06:20:00Z", "2026-11-01T06:40:00Z", "2026-11-02T06:00:00Z"}},
		// Lord Howe repeats 01:30-02:00 (+11 -> +10:30).
		{"lord howe fixed 01:45", "0 45 1 * * ?", "Australia/Lord_Howe", "2026-04-04T00:00:00Z",
			[]string{"2026-04-04T14:45:00Z", "2026-04-05T15:15:00Z"}},
		{"lord howe every 15 minutes", "0 0/15 * * * ?", "Australia/Lord_Howe", "2026-04-04T14:20:00Z",
			[]string{"2026-04-04T14:30:00Z", "2026-04-04T14:45:00Z", "2026-04-04T15:00:00Z", "2026-04-04T15:15:00Z", "2026-04-04T15:30:00Z"}},
		{"adelaide fixed 02:30", "0 30 2 * * ?", "Australia/Adelaide", "2026-04-04T00:00:00Z",
			[]string{"2026-04-04T16:00:00Z", "2026-04-05T17:00:00Z"}},
	})
}

func TestNoDSTZone(t *testing.T) {
	runFireCases(t, []fireCase{
		{"kolkata", "0 0 9 * * ?", "Asia/Kolkata", "2026-03-08T00:00:00Z",
			[]string{"2026-03-08T03:30:00Z", "2026-03-09T03:30:00Z"}},
		{"kolkata windows id", "0 9 * * *", "India Standard Time", "2026-10-25T00:00:00Z",
			[]string{"2026-10-25T03:30:00Z", "2026-10-26T03:30:00Z"}},
		{"utc", "0 0 9 * * ?", "UTC", "2026-03-29T00:00:00Z",
			[]string{"2026-03-29T09:00:00Z"}},
	})
}

// Fire times must rise strictly and never repeat, whatever the zone does.
func TestFireTimesStrictlyIncrease(t *testing.T) {
	exprs := []string{"* * * * * ?", "0 * * * * ?", "0 0/30 * * * ?", "0 30 2 * * ?", "0 0 * * * ?", "*/7 1-3 * * *", "0 45 1 * * ?"}
	zones := []string{"Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Australia/Adelaide"}
	// each window starts about 2 h before a transition of one of the zones
	windows := []string{"2026-03-08T05:00:00Z", "2026-03-28T23:00:00Z", "2026-04-04T13:30:00Z", "2026-10-03T14:00:00Z", "2026-10-24T23:00:00Z", "2026-11-01T04:00:00Z"}
	for _, e := range exprs {
		s, err := Parse(e)
		if err != nil {
			t.Fatal(err)
		}
		for _, z := range zones {
			loc, _ := LoadLocation(z)
			for _, w := range windows {
				after := utc(t, w)
				end := after.Add(4 * time.Hour)
				for after.Before(end) {
					n := s.Next(after, loc)
					if !n.After(after) {
						t.Fatalf("%q in %s: Next(%s) = %s, not after", e, z, after, n)
					}
					after = n
				}
			}
		}
	}
}

func TestNextInputs(t *testing.T) {
	s, _ := Parse("0 0 9 * * ?")
	ber, _ := LoadLocation("Europe/Berlin")
	// after given in another zone and with a fraction of a second: the same instant counts.
	after := time.Date(2026, 4, 1, 8, 59, 59, 999_000_000, ber) // 06:59:59.999Z
	got := s.Next(after, ber)
	if !got.Equal(utc(t, "2026-04-01T07:00:00Z")) || got.Location() != ber {
		t.Errorf("Next = %s (%s), want 2026-04-01T07:00:00Z in Europe/Berlin", got, got.Location())
	}
	// strictly after: a fire time is not returned for itself.
	if got2 := s.Next(got, ber); !got2.Equal(utc(t, "2026-04-02T07:00:00Z")) {
		t.Errorf("Next(fire) = %s, want the next day", got2)
	}
	// nil location is UTC.
	if got := s.Next(utc(t, "2026-04-01T00:00:00Z"), nil); !got.Equal(utc(t, "2026-04-01T09:00:00Z")) {
		t.Errorf("nil loc: %s", got)
	}
}
