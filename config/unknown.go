package config

import (
	"reflect"
	"slices"
	"strings"
)

// otherVariables are DELAYBRIDGE_* variables that are not the bridge's
// settings but are set beside them: the admin CLI's (docs/contract.md §5.2)
// and docker-compose.yml's build arguments.
var otherVariables = []string{"DELAYBRIDGE_ADMIN_URL", "DELAYBRIDGE_VERSION", "DELAYBRIDGE_REVISION"}

// testPrefix names the test suite's variables (scripts/test.sh).
const testPrefix = "DELAYBRIDGE_TEST_"

// Variables returns the name of every variable Config reads.
func Variables() []string {
	t := reflect.TypeOf(Config{})
	names := make([]string, 0, t.NumField())
	for i := range t.NumField() {
		if n := t.Field(i).Tag.Get("envconfig"); n != "" {
			names = append(names, n)
		}
	}
	return names
}

// UnknownVariable is a DELAYBRIDGE_* variable in the environment that
// nothing reads, most likely a typo.
type UnknownVariable struct {
	Name string
	// Like is the known variable closest to Name, when one is close enough
	// to be what was meant; empty otherwise.
	Like string
}

// Unknown returns the DELAYBRIDGE_* variables of environ (as os.Environ
// gives it) that neither the bridge nor its tools read, sorted by name.
func Unknown(environ []string) []UnknownVariable {
	known := append(Variables(), otherVariables...)
	var out []UnknownVariable
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, Prefix+"_") || strings.HasPrefix(name, testPrefix) || slices.Contains(known, name) {
			continue
		}
		u := UnknownVariable{Name: name}
		best := (len(name)-len(Prefix))/3 + 1 // more edits than that is another word, not a typo
		for _, k := range known {
			if d := distance(name, k); d < best {
				best, u.Like = d, k
			}
		}
		out = append(out, u)
	}
	slices.SortFunc(out, func(a, b UnknownVariable) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// distance is the Levenshtein distance between a and b, in bytes (the
// names are ASCII).
func distance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
