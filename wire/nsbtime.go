package wire

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// NServiceBus writes its time headers (NServiceBus.TimeSent,
// NServiceBus.Timeout.Expire, NServiceBus.Retries.Timestamp) in one wire
// format, UTC with microseconds: yyyy-MM-dd HH:mm:ss:ffffff Z, the Z a
// literal (Particular/NServiceBus, src/NServiceBus.Core/DateTimeOffsetHelper.cs,
// ToWireFormattedString; older versions DateTimeExtensions, the same format).
// Readers here accept 1 to 9 fractional digits.
var nsbTime = regexp.MustCompile(`^(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}):(\d{1,9}) Z$`)

// NSBTimeLayout names the format in error text.
const NSBTimeLayout = "yyyy-MM-dd HH:mm:ss:ffffff Z"

// ErrNSBTime is returned for text that is not in the NServiceBus wire format.
var ErrNSBTime = errors.New("not in the NServiceBus wire format " + NSBTimeLayout)

// ParseNSBTime reads a time in the NServiceBus wire format.
func ParseNSBTime(s string) (time.Time, error) {
	m := nsbTime.FindStringSubmatch(s)
	if m == nil {
		return time.Time{}, ErrNSBTime
	}
	t, err := time.Parse("2006-01-02 15:04:05", m[1])
	if err != nil {
		return time.Time{}, fmt.Errorf("%w: %v", ErrNSBTime, err)
	}
	frac := m[2] + strings.Repeat("0", 9-len(m[2]))
	ns, _ := strconv.Atoi(frac) // nine digits at most: always fits
	return t.Add(time.Duration(ns)).UTC(), nil
}

// FormatNSBTime writes t as NServiceBus does: UTC, six fractional digits
// (sub-microsecond precision is dropped).
func FormatNSBTime(t time.Time) string {
	t = t.UTC()
	return fmt.Sprintf("%s:%06d Z", t.Format("2006-01-02 15:04:05"), t.Nanosecond()/1000)
}
