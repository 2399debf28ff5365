package cron

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// ErrSyntax is wrapped by every error Parse returns, so callers can tell a
// bad expression from other failures with errors.Is.
var ErrSyntax = errors.New("cron: invalid expression")

// FieldError names the field of an expression that could not be parsed.
type FieldError struct {
	Field  string // "second", "minute", "hour", "day-of-month", "month", "day-of-week", "year"
	Value  string // the field as written
	Reason string
}

func (e *FieldError) Error() string {
	return fmt.Sprintf("cron: %s field %q: %s", e.Field, e.Value, e.Reason)
}

func (e *FieldError) Unwrap() error { return ErrSyntax }

// Dialect says which syntax an expression was parsed as.
type Dialect int

const (
	// Unix is the 5-field crontab syntax: minute hour day-of-month month day-of-week.
	Unix Dialect = iota + 1
	// Quartz is the 6- or 7-field syntax of Quartz's CronExpression:
	// second minute hour day-of-month month day-of-week [year].
	Quartz
)

func (d Dialect) String() string {
	switch d {
	case Unix:
		return "unix"
	case Quartz:
		return "quartz"
	}
	return "unknown"
}

// minYear and maxYear bound the year field and the search: Quartz accepts
// years from 1970, and a schedule with no fire time before maxYear never fires.
const (
	minYear = 1970
	maxYear = 2199
)

var (
	monthNames = map[string]int{"JAN": 1, "FEB": 2, "MAR": 3, "APR": 4, "MAY": 5, "JUN": 6,
		"JUL": 7, "AUG": 8, "SEP": 9, "OCT": 10, "NOV": 11, "DEC": 12}
	// Quartz numbers days of week 1 (SUN) to 7 (SAT); Unix 0 (SUN) to 6 (SAT), 7 also SUN.
	quartzDayNames = map[string]int{"SUN": 1, "MON": 2, "TUE": 3, "WED": 4, "THU": 5, "FRI": 6, "SAT": 7}
	unixDayNames   = map[string]int{"SUN": 0, "MON": 1, "TUE": 2, "WED": 3, "THU": 4, "FRI": 5, "SAT": 6}

	descriptors = map[string]string{
		"@YEARLY": "0 0 1 1 *", "@ANNUALLY": "0 0 1 1 *", "@MONTHLY": "0 0 1 * *",
		"@WEEKLY": "0 0 * * 0", "@DAILY": "0 0 * * *", "@MIDNIGHT": "0 0 * * *", "@HOURLY": "0 * * * *",
	}
)

// field describes one position of an expression: its name and value bounds.
type field struct {
	name     string
	min, max int
	names    map[string]int
	wrap     bool // a range may wrap past max (Quartz: "FRI-MON", "22-2")
}

// Parse reads a cron expression. Five fields are Unix cron (minute first);
// six or seven are Quartz (second first, optional year); a leading '@' is one
// of the Unix descriptors @yearly, @annually, @monthly, @weekly, @daily,
// @midnight, @hourly. Names (JAN, MON) are case-insensitive. An error names
// the field at fault and wraps ErrSyntax.
func Parse(expr string) (Schedule, error) {
	upper := strings.ToUpper(strings.TrimSpace(expr))
	if strings.HasPrefix(upper, "@") {
		d, ok := descriptors[upper]
		if !ok {
			return Schedule{}, fmt.Errorf("%w: unknown descriptor %q (want @yearly, @annually, @monthly, @weekly, @daily, @midnight or @hourly)", ErrSyntax, expr)
		}
		s, err := parseUnix(strings.Fields(d))
		if err != nil {
			return Schedule{}, err
		}
		s.expr = expr
		return s, nil
	}
	tokens := strings.Fields(upper)
	var (
		s   Schedule
		err error
	)
	switch len(tokens) {
	case 5:
		s, err = parseUnix(tokens)
	case 6, 7:
		s, err = parseQuartz(tokens)
	default:
		return Schedule{}, fmt.Errorf("%w: %d fields in %q: want 5 (Unix: minute hour day-of-month month day-of-week) or 6-7 (Quartz: second minute hour day-of-month month day-of-week [year])", ErrSyntax, len(tokens), expr)
	}
	if err != nil {
		return Schedule{}, err
	}
	s.expr = expr
	return s, nil
}

func parseUnix(tok []string) (Schedule, error) {
	sp := spec{dialect: Unix}
	sp.sec = 1 // second 0
	var err error
	if sp.min, err = parseSet(tok[0], field{name: "minute", max: 59}); err != nil {
		return Schedule{}, err
	}
	if sp.hour, err = parseSet(tok[1], field{name: "hour", max: 23}); err != nil {
		return Schedule{}, err
	}
	if err = sp.parseDayOfMonth(tok[2], false); err != nil {
		return Schedule{}, err
	}
	if sp.month, err = parseSet(tok[3], field{name: "month", min: 1, max: 12, names: monthNames}); err != nil {
		return Schedule{}, err
	}
	if err = sp.parseDayOfWeek(tok[4], false); err != nil {
		return Schedule{}, err
	}
	sp.anyYear = true
	return Schedule{sp: &sp, interval: isInterval(tok[0]) || isInterval(tok[1])}, nil
}

func parseQuartz(tok []string) (Schedule, error) {
	sp := spec{dialect: Quartz}
	var err error
	if sp.sec, err = parseSet(tok[0], field{name: "second", max: 59, wrap: true}); err != nil {
		return Schedule{}, err
	}
	if sp.min, err = parseSet(tok[1], field{name: "minute", max: 59, wrap: true}); err != nil {
		return Schedule{}, err
	}
	if sp.hour, err = parseSet(tok[2], field{name: "hour", max: 23, wrap: true}); err != nil {
		return Schedule{}, err
	}
	if err = sp.parseDayOfMonth(tok[3], true); err != nil {
		return Schedule{}, err
	}
	if sp.month, err = parseSet(tok[4], field{name: "month", min: 1, max: 12, names: monthNames, wrap: true}); err != nil {
		return Schedule{}, err
	}
	if err = sp.parseDayOfWeek(tok[5], true); err != nil {
		return Schedule{}, err
	}
	// Quartz resolves a day by one of the two day fields; the other must be '?'.
	switch {
	case sp.domNoSpec && sp.dowNoSpec:
		return Schedule{}, &FieldError{Field: "day-of-week", Value: tok[5], Reason: "'?' may stand in only one of day-of-month and day-of-week"}
	case !sp.domNoSpec && !sp.dowNoSpec:
		return Schedule{}, &FieldError{Field: "day-of-week", Value: tok[5], Reason: fmt.Sprintf("Quartz needs '?' in day-of-month (%q) or day-of-week; both days given is not supported", tok[3])}
	}
	sp.anyYear = true
	if len(tok) == 7 && tok[6] != "*" {
		sp.anyYear = false
		if err = sp.parseYears(tok[6]); err != nil {
			return Schedule{}, err
		}
	}
	return Schedule{sp: &sp, interval: isInterval(tok[0]) || isInterval(tok[1]) || isInterval(tok[2])}, nil
}

// isInterval reports whether a time-of-day field repeats ("*", "*/5", "0/15",
// "8-17") rather than naming fixed values. Quartz fires such schedules through
// both passes of a repeated fall-back hour; see the package comment.
func isInterval(tok string) bool {
	return strings.ContainsAny(tok, "*/-")
}

// parseSet parses a comma list of values, ranges and steps into a bit set.
func parseSet(tok string, f field) (uint64, error) {
	var set uint64
	for _, item := range strings.Split(tok, ",") {
		lo, hi, step, err := parseItem(item, f)
		if err != nil {
			return 0, &FieldError{Field: f.name, Value: tok, Reason: err.Error()}
		}
		if hi >= lo {
			for v := lo; v <= hi; v += step {
				set |= 1 << uint(v)
			}
			continue
		}
		// A wrapped range (Quartz only), e.g. hours 22-2: 22, 23, 0, 1, 2.
		size := f.max - f.min + 1
		for n := 0; n < (f.max-lo+1)+(hi-f.min+1); n += step {
			v := lo + n
			if v > f.max {
				v -= size
			}
			set |= 1 << uint(v)
		}
	}
	return set, nil
}

// parseItem parses one list item: "*", "?", "a", "a-b", with an optional "/step".
func parseItem(item string, f field) (lo, hi, step int, err error) {
	step = 1
	base := item
	if i := strings.IndexByte(item, '/'); i >= 0 {
		base = item[:i]
		step, err = strconv.Atoi(item[i+1:])
		if err != nil || step < 1 {
			return 0, 0, 0, fmt.Errorf("step %q is not a whole number of 1 or more", item[i+1:])
		}
		if step > f.max-f.min+1 {
			return 0, 0, 0, fmt.Errorf("step %d is larger than the field's range %d-%d", step, f.min, f.max)
		}
	}
	switch {
	case base == "*":
		return f.min, f.max, step, nil
	case strings.Contains(base, "?"):
		return 0, 0, 0, errors.New("'?' stands alone, and only in day-of-month or day-of-week (Quartz)")
	case base == "":
		return 0, 0, 0, errors.New("empty value")
	}
	if i := strings.IndexByte(base, '-'); i > 0 {
		if lo, err = value(base[:i], f); err != nil {
			return 0, 0, 0, err
		}
		if hi, err = value(base[i+1:], f); err != nil {
			return 0, 0, 0, err
		}
		if hi < lo && !f.wrap {
			return 0, 0, 0, fmt.Errorf("range %s runs backwards", base)
		}
		return lo, hi, step, nil
	}
	if lo, err = value(base, f); err != nil {
		return 0, 0, 0, err
	}
	if strings.Contains(item, "/") {
		return lo, f.max, step, nil // "a/step": from a to the end of the range
	}
	return lo, lo, 1, nil
}

func value(s string, f field) (int, error) {
	if v, ok := f.names[s]; ok {
		return v, nil
	}
	v, err := strconv.Atoi(s)
	if err != nil {
		return 0, fmt.Errorf("%q is not a number or name", s)
	}
	if v < f.min || v > f.max {
		return 0, fmt.Errorf("%d is outside %d-%d", v, f.min, f.max)
	}
	return v, nil
}

// parseDayOfMonth reads the day-of-month field. Quartz adds '?', L, L-n, LW and nW.
func (sp *spec) parseDayOfMonth(tok string, quartz bool) error {
	f := field{name: "day-of-month", min: 1, max: 31, wrap: quartz}
	if tok == "?" {
		if !quartz {
			return &FieldError{Field: f.name, Value: tok, Reason: "'?' is Quartz syntax; Unix cron uses '*'"}
		}
		sp.domNoSpec, sp.domStar = true, true
		return nil
	}
	if tok == "*" {
		sp.domStar = true
		return nil
	}
	for _, item := range strings.Split(tok, ",") {
		if quartz && (strings.HasPrefix(item, "L") || strings.HasSuffix(item, "W")) {
			r, err := parseDomSpecial(item)
			if err != nil {
				return &FieldError{Field: f.name, Value: tok, Reason: err.Error()}
			}
			sp.domRules = append(sp.domRules, r)
			continue
		}
		set, err := parseSet(item, f)
		if err != nil {
			return &FieldError{Field: f.name, Value: tok, Reason: err.(*FieldError).Reason}
		}
		sp.dom |= set
	}
	return nil
}

// lastDaySyntax is Quartz's grammar of the 'L' family in day-of-month: L,
// L-n, LW, L-nW, LW-m, L-nW-m.
var lastDaySyntax = regexp.MustCompile(`^L(?:-(\d+))?(W(?:-(\d+))?)?$`)

func parseDomSpecial(item string) (domRule, error) {
	if strings.HasPrefix(item, "L") {
		m := lastDaySyntax.FindStringSubmatch(item)
		if m == nil {
			return domRule{}, fmt.Errorf("%q: 'L' is valid as L, L-n, LW, L-nW or LW-m", item)
		}
		r := domRule{kind: domLast, weekday: m[2] != ""}
		var err error
		if m[1] != "" {
			if r.n, err = strconv.Atoi(m[1]); err != nil || r.n > 30 {
				return domRule{}, fmt.Errorf("offset from the last day in %q must be 0-30", item)
			}
		}
		if m[3] != "" {
			if r.after, err = strconv.Atoi(m[3]); err != nil || r.after > 30 {
				return domRule{}, fmt.Errorf("offset from the last weekday in %q must be 0-30", item)
			}
		}
		return r, nil
	}
	n, err := strconv.Atoi(item[:len(item)-1])
	if err != nil || n < 1 || n > 31 {
		return domRule{}, fmt.Errorf("'W' in %q needs a day of 1-31 before it", item)
	}
	return domRule{kind: domNearestWeekday, n: n}, nil
}

// parseDayOfWeek reads the day-of-week field into 0 (Sunday) to 6 (Saturday).
// Quartz adds '?', nL (last such day of the month) and n#k (k-th such day).
func (sp *spec) parseDayOfWeek(tok string, quartz bool) error {
	if tok == "?" {
		if !quartz {
			return &FieldError{Field: "day-of-week", Value: tok, Reason: "'?' is Quartz syntax; Unix cron uses '*'"}
		}
		sp.dowNoSpec, sp.dowStar = true, true
		return nil
	}
	if tok == "*" {
		sp.dowStar = true
		return nil
	}
	if !quartz {
		// Unix: 0-7, both 0 and 7 are Sunday.
		set, err := parseSet(tok, field{name: "day-of-week", max: 7, names: unixDayNames})
		if err != nil {
			return err
		}
		if set&(1<<7) != 0 {
			set = set&^(1<<7) | 1
		}
		sp.dow = set
		return nil
	}
	f := field{name: "day-of-week", min: 1, max: 7, names: quartzDayNames, wrap: true}
	fail := func(reason string) error { return &FieldError{Field: f.name, Value: tok, Reason: reason} }
	if tok == "L" {
		sp.dow = 1 << 6 // 'L' alone is the last day of the week, Saturday
		return nil
	}
	if strings.ContainsAny(tok, "L#") {
		if strings.Contains(tok, ",") {
			return fail("'L' or '#' cannot be combined with other days (Quartz does not support it)")
		}
		if i := strings.IndexByte(tok, '#'); i >= 0 {
			d, err := value(tok[:i], f)
			if err != nil {
				return fail(err.Error())
			}
			k, err := strconv.Atoi(tok[i+1:])
			if err != nil || k < 1 || k > 5 {
				return fail("'#' must be followed by 1-5")
			}
			sp.dowNth, sp.dowNthDay = k, d-1
			return nil
		}
		if !strings.HasSuffix(tok, "L") {
			return fail("'L' must follow a day, as in 6L or FRIL")
		}
		d, err := value(tok[:len(tok)-1], f)
		if err != nil {
			return fail(err.Error())
		}
		sp.dowLast, sp.dowNthDay = true, d-1
		return nil
	}
	for _, item := range strings.Split(tok, ",") {
		if i := strings.IndexByte(item, '/'); i >= 0 {
			if _, named := f.names[item[:i]]; named {
				// Quartz.NET reads NAME/n as "every n-th week", counted from
				// wherever a search starts, so its fire times are not fixed.
				return fail("a day name followed by '/' is Quartz.NET's every-n-th-week form, which is not supported; write the days as numbers (2/2 is MON, WED, FRI)")
			}
		}
	}
	set, err := parseSet(tok, f)
	if err != nil {
		return err
	}
	sp.dow = set >> 1 // Quartz 1-7 to 0-6
	return nil
}

func (sp *spec) parseYears(tok string) error {
	f := field{name: "year", min: minYear, max: maxYear}
	for _, item := range strings.Split(tok, ",") {
		lo, hi, step, err := parseItem(item, f)
		if err != nil {
			return &FieldError{Field: f.name, Value: tok, Reason: err.Error()}
		}
		for y := lo; y <= hi; y += step {
			sp.years[(y-minYear)/64] |= 1 << uint((y-minYear)%64)
		}
	}
	return nil
}
