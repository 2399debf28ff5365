package cron

import (
	"errors"
	"testing"
	"time"
)

func TestLoadLocation(t *testing.T) {
	cases := map[string]string{
		"Europe/Berlin":           "Europe/Berlin",
		"W. Europe Standard Time": "Europe/Berlin",
		"w. europe standard time": "Europe/Berlin",
		"Eastern Standard Time":   "America/New_York",
		"India Standard Time":     "Asia/Calcutta",
		"Lord Howe Standard Time": "Australia/Lord_Howe",
		"UTC":                     "Etc/UTC",
		"  America/New_York ":     "America/New_York",
	}
	for in, want := range cases {
		loc, err := LoadLocation(in)
		if err != nil {
			t.Errorf("LoadLocation(%q): %v", in, err)
			continue
		}
		if loc.String() != want {
			t.Errorf("LoadLocation(%q) = %s, want %s", in, loc, want)
		}
	}
	// India has no DST and is 5:30 ahead of UTC all year.
	loc, _ := LoadLocation("India Standard Time")
	for _, m := range []time.Month{1, 7} {
		if _, off := time.Date(2026, m, 1, 0, 0, 0, 0, loc).Zone(); off != 5*3600+1800 {
			t.Errorf("India Standard Time offset in month %d = %d s", m, off)
		}
	}
	for _, bad := range []string{"", "Local", "Nowhere/Zone", "Mars Standard Time", "../etc/passwd"} {
		if _, err := LoadLocation(bad); !errors.Is(err, ErrUnknownZone) {
			t.Errorf("LoadLocation(%q) = %v, want ErrUnknownZone", bad, err)
		}
	}
}

// Every Windows id in the generated table names a zone the embedded tz
// database has.
func TestWindowsTableResolves(t *testing.T) {
	if len(windowsZones) < 100 {
		t.Fatalf("only %d Windows ids in the table", len(windowsZones))
	}
	for win, iana := range windowsZones {
		if _, err := time.LoadLocation(iana); err != nil {
			t.Errorf("%q -> %q: %v", win, iana, err)
		}
		if _, err := LoadLocation(win); err != nil {
			t.Errorf("LoadLocation(%q): %v", win, err)
		}
	}
}
