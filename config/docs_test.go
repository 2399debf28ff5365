package config

import (
	"bufio"
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"
)

// contractPage holds the one configuration table (docs/contract.md §5.1);
// other pages link to it rather than repeat it.
const contractPage = "../docs/contract.md"

// codeSpan is the first `…` of a table cell.
var codeSpan = regexp.MustCompile("`([^`]*)`")

// tableRow is one variable of the configuration table: its default cell.
type tableRow struct {
	line       int
	defaultCol string
}

// configTable reads the first table under the heading "§5.1" of the
// contract: variable name (a code span) → its row.
func configTable(t *testing.T) map[string]tableRow {
	t.Helper()
	f, err := os.Open(contractPage)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rows := map[string]tableRow{}
	inSection, inTable := false, false
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; s.Scan(); n++ {
		text := strings.TrimSpace(s.Text())
		if strings.HasPrefix(text, "#") {
			if inSection {
				break
			}
			inSection = strings.Contains(text, "§5.1")
			continue
		}
		if !inSection {
			continue
		}
		if !strings.HasPrefix(text, "|") {
			if inTable {
				break // the first table of the section ends
			}
			continue
		}
		inTable = true
		cells := strings.Split(strings.Trim(text, "|"), "|")
		if len(cells) < 2 {
			continue
		}
		name := codeSpan.FindStringSubmatch(cells[0])
		if name == nil || !strings.HasPrefix(name[1], Prefix+"_") {
			continue // the header and the separator row
		}
		if prev, dup := rows[name[1]]; dup {
			t.Errorf("%s:%d: %s has a second row (first at line %d)", contractPage, n, name[1], prev.line)
		}
		rows[name[1]] = tableRow{line: n, defaultCol: strings.TrimSpace(cells[1])}
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	if len(rows) == 0 {
		t.Fatalf("%s: no configuration table found under §5.1", contractPage)
	}
	return rows
}

// TestConfigurationTableMatchesConfig keeps the contract's configuration
// table and Config in step: every envconfig field has a row whose default
// is the field's, and every row names a field.
func TestConfigurationTableMatchesConfig(t *testing.T) {
	rows := configTable(t)
	typ := reflect.TypeOf(Config{})
	fields := map[string]bool{}
	for i := range typ.NumField() {
		f := typ.Field(i)
		name := f.Tag.Get("envconfig")
		if name == "" {
			continue
		}
		fields[name] = true
		row, ok := rows[name]
		if !ok {
			t.Errorf("Config.%s (%s) has no row in the configuration table of %s §5.1", f.Name, name, contractPage)
			continue
		}
		def, hasDefault := f.Tag.Lookup("default")
		shown := codeSpan.FindStringSubmatch(row.defaultCol)
		switch {
		case hasDefault && def != "":
			// The default cell starts with the value, as code: `5m`, `0` (no limit).
			if shown == nil || !strings.HasPrefix(row.defaultCol, "`") || shown[1] != def {
				t.Errorf("%s:%d: %s: default cell %q, want it to start with `%s` (Config.%s)", contractPage, row.line, name, row.defaultCol, def, f.Name)
			}
		default:
			// No default value: the cell says what applies in words, never as a value.
			if strings.HasPrefix(row.defaultCol, "`") {
				t.Errorf("%s:%d: %s: default cell %q shows a value, but Config.%s has no default", contractPage, row.line, name, row.defaultCol, f.Name)
			}
		}
	}
	for name, row := range rows {
		if !fields[name] {
			t.Errorf("%s:%d: %s has a row in the configuration table but no field of Config reads it", contractPage, row.line, name)
		}
	}
}
