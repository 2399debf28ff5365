package ingest

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// Drops are logged at warn (docs/contract.md §6.2): the first of a reason
// at once with its id, destination and why; the others of that reason as
// one summary line per interval with their count and the last one; and
// what is left when ingest stops, so that no drop goes without a line.
func TestDropsSummedUpPerInterval(t *testing.T) {
	var buf bytes.Buffer
	l := newDropLog(zerolog.New(&buf))
	t0 := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	l.note(DropDuplicate, 1, "a", "q", t0)
	l.note(DropDuplicate, 3, "b", "q", t0.Add(time.Second))
	l.note(DropCancelled, 1, "c", "q2", t0.Add(2*time.Second))
	l.note(DropDuplicate, 1, "d", "q", t0.Add(dropInterval)) // writes the summary of b's 3
	l.note(DropReplaced, 2, "", "token-1,token-2", t0.Add(dropInterval))
	stop := make(chan struct{})
	close(stop)
	l.run(stop, func() time.Time { return t0.Add(dropInterval + time.Second) })

	var lines []map[string]any
	for _, s := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(s), &m); err != nil {
			t.Fatal(err)
		}
		lines = append(lines, m)
	}
	want := []map[string]any{
		{"reason": DropDuplicate, "id": "a", "destination": "q"},
		{"reason": DropCancelled, "id": "c", "destination": "q2"},
		{"reason": DropDuplicate, "dropped": float64(3), "last_id": "b"},
		{"reason": DropReplaced, "groups": "token-1,token-2"},
		// at stop, in any order: d's duplicate and the second replaced
		{"reason": DropDuplicate, "dropped": float64(1), "last_id": "d"},
		{"reason": DropReplaced, "dropped": float64(1), "last_groups": "token-1,token-2"},
	}
	if len(lines) != len(want) {
		t.Fatalf("%d lines, want %d:\n%s", len(lines), len(want), buf.String())
	}
	for i, w := range want {
		j := i
		if i >= 4 { // the stop's summaries come in map order
			for j = 4; j < len(lines) && lines[j]["reason"] != w["reason"]; j++ {
			}
			if j == len(lines) {
				t.Fatalf("no summary of %s at stop:\n%s", w["reason"], buf.String())
			}
		}
		if lines[j]["level"] != "warn" || lines[j]["why"] == nil && lines[j]["last_why"] == nil {
			t.Errorf("line %d %v: want a warning saying why", j, lines[j])
		}
		for k, v := range w {
			if lines[j][k] != v {
				t.Errorf("line %d %v: %s = %v, want %v", j, lines[j], k, lines[j][k], v)
			}
		}
	}
	if got := lines[2]["message"]; got != "taken in and not stored" {
		t.Errorf("summary message %q", got)
	}
}
