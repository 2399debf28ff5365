package boltstore

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/storage/storetest"
)

// BenchmarkInsertBatch256: one op = one Insert (one commit) of 256 rows with
// 512-byte bodies.
func BenchmarkInsertBatch256(b *testing.B) {
	s := open(b, filepath.Join(b.TempDir(), "db"), nil)
	batches := make([][]storage.Timeout, b.N)
	for i := range batches {
		batches[i] = storetest.BenchRows(fmt.Sprint("b", i), 256, time.Now().Add(time.Hour))
	}
	b.ResetTimer()
	for i := range b.N {
		if _, err := s.Insert(ctx, batches[i]); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*256), "ns/row")
}

// BenchmarkLeaseRemove1000: one op = Lease of 1000 due rows and Remove of
// them with their locks (two commits). The insert is not timed.
func BenchmarkLeaseRemove1000(b *testing.B) {
	clock := storetest.NewClock(storetest.T0)
	s := open(b, filepath.Join(b.TempDir(), "db"), clock.Now)
	insertFuture(b, s, 10_000) // some rows that stay behind
	refs := make([]storage.Ref, 1000)
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		if _, err := s.Insert(ctx, storetest.BenchRows(fmt.Sprint("r", i), 1000, storetest.T0.Add(-time.Second))); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		ls, err := s.Lease(ctx, "bench", time.Time{}, 1000, time.Minute)
		if err != nil || len(ls) != 1000 {
			b.Fatalf("Lease = %d rows, %v", len(ls), err)
		}
		for j, l := range ls {
			refs[j] = storage.Ref{ID: l.ID, Lock: l.Lock}
		}
		res, err := s.Remove(ctx, refs)
		if err != nil {
			b.Fatal(err)
		}
		for _, e := range res {
			if e != nil {
				b.Fatal(e)
			}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*1000), "ns/row")
}

// BenchmarkNextDueWith100kPending: NextDue reads the first entry of each
// index, however many rows are pending.
func BenchmarkNextDueWith100kPending(b *testing.B) {
	clock := storetest.NewClock(storetest.T0)
	s := open(b, filepath.Join(b.TempDir(), "db"), clock.Now)
	insertFuture(b, s, 100_000)
	b.ResetTimer()
	for range b.N {
		if _, ok, err := s.NextDue(ctx); err != nil || !ok {
			b.Fatal(ok, err)
		}
	}
}

// BenchmarkEmptyLeaseWith100kPending: a poll that finds nothing due stops at
// the first future key of each index, in a read transaction only.
func BenchmarkEmptyLeaseWith100kPending(b *testing.B) {
	clock := storetest.NewClock(storetest.T0)
	s := open(b, filepath.Join(b.TempDir(), "db"), clock.Now)
	insertFuture(b, s, 100_000)
	b.ResetTimer()
	for range b.N {
		if ls, err := s.Lease(ctx, "o", time.Time{}, 1000, time.Minute); err != nil || len(ls) != 0 {
			b.Fatal(len(ls), err)
		}
	}
}
