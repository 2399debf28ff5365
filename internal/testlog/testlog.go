// Package testlog collects log output in tests and counts its lines.
package testlog

import (
	"strings"
	"sync"
)

// Buffer is an io.Writer for a logger that tests read while it writes; safe
// for concurrent use.
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
