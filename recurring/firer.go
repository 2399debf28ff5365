package recurring

import (
	"context"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/delaybridge/delaybridge/cron"
	"github.com/delaybridge/delaybridge/storage"
)

// Store is what the firer needs of the store.
type Store interface {
	NextScheduleDue(ctx context.Context) (time.Time, bool, error)
	FireDue(ctx context.Context, now time.Time, lead time.Duration, limit int, plan storage.Planner) ([]storage.Fired, error)
}

// Options configure a Firer.
type Options struct {
	// Lead stores each fire this long before its fire time, so that the
	// poller, leasing a lookahead ahead, hands it to the dispatcher in time
	// to forward it on the second (the bridge passes the poller's
	// lookahead). Never early: a fire is due at its fire time.
	Lead time.Duration
	// Batch is how many schedules one FireDue plans at most. Default 500.
	Batch int
	// MaxWait bounds a sleep: a schedule another instance stored is seen
	// within it. Default 1 s.
	MaxWait time.Duration
	// Threshold is how late a fire may be and still count as on time
	// (cron.DefaultMisfireThreshold unless set).
	Threshold time.Duration
	// Stampers are the sources' own fire formats, by Schedule.Source
	// (Plan).
	Stampers map[string]FireStamper
	// Wake, when set, is told the earliest due time of the fires each
	// FireDue stored (the poller's Wake).
	Wake func(due time.Time)
	// Now is the clock; After makes the timers of the sleeps (tests
	// replace both). Defaults time.Now and time.After.
	Now    func() time.Time
	After  func(d time.Duration) <-chan time.Time
	Logger zerolog.Logger
}

// Firer stores the fires of due recurring schedules.
type Firer struct {
	store Store
	opts  Options
	plan  storage.Planner
	log   zerolog.Logger

	wake      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

// New returns a Firer; it starts nothing.
func New(store Store, opts Options) *Firer {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.After == nil {
		opts.After = time.After
	}
	if opts.Batch < 1 {
		opts.Batch = 500
	}
	if opts.MaxWait <= 0 {
		opts.MaxWait = time.Second
	}
	if opts.Threshold <= 0 {
		opts.Threshold = cron.DefaultMisfireThreshold
	}
	return &Firer{store: store, opts: opts, plan: Plan(opts.Threshold, opts.Stampers), log: opts.Logger,
		wake: make(chan struct{}, 1), done: make(chan struct{})}
}

// Wake tells the firer a schedule was stored or changed: it reads the next
// fire time again at once. It never blocks.
func (f *Firer) Wake() {
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

// Close makes Run return; closing twice is not an error.
func (f *Firer) Close() error {
	f.closeOnce.Do(func() { close(f.done) })
	return nil
}

// retryWait is the pause after a failed store call.
const retryWait = time.Second

// minWait keeps the firer from spinning when a schedule is due but another
// caller holds it (another instance's FireDue).
const minWait = 10 * time.Millisecond

// Run fires due schedules until ctx ends or Close is called. Store
// failures are logged and retried: a fire missed meanwhile is a misfire,
// handled by the schedule's policy once the store answers.
func (f *Firer) Run(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-f.done:
			return nil
		default:
		}
		wait, err := f.once(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			f.log.Error().Err(err).Dur("retry_in", retryWait).Msg("firing recurring schedules failed")
			wait = retryWait
		}
		if wait <= 0 {
			continue
		}
		select {
		case <-ctx.Done():
			return nil
		case <-f.done:
			return nil
		case <-f.wake:
		case <-f.opts.After(wait):
		}
	}
}

// once fires what is due and returns how long to sleep.
func (f *Firer) once(ctx context.Context) (time.Duration, error) {
	now := f.opts.Now()
	fired, err := f.store.FireDue(ctx, now, f.opts.Lead, f.opts.Batch, f.plan)
	if err != nil {
		return 0, err
	}
	f.report(fired)
	if len(fired) == f.opts.Batch {
		return 0, nil // more may be due
	}
	next, ok, err := f.store.NextScheduleDue(ctx)
	if err != nil {
		return 0, err
	}
	wait := f.opts.MaxWait
	if ok {
		wait = min(wait, next.Add(-f.opts.Lead).Sub(f.opts.Now()))
	}
	return max(wait, minWait), nil
}

// report logs what FireDue did and wakes the poller for the fires stored.
func (f *Firer) report(fired []storage.Fired) {
	var earliest time.Time
	for i := range fired {
		x := &fired[i]
		switch {
		case x.Err != "":
			f.log.Error().Str("schedule", x.Key).Str("reason", x.Err).Msg("recurring schedule ended: it cannot be planned")
			continue
		case x.Misfired && x.ID == "":
			f.log.Warn().Str("schedule", x.Key).Time("next", x.Next).Msg("recurring schedule missed its fire time; skipped (misfire policy Skip)")
		case x.Misfired:
			f.log.Warn().Str("schedule", x.Key).Time("scheduled", x.Scheduled).Msg("recurring schedule missed its fire time; fired once now (misfire policy)")
		case x.ID != "" && !x.Stored:
			f.log.Warn().Str("schedule", x.Key).Str("fire", x.ID).Msg("fire not stored: stored already, or cancelled")
		default:
			f.log.Debug().Str("schedule", x.Key).Str("fire", x.ID).Time("scheduled", x.Scheduled).Msg("fire stored")
		}
		if x.Next.IsZero() {
			f.log.Info().Str("schedule", x.Key).Msg("recurring schedule has no fire time left")
		}
		if x.Stored && (earliest.IsZero() || x.DueAt.Before(earliest)) {
			earliest = x.DueAt
		}
	}
	if !earliest.IsZero() && f.opts.Wake != nil {
		f.opts.Wake(earliest)
	}
}
