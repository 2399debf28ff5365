package storetest

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/storage"
)

var benchBody = bytes.Repeat([]byte("x"), 512)

// BenchRows returns n timeouts due at due with 512-byte bodies and ids
// prefix-0 … prefix-(n-1): the rows every backend's benchmarks store.
func BenchRows(prefix string, n int, due time.Time) []storage.Timeout {
	ts := make([]storage.Timeout, n)
	for i := range ts {
		ts[i] = storage.Timeout{
			ID:          fmt.Sprintf("%s-%d", prefix, i),
			Destination: "bench.destination",
			DueAt:       due,
			ReceivedAt:  due,
			Message:     benchBody,
		}
	}
	return ts
}

// BenchInsert times b.N Inserts into s, each of n BenchRows due in an hour
// (ids prefix0-…, prefix1-…); the rows are made before the timer starts.
func BenchInsert(b *testing.B, s storage.Store, prefix string, n int) {
	due := time.Now().Add(time.Hour)
	batches := make([][]storage.Timeout, b.N)
	for i := range batches {
		batches[i] = BenchRows(fmt.Sprint(prefix, i), n, due)
	}
	b.ResetTimer()
	for i := range b.N {
		if _, err := s.Insert(context.Background(), batches[i]); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchLeaseRemove times b.N rounds of a Lease of n due rows and a Remove of
// them with their locks. Each round first inserts its n rows, due before
// T0 (s reads a clock at T0), with the timer stopped.
func BenchLeaseRemove(b *testing.B, s storage.Store, n int) {
	ctx := context.Background()
	refs := make([]storage.Ref, n)
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		if _, err := s.Insert(ctx, BenchRows(fmt.Sprint("r", i), n, T0.Add(-time.Second))); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		ls, err := s.Lease(ctx, "bench", time.Time{}, n, time.Minute)
		if err != nil || len(ls) != n {
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
}
