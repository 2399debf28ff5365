package ingest

import (
	"fmt"
	"maps"
	"regexp"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/delaybridge/delaybridge/intake"
	"github.com/delaybridge/delaybridge/wire"
)

// Rules are the operator's limits on what may be scheduled (docs/contract.md §4, §5).
type Rules struct {
	MaxDelay        time.Duration // 0: no limit
	MaxMessageBytes int
	Allowed         *Globs
	// Reserved are queues a message may never be forwarded to: the bridge's
	// own, E.Timeouts, E.TimeoutsDispatcher and the error queue. Replay
	// applies the same Rules.
	Reserved []string
}

// Check returns why a parsed message may not be stored, or nil.
func (r Rules) Check(p intake.Parsed, bodyLen int, receivedAt time.Time) error {
	if r.MaxMessageBytes > 0 && bodyLen > r.MaxMessageBytes {
		return fmt.Errorf("body is %d bytes, over DELAYBRIDGE_MAX_MESSAGE_BYTES (%d)", bodyLen, r.MaxMessageBytes)
	}
	for _, q := range r.Reserved {
		if p.Destination == wire.Queue(q) {
			return fmt.Errorf("destination %q is one of the bridge's own queues", q)
		}
	}
	if r.Allowed != nil && !r.Allowed.Allows(p.Destination) {
		return fmt.Errorf("destination %s is not allowed by DELAYBRIDGE_ALLOWED_DESTINATIONS", p.Destination.Quoted())
	}
	if r.MaxDelay > 0 && p.DueAt.Sub(receivedAt) > r.MaxDelay {
		return fmt.Errorf("due at %s, further out than DELAYBRIDGE_MAX_DELAY (%s)", p.DueAt.Format(time.RFC3339Nano), r.MaxDelay)
	}
	return nil
}

// Globs matches destination names (queues, and exchange:NAME for exchange
// destinations) against patterns where * is any run of characters
// (including none) and ? is one character; everything else is literal. Unlike
// path.Match, * also crosses '/' and '.', which queue names may contain.
type Globs struct {
	patterns []string
	re       *regexp.Regexp
	// exchanges are allowed whatever the patterns (WithExchanges).
	exchanges map[string]bool
}

// CompileGlobs compiles patterns; surrounding spaces are ignored.
func CompileGlobs(patterns []string) (*Globs, error) {
	alts := make([]string, 0, len(patterns))
	for _, p := range patterns {
		p = strings.TrimSpace(p)
		if p == "" {
			return nil, fmt.Errorf("empty destination pattern")
		}
		if !utf8.ValidString(p) {
			return nil, fmt.Errorf("destination pattern %q is not valid UTF-8", p)
		}
		var b strings.Builder
		for _, r := range p {
			switch r {
			case '*':
				b.WriteString(".*")
			case '?':
				b.WriteString(".")
			default:
				b.WriteString(regexp.QuoteMeta(string(r)))
			}
		}
		alts = append(alts, b.String())
	}
	re, err := regexp.Compile(`^(?s:` + strings.Join(alts, "|") + `)$`)
	if err != nil {
		return nil, err
	}
	return &Globs{patterns: patterns, re: re}, nil
}

// WithExchanges returns g allowing the exchanges named too, with any
// routing key, each exactly (* and ? are literal there): exchanges the
// operator named elsewhere in the configuration, such as the routing
// exchanges of DELAYBRIDGE_DELAYED_EXCHANGES.
func (g *Globs) WithExchanges(names ...string) *Globs {
	c := *g
	c.exchanges = maps.Clone(g.exchanges)
	if c.exchanges == nil {
		c.exchanges = make(map[string]bool, len(names))
	}
	for _, n := range names {
		c.exchanges[n] = true
	}
	return &c
}

// Match reports whether name matches any pattern.
func (g *Globs) Match(name string) bool { return g.re.MatchString(name) }

// Allows reports whether d matches any pattern: a queue by its name, an
// exchange destination as exchange:NAME (wire.Destination.AllowName).
func (g *Globs) Allows(d wire.Destination) bool {
	return !d.IsQueue() && g.exchanges[d.Exchange] || g.Match(d.AllowName())
}

func (g *Globs) String() string { return strings.Join(g.patterns, ",") }
