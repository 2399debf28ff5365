package postgres

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/wire"
)

// destSampleRows is about how many rows CountByDestination reads to
// estimate the per-destination counts of a table of exactCountLimit rows
// or more.
const destSampleRows = 100_000

// dueSoonScanLimit bounds the rows CountByDestination reads for its due
// soon counts: past it, DueSoon is a lower bound.
const dueSoonScanLimit = 100_000

// CountByDestination counts the pending rows per destination; see
// storage.DestinationCounter. Below exactCountLimit rows (the planner's
// estimate, as Stats) it counts them all: one scan of the table. From there
// on it estimates from a sample of about destSampleRows rows
// (TABLESAMPLE SYSTEM, whole pages), scaled to the table's estimated size,
// so a destination with few rows may show as none. DueSoon is exact, up to
// dueSoonScanLimit rows, read over the index timeouts_due. Every instance
// sees every instance's rows. Callers keep to an interval (the metrics:
// DELAYBRIDGE_METRICS_DESTINATION_INTERVAL).
func (s *Store) CountByDestination(ctx context.Context, soonFrom, soonTo time.Time) (map[wire.Destination]storage.DestinationCount, error) {
	var out map[wire.Destination]storage.DestinationCount
	err := s.run(ctx, "count by destination", func(ctx context.Context) error {
		out = map[wire.Destination]storage.DestinationCount{}
		var estimate int64
		if err := s.pool.QueryRow(ctx, s.q.estimate).Scan(&estimate); err != nil {
			return err
		}
		query := "SELECT exchange, destination, count(*) FROM " + s.q.table + " GROUP BY 1, 2"
		scale := func(n, _ int64) int { return int(n) }
		if estimate >= int64(exactCountLimit) {
			pct := math.Min(100, 100*float64(destSampleRows)/float64(estimate))
			query = fmt.Sprintf("SELECT exchange, destination, count(*), sum(count(*)) OVER () FROM %s TABLESAMPLE SYSTEM (%g) GROUP BY 1, 2", s.q.table, pct)
			scale = func(n, total int64) int { return int(math.Round(float64(n) / float64(total) * float64(estimate))) }
		}
		rows, err := s.pool.Query(ctx, query)
		if err != nil {
			return err
		}
		var (
			d        wire.Destination
			n, total int64
		)
		dst := []any{&d.Exchange, &d.Key, &n}
		if estimate >= int64(exactCountLimit) {
			dst = append(dst, &total)
		}
		if _, err := pgx.ForEachRow(rows, dst, func() error {
			out[d] = storage.DestinationCount{Pending: max(1, scale(n, total))}
			return nil
		}); err != nil {
			return err
		}
		rows, err = s.pool.Query(ctx, "SELECT exchange, destination, count(*) FROM (SELECT exchange, destination FROM "+s.q.table+
			" WHERE due_at >= $1 AND due_at < $2 LIMIT $3) soon GROUP BY 1, 2", ts(soonFrom), ts(soonTo), dueSoonScanLimit)
		if err != nil {
			return err
		}
		_, err = pgx.ForEachRow(rows, []any{&d.Exchange, &d.Key, &n}, func() error {
			c := out[d]
			c.DueSoon = int(n)
			c.Pending = max(c.Pending, c.DueSoon) // a sample may have missed it
			out[d] = c
			return nil
		})
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}
