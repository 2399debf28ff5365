package main

import (
	"strings"
	"testing"
)

func TestGenerate(t *testing.T) {
	raw := `{"supplemental":{"version":{"_cldrVersion":"48"},"windowsZones":{"mapTimezones":[
		{"mapZone":{"_other":"W. Europe Standard Time","_type":"Europe/Berlin","_territory":"001"}},
		{"mapZone":{"_other":"W. Europe Standard Time","_type":"Europe/Zurich","_territory":"CH"}},
		{"mapZone":{"_other":"Eastern Standard Time","_type":"America/New_York America/Detroit","_territory":"001"}}]}}}`
	src, err := generate([]byte(raw), "test fixture")
	if err != nil {
		t.Fatal(err)
	}
	out := string(src)
	for _, want := range []string{
		"// Source: test fixture (CLDR 48,",
		`const windowsZonesCLDR = "48"`,
		`"W. Europe Standard Time": "Europe/Berlin",`,
		`"Eastern Standard Time":   "America/New_York",`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "Zurich") || strings.Contains(out, "Detroit") {
		t.Errorf("kept a non-001 or non-canonical zone:\n%s", out)
	}
}

func TestGenerateRefuses(t *testing.T) {
	for name, raw := range map[string]string{
		"not json":    `{`,
		"no 001 rows": `{"supplemental":{"version":{"_cldrVersion":"48"},"windowsZones":{"mapTimezones":[{"mapZone":{"_other":"X","_type":"Etc/UTC","_territory":"ZZ"}}]}}}`,
		"no version":  `{"supplemental":{"windowsZones":{"mapTimezones":[{"mapZone":{"_other":"X","_type":"Etc/UTC","_territory":"001"}}]}}}`,
		"empty zone":  `{"supplemental":{"version":{"_cldrVersion":"48"},"windowsZones":{"mapTimezones":[{"mapZone":{"_other":"X","_type":"","_territory":"001"}}]}}}`,
	} {
		if _, err := generate([]byte(raw), "x"); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
