package storetest

import (
	"bytes"
	"fmt"
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
