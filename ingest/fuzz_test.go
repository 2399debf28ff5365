package ingest

// Fuzz targets for Parse, Rules.Check and CompileGlobs. Run one with
//
//	go test -run XXX -fuzz '^FuzzParseHeaderValues$' -fuzztime 60s ./ingest/
//	go test -run XXX -fuzz '^FuzzDueTimeStrings$' -fuzztime 60s ./ingest/
//	go test -run XXX -fuzz '^FuzzGlobs$' -fuzztime 60s ./ingest/
//
// A plain `go test` runs the f.Add seeds and the committed corpus under
// testdata/fuzz/<FuzzName>/ as regular tests.

import (
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/intake"
	"github.com/delaybridge/delaybridge/protocol/nsbtimeout"
	"github.com/delaybridge/delaybridge/wire"
)

var (
	fzReceived = time.Date(2026, 11, 21, 19, 0, 0, 0, time.UTC)
	fzDue      = "2026-11-21T20:00:00Z"
	fzExpire   = "2026-11-21 20:00:00:250000 Z"

	// Contract §2.3 due times: year 0000 to 2262-04-11T23:47:16.854775807Z.
	fzMinDue = time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC)
	fzEndDue = time.Date(2262, 4, 11, 23, 47, 16, 854775808, time.UTC) // exclusive

	// NServiceBus DateTimeExtensions.ToWireFormattedString, written out
	// independently of parse.go (ASCII digits only).
	fzNSBWire = regexp.MustCompile(`^[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}:[0-9]{1,9} Z$`)
	fzNSBZero = regexp.MustCompile(`^0001-01-01 00:00:00:0{1,9} Z$`)
	fzDecimal = regexp.MustCompile(`^[+-]?[0-9]{1,12}$`) // always fits: 12 digits < 2^63 ns / 1e6

	fzRuleGlobs = fzMustGlobs("orders*", "q?", "*.eu")
	fzStar      = fzMustGlobs("*")
)

const (
	fzMaxErrBytes   = 400  // the brief: Parse's reason fits in a header
	fzMaxCheckBytes = 1024 // Check quotes a destination of at most 255 bytes
	fzHugeBytes     = 1 << 20
	// The longest x-delay whose due time a time.Duration can hold.
	fzMaxDelayMs = math.MaxInt64 / int64(time.Millisecond)
)

func fzMustGlobs(p ...string) *Globs {
	g, err := CompileGlobs(p)
	if err != nil {
		panic(err)
	}
	return g
}

// ---------------------------------------------------------------------------
// Regression tests for what the fuzz targets found.

// An AMQP timestamp is any int64 of seconds on the wire; FuzzParseHeaderValues
// found x-due-at timestamps outside years 0000 to 9999 accepted unchecked
// (testdata/fuzz/FuzzParseHeaderValues/timestamp-year-*).
func TestParseTimestampDueAtOutsideYears0000To9999(t *testing.T) {
	for _, c := range []struct {
		due  time.Time
		want bool
	}{
		{time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC), true},
		{time.Unix(-62167219200, 0), true}, // 0000-01-01T00:00:00Z
		{time.Date(2262, 4, 11, 23, 47, 16, 0, time.UTC), true},
		{time.Date(2262, 4, 12, 13, 47, 16, 0, time.FixedZone("+14", 14*3600)), true},
		{time.Date(2262, 4, 11, 23, 47, 17, 0, time.UTC), false},
		{time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC), false},
		{time.Date(9999, 12, 31, 23, 59, 59, 0, time.FixedZone("+14", 14*3600)), false},
		{time.Unix(1763755200, 0), true},
		{time.Unix(-1, 0), true},
		{time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC), false},
		{time.Date(9999, 12, 31, 23, 59, 59, 0, time.FixedZone("-1s", -1)), false},
		{time.Date(-1, 12, 31, 23, 59, 59, 999999999, time.UTC), false},
		{time.Date(0, 1, 1, 0, 0, 0, 0, time.FixedZone("+1s", 1)), false},
		{time.Date(300000, 1, 1, 0, 0, 0, 0, time.UTC), false},
		{time.Unix(253402300800, 0), false}, // 10000-01-01T00:00:00Z
		{time.Unix(math.MaxInt64, 0), false},
		{time.Unix(math.MinInt64, 0), false},
		{time.Unix(-1<<62, 0), false},
	} {
		d := &amqp.Delivery{MessageId: "m1", Headers: amqp.Table{wire.HeaderDestination: "q", wire.HeaderDueAt: c.due}}
		p, err := nsbtimeout.Parse(d, fzReceived)
		if c.want {
			if err != nil || !p.DueAt.Equal(c.due) {
				t.Errorf("x-due-at timestamp %s: got %s, %v", c.due, p.DueAt, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), "outside years 0000 to 2262") || len(err.Error()) > fzMaxErrBytes {
			t.Errorf("x-due-at timestamp %s: got due %s, error %v; want it refused as outside years 0000 to 2262", c.due, p.DueAt, err)
		}
	}
}

// 0001-01-01T00:00:00Z is a valid RFC 3339 due time in years 0000 to 9999
// (docs/contract.md §2: in the past, so due at once), and it is time.Time's zero
// value. That is why the fuzz targets allow a zero DueAt for exactly this
// instant and no other input.
func TestParseZeroInstantIsAValidDueTime(t *testing.T) {
	for _, h := range []amqp.Table{
		{wire.HeaderDestination: "q", wire.HeaderDueAt: "0001-01-01T00:00:00Z"},
		{wire.HeaderDestination: "q", wire.HeaderDueAt: "0001-01-01T01:00:00+01:00"},
		{wire.HeaderDestination: "q", wire.HeaderDueAt: time.Time{}},
		{wire.HeaderDestination: "q", wire.HeaderNSBExpire: "0001-01-01 00:00:00:000000 Z"},
	} {
		p, err := nsbtimeout.Parse(&amqp.Delivery{MessageId: "m1", Headers: h}, fzReceived)
		if err != nil || !p.DueAt.Equal(time.Time{}) || !fzZeroInstant(h) {
			t.Errorf("%v: got %s, %v", h, p.DueAt, err)
		}
	}
}

// ---------------------------------------------------------------------------
// FuzzParseHeaderValues

// Flag bits of FuzzParseHeaderValues.
const (
	fzHuge    = 1<<0 | 1<<6 | 1<<7 // all three: strings and byte arrays repeated to 1 MiB (slow, so rare)
	fzExtreme = 1 << 1             // integers at their type's min or max; floats NaN, ±Inf, -0, ...
	fzTimeBit = 2                  // bits 2-3: how the time.Time is made (see fzSrc.time)
	fzNow     = 1 << 4             // receivedAt is time.Now(), with a monotonic reading
	fzZone    = 1 << 5             // the time.Time is in a far-off fixed zone
)

// The AMQP field value types amqp091-go decodes (plus Go's int, which
// publishers in the same process may use).
var fzKindNames = [...]string{
	"nil", "bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "int",
	"float32", "float64", "decimal", "string", "bytes", "timestamp", "table", "array",
}

const fzKinds = byte(len(fzKindNames))

// fzSrc makes AMQP values of every type from the fuzzer's raw material.
type fzSrc struct {
	flags byte
	raw   []byte
	s     string
	i     int64
	u     uint64
	f     float64

	hugeS string
	hugeB []byte
}

func (src *fzSrc) has(bits byte) bool { return src.flags&bits == bits }

// ext picks the type's minimum for negative i and its maximum otherwise.
func (src *fzSrc) ext(lo, hi int64) int64 {
	if src.i < 0 {
		return lo
	}
	return hi
}

// fzInt is an integer of type T, one of the types an AMQP table value
// decodes to: the type's minimum or maximum when extreme (ext), else i
// converted to T.
func fzInt[T int8 | uint8 | int16 | uint16 | int32 | uint32 | int64 | int](src *fzSrc, extreme bool, lo, hi int64) T {
	if extreme {
		return T(src.ext(lo, hi))
	}
	return T(src.i)
}

func (src *fzSrc) value(sel byte, depth int) any {
	x := src.has(fzExtreme)
	switch sel % fzKinds {
	case 0:
		return nil
	case 1:
		return src.u&1 == 1
	case 2:
		return fzInt[int8](src, x, math.MinInt8, math.MaxInt8)
	case 3:
		return fzInt[uint8](src, x, 0, math.MaxUint8)
	case 4:
		return fzInt[int16](src, x, math.MinInt16, math.MaxInt16)
	case 5:
		return fzInt[uint16](src, x, 0, math.MaxUint16)
	case 6:
		return fzInt[int32](src, x, math.MinInt32, math.MaxInt32)
	case 7:
		return fzInt[uint32](src, x, 0, math.MaxUint32)
	case 8:
		return fzInt[int64](src, x, math.MinInt64, math.MaxInt64)
	case 9:
		return fzInt[int](src, x, math.MinInt, math.MaxInt)
	case 10:
		return float32(src.float())
	case 11:
		return src.float()
	case 12:
		if x {
			return amqp.Decimal{Scale: math.MaxUint8, Value: int32(src.ext(math.MinInt32, math.MaxInt32))}
		}
		return amqp.Decimal{Scale: uint8(src.u), Value: int32(src.i)}
	case 13:
		return src.str()
	case 14:
		return src.bytes()
	case 15:
		return src.time()
	case 16:
		t := amqp.Table{}
		for k, sel := range src.children(depth) {
			key := [...]string{wire.HeaderDestination, wire.HeaderDueAt, wire.HeaderDelay, "", src.s}[k%5]
			t[key] = src.value(sel, depth+1)
		}
		return t
	default:
		a := []any{}
		for _, sel := range src.children(depth) {
			a = append(a, src.value(sel, depth+1))
		}
		return a
	}
}

// children returns the kinds of a table's or array's elements: up to three,
// chosen by raw, and none below depth 3 (empty containers).
func (src *fzSrc) children(depth int) []byte {
	if depth >= 3 || len(src.raw) == 0 {
		return nil
	}
	n := int(src.raw[0]) % 4
	kids := make([]byte, n)
	for k := range kids {
		kids[k] = src.raw[(1+depth*3+k)%len(src.raw)]
	}
	return kids
}

func (src *fzSrc) float() float64 {
	if !src.has(fzExtreme) {
		return src.f
	}
	return [...]float64{
		math.NaN(), math.Inf(1), math.Inf(-1), math.Copysign(0, -1),
		math.MaxFloat64, math.SmallestNonzeroFloat64, 1 << 63, -1 << 63,
	}[src.u%8]
}

func (src *fzSrc) str() string {
	if !src.has(fzHuge) {
		return src.s
	}
	if src.hugeS == "" {
		unit := src.s
		if unit == "" {
			unit = "9"
		}
		src.hugeS = strings.Repeat(unit, fzHugeBytes/len(unit)+1)
	}
	return src.hugeS
}

func (src *fzSrc) bytes() []byte {
	if !src.has(fzHuge) {
		return src.raw
	}
	if src.hugeB == nil {
		unit := string(src.raw)
		if unit == "" {
			unit = "\xff"
		}
		src.hugeB = []byte(strings.Repeat(unit, fzHugeBytes/len(unit)+1))
	}
	return src.hugeB
}

func (src *fzSrc) time() time.Time {
	var t time.Time
	switch (src.flags >> fzTimeBit) & 3 {
	case 0: // what amqp091-go decodes from the wire: any int64 of seconds
		t = time.Unix(src.i, 0)
	case 1: // a calendar date at the edges of, or far outside, years 0000 to 9999
		years := [...]int{1, 0, 9999, 10000, 300000, -1, 1970, int(int32(src.i))}
		u := src.u
		year := years[u%8]
		if year == 9999 && u&8 != 0 { // the last representable instant
			t = time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC)
			break
		}
		t = time.Date(year, time.Month(u>>8%12+1), int(u>>16%31+1), int(u>>24%24), int(u>>32%60), int(u>>40%60), int(src.i%1e9), time.UTC)
	case 2:
		t = time.Time{}
	default: // Unix seconds with nanoseconds, negative included
		t = time.Unix(src.i, int64(src.u%2e9)-1e9)
	}
	if src.has(fzZone) {
		t = t.In(time.FixedZone("far", [...]int{14 * 3600, -12 * 3600, 1, -1}[src.u%4]))
	}
	return t
}

// fzText is the message-id property a value stands for.
func fzText(v any, fallback string) string {
	switch v := v.(type) {
	case string:
		return v
	case []byte:
		return string(v)
	}
	return fallback
}

// fzShow describes a value briefly, whatever its size.
func fzShow(v any) string {
	s := fmt.Sprintf("%T %#v", v, v)
	if len(s) > 300 {
		s = fmt.Sprintf("%s… (%d bytes)", s[:300], len(s))
	}
	return s
}

func fzShowDelivery(d *amqp.Delivery) string {
	var b strings.Builder
	fmt.Fprintf(&b, "message-id %s; headers:", fzShow(d.MessageId))
	for k, v := range d.Headers {
		fmt.Fprintf(&b, " %q=%s", k, fzShow(v))
	}
	return b.String()
}

// fzValidName reports whether s is a usable queue name or message id.
func fzValidName(s string) bool {
	return s != "" && len(s) <= 255 && utf8.ValidString(s) && strings.IndexFunc(s, unicode.IsControl) < 0
}

func fzPresent(h amqp.Table, name string) bool { return h[name] != nil }

// fzZeroInstant reports whether the due-time header Parse reads names
// 0001-01-01T00:00:00Z, the one valid due time that is time.Time's zero value.
func fzZeroInstant(h amqp.Table) bool {
	switch {
	case fzPresent(h, wire.HeaderDueAt):
		switch v := h[wire.HeaderDueAt].(type) {
		case time.Time:
			return v.Equal(time.Time{})
		case string, []byte:
			t, err := time.Parse(time.RFC3339Nano, strings.ToUpper(strings.TrimSpace(fzText(v, ""))))
			return err == nil && t.Equal(time.Time{})
		}
	case fzPresent(h, wire.HeaderNSBExpire):
		return fzNSBZero.MatchString(fzText(h[wire.HeaderNSBExpire], ""))
	}
	return false
}

// fzParse runs Parse twice and checks what must hold of any result.
func fzParse(t *testing.T, what string, d *amqp.Delivery, r time.Time) (intake.Parsed, error) {
	t.Helper()
	keys := make([]string, 0, len(d.Headers))
	for k := range d.Headers {
		keys = append(keys, k)
	}
	p, err := nsbtimeout.Parse(d, r)
	p2, err2 := nsbtimeout.Parse(d, r)
	if p != p2 || fmt.Sprint(err) != fmt.Sprint(err2) {
		t.Fatalf("%s: Parse is not deterministic: %+v, %v then %+v, %v\n%s", what, p, err, p2, err2, fzShowDelivery(d))
	}
	if len(d.Headers) != len(keys) {
		t.Fatalf("%s: Parse changed the headers", what)
	}
	for _, k := range keys {
		if _, ok := d.Headers[k]; !ok {
			t.Fatalf("%s: Parse removed header %q", what, k)
		}
	}
	if err != nil {
		msg := err.Error()
		if msg == "" || len(msg) > fzMaxErrBytes || !utf8.ValidString(msg) {
			t.Fatalf("%s: bad reason (%d bytes, empty, over %d or not UTF-8): %.500q\n%s", what, len(msg), fzMaxErrBytes, msg, fzShowDelivery(d))
		}
		return p, err
	}

	if dest := p.Destination; !(dest.IsQueue() && fzValidName(dest.Key)) &&
		!(!dest.IsQueue() && fzValidName(dest.Exchange) && dest.Exchange != "amq.default" && (dest.Key == "" || fzValidName(dest.Key))) {
		t.Fatalf("%s: accepted destination %.300q (%d bytes)\n%s", what, dest, len(dest.Key), fzShowDelivery(d))
	}
	if p.ID != "" && !fzValidName(p.ID) {
		t.Fatalf("%s: accepted id %.300q (%d bytes)\n%s", what, p.ID, len(p.ID), fzShowDelivery(d))
	}
	if p.DueAt.IsZero() && !fzZeroInstant(d.Headers) {
		t.Fatalf("%s: accepted with a zero due time\n%s", what, fzShowDelivery(d))
	}
	viaDelay := !fzPresent(d.Headers, wire.HeaderDueAt) && !fzPresent(d.Headers, wire.HeaderNSBExpire)
	switch {
	case viaDelay && !fzPresent(d.Headers, wire.HeaderDelay):
		t.Fatalf("%s: accepted without a due-time header: %+v", what, p)
	case viaDelay:
		if p.DueAt.Before(r) || p.DueAt.Sub(r) > time.Duration(fzMaxDelayMs)*time.Millisecond || !p.DueAt.Before(fzEndDue) {
			t.Fatalf("%s: x-delay gave due %s for receivedAt %s\n%s", what, p.DueAt, r, fzShowDelivery(d))
		}
	case p.DueAt.Before(fzMinDue) || !p.DueAt.Before(fzEndDue):
		t.Fatalf("%s: accepted due %s, outside years 0000 to 2262\n%s", what, p.DueAt, fzShowDelivery(d))
	}
	fzCheckRules(t, what, p, r)
	return p, nil
}

// fzCheckRules checks Rules.Check on an accepted message.
func fzCheckRules(t *testing.T, what string, p intake.Parsed, r time.Time) {
	t.Helper()
	if err := (Rules{}).Check(p, math.MaxInt, r); err != nil {
		t.Fatalf("%s: Rules{} refused %+v: %v", what, p, err)
	}
	rules := Rules{MaxDelay: time.Hour, MaxMessageBytes: 10, Allowed: fzRuleGlobs, Reserved: []string{"delaybridge.Timeouts"}}
	for _, size := range []int{0, 10, 11} {
		err := rules.Check(p, size, r)
		if err != nil {
			if msg := err.Error(); len(msg) > fzMaxCheckBytes || !utf8.ValidString(msg) {
				t.Fatalf("%s: Check reason is %d bytes or not UTF-8: %.300q", what, len(msg), msg)
			}
		}
		mustFail := size > 10 || !fzRuleGlobs.Allows(p.Destination) || p.DueAt.Sub(r) > time.Hour
		if mustFail != (err != nil) {
			t.Fatalf("%s: Check(%+v, %d) = %v", what, p, size, err)
		}
	}
	reserved := Rules{Reserved: []string{p.Destination.Key}}
	if p.Destination.IsQueue() && reserved.Check(p, 0, r) == nil {
		t.Fatalf("%s: Check allowed reserved destination %q", what, p.Destination)
	}
}

func FuzzParseHeaderValues(f *testing.F) {
	type seed struct {
		sel, sel2, flags byte
		raw              []byte
		s, s2            string
		i                int64
		u                uint64
		fl               float64
	}
	add := func(s seed) { f.Add(s.sel, s.sel2, s.flags, s.raw, s.s, s.s2, s.i, s.u, s.fl) }
	const (
		kNil, kBool, kI8, kU8, kI16, kU16, kI32, kU32, kI64, kInt = 0, 1, 2, 3, 4, 5, 6, 7, 8, 9
		kF32, kF64, kDec, kStr, kBytes, kTime, kTable, kArray     = 10, 11, 12, 13, 14, 15, 16, 17
	)
	// Every kind, plain and at its extremes.
	for k := byte(0); k < fzKinds; k++ {
		add(seed{k, kStr, 0, []byte("orders"), "orders", "billing", 1500, 0, 1.5})
		add(seed{k, kBytes, fzExtreme, []byte{3, 16, 17, 13}, "", "", -1, 3, 0})
		add(seed{k, kStr, fzExtreme, nil, "", "q", 1, 4, 0})
	}
	// Huge strings and byte arrays, alone and nested (one seed each: they are slow).
	for _, k := range []byte{kStr, kBytes, kTable, kArray} {
		add(seed{k, kStr, fzHuge, []byte{2, kStr, kBytes}, "9", "q", 0, 0, 0})
	}
	// (1 MiB of "\xff" or "é" as x-due-at is the slowest: see the committed
	// corpus files huge-invalid-utf8-bytes and huge-due-at-non-ascii.)
	for _, s := range []string{"", "\u0378", " ", "a\x00b", fzDue, fzExpire, "2026-11-21T20:00:00Z "} {
		add(seed{kStr, kBytes, fzHuge, []byte(s), s, "q", 0, 0, 0})
	}
	// Integers around the x-delay limit and the type limits.
	for _, i := range []int64{0, -1, 1, math.MinInt8, math.MaxInt8, math.MaxUint8, math.MinInt16, math.MaxUint16,
		math.MinInt32, math.MaxInt32, math.MaxUint32, fzMaxDelayMs, fzMaxDelayMs + 1, math.MinInt64, math.MaxInt64} {
		for _, k := range []byte{kI8, kU8, kI16, kU16, kI32, kU32, kI64, kInt, kDec} {
			add(seed{k, kStr, 0, nil, "", "q", i, 0, 0})
		}
	}
	// Floats: NaN, ±Inf, -0, huge and tiny.
	for u := uint64(0); u < 8; u++ {
		add(seed{kF64, kStr, fzExtreme, nil, "", "q", 0, u, 0})
		add(seed{kF32, kStr, fzExtreme, nil, "", "q", 0, u, 0})
	}
	add(seed{kF64, kStr, 0, nil, "", "q", 0, 0, 1500})
	// Timestamps: every year of fzSrc.time, the zero time, Unix extremes, far zones.
	for u := uint64(0); u < 16; u++ {
		add(seed{kTime, kStr, 1 << fzTimeBit, nil, "", "q", 1, u, 0})
		add(seed{kTime, kStr, 1<<fzTimeBit | fzZone, nil, "", "q", -1, u, 0})
	}
	for _, sec := range []int64{0, -1, -62135596800, -62167219200, -62167219201, 253402300799, 253402300800,
		9214646400, math.MinInt64, math.MaxInt64, 1763755200} {
		add(seed{kTime, kStr, 0, nil, "", "q", sec, 0, 0})
		add(seed{kTime, kStr, 3 << fzTimeBit, nil, "", "q", sec, 0, 0})
		add(seed{kTime, kStr, fzZone, nil, "", "q", sec, 1, 0})
	}
	add(seed{kTime, kStr, 2 << fzTimeBit, nil, "", "q", 0, 0, 0})
	add(seed{kTime, kStr, 2<<fzTimeBit | fzZone, nil, "", "q", 0, 0, 0})
	// Strings: destinations, ids, every due-time form, invalid UTF-8.
	for _, s := range []string{
		"", " ", "\t\n", "\u00a0", "\u0085", "q", "orders", "a\x00b", "a\nb", "\x7f", "\u200b", "\ufeff",
		"\xff", "\xff\xfe", "\xc3", "é", "\u0378", strings.Repeat("\u0378", 127), strings.Repeat("q", 255), strings.Repeat("q", 256),
		strings.Repeat("é", 127) + "q", strings.Repeat("é", 128), strings.Repeat("\x00", 300),
		fzDue, "2026-11-21t20:00:00.5z", " 2026-11-21T20:00:00Z\n", "2026-11-21T20:00:00",
		"0001-01-01T00:00:00Z", "0000-01-01T00:00:00Z", "0000-01-01T00:00:00+00:01", "9999-12-31T23:59:59.999999999Z",
		"9999-12-31T23:59:59-00:01", "2026-11-21T20:00:00,5Z", "2026-11-21T20:00:00+24:00", "2026-11-21T20:00:00+00:60",
		"2026-02-29T00:00:00Z", "2026-11-21T20:00:60Z", "2026-11-21T20:00:00.1234567890Z",
		fzExpire, "2026-11-21 20:00:00:1234567 Z", "0001-01-01 00:00:00:0 Z", "0000-01-01 00:00:00:000000 Z",
		"9999-12-31 23:59:59:999999999 Z", "2026-11-21 20:00:00:1234567890 Z", "2026-13-41 20:00:00:000000 Z",
		"2026-11-21 24:00:00:0 Z", "٢٠٢٦-11-21 20:00:00:0 Z", "2026-11-21 20:00:00:250000 Z\n",
		"0", "-0", "+15", " 1500 ", "-5", "9223372036854", "9223372036855", "9223372036854775807",
		"9223372036854775808", "-9223372036854775808", "1_000", "0x10", "1e3", "1.5", "١٢٣",
	} {
		add(seed{kStr, kStr, 0, []byte(s), s, "orders", 0, 0, 0})
		add(seed{kBytes, kStr, 0, []byte(s), s, s, 0, 0, 0})
	}
	// Nested tables and arrays holding every kind, including each other.
	for k := byte(0); k < fzKinds; k++ {
		add(seed{kTable, kArray, 0, []byte{3, k, kTable, kArray, k, kStr, kTime, kTable, kArray, kI64}, "x-destination", "q", 7, 0, 0})
		add(seed{kArray, kTable, fzExtreme, []byte{3, kArray, k, kTable, kBytes, kStr, kF64, kArray, kTable}, "", "", -7, 0, 0})
	}
	// The seeds of the former FuzzParse: dest, due time and id as strings.
	add(seed{kStr, kStr, 0, []byte("id"), "2026-11-21T20:00:00Z", "orders", 7, 0, 0})
	add(seed{kStr, kStr, 0, []byte("id"), "2026-11-21 20:00:00:250000 Z", "orders", 7, 0, 0})
	add(seed{kStr, kStr, 0, []byte("id"), "1500", "orders", 7, 0, 0})
	add(seed{kI64, kStr, 0, []byte(""), "", "", -1, 0, 0})
	add(seed{kStr, kStr, 0, []byte("\x00"), "9999-99-99T99:99:99Z", "\xff", 1 << 62, 0, 0})
	add(seed{kStr, kStr, 0, []byte("\x00"), "0000-00-00 00:00:00:0 Z", "\xff", 1 << 62, 0, 0})
	add(seed{kStr, kStr, 0, []byte("\x00"), "-9223372036854775808", "\xff", 1 << 62, 0, 0})
	add(seed{kI64, kStr, 0, []byte("\x00"), "", "\xff", 1 << 62, 0, 0})

	baseline, err := nsbtimeout.Parse(&amqp.Delivery{MessageId: "m1", Headers: amqp.Table{wire.HeaderDestination: "orders", wire.HeaderDueAt: fzDue}}, fzReceived)
	if err != nil {
		f.Fatal(err)
	}
	expireBaseline, err := nsbtimeout.Parse(&amqp.Delivery{MessageId: "m1", Headers: amqp.Table{wire.HeaderDestination: "orders", wire.HeaderNSBExpire: fzExpire}}, fzReceived)
	if err != nil {
		f.Fatal(err)
	}

	f.Fuzz(func(t *testing.T, sel, sel2, flags byte, raw []byte, s, s2 string, i int64, u uint64, fl float64) {
		src := &fzSrc{flags: flags, raw: raw, s: s, i: i, u: u, f: fl}
		v := src.value(sel, 0)
		// A second, independent value (never huge) for the pairs below.
		src2 := &fzSrc{flags: flags &^ fzHuge, raw: []byte(s2), s: s2, i: ^i, u: u >> 7, f: -fl}
		v2 := src2.value(sel2, 0)
		r := fzReceived
		if src.has(fzNow) {
			r = time.Now()
		}
		kind := fzKindNames[sel%fzKinds]
		str, isStr := v.(string)
		if b, ok := v.([]byte); ok {
			str, isStr = string(b), true
		}
		want := func(what string, err error, ok bool) {
			t.Helper()
			if ok != (err == nil) {
				t.Fatalf("%s %s = %s: accepted %v, want %v (%v)", what, kind, fzShow(v), err == nil, ok, err)
			}
		}

		// 1. The value alone in each slot, every other field valid.
		for _, name := range []string{wire.HeaderDestination, wire.HeaderNSBDestination} {
			p, err := fzParse(t, name, &amqp.Delivery{MessageId: "m1", Headers: amqp.Table{name: v, wire.HeaderDueAt: fzDue}}, r)
			want(name, err, isStr && fzValidName(str))
			if err == nil && p.Destination != wire.Queue(str) {
				t.Fatalf("%s: destination %q, want %q", name, p.Destination, str)
			}
		}
		{
			p, err := fzParse(t, wire.HeaderDueAt, &amqp.Delivery{MessageId: "m1", Headers: amqp.Table{wire.HeaderDestination: "orders", wire.HeaderDueAt: v}}, r)
			switch v := v.(type) {
			case time.Time:
				want(wire.HeaderDueAt, err, !v.Before(fzMinDue) && v.Before(fzEndDue))
				if err == nil && !p.DueAt.Equal(v) {
					t.Fatalf("x-due-at %s: due %s", v, p.DueAt)
				}
			case string, []byte:
			default:
				want(wire.HeaderDueAt, err, false)
			}
		}
		{
			_, err := fzParse(t, wire.HeaderNSBExpire, &amqp.Delivery{MessageId: "m1", Headers: amqp.Table{wire.HeaderDestination: "orders", wire.HeaderNSBExpire: v}}, r)
			if err == nil && (!isStr || !fzNSBWire.MatchString(str)) {
				t.Fatalf("accepted %s %s", wire.HeaderNSBExpire, fzShow(v))
			}
		}
		{
			p, err := fzParse(t, wire.HeaderDelay, &amqp.Delivery{MessageId: "m1", Headers: amqp.Table{wire.HeaderDestination: "orders", wire.HeaderDelay: v}}, r)
			var ms int64
			isInt := true
			switch v := v.(type) {
			case int8:
				ms = int64(v)
			case uint8:
				ms = int64(v)
			case int16:
				ms = int64(v)
			case uint16:
				ms = int64(v)
			case int32:
				ms = int64(v)
			case uint32:
				ms = int64(v)
			case int64:
				ms = v
			case int:
				ms = int64(v)
			case float32, float64:
				// Truncated toward zero, as the plugin does; NaN and what
				// no Duration holds are refused.
				f, _ := v.(float64)
				if f32, ok := v.(float32); ok {
					f = float64(f32)
				}
				switch {
				case math.IsNaN(f) || f > float64(fzMaxDelayMs):
					isInt = false
					want(wire.HeaderDelay, err, false)
				case f <= 0:
					ms = 0
				default:
					ms = int64(math.Trunc(f))
				}
			case string, []byte:
				isInt = false
				if fzDecimal.MatchString(strings.TrimSpace(str)) {
					want(wire.HeaderDelay, err, true)
				}
				if err == nil {
					n, perr := strconv.ParseInt(strings.TrimSpace(str), 10, 64)
					if perr != nil {
						t.Fatalf("x-delay %.100q accepted, but it is not a decimal integer", str)
					}
					ms = n
					isInt = true
				}
			default:
				isInt = false
				want(wire.HeaderDelay, err, false)
			}
			if isInt {
				// Accepted when it fits a Duration and its due time the range (§2.3).
				want(wire.HeaderDelay, err, ms <= fzMaxDelayMs && (ms <= 0 || r.Add(time.Duration(ms)*time.Millisecond).Before(fzEndDue)))
				switch {
				case err != nil:
				case ms <= 0 && !p.DueAt.Equal(r):
					t.Fatalf("x-delay %d: due %s, want receivedAt %s", ms, p.DueAt, r)
				case ms > 0 && !p.DueAt.Equal(r.Add(time.Duration(ms)*time.Millisecond)):
					t.Fatalf("x-delay %d: due %s, want %s", ms, p.DueAt, r.Add(time.Duration(ms)*time.Millisecond))
				}
			}
		}
		{
			p, err := fzParse(t, wire.HeaderNSBMessageID, &amqp.Delivery{Headers: amqp.Table{wire.HeaderDestination: "orders", wire.HeaderDueAt: fzDue, wire.HeaderNSBMessageID: v}}, r)
			switch {
			case v == nil || isStr && strings.TrimSpace(str) == "":
				want(wire.HeaderNSBMessageID, err, true)
				if p.ID != "" {
					t.Fatalf("blank %s gave id %q", wire.HeaderNSBMessageID, p.ID)
				}
			case isStr:
				want(wire.HeaderNSBMessageID, err, fzValidName(str))
				if err == nil && p.ID != str {
					t.Fatalf("%s: id %q, want %q", wire.HeaderNSBMessageID, p.ID, str)
				}
			default:
				want(wire.HeaderNSBMessageID, err, false)
			}
		}
		for _, id := range []string{fzText(v, s), s} {
			p, err := fzParse(t, "message-id", &amqp.Delivery{MessageId: id, Headers: amqp.Table{wire.HeaderDestination: "orders", wire.HeaderDueAt: fzDue}}, r)
			blank := strings.TrimSpace(id) == ""
			if ok := blank || fzValidName(id); ok != (err == nil) {
				t.Fatalf("message-id %.300q (%d bytes): accepted %v, want %v (%v)", id, len(id), err == nil, ok, err)
			}
			if err == nil && (blank && p.ID != "" || !blank && p.ID != id) {
				t.Fatalf("message-id %.300q: id %q", id, p.ID)
			}
		}

		// 2. A lower-priority header never matters when the higher one is set.
		for _, c := range []struct {
			h    amqp.Table
			id   string
			want intake.Parsed
		}{
			{amqp.Table{wire.HeaderDestination: "orders", wire.HeaderDueAt: fzDue, wire.HeaderNSBDestination: v}, "m1", baseline},
			{amqp.Table{wire.HeaderDestination: "orders", wire.HeaderDueAt: fzDue, wire.HeaderNSBExpire: v}, "m1", baseline},
			{amqp.Table{wire.HeaderDestination: "orders", wire.HeaderDueAt: fzDue, wire.HeaderDelay: v}, "m1", baseline},
			{amqp.Table{wire.HeaderDestination: "orders", wire.HeaderDueAt: fzDue, wire.HeaderNSBMessageID: v}, "m1", baseline},
			{amqp.Table{wire.HeaderDestination: "orders", wire.HeaderNSBExpire: fzExpire, wire.HeaderDelay: v}, "m1", expireBaseline},
		} {
			p, err := fzParse(t, "precedence", &amqp.Delivery{MessageId: c.id, Headers: c.h}, r)
			if err != nil || p != c.want {
				t.Fatalf("a lower-priority header changed the result: %+v, %v\n%s", p, err, fzShowDelivery(&amqp.Delivery{Headers: c.h}))
			}
		}

		// 3. Destination and due time both from the fuzzer, with both ids.
		for _, dest := range []string{wire.HeaderDestination, wire.HeaderNSBDestination} {
			for _, due := range []string{wire.HeaderDueAt, wire.HeaderNSBExpire, wire.HeaderDelay} {
				h := amqp.Table{dest: v2, due: v, wire.HeaderNSBMessageID: s2}
				fzParse(t, dest+"+"+due, &amqp.Delivery{MessageId: string(raw), Headers: h}, r)
			}
		}

		// 4. The value everywhere at once.
		all := amqp.Table{}
		for _, name := range []string{wire.HeaderDestination, wire.HeaderNSBDestination, wire.HeaderDueAt, wire.HeaderNSBExpire, wire.HeaderDelay, wire.HeaderNSBMessageID} {
			all[name] = v
		}
		fzParse(t, "everywhere", &amqp.Delivery{MessageId: fzText(v, s), Headers: all}, r)
	})
}

// ---------------------------------------------------------------------------
// FuzzDueTimeStrings

// fzFormatNSB writes t in the NServiceBus wire format with digits fractional digits.
func fzFormatNSB(t time.Time, digits int) string {
	t = t.UTC()
	return t.Format("2006-01-02 15:04:05") + ":" + fmt.Sprintf("%09d", t.Nanosecond())[:digits] + " Z"
}

func fzDueAt(t *testing.T, header string, v any) (time.Time, error) {
	t.Helper()
	d := &amqp.Delivery{MessageId: "m1", Headers: amqp.Table{wire.HeaderDestination: "q", header: v}}
	p, err := fzParse(t, header, d, fzReceived)
	return p.DueAt, err
}

func FuzzDueTimeStrings(f *testing.F) {
	for _, s := range []string{
		"", " ", "Z", "T", fzDue, fzExpire, "2026-11-21T20:00:00.250Z", "2026-11-21T22:00:00+02:00",
		"2026-11-21t20:00:00.5z", "2026-11-21T20:00:00.123456789Z", "2026-11-21T20:00:00.1234567890Z",
		" 2026-11-21T20:00:00Z\n", "\u00a02026-11-21T20:00:00Z\u0085", "2026-11-21T20:00:00", "2026-11-21 20:00:00Z",
		"0001-01-01T00:00:00Z", "0000-01-01T00:00:00Z", "0000-01-01T00:00:00+00:01", "0000-01-01T00:00:00-00:01",
		"9999-12-31T23:59:59.999999999Z", "9999-12-31T23:59:59.999999999+00:01", "9999-12-31T23:59:59-00:01",
		"2026-11-21T20:00:00,5Z", "2026-11-21T20:00:00+24:00", "2026-11-21T20:00:00+00:60", "2026-11-21T20:00:00+99:99",
		"2026-11-21T20:00:00-00:00", "2026-02-29T00:00:00Z", "2024-02-29T00:00:00Z", "2026-11-21T20:00:60Z",
		"2026-11-21T24:00:00Z", "+2026-11-21T20:00:00Z", "10000-01-01T00:00:00Z", "-0001-01-01T00:00:00Z",
		"2026-11-21T20:00:00.Z", "2026-11-21T20:00:00ſ", "2026-11-21ı20:00:00Z", "２０２６-11-21T20:00:00Z",
		"2026-11-21 20:00:00:250000 Z", "2026-11-21 20:00:00:1234567 Z", "2026-11-21 20:00:00:1 Z",
		"2026-11-21 20:00:00:123456789 Z", "2026-11-21 20:00:00:1234567890 Z", "2026-11-21 20:00:00: Z",
		"0001-01-01 00:00:00:0 Z", "0000-01-01 00:00:00:000000 Z", "9999-12-31 23:59:59:999999999 Z",
		"2026-13-41 20:00:00:000000 Z", "2026-02-29 00:00:00:0 Z", "2026-11-21 24:00:00:0 Z",
		"2026-11-21 20:00:60:0 Z", "2026-11-21 20:00:00:250000 z", "2026-11-21 20:00:00:250000 Z\n",
		" 2026-11-21 20:00:00:250000 Z", "2026-11-21 20:00:00.250000 Z", "٢٠٢٦-11-21 20:00:00:0 Z",
		"\xff", "2026-11-21T20:00:00Z\xff", strings.Repeat("9", 1000), strings.Repeat("\x00", 100),
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, header := range []string{wire.HeaderDueAt, wire.HeaderNSBExpire} {
			due, err := fzDueAt(t, header, s)
			dueB, errB := fzDueAt(t, header, []byte(s))
			if due != dueB || fmt.Sprint(err) != fmt.Sprint(errB) {
				t.Fatalf("%s %q: string gives %s, %v; bytes give %s, %v", header, s, due, err, dueB, errB)
			}
			if err != nil {
				if !strings.Contains(err.Error(), header) {
					t.Fatalf("%s %q: reason %q does not name the header", header, s, err)
				}
				continue
			}
			if due.Location() != time.UTC {
				t.Fatalf("%s %q: due %s is not in UTC", header, s, due)
			}
			// Round trips: the instant written in either format reads back the same.
			rfc := due.Format(time.RFC3339Nano)
			if back, err := fzDueAt(t, wire.HeaderDueAt, rfc); err != nil || !back.Equal(due) {
				t.Fatalf("%s %q: due %s; as x-due-at %q it reads back %s, %v", header, s, due, rfc, back, err)
			}
			nsb := fzFormatNSB(due, 9)
			if back, err := fzDueAt(t, wire.HeaderNSBExpire, nsb); err != nil || !back.Equal(due) {
				t.Fatalf("%s %q: due %s; as NServiceBus %q it reads back %s, %v", header, s, due, nsb, back, err)
			}
			switch header {
			case wire.HeaderNSBExpire:
				if !fzNSBWire.MatchString(s) {
					t.Fatalf("accepted NServiceBus.Timeout.Expire %q, which is not in the wire format", s)
				}
				// The wire format has no zone and nothing to normalise: the
				// instant written with as many digits is the input itself.
				digits := len(s) - strings.LastIndexByte(s, ':') - 1 - len(" Z")
				if again := fzFormatNSB(due, digits); again != s {
					t.Fatalf("NServiceBus.Timeout.Expire %q read as %s, which is %q", s, due, again)
				}
			case wire.HeaderDueAt:
				// RFC 3339 is case-insensitive and Parse trims spaces.
				for _, alt := range []string{strings.ToLower(s), strings.ToUpper(s), " " + s + "\t"} {
					if back, err := fzDueAt(t, wire.HeaderDueAt, alt); err != nil || !back.Equal(due) {
						t.Fatalf("x-due-at %q is %s, but %q reads %s, %v", s, due, alt, back, err)
					}
				}
			}
		}
	})
}

// ---------------------------------------------------------------------------
// FuzzGlobs

// fzGlob is a reference matcher: * is any run of characters, ? one character.
func fzGlob(pattern, name []rune) bool {
	// match[j]: pattern[:i] matches name[:j]
	match := make([]bool, len(name)+1)
	match[0] = true
	for _, pr := range pattern {
		next := make([]bool, len(name)+1)
		for j := 0; j <= len(name); j++ {
			switch {
			case pr == '*':
				next[j] = match[j] || j > 0 && next[j-1]
			case j == 0:
			case pr == '?' || pr == name[j-1]:
				next[j] = match[j-1]
			}
		}
		match = next
	}
	return match[len(name)]
}

func FuzzGlobs(f *testing.F) {
	for _, c := range [][2]string{
		{"*", ""}, {"*", "any/thing.at all"}, {"orders.*", "orders.eu"}, {"orders.*", "ordersXeu"},
		{" billing ", "billing"}, {" billing ", " billing "}, {"a?c", "abc"}, {"a?c", "aéc"}, {"a?c", "abbc"},
		{"x/*", "x/y/z"}, {"a,,b", "a"}, {"a, ", "a"}, {"", ""}, {" ", " "}, {",", ""},
		{`a.b`, "aXb"}, {`(a|b)`, "a"}, {`a+`, "aa"}, {`[a-z]`, "q"}, {`\d`, "5"}, {`^a$`, "a"}, {`a{2}`, "aa"},
		{`\`, `\`}, {`$`, "$"}, {`.*`, "anything"}, {"*a*a*a*a*a*a*a*a*b", strings.Repeat("a", 100)},
		{"?", "é"}, {"?", "\xff"}, {"\xff", "\xff"}, {"\xff", "\ufffd"}, {"\ufffd", "\xff"}, {"é", "e\u0301"},
		{"a\nb", "a\nb"}, {"*", "a\nb"}, {"a?b", "a\nb"}, {"\x00", "\x00"}, {"q" + strings.Repeat("?", 255), strings.Repeat("q", 256)},
		{"orders*,q?,*.eu", "shop.eu"}, {strings.Repeat("*", 1000), ""}, {strings.Repeat("a,", 500) + "b", "b"},
		{"\u00a0q\u00a0", "q"}, {"\u0085q", "q"}, {"K", "\u212a"}, {"k", "K"},
	} {
		f.Add(c[0], c[1])
	}
	f.Fuzz(func(t *testing.T, patterns, name string) {
		pats := strings.Split(patterns, ",")
		trimmed := make([]string, len(pats))
		empty, valid := false, utf8.ValidString(name)
		patsValid := true
		for k, p := range pats {
			trimmed[k] = strings.TrimSpace(p)
			empty = empty || trimmed[k] == ""
			patsValid = patsValid && utf8.ValidString(trimmed[k])
		}
		valid = valid && patsValid
		g, err := CompileGlobs(pats)
		switch {
		case empty && err == nil:
			t.Fatalf("CompileGlobs(%q) accepted an empty pattern", pats)
		case !patsValid && err == nil:
			t.Fatalf("CompileGlobs(%q) accepted a pattern that is not UTF-8", pats)
		case !empty && patsValid && err != nil && len(patterns) <= 1<<16:
			t.Fatalf("CompileGlobs(%q): %v", pats, err)
		case err != nil:
			if err.Error() == "" {
				t.Fatal("empty error")
			}
			return
		}
		_ = g.String()
		m := g.Match(name)

		if !fzStar.Match(name) {
			t.Fatalf("* does not match %q", name)
		}
		if !fzStar.Match(patterns) || !fzStar.Match(strings.Repeat(name, 3)) {
			t.Fatalf("* does not match %q or %q", patterns, strings.Repeat(name, 3))
		}
		for _, tp := range trimmed {
			if tp == "*" && !m {
				t.Fatalf("patterns %q include * but do not match %q", pats, name)
			}
			// Read literally, every pattern matches itself: * and ? match themselves.
			if !g.Match(tp) {
				t.Fatalf("patterns %q do not match their own %q", pats, tp)
			}
			if strings.ContainsAny(tp, "*?") {
				continue
			}
			single, err := CompileGlobs([]string{tp})
			if err != nil {
				t.Fatalf("CompileGlobs(%q): %v", tp, err)
			}
			if !single.Match(tp) {
				t.Fatalf("literal pattern %q does not match itself", tp)
			}
			// A pattern without * or ? matches exactly itself. Queue names
			// reaching Match are valid UTF-8 (Parse checks them), so that
			// is what is required: an invalid byte in a pattern or a name
			// reads as U+FFFD, and "\xff" matches "\ufffd" and "\xfe".
			if utf8.ValidString(tp) && utf8.ValidString(name) && single.Match(name) != (name == tp) {
				t.Fatalf("literal pattern %q: Match(%q) = %v", tp, name, single.Match(name))
			}
		}
		if valid && len(name) <= 1000 && len(patterns) <= 1000 {
			want := false
			for _, tp := range trimmed {
				want = want || fzGlob([]rune(tp), []rune(name))
			}
			if m != want {
				t.Fatalf("patterns %q: Match(%q) = %v, reference says %v", pats, name, m, want)
			}
		}

		// Rules.Check allows exactly the names Match allows.
		p := intake.Parsed{Destination: wire.Queue(name), DueAt: fzReceived}
		err = Rules{Allowed: g}.Check(p, 0, fzReceived)
		if (err == nil) != m {
			t.Fatalf("Check(%q) = %v but Match = %v", name, err, m)
		}
		if err != nil && fzValidName(name) && len(err.Error()) > fzMaxCheckBytes {
			t.Fatalf("Check reason is %d bytes", len(err.Error()))
		}
	})
}
