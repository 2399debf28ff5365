package cron

import (
	"errors"
	"fmt"
	"strings"
	"time"

	// The zone data travels with the binary: a container without zoneinfo
	// computes the same fire times.
	_ "time/tzdata"
)

// ErrUnknownZone is wrapped by LoadLocation's errors.
var ErrUnknownZone = errors.New("cron: unknown time zone")

// windowsZonesFold is windowsZones keyed by lower case: .NET matches Windows
// ids without regard to case.
var windowsZonesFold = func() map[string]string {
	m := make(map[string]string, len(windowsZones))
	for k, v := range windowsZones {
		m[strings.ToLower(k)] = v
	}
	return m
}()

// LoadLocation returns the time zone named by an IANA name ("Europe/Berlin")
// or a Windows id ("W. Europe Standard Time"), the two forms .NET's
// TimeZoneInfo ids take. Windows ids map to IANA zones through CLDR's
// windowsZones table (windowszones.go). "UTC" is UTC; an empty name and
// "Local" are refused, since the bridge host's zone means nothing to the
// sender. The zone data comes from the tz database the binary carries when it
// imports time/tzdata, so it does not depend on the host's zoneinfo.
func LoadLocation(name string) (*time.Location, error) {
	name = strings.TrimSpace(name)
	switch name {
	case "":
		return nil, fmt.Errorf("%w: empty name", ErrUnknownZone)
	case "Local":
		return nil, fmt.Errorf("%w: %q names the host's zone; give an IANA name or a Windows id", ErrUnknownZone, name)
	}
	if iana, ok := windowsZonesFold[strings.ToLower(name)]; ok {
		loc, err := time.LoadLocation(iana)
		if err != nil {
			return nil, fmt.Errorf("%w: Windows id %q maps to %q, which the tz database lacks: %v", ErrUnknownZone, name, iana, err)
		}
		return loc, nil
	}
	loc, err := time.LoadLocation(name)
	if err != nil {
		return nil, fmt.Errorf("%w: %q is neither an IANA name nor a Windows id (CLDR %s): %v", ErrUnknownZone, name, windowsZonesCLDR, err)
	}
	return loc, nil
}
