package wire

import (
	"errors"
	"testing"
	"time"
)

func TestNSBTime(t *testing.T) {
	at := time.Date(2026, 11, 21, 20, 0, 1, 123456789, time.UTC)
	s := FormatNSBTime(at.In(time.FixedZone("CET", 3600)))
	if s != "2026-11-21 20:00:01:123456 Z" {
		t.Fatalf("FormatNSBTime = %q", s)
	}
	got, err := ParseNSBTime(s)
	if err != nil || !got.Equal(at.Truncate(time.Microsecond)) || got.Location() != time.UTC {
		t.Errorf("ParseNSBTime(%q) = %v, %v", s, got, err)
	}
	for in, want := range map[string]time.Time{
		"2026-11-21 20:00:01:1 Z":         time.Date(2026, 11, 21, 20, 0, 1, 1e8, time.UTC),
		"2026-11-21 20:00:01:123456789 Z": time.Date(2026, 11, 21, 20, 0, 1, 123456789, time.UTC),
	} {
		if got, err := ParseNSBTime(in); err != nil || !got.Equal(want) {
			t.Errorf("ParseNSBTime(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "2026-11-21T20:00:01Z", "2026-11-21 20:00:01 Z", "2026-11-21 20:00:01:1234567890 Z",
		"2026-13-21 20:00:01:000000 Z", "2026-11-21 20:00:01:000000 z", " 2026-11-21 20:00:01:000000 Z"} {
		if got, err := ParseNSBTime(in); !errors.Is(err, ErrNSBTime) {
			t.Errorf("ParseNSBTime(%q) = %v, %v; want ErrNSBTime", in, got, err)
		}
	}
}
