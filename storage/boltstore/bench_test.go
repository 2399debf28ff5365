package boltstore

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/storage/storetest"
)

// BenchmarkInsertBatch256: one op = one Insert (one commit) of 256 rows with
// 512-byte bodies.
func BenchmarkInsertBatch256(b *testing.B) {
	storetest.BenchInsert(b, open(b, filepath.Join(b.TempDir(), "db"), nil), "b", 256)
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*256), "ns/row")
}

// BenchmarkLeaseRemove1000: one op = Lease of 1000 due rows and Remove of
// them with their locks (two commits). The insert is not timed.
func BenchmarkLeaseRemove1000(b *testing.B) {
	clock := storetest.NewClock(storetest.T0)
	s := open(b, filepath.Join(b.TempDir(), "db"), clock.Now)
	insertFuture(b, s, 10_000) // some rows that stay behind
	storetest.BenchLeaseRemove(b, s, 1000)
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*1000), "ns/row")
}

// pending100k opens a store, reading a clock at T0, that holds 100,000 rows
// due later, and resets the timer.
func pending100k(b *testing.B) *Store {
	s := open(b, filepath.Join(b.TempDir(), "db"), storetest.NewClock(storetest.T0).Now)
	insertFuture(b, s, 100_000)
	b.ResetTimer()
	return s
}

// BenchmarkNextDueWith100kPending: NextDue reads the first entry of each
// index, however many rows are pending.
func BenchmarkNextDueWith100kPending(b *testing.B) {
	s := pending100k(b)
	for range b.N {
		if _, ok, err := s.NextDue(ctx); err != nil || !ok {
			b.Fatal(ok, err)
		}
	}
}

// BenchmarkEmptyLeaseWith100kPending: a poll that finds nothing due stops at
// the first future key of each index, in a read transaction only.
func BenchmarkEmptyLeaseWith100kPending(b *testing.B) {
	s := pending100k(b)
	for range b.N {
		if ls, err := s.Lease(ctx, "o", time.Time{}, 1000, time.Minute); err != nil || len(ls) != 0 {
			b.Fatal(len(ls), err)
		}
	}
}
