package admin

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/storage/faultstore"
)

// An id no stored timeout can have (NUL, invalid UTF-8, control characters,
// over 255 bytes, blank) is a 400 with a JSON error saying what is wrong, on
// every route that takes one, and never a store call: PostgreSQL refuses such
// ids with an error that would read as a store failure.
func TestInvalidIDsAreRefusedBeforeTheStore(t *testing.T) {
	var fs *faultstore.Store
	f := newFixtureOver(t, token, func(s storage.Store) storage.Store { fs = faultstore.Wrap(s); return fs })
	for id, want := range map[string]string{
		"a\x00b":                 "control characters",
		"\xff\xfe":               "not valid UTF-8",
		"tab\tid":                "control characters",
		strings.Repeat("i", 256): "at most 255",
		" ":                      "empty",
	} {
		for _, r := range []struct{ method, suffix, body string }{
			{"GET", "", ""}, {"DELETE", "", ""}, {"PATCH", "", `{"due_at":"2027-01-01T00:00:00Z"}`}, {"POST", "/dispatch", ""},
		} {
			path := "/api/v1/timeouts/" + url.PathEscape(id) + r.suffix
			b := f.want(r.method, path, r.body, http.StatusBadRequest, nil)
			var e ErrorJSON
			_ = json.Unmarshal(b, &e)
			if !strings.Contains(e.Error, "invalid timeout id") || !strings.Contains(e.Error, want) {
				t.Errorf("%s %.40q: error %q, want it to say %q", r.method, id, e.Error, want)
			}
		}
	}
	for _, op := range []faultstore.Op{faultstore.Get, faultstore.Cancel, faultstore.Reschedule} {
		if n := fs.Calls(op); n != 0 {
			t.Errorf("%d store calls of %s for invalid ids", n, op)
		}
	}
	// The list's destination filter obeys the queue-name rules.
	for dest, want := range map[string]string{"a\x00": "control characters", "\xff": "not valid UTF-8", strings.Repeat("q", 256): "at most 255"} {
		b := f.want("GET", "/api/v1/timeouts?destination="+url.QueryEscape(dest), "", http.StatusBadRequest, nil)
		var e ErrorJSON
		_ = json.Unmarshal(b, &e)
		if !strings.Contains(e.Error, "invalid destination filter") || !strings.Contains(e.Error, want) {
			t.Errorf("destination %.40q: error %q, want it to say %q", dest, e.Error, want)
		}
	}
	if n := fs.Calls(faultstore.List); n != 0 {
		t.Errorf("%d List calls for invalid destinations", n)
	}
	// Valid ids still reach the store: unknown ones are 404.
	f.want("GET", tpath("no-such"), "", http.StatusNotFound, nil)
	f.want("GET", "/api/v1/timeouts?destination=q", "", http.StatusOK, nil)
}
