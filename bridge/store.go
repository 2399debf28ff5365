package bridge

import (
	"context"
	"fmt"
	"time"

	"github.com/rs/zerolog"

	"github.com/delaybridge/delaybridge/config"
	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/storage/boltstore"
	"github.com/delaybridge/delaybridge/storage/postgres"
)

// openStore opens the store cfg names: a bbolt file for one instance, or a
// PostgreSQL database shared by several.
func openStore(ctx context.Context, cfg config.Config, owner string, now func() time.Time, log zerolog.Logger) (storage.Store, error) {
	switch cfg.Store {
	case "postgres":
		// Connecting is bounded (postgres.DefaultConnectTimeout), a schema
		// migration only by ctx: cut short, it would roll back at every
		// start (postgres.Options.ConnectTimeout).
		//
		// A statement must fail well within the breaker times, so that a
		// silent database triggers them on time; healthy ones take ms.
		callTimeout := min(cfg.TimeToTriggerStoreCircuitBreaker, cfg.TimeToTriggerFetchCircuitBreaker,
			cfg.TimeToTriggerDispatchBreaker) / 3
		callTimeout = max(2*time.Second, min(callTimeout, postgres.DefaultCallTimeout))
		ps, err := postgres.Open(ctx, cfg.PostgresURL, postgres.Options{Now: now, Schema: cfg.PostgresSchema, Endpoint: cfg.Endpoint,
			Owner:           owner,
			ApplicationName: "delaybridge " + owner, CallTimeout: callTimeout,
			Logger: log.With().Str("component", "store").Logger()})
		if err != nil {
			return nil, fmt.Errorf("open store: %w", err)
		}
		log.Info().Str("store", "postgres").Msg("store open")
		return ps, nil
	default:
		bs, err := boltstore.Open(cfg.StorePath, boltstore.Options{Now: now, Logger: log.With().Str("component", "store").Logger()})
		if err != nil {
			return nil, fmt.Errorf("open store: %w", err)
		}
		log.Info().Str("path", cfg.StorePath).Int("recovered_leases", bs.RecoveredLeases()).Msg("store open")
		return bs, nil
	}
}

// takeoverEvery is the most time between two TakeOver passes: with the
// store's grace (postgres.DefaultTakeoverGrace) it bounds how late a dead
// instance's lost leases are forwarded (docs/contract.md §7.1).
const takeoverEvery = 500 * time.Millisecond

// takeOverFunc runs a store's TakeOver as a poller.Reaper's pass.
type takeOverFunc func(ctx context.Context) (int, error)

func (f takeOverFunc) Reap(ctx context.Context) (int, error) { return f(ctx) }
