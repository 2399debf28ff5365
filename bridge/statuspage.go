package bridge

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"time"

	"github.com/delaybridge/delaybridge/admin"
	"github.com/delaybridge/delaybridge/internal/buildinfo"
	"github.com/delaybridge/delaybridge/management"
	"github.com/delaybridge/delaybridge/status"
	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/wire"
)

// newStatusPage builds the status page served at GET / (docs/contract.md §6.4).
// Breaker states come from the delaybridge_circuit_breaker_state gauges of
// the bridge's metrics; its actions are the admin API's operations, behind
// the same token.
func (b *Bridge) newStatusPage(c *components, ops *admin.Ops, errs admin.ErrorsFunc) *status.Handler {
	cfg, log := b.cfg, b.log.With().Str("component", "status-page").Logger()
	host, _ := os.Hostname()
	bi := buildinfo.Get()
	opts := status.Options{
		Endpoint: cfg.Endpoint, Stats: c.store.Stats, NextDue: c.store.NextDue, List: c.store.List,
		Now: b.deps.Now, Refresh: 5 * time.Second,
		Instance: status.Instance{Owner: b.owner, Hostname: host, Version: bi.Version, Revision: bi.Revision, Started: b.started},
		Broker: func() map[string]bool {
			return map[string]bool{"consume": c.consumeConn.Connected(), "ingest": c.ingestConn.Connected(), "publish": c.publishConn.Connected()}
		},
		ErrorQueue: func(ctx context.Context) (status.ErrorQueue, error) { return errorQueue(ctx, errs) },
		Problems:   func() []status.Problem { return foreignBindings(c.bindings) },
		Gatherer:   b.deps.Metrics.Registry(),
		Token:      cfg.AdminToken, Actions: ops,
		Log: func(action, id, outcome string) {
			log.Info().Str("action", action).Str("id", id).Str("outcome", outcome).Msg("status page action")
		},
	}
	if sc, ok := c.store.(storage.Scheduler); ok {
		opts.Schedules = sc.ListSchedules
	}
	return status.New(opts)
}

// errorQueue reads this endpoint's copies among the first
// admin.DefaultErrorScan messages of the error queue, as GET /api/v1/errors
// lists them, and returns their count and the newest.
func errorQueue(ctx context.Context, errs admin.ErrorsFunc) (status.ErrorQueue, error) {
	res, err := errs(ctx, admin.ErrorsRequest{Op: admin.ErrorsList, Scan: admin.DefaultErrorScan, Limit: admin.DefaultErrorScan})
	if err != nil {
		return status.ErrorQueue{}, err
	}
	eq := status.ErrorQueue{Depth: len(res.Errors), Partial: !res.End}
	for _, e := range res.Errors {
		entry := status.ErrorEntry{ID: e.ID, Destination: e.Destination, Stage: e.Stage, Reason: e.Reason}
		if e.Exchange != "" && e.RoutingKey != nil {
			entry.Destination = wire.Destination{Exchange: e.Exchange, Key: *e.RoutingKey}.String()
		}
		if e.FailedAt != nil {
			entry.FailedAt = *e.FailedAt
		}
		eq.Newest = append(eq.Newest, entry)
	}
	// The queue's tail is its newest; a copy without a failure time (a
	// foreign tool's) counts by its place.
	slices.Reverse(eq.Newest)
	slices.SortStableFunc(eq.Newest, func(a, b status.ErrorEntry) int { return cmp.Compare(b.FailedAt.UnixNano(), a.FailedAt.UnixNano()) })
	if len(eq.Newest) > status.MoreErrorRows {
		eq.Newest = eq.Newest[:status.MoreErrorRows]
	}
	return eq, nil
}

// foreignBindings are the status page's problems for the delayed exchanges
// with bindings besides the bridge's own (docs/contract.md §6.4).
func foreignBindings(w *management.Watcher) []status.Problem {
	if w == nil {
		return nil
	}
	foreign := w.Foreign()
	var ps []status.Problem
	for _, x := range slices.Sorted(maps.Keys(foreign)) {
		ps = append(ps, status.Problem{Name: "foreign binding on a delayed exchange",
			Detail: fmt.Sprintf("%s: %s; every message published to %s reaches it at once, delays ignored: "+
				"bind to %s instead (delaybridge migrate-bindings --exchange %s moves it)",
				x, management.Describe(foreign[x]), x, wire.DelayedRoute(x), x)})
	}
	return ps
}
