package bridge

import (
	"context"
	"time"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/metrics"
	"github.com/delaybridge/delaybridge/status"
	"github.com/delaybridge/delaybridge/storage"
)

// newStatusPage builds the status page served at GET / (issue 5). Breaker
// states come from the delaybridge_circuit_breaker_state gauges of met.
func newStatusPage(endpoint string, store storage.Store, stats func(context.Context) (int, int, error),
	now func() time.Time, met *metrics.Metrics, consumeConn, ingestConn, publishConn *broker.Conn) *status.Handler {
	return status.New(status.Options{
		Endpoint: endpoint, Stats: stats, NextDue: store.NextDue, Now: now, Refresh: 5 * time.Second,
		NextDueMessages: func(ctx context.Context, n int) ([]storage.Timeout, error) {
			rows, _, err := store.List(ctx, storage.ListFilter{Limit: n})
			return rows, err
		},
		Broker: func() map[string]bool {
			return map[string]bool{"consume": consumeConn.Connected(), "ingest": ingestConn.Connected(), "publish": publishConn.Connected()}
		},
		Gatherer: met.Registry(),
	})
}
