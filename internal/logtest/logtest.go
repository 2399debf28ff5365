// Package logtest collects the JSON lines a zerolog logger writes, from
// any number of goroutines, for tests to count and inspect.
package logtest

import (
	"bufio"
	"encoding/json"
	"strings"
	"sync"
)

// Buffer is an io.Writer for zerolog.New.
type Buffer struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// Lines returns every JSON line written so far, decoded.
func (b *Buffer) Lines() []map[string]any {
	b.mu.Lock()
	text := b.buf.String()
	b.mu.Unlock()
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil {
			out = append(out, m)
		}
	}
	return out
}

// Count returns how many lines have this message.
func (b *Buffer) Count(msg string) int {
	n := 0
	for _, l := range b.Lines() {
		if l["message"] == msg {
			n++
		}
	}
	return n
}
