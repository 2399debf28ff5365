package cron

import (
	"errors"
	"strings"
	"testing"
	"time"

	robfig "github.com/robfig/cron/v3"
)

func TestQuartzSpecials(t *testing.T) {
	runFireCases(t, []fireCase{
		{"L leap year", "0 0 12 L * ?", "UTC", "2024-02-01T00:00:00Z",
			[]string{"2024-02-29T12:00:00Z", "2024-03-31T12:00:00Z", "2024-04-30T12:00:00Z"}},
		{"L common year", "0 0 12 L 2 ?", "UTC", "2026-01-01T00:00:00Z",
			[]string{"2026-02-28T12:00:00Z", "2027-02-28T12:00:00Z", "2028-02-29T12:00:00Z"}},
		{"L-3", "0 0 12 L-3 * ?", "UTC", "2026-02-01T00:00:00Z",
			[]string{"2026-02-25T12:00:00Z", "2026-03-28T12:00:00Z", "2026-04-27T12:00:00Z"}},
		// last weekday: 28 Feb 2026 is a Saturday, 31 May 2026 a Sunday.
		{"LW", "0 0 12 LW * ?", "UTC", "2026-02-01T00:00:00Z",
			[]string{"2026-02-27T12:00:00Z", "2026-03-31T12:00:00Z", "2026-04-30T12:00:00Z", "2026-05-29T12:00:00Z"}},
		// nearest weekday: 15 Aug 2026 is a Saturday (-> Fri 14), 15 Nov a Sunday (-> Mon 16).
		{"15W", "0 0 12 15W * ?", "UTC", "2026-08-01T00:00:00Z",
			[]string{"2026-08-14T12:00:00Z", "2026-09-15T12:00:00Z", "2026-10-15T12:00:00Z", "2026-11-16T12:00:00Z"}},
		// 1 Aug 2026 is a Saturday: W does not leave the month, so Monday the 3rd.
		{"1W", "0 0 12 1W 8 ?", "UTC", "2026-07-01T00:00:00Z",
			[]string{"2026-08-03T12:00:00Z"}},
		// 31W: as Quartz.NET, a day past the month's end is the last day first
		// (30 Apr, a Thursday; 30 Jun, a Tuesday); 31 May 2026 is a Sunday -> Fri 29.
		{"31W", "0 0 12 31W * ?", "UTC", "2026-04-01T00:00:00Z",
			[]string{"2026-04-30T12:00:00Z", "2026-05-29T12:00:00Z", "2026-06-30T12:00:00Z", "2026-07-31T12:00:00Z"}},
		{"31W in February", "0 0 0 31W 2 ?", "UTC", "2026-01-01T00:00:00Z",
			[]string{"2026-02-27T00:00:00Z"}},
		// L-3W: the weekday nearest 3 days before the last (28 May, a Thursday;
		// 27 Jun, a Saturday -> Fri 26).
		{"L-3W", "0 0 12 L-3W * ?", "UTC", "2026-05-01T00:00:00Z",
			[]string{"2026-05-28T12:00:00Z", "2026-06-26T12:00:00Z"}},
		// LW-2: two days before the last weekday (Fri 29 May -> 27; Tue 30 Jun -> 28).
		{"LW-2", "0 0 12 LW-2 * ?", "UTC", "2026-05-01T00:00:00Z",
			[]string{"2026-05-27T12:00:00Z", "2026-06-28T12:00:00Z"}},
		// L and a plain day together.
		{"L,15", "0 0 12 L,15 * ?", "UTC", "2026-04-01T00:00:00Z",
			[]string{"2026-04-15T12:00:00Z", "2026-04-30T12:00:00Z", "2026-05-15T12:00:00Z"}},
		{"6#3 third Friday", "0 0 12 ? * 6#3", "UTC", "2026-04-01T00:00:00Z",
			[]string{"2026-04-17T12:00:00Z", "2026-05-15T12:00:00Z"}},
		{"FRI#3 by name", "0 0 12 ? * fri#3", "UTC", "2026-04-01T00:00:00Z",
			[]string{"2026-04-17T12:00:00Z", "2026-05-15T12:00:00Z"}},
		// fifth Monday: March and June 2026 have one, April and May do not.
		{"2#5", "0 0 12 ? * 2#5", "UTC", "2026-03-01T00:00:00Z",
			[]string{"2026-03-30T12:00:00Z", "2026-06-29T12:00:00Z"}},
		{"6L last Friday", "0 0 12 ? * 6L", "UTC", "2026-04-01T00:00:00Z",
			[]string{"2026-04-24T12:00:00Z", "2026-05-29T12:00:00Z"}},
		{"FRIL last Friday", "0 0 12 ? * FRIL", "UTC", "2026-04-01T00:00:00Z",
			[]string{"2026-04-24T12:00:00Z"}},
		{"L alone in day-of-week is Saturday", "0 0 12 ? * L", "UTC", "2026-04-01T00:00:00Z",
			[]string{"2026-04-04T12:00:00Z", "2026-04-11T12:00:00Z"}},
		{"numeric day-of-week step", "0 0 12 ? * 2/2", "UTC", "2026-04-01T00:00:00Z",
			[]string{"2026-04-01T12:00:00Z", "2026-04-03T12:00:00Z", "2026-04-06T12:00:00Z"}},
		{"MON-FRI", "0 0 12 ? * MON-FRI", "UTC", "2026-04-03T00:00:00Z",
			[]string{"2026-04-03T12:00:00Z", "2026-04-06T12:00:00Z"}},
		{"wrapped weekday range FRI-MON", "0 0 12 ? * FRI-MON", "UTC", "2026-04-01T00:00:00Z",
			[]string{"2026-04-03T12:00:00Z", "2026-04-04T12:00:00Z", "2026-04-05T12:00:00Z", "2026-04-06T12:00:00Z", "2026-04-10T12:00:00Z"}},
		{"wrapped hour range", "0 0 22-1 * * ?", "UTC", "2026-04-01T12:00:00Z",
			[]string{"2026-04-01T22:00:00Z", "2026-04-01T23:00:00Z", "2026-04-02T00:00:00Z", "2026-04-02T01:00:00Z", "2026-04-02T22:00:00Z"}},
		{"months by name and step", "0 0 0 1 JAN/3 ?", "UTC", "2026-01-15T00:00:00Z",
			[]string{"2026-04-01T00:00:00Z", "2026-07-01T00:00:00Z", "2026-10-01T00:00:00Z", "2027-01-01T00:00:00Z"}},
		{"year", "0 0 12 1 1 ? 2030", "UTC", "2026-06-01T00:00:00Z",
			[]string{"2030-01-01T12:00:00Z"}},
		{"year list and range", "0 0 12 1 1 ? 2027,2029-2030", "UTC", "2026-06-01T00:00:00Z",
			[]string{"2027-01-01T12:00:00Z", "2029-01-01T12:00:00Z", "2030-01-01T12:00:00Z"}},
		{"29 February", "0 0 0 29 2 ?", "UTC", "2025-01-01T00:00:00Z",
			[]string{"2028-02-29T00:00:00Z", "2032-02-29T00:00:00Z"}},
		{"29 February unix", "0 0 29 2 *", "UTC", "2025-01-01T00:00:00Z",
			[]string{"2028-02-29T00:00:00Z", "2032-02-29T00:00:00Z"}},
		{"2100 is not a leap year", "0 0 0 29 2 ?", "UTC", "2096-03-01T00:00:00Z",
			[]string{"2104-02-29T00:00:00Z"}},
		{"every second", "* * * * * ?", "UTC", "2026-04-01T12:00:00.5Z",
			[]string{"2026-04-01T12:00:01Z", "2026-04-01T12:00:02Z", "2026-04-01T12:00:03Z", "2026-04-01T12:00:04Z", "2026-04-01T12:00:05Z"}},
		{"every second across midnight and a year", "* * * * * ?", "UTC", "2026-12-31T23:59:58Z",
			[]string{"2026-12-31T23:59:59Z", "2027-01-01T00:00:00Z", "2027-01-01T00:00:01Z"}},
		{"every 15 seconds", "0/15 * * * * ?", "UTC", "2026-04-01T12:00:00Z",
			[]string{"2026-04-01T12:00:15Z", "2026-04-01T12:00:30Z", "2026-04-01T12:00:45Z", "2026-04-01T12:01:00Z"}},
		{"seconds list", "5,10 * * * * ?", "UTC", "2026-04-01T12:00:07Z",
			[]string{"2026-04-01T12:00:10Z", "2026-04-01T12:01:05Z"}},
		// Unix: both day fields restricted -> either matches (Fridays and the 13th).
		{"unix day fields OR", "0 12 13 * 5", "UTC", "2026-04-01T00:00:00Z",
			[]string{"2026-04-03T12:00:00Z", "2026-04-10T12:00:00Z", "2026-04-13T12:00:00Z", "2026-04-17T12:00:00Z"}},
		// Unix: one day field '*' -> the other decides.
		{"unix day-of-week only", "0 12 * * 1", "UTC", "2026-04-01T00:00:00Z",
			[]string{"2026-04-06T12:00:00Z", "2026-04-13T12:00:00Z"}},
		{"unix 7 is Sunday", "0 0 * * 7", "UTC", "2026-04-01T00:00:00Z",
			[]string{"2026-04-05T00:00:00Z", "2026-04-12T00:00:00Z"}},
		{"unix 5-7 is Friday to Sunday", "0 0 * * 5-7", "UTC", "2026-04-01T00:00:00Z",
			[]string{"2026-04-03T00:00:00Z", "2026-04-04T00:00:00Z", "2026-04-05T00:00:00Z", "2026-04-10T00:00:00Z"}},
		{"unix names", "0 9 * jan-mar mon", "UTC", "2026-03-28T00:00:00Z",
			[]string{"2026-03-30T09:00:00Z", "2027-01-04T09:00:00Z"}},
		{"descriptor @daily", "@daily", "Europe/Berlin", "2026-04-01T00:00:00Z",
			[]string{"2026-04-01T22:00:00Z", "2026-04-02T22:00:00Z"}},
		{"descriptor @hourly", "@hourly", "UTC", "2026-04-01T00:30:00Z",
			[]string{"2026-04-01T01:00:00Z"}},
	})
}

func TestNeverFires(t *testing.T) {
	after := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, e := range []string{
		"0 0 12 1 1 ? 2020",   // past year
		"0 0 0 30 2 ?",        // 30 February
		"0 0 0 31 4,6,9,11 ?", // 31st of 30-day months
		"0 0 0 ? 2 1#5 2027",  // no fifth Sunday in February 2027
		"0 0 0 L-30 2 ?",      // 30 days before the last of February
		"0 0 30 2 *",          // Unix, 30 February
	} {
		s, err := Parse(e)
		if err != nil {
			t.Fatalf("Parse(%q): %v", e, err)
		}
		if got := s.Next(after, time.UTC); !got.IsZero() {
			t.Errorf("%q: Next = %s, want none (zero)", e, got)
		}
		if got := s.NextN(after, time.UTC, 5); len(got) != 0 {
			t.Errorf("%q: NextN = %v, want none", e, got)
		}
	}
	if got := (Schedule{}).Next(after, nil); !got.IsZero() {
		t.Errorf("zero Schedule fired at %s", got)
	}
}

func TestParseErrorsNameTheField(t *testing.T) {
	cases := []struct{ expr, field string }{
		{"60 * * * * ?", "second"},
		{"0 60 * * * ?", "minute"},
		{"0 0 24 * * ?", "hour"},
		{"0 0 ? * * ?", "hour"},
		{"0 */0 * * * ?", "minute"},
		{"0 0/61 * * * ?", "minute"},
		{"0 0 0 32 * ?", "day-of-month"},
		{"0 0 0 0 * ?", "day-of-month"},
		{"0 0 0 L-31 * ?", "day-of-month"},
		{"0 0 0 0W * ?", "day-of-month"},
		{"0 0 0 LX * ?", "day-of-month"},
		{"0 0 0 LW-31 * ?", "day-of-month"},
		{"0 0 0 L-3W- * ?", "day-of-month"},
		{"0 0 0 32W * ?", "day-of-month"},
		{"0 0 0 ? 13 *", "month"},
		{"0 0 0 1 JANX ?", "month"},
		{"0 0 0 ? * 8", "day-of-week"},
		{"0 0 0 ? * 0", "day-of-week"},
		{"0 0 0 ? * MON#6", "day-of-week"},
		{"0 0 0 ? * MON#0", "day-of-week"},
		{"0 0 0 ? * MON/2", "day-of-week"},
		{"0 0 0 ? * 2L,3", "day-of-week"},
		{"0 0 0 ? * 1#2,2#3", "day-of-week"},
		{"0 0 0 * * MON", "day-of-week"},
		{"0 0 0 15 * *", "day-of-week"},
		{"0 0 0 ? * ?", "day-of-week"},
		{"0 0 0 ? * * 1969", "year"},
		{"0 0 0 ? * * 2200", "year"},
		{"0 0 0 ? * * 20x0", "year"},
		{"60 * * * *", "minute"},
		{"5-1 * * * *", "minute"},
		{"* 25 * * *", "hour"},
		{"* * ? * *", "day-of-month"},
		{"* * L * *", "day-of-month"},
		{"* * 15W * *", "day-of-month"},
		{"* * * 0 *", "month"},
		{"* * * * 8", "day-of-week"},
		{"* * * * ?", "day-of-week"},
		{"* * * * 5#2", "day-of-week"},
		{"* * * * ,", "day-of-week"},
	}
	for _, c := range cases {
		_, err := Parse(c.expr)
		var fe *FieldError
		if !errors.As(err, &fe) {
			t.Errorf("Parse(%q) = %v, want a FieldError for %s", c.expr, err, c.field)
			continue
		}
		if fe.Field != c.field {
			t.Errorf("Parse(%q): field %q (%v), want %q", c.expr, fe.Field, err, c.field)
		}
		if !errors.Is(err, ErrSyntax) || !strings.Contains(err.Error(), c.field) {
			t.Errorf("Parse(%q): %v does not wrap ErrSyntax or name %s", c.expr, err, c.field)
		}
	}
	for _, e := range []string{"", "* * * *", "0 0 0 ? * * 2030 1", "@every 5m", "@reboot", "CRON_TZ=UTC 0 0 * * *"} {
		if _, err := Parse(e); !errors.Is(err, ErrSyntax) {
			t.Errorf("Parse(%q) = %v, want ErrSyntax", e, err)
		}
	}
}

func TestDialect(t *testing.T) {
	for e, want := range map[string]Dialect{"* * * * *": Unix, "@daily": Unix, "0 * * * * ?": Quartz, "0 0 0 ? * * 2030": Quartz} {
		s, err := Parse(e)
		if err != nil {
			t.Fatal(err)
		}
		if s.Dialect() != want || s.String() != e {
			t.Errorf("%q: dialect %v string %q, want %v", e, s.Dialect(), s.String(), want)
		}
	}
}

// Unix expressions agree with robfig/cron's standard parser, a widely used
// implementation of the same syntax, in UTC (where no DST rule applies).
func TestUnixMatchesRobfig(t *testing.T) {
	exprs := []string{
		"* * * * *", "*/5 * * * *", "0 * * * *", "15,45 8-18 * * *", "0 0 1 * *", "0 12 * * 1-5",
		"30 6 13 * 5", "0 0 29 2 *", "0 0 31 * *", "5 4 * * sun", "0 22 * * 1,3,5", "0 0 1 jan,jul *",
		"0 0 1-7 * 1", "10-50/20 3 * * *", "0 0 * feb-apr *", "59 23 31 12 *",
	}
	starts := []time.Time{
		time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(2027, 2, 27, 23, 59, 30, 0, time.UTC),
		time.Date(2028, 12, 31, 12, 0, 0, 0, time.UTC),
	}
	for _, e := range exprs {
		ours, err := Parse(e)
		if err != nil {
			t.Fatalf("Parse(%q): %v", e, err)
		}
		theirs, err := robfig.ParseStandard(e)
		if err != nil {
			t.Fatalf("robfig.ParseStandard(%q): %v", e, err)
		}
		for _, st := range starts {
			a, b := st, st
			for i := 0; i < 50; i++ {
				prev := a
				a, b = ours.Next(a, time.UTC), theirs.Next(b)
				if b.IsZero() && a.Sub(prev) > 5*365*24*time.Hour {
					break // robfig gives up 5 years after its start; ours searches to 2199
				}
				if !a.Equal(b) {
					t.Fatalf("%q from %s, fire %d: ours %s, robfig %s", e, st, i, a, b)
				}
			}
		}
	}
}
