// Package logsum aggregates repeated warnings: the first occurrence of a
// key is logged at once, and later ones as one line per key per interval
// with their count and the last one's details, so a condition that repeats
// for thousands of messages does not write thousands of lines.
package logsum

import (
	"sync"
	"time"

	"github.com/rs/zerolog"
)

// Options configure a Log.
type Options struct {
	// Interval between two summaries of one key; default 10s.
	Interval time.Duration
	// KeyField names the key in every line ("destination").
	KeyField string
	// CountField names the count of a summary ("failures").
	CountField string
	// First is the message of a key's first line, Summary that of its
	// summaries.
	First, Summary string
	// MaxKeys bounds the keys summarised at once; past it, new keys share
	// the summary of OtherKey, so the log stays bounded whatever the number
	// of keys. 0: no bound.
	MaxKeys  int
	OtherKey string
}

// Detail adds one occurrence's fields to a line; prefix is "" on a first
// line and "last_" on a summary.
type Detail func(e *zerolog.Event, prefix string) *zerolog.Event

// Log is safe for concurrent use.
type Log struct {
	opts Options
	log  zerolog.Logger

	mu   sync.Mutex
	keys map[string]*summary
}

type summary struct {
	since time.Time
	count int
	last  Detail
}

// New returns a Log writing to log.
func New(opts Options, log zerolog.Logger) *Log {
	if opts.Interval <= 0 {
		opts.Interval = 10 * time.Second
	}
	return &Log{opts: opts, log: log, keys: map[string]*summary{}}
}

// Note records n occurrences of key at now (n ≥ 1), detail describing the
// last of them. The first of a key is logged at once; the others are
// counted for its next summary, which is written here once the interval is
// over.
func (l *Log) Note(key string, n int, now time.Time, detail Detail) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.keys[key]
	if s == nil && l.opts.MaxKeys > 0 && len(l.keys) >= l.opts.MaxKeys {
		key = l.opts.OtherKey
		s = l.keys[key]
	}
	if s != nil && now.Sub(s.since) >= l.opts.Interval {
		l.flushOne(key, s, now)
		s = l.keys[key]
	}
	if s == nil {
		l.keys[key] = &summary{since: now, count: n - 1, last: detail}
		detail(l.log.Warn().Str(l.opts.KeyField, key), "").Dur("summary_interval", l.opts.Interval).Msg(l.opts.First)
		return
	}
	s.count += n
	s.last = detail
}

// Flush writes the summaries whose interval is over, or all with all set
// (when the caller stops, or the condition ended: no count is left
// unlogged).
func (l *Log) Flush(now time.Time, all bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for key, s := range l.keys {
		if all || now.Sub(s.since) >= l.opts.Interval {
			l.flushOne(key, s, now)
		}
	}
}

// flushOne logs key's summary and starts its next interval; a key quiet for
// a whole interval is forgotten, so its next occurrence logs at once.
func (l *Log) flushOne(key string, s *summary, now time.Time) {
	if s.count == 0 {
		delete(l.keys, key)
		return
	}
	s.last(l.log.Warn().Str(l.opts.KeyField, key).Int(l.opts.CountField, s.count).Dur("over", now.Sub(s.since)), "last_").
		Msg(l.opts.Summary)
	s.since, s.count = now, 0
}
