package cron

import (
	"math/bits"
	"time"
)

// spec is a parsed expression matched against wall-clock (civil) times. It
// knows nothing of time zones: Schedule maps wall-clock times to instants.
type spec struct {
	dialect Dialect

	sec, min, hour uint64 // bit v set: value v matches
	month          uint64 // bits 1-12

	dom       uint64 // bits 1-31
	domRules  []domRule
	domStar   bool // '*' or '?': any day of the month
	domNoSpec bool // '?' (Quartz): the day is chosen by day-of-week

	dow       uint64 // bits 0 (Sunday) - 6
	dowStar   bool
	dowNoSpec bool
	dowLast   bool // nL: the last such weekday of the month
	dowNth    int  // n#k: k, 1-5; 0 when unused
	dowNthDay int  // weekday of nL and n#k, 0-6

	anyYear bool
	years   [4]uint64 // bit y-minYear
}

type domKind int

const (
	// L-n[W[-m]]: n days before the last day; with W the weekday nearest
	// that day, then m days earlier (not before the 1st).
	domLast domKind = iota + 1
	// nW: the Monday-Friday nearest day n (the last day when the month is
	// shorter), within the month.
	domNearestWeekday
)

type domRule struct {
	kind    domKind
	n       int
	weekday bool // domLast: W
	after   int  // domLast: m of LW-m
}

// nextBit returns the smallest set bit >= from, or -1.
func nextBit(set uint64, from int) int {
	if from > 63 {
		return -1
	}
	rest := set >> uint(from) << uint(from)
	if rest == 0 {
		return -1
	}
	return bits.TrailingZeros64(rest)
}

func daysIn(y int, m time.Month) int {
	return time.Date(y, m+1, 0, 0, 0, 0, 0, time.UTC).Day()
}

func weekday(y int, m time.Month, d int) int {
	return int(time.Date(y, m, d, 0, 0, 0, 0, time.UTC).Weekday())
}

func (sp *spec) yearOK(y int) bool {
	if sp.anyYear {
		return true
	}
	i := y - minYear
	return i >= 0 && y <= maxYear && sp.years[i/64]&(1<<uint(i%64)) != 0
}

func (sp *spec) domMatch(y int, m time.Month, d int) bool {
	if sp.domStar || sp.dom&(1<<uint(d)) != 0 {
		return true
	}
	last := daysIn(y, m)
	for _, r := range sp.domRules {
		var want int
		switch r.kind {
		case domLast:
			want = last - r.n
			if r.weekday && want >= 1 {
				want = nearestWeekday(y, m, want, last) - r.after
				if want < 1 {
					want = 1 // as Quartz: an offset past the 1st stays on the 1st
				}
			}
		case domNearestWeekday:
			want = nearestWeekday(y, m, min(r.n, last), last)
		}
		if d == want {
			return true
		}
	}
	return false
}

// nearestWeekday moves a Saturday to the Friday before and a Sunday to the
// Monday after, without leaving the month (Saturday the 1st goes to Monday
// the 3rd, Sunday the last to the Friday before), as Quartz's W does.
func nearestWeekday(y int, m time.Month, d, last int) int {
	switch weekday(y, m, d) {
	case 6:
		if d == 1 {
			return 3
		}
		return d - 1
	case 0:
		if d == last {
			return d - 2
		}
		return d + 1
	}
	return d
}

func (sp *spec) dowMatch(y int, m time.Month, d int) bool {
	if sp.dowStar {
		return true
	}
	wd := weekday(y, m, d)
	switch {
	case sp.dowLast:
		return wd == sp.dowNthDay && d+7 > daysIn(y, m)
	case sp.dowNth > 0:
		return wd == sp.dowNthDay && (d-1)/7+1 == sp.dowNth
	}
	return sp.dow&(1<<uint(wd)) != 0
}

// dayMatch combines the two day fields. Quartz: the field that is not '?'
// decides. Unix (as Vixie cron and POSIX): when both are restricted (neither
// is '*') a day matching either one fires; otherwise the restricted one decides.
func (sp *spec) dayMatch(y int, m time.Month, d int) bool {
	if sp.dialect == Quartz {
		if sp.domNoSpec {
			return sp.dowMatch(y, m, d)
		}
		return sp.domMatch(y, m, d)
	}
	if !sp.domStar && !sp.dowStar {
		return sp.domMatch(y, m, d) || sp.dowMatch(y, m, d)
	}
	return sp.domMatch(y, m, d) && sp.dowMatch(y, m, d)
}

// timeOfDay returns the first matching second of a day at or after h:mi:s.
func (sp *spec) timeOfDay(h, mi, s int) (int, int, int, bool) {
	for H := nextBit(sp.hour, h); H >= 0; H = nextBit(sp.hour, H+1) {
		m0 := 0
		if H == h {
			m0 = mi
		}
		for M := nextBit(sp.min, m0); M >= 0; M = nextBit(sp.min, M+1) {
			s0 := 0
			if H == h && M == mi {
				s0 = s
			}
			if S := nextBit(sp.sec, s0); S >= 0 {
				return H, M, S, true
			}
		}
	}
	return 0, 0, 0, false
}

// nextWall returns the first matching wall-clock time at or after from (whose
// location is ignored: its fields are the wall clock), or false when none
// comes before the end of maxYear.
func (sp *spec) nextWall(from time.Time) (time.Time, bool) {
	y, m, d := from.Date()
	h, mi, s := from.Clock()
	for y <= maxYear {
		if !sp.yearOK(y) {
			y, m, d, h, mi, s = y+1, 1, 1, 0, 0, 0
			continue
		}
		if sp.month&(1<<uint(m)) == 0 {
			if nm := nextBit(sp.month, int(m)+1); nm > 0 && nm <= 12 {
				m = time.Month(nm)
			} else {
				y, m = y+1, 1
			}
			d, h, mi, s = 1, 0, 0, 0
			continue
		}
		if d > daysIn(y, m) {
			if m == 12 {
				y, m = y+1, 1
			} else {
				m++
			}
			d, h, mi, s = 1, 0, 0, 0
			continue
		}
		if sp.dayMatch(y, m, d) {
			if H, M, S, ok := sp.timeOfDay(h, mi, s); ok {
				return time.Date(y, m, d, H, M, S, 0, time.UTC), true
			}
		}
		d, h, mi, s = d+1, 0, 0, 0
	}
	return time.Time{}, false
}
