package poller

import (
	"context"
	"time"

	"github.com/rs/zerolog"
)

// Reaping is what the reaper needs of the store.
type Reaping interface {
	Reap(ctx context.Context) (int, error)
}

// Reaper frees expired leases on a timer. Lease already takes rows whose
// lease expired, so reaping is not needed for correctness; it keeps the
// leased count (and with it MaxLeased backpressure, metrics and the admin
// view) honest after an instance died holding leases, and lets a shared
// store's due index see those rows as due again.
type Reaper struct {
	Store    Reaping
	Interval time.Duration // contract: a quarter of LOCK_LEASE_DURATION
	// OnReap, when set, is told how many leases each pass freed.
	OnReap func(n int)
	// Quiet leaves the passes that freed leases unlogged: for a store
	// that logs its own (the take-over of a dead instance's leases).
	Quiet  bool
	Logger zerolog.Logger
}

// Run reaps every Interval until ctx ends. Failures are logged and retried
// on the next tick: the poller's fetch breaker already watches the store.
func (r *Reaper) Run(ctx context.Context) error {
	t := time.NewTicker(r.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		n, err := r.Store.Reap(ctx)
		switch {
		case err != nil && ctx.Err() != nil:
			return nil
		case err != nil:
			r.Logger.Warn().Err(err).Msg("reaping expired leases failed; retrying on the next tick")
		case n > 0 && !r.Quiet:
			r.Logger.Info().Int("freed", n).Msg("reaped expired leases (an instance stopped or stalled while dispatching)")
		}
		if err == nil && r.OnReap != nil {
			r.OnReap(n)
		}
	}
}
