package cron

import "time"

// Schedule is a parsed cron expression. The zero Schedule never fires.
// A Schedule is immutable and safe for concurrent use.
type Schedule struct {
	expr     string
	sp       *spec
	interval bool // a time-of-day field repeats; see the package comment on fall-back
}

// String returns the expression as given to Parse.
func (s Schedule) String() string { return s.expr }

// Dialect says whether the expression was read as Unix or Quartz cron.
func (s Schedule) Dialect() Dialect {
	if s.sp == nil {
		return 0
	}
	return s.sp.dialect
}

// Next returns the first fire time strictly after after, evaluating the
// expression on the wall clock of loc (nil means UTC). Fire times are whole
// seconds, returned in loc. It returns the zero Time when the schedule has no fire time left
// (a past year, a day that never exists) up to the end of 2199.
//
// Daylight-saving changes follow Quartz's CronExpression.GetTimeAfter; see the
// package comment.
func (s Schedule) Next(after time.Time, loc *time.Location) time.Time {
	if s.sp == nil {
		return time.Time{}
	}
	if loc == nil {
		loc = time.UTC
	}
	// As Quartz: the search starts one whole second after after.
	floor := after.Truncate(time.Second).Add(time.Second)
	next, ok := s.nextFrom(floor, loc)
	if !ok {
		return time.Time{}
	}
	if s.interval {
		next = s.secondPass(next, floor, loc)
	}
	return next
}

// NextN returns up to n fire times after after, in order (fewer when the
// schedule ends).
func (s Schedule) NextN(after time.Time, loc *time.Location, n int) []time.Time {
	out := make([]time.Time, 0, n)
	for len(out) < n {
		t := s.Next(after, loc)
		if t.IsZero() {
			break
		}
		out = append(out, t)
		after = t
	}
	return out
}

// nextFrom finds the first matching wall-clock time at or after floor's wall
// clock and turns it into an instant: a time in a spring-forward gap moves
// forward by the gap; a time that happens twice is its first occurrence,
// unless that is before floor (the search began in the repeated hour), then
// its second.
func (s Schedule) nextFrom(floor time.Time, loc *time.Location) (time.Time, bool) {
	w, ok := s.sp.nextWall(wallClock(floor.In(loc)))
	if !ok {
		return time.Time{}, false
	}
	first, second := resolve(w, loc)
	if first.Before(floor) {
		return second, true
	}
	return first, true
}

// secondPass gives interval schedules ("every 15 minutes") their fires in the
// second pass of a repeated fall-back hour. The wall-clock walk goes from the
// last minute of the first pass straight past the repeated hour, so when the
// search starts in the first pass and the candidate lies beyond the start of
// the second pass, search again from the transition.
func (s Schedule) secondPass(next, floor time.Time, loc *time.Location) time.Time {
	fl := floor.In(loc)
	first, second := resolve(wallClock(fl), loc)
	if first.Equal(second) || !fl.Equal(first) {
		return next // not in a repeated hour, or already in its second pass
	}
	_, transition := fl.ZoneBounds() // the first instant of the second pass
	if transition.IsZero() || next.Before(transition) {
		return next
	}
	if alt, ok := s.nextFrom(transition, loc); ok && alt.Before(next) {
		return alt
	}
	return next
}

// wallClock returns t's wall-clock fields as a UTC time.
func wallClock(t time.Time) time.Time {
	y, m, d := t.Date()
	h, mi, s := t.Clock()
	return time.Date(y, m, d, h, mi, s, 0, time.UTC)
}

// resolve maps a wall-clock time (fields of w, a UTC time) in loc to
// instants. Normally first == second. When the wall clock happens twice, first
// is the earlier (daylight) occurrence and second the later. When it does not
// happen (a spring-forward gap) both are the wall clock read with the offset in
// force before the gap, which lands after the gap by as much as w was into it
// (02:30 in a 02:00-03:00 gap is 03:30), as Quartz resolves it.
func resolve(w time.Time, loc *time.Location) (first, second time.Time) {
	u := w.Unix()
	// Offsets in force near w: zone transitions are far more than a day apart
	// in the tz database, so these cover both sides of any transition at w.
	var offs [3]int
	for i, probe := range [3]int64{u - 26*3600, u, u + 26*3600} {
		_, offs[i] = time.Unix(probe, 0).In(loc).Zone()
	}
	var valid []time.Time
	maxOff := offs[0]
	for _, o := range offs {
		if o > maxOff {
			maxOff = o
		}
		t := time.Unix(u-int64(o), 0).In(loc)
		if _, got := t.Zone(); got == o && !contains(valid, t) {
			valid = append(valid, t)
		}
	}
	switch len(valid) {
	case 0: // gap: read w with the offset in force just before it
		_, pre := time.Unix(u-int64(maxOff), 0).In(loc).Zone()
		t := time.Unix(u-int64(pre), 0).In(loc)
		return t, t
	case 1:
		return valid[0], valid[0]
	}
	first, second = valid[0], valid[0]
	for _, t := range valid[1:] {
		if t.Before(first) {
			first = t
		}
		if t.After(second) {
			second = t
		}
	}
	return first, second
}

func contains(ts []time.Time, t time.Time) bool {
	for _, x := range ts {
		if x.Equal(t) {
			return true
		}
	}
	return false
}
