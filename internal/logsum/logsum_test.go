package logsum

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

func lines(t *testing.T, buf *bytes.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, s := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		if s == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(s), &m); err != nil {
			t.Fatal(err)
		}
		out = append(out, m)
	}
	return out
}

// Occurrences noted n at a time: the first is logged at once, the rest of
// that call and later ones are counted for the summary, which carries the
// last one's details under last_.
func TestNoteCountsBatches(t *testing.T) {
	var buf bytes.Buffer
	l := New(Options{Interval: 10 * time.Second, KeyField: "queue", CountField: "copies", First: "first", Summary: "summary"}, zerolog.New(&buf))
	t0 := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	detail := func(reason string) Detail {
		return func(e *zerolog.Event, p string) *zerolog.Event { return e.Str(p+"reason", reason) }
	}
	l.Note("error", 5, t0, detail("a"))
	l.Note("error", 3, t0.Add(time.Second), detail("b"))
	ls := lines(t, &buf)
	if len(ls) != 1 || ls[0]["message"] != "first" || ls[0]["reason"] != "a" || ls[0]["queue"] != "error" || ls[0]["copies"] != nil {
		t.Fatalf("lines %v, want the first alone", ls)
	}
	// Written by the next note once the interval is over.
	l.Note("error", 1, t0.Add(10*time.Second), detail("c"))
	ls = lines(t, &buf)
	if len(ls) != 2 || ls[1]["message"] != "summary" || ls[1]["copies"] != float64(4+3) || ls[1]["last_reason"] != "b" {
		t.Fatalf("summary %v, want 7 copies, the last reason b", ls[len(ls)-1])
	}
	l.Flush(t0.Add(11*time.Second), true)
	ls = lines(t, &buf)
	if len(ls) != 3 || ls[2]["copies"] != float64(1) || ls[2]["last_reason"] != "c" {
		t.Fatalf("final summary %v", ls[len(ls)-1])
	}
}

func TestMaxKeysShareOneSummary(t *testing.T) {
	var buf bytes.Buffer
	l := New(Options{KeyField: "k", CountField: "n", First: "first", Summary: "summary", MaxKeys: 2, OtherKey: "(others)"}, zerolog.New(&buf))
	t0 := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	none := func(e *zerolog.Event, _ string) *zerolog.Event { return e }
	for _, k := range []string{"a", "b", "c", "d", "e"} {
		l.Note(k, 1, t0, none)
	}
	if ls := lines(t, &buf); len(ls) != 3 || ls[2]["k"] != "(others)" {
		t.Fatalf("lines %v, want a, b and one for the others", ls)
	}
	l.Flush(t0.Add(10*time.Second), false)
	ls := lines(t, &buf)
	if last := ls[len(ls)-1]; last["k"] != "(others)" || last["n"] != float64(2) {
		t.Fatalf("summary %v, want the others' 2 further occurrences", last)
	}
}
