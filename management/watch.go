package management

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"
)

// BindingLister lists the bindings whose source is an exchange (*Client
// is one).
type BindingLister interface {
	BindingsFrom(ctx context.Context, exchange string) ([]Binding, error)
}

// WatchOptions configure a Watcher.
type WatchOptions struct {
	Lister BindingLister
	// Exchanges are the exchanges to watch.
	Exchanges []string
	// Own reports whether a binding is the bridge's own on its exchange.
	Own func(Binding) bool
	// Interval is the time between two checks; default DefaultWatchInterval.
	Interval time.Duration
	// Report, when set, is told each exchange's foreign bindings after
	// every check that read them.
	Report func(exchange string, foreign []Binding)
	// Hint ends the log line of a failed check: how to give the bridge the
	// management API.
	Hint   string
	Logger zerolog.Logger
}

// DefaultWatchInterval is how often a Watcher checks by default.
const DefaultWatchInterval = time.Minute

// Watcher checks now and then that the exchanges it watches have no
// binding but their own, and says so once when one appears (docs/contract.md
// §2.7): such a binding silently breaks delays, and only the management API
// can list bindings. New starts nothing; Run checks until its context ends.
type Watcher struct {
	opts WatchOptions

	mu      sync.Mutex
	foreign map[string][]Binding // the last check's, per exchange
	logged  map[string]string    // what was last logged, per exchange
	failing bool                 // the last check failed, and that was logged
}

// NewWatcher returns a Watcher; it starts nothing.
func NewWatcher(opts WatchOptions) *Watcher {
	if opts.Interval <= 0 {
		opts.Interval = DefaultWatchInterval
	}
	return &Watcher{opts: opts, foreign: map[string][]Binding{}, logged: map[string]string{}}
}

// Run checks at once and then every Interval, until ctx ends.
func (w *Watcher) Run(ctx context.Context) error {
	t := time.NewTicker(w.opts.Interval)
	defer t.Stop()
	for {
		w.Check(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Check checks every exchange once. A check that fails is logged once,
// until one succeeds again; what it knew before stays known.
func (w *Watcher) Check(ctx context.Context) {
	for _, x := range w.opts.Exchanges {
		bs, err := w.opts.Lister.BindingsFrom(ctx, x)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			w.failed(x, err)
			continue
		}
		var foreign []Binding
		for _, b := range bs {
			if !w.opts.Own(b) {
				foreign = append(foreign, b)
			}
		}
		w.seen(x, foreign)
	}
}

// failed logs the first failure after a success, or at start.
func (w *Watcher) failed(x string, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.failing {
		return
	}
	w.failing = true
	w.opts.Logger.Warn().Err(err).Str("exchange", x).
		Msg("cannot check the bindings of the delayed exchanges through the RabbitMQ management API; a queue bound to a delayed exchange itself would get its messages at once, delays ignored, unnoticed. " + w.opts.Hint)
}

// seen records x's foreign bindings, and logs when they change.
func (w *Watcher) seen(x string, foreign []Binding) {
	desc := Describe(foreign)
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.failing {
		w.failing = false
		w.opts.Logger.Info().Msg("checking the bindings of the delayed exchanges through the RabbitMQ management API again")
	}
	w.foreign[x] = foreign
	if w.opts.Report != nil {
		w.opts.Report(x, foreign)
	}
	last, known := w.logged[x]
	if desc == last && (known || desc == "") {
		return
	}
	w.logged[x] = desc
	if desc == "" {
		w.opts.Logger.Info().Str("exchange", x).Msg("the delayed exchange has no foreign binding any more")
		return
	}
	w.opts.Logger.Warn().Str("exchange", x).Int("count", len(foreign)).Str("bindings", desc).
		Msg("foreign bindings on a delayed exchange: each gets every message published to it at once, delays ignored, and messages without x-delay no longer reach " + x + ".route; bind to " + x + ".route instead (delaybridge migrate-bindings --exchange " + x + " moves them)")
}

// Foreign returns each watched exchange's foreign bindings as the last
// successful check found them (none for an exchange not checked yet).
func (w *Watcher) Foreign() map[string][]Binding {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make(map[string][]Binding, len(w.foreign))
	for x, bs := range w.foreign {
		if len(bs) > 0 {
			out[x] = slices.Clone(bs)
		}
	}
	return out
}

// Describe lists bindings for people, in a stable order.
func Describe(bs []Binding) string {
	ss := make([]string, len(bs))
	for i, b := range bs {
		ss[i] = b.String()
	}
	slices.Sort(ss)
	return strings.Join(ss, "; ")
}
