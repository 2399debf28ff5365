// Package logtest collects the log lines a logger writes, from any number
// of goroutines, for tests to count and inspect.
package logtest

import (
	"bufio"
	"encoding/json"
	"strings"
	"sync"
)

// Buffer is an io.Writer for zerolog.New that tests read while it writes.
type Buffer struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String is everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Lines returns every JSON line written so far, decoded.
func (b *Buffer) Lines() []map[string]any {
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(b.String()))
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil {
			out = append(out, m)
		}
	}
	return out
}

// LinesAt returns the JSON lines written so far at level ("warn",
// "error", …), decoded; every line for "".
func (b *Buffer) LinesAt(level string) []map[string]any {
	var out []map[string]any
	for _, l := range b.Lines() {
		if level == "" || l["level"] == level {
			out = append(out, l)
		}
	}
	return out
}

// CountMessage returns how many JSON lines have exactly this message.
func (b *Buffer) CountMessage(msg string) int {
	n := 0
	for _, l := range b.Lines() {
		if l["message"] == msg {
			n++
		}
	}
	return n
}

// Count is CountLines of what was written so far.
func (b *Buffer) Count(parts ...string) int { return CountLines(b.String(), parts...) }

// CountLines is the number of lines of logs that contain every one of parts.
func CountLines(logs string, parts ...string) int {
	n := 0
	for _, line := range strings.Split(logs, "\n") {
		all := line != ""
		for _, p := range parts {
			all = all && strings.Contains(line, p)
		}
		if all {
			n++
		}
	}
	return n
}
