package postgres

import (
	"fmt"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/storage/storetest"
)

// BenchmarkInsert: one op = one Insert (one transaction) of 256 rows with
// 512-byte bodies, the size of an ingest group commit.
func BenchmarkInsert(b *testing.B) {
	s := open(b, nil)
	due := time.Now().Add(time.Hour)
	batches := make([][]storage.Timeout, b.N)
	for i := range batches {
		batches[i] = storetest.BenchRows(fmt.Sprint("b", i), 256, due)
	}
	b.ResetTimer()
	for i := range b.N {
		if _, err := s.Insert(ctx, batches[i]); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*256)/b.Elapsed().Seconds(), "msgs/s")
}

// BenchmarkLeaseRemove: one op = Lease of 1000 due rows and Remove of them
// with their locks (two statements). The insert is not timed.
func BenchmarkLeaseRemove(b *testing.B) {
	clock := storetest.NewClock(storetest.T0)
	s := open(b, clock.Now)
	if _, err := s.Insert(ctx, storetest.BenchRows("future", 10_000, storetest.T0.Add(time.Hour))); err != nil {
		b.Fatal(err)
	}
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
		for _, r := range res {
			if r != nil {
				b.Fatal(r)
			}
		}
	}
	b.ReportMetric(float64(b.N*1000)/b.Elapsed().Seconds(), "msgs/s")
}
