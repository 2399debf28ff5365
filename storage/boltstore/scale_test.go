package boltstore

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"
	bolt "go.etcd.io/bbolt"

	"github.com/delaybridge/delaybridge/message"
	"github.com/delaybridge/delaybridge/storage"
)

// TestScaleFile measures the file a large store needs, without a broker:
// BOLTSTORE_SCALE_N rows (random UUID ids, a 256-byte body with the bench's
// headers, due at random over a day 30 days out) inserted in batches of 500
// as ingest does. It logs the file's bytes per stored message, the insert
// rate, the time Open takes on the full file and the Go heap after it. A
// measurement, so a benchmark (run once, whatever b.N): go test -run '^$'
// -bench ScaleFile -benchtime 1x. BOLTSTORE_SCALE_N sets the rows (default
// 100,000); BOLTSTORE_SCALE_DIR keeps the file there.
func BenchmarkScaleFile(t *testing.B) {
	n, _ := strconv.Atoi(os.Getenv("BOLTSTORE_SCALE_N"))
	if n <= 0 {
		n = 100_000
	}
	dir := os.Getenv("BOLTSTORE_SCALE_DIR")
	if dir == "" {
		dir = t.TempDir()
	}
	path := filepath.Join(dir, "scale.db")
	_ = os.Remove(path)
	// BOLTSTORE_SCALE_RENEW: page allocations between reopens (renew.go);
	// unset: the default, -1: never.
	var opts Options
	if r, _ := strconv.ParseInt(os.Getenv("BOLTSTORE_SCALE_RENEW"), 10, 64); r != 0 {
		opts.renewAfter = r
		if r < 0 {
			opts.renewAfter = math.MaxInt64
		}
	}
	s, err := Open(path, opts)
	if err != nil {
		t.Fatal(err)
	}
	body := make([]byte, 256)
	base := time.Now().Add(30 * 24 * time.Hour)
	var msgBytes, rowBytes int64
	const batch = 500
	start := time.Now()
	ts := make([]storage.Timeout, 0, batch)
	for i := 0; i < n; i += batch {
		ts = ts[:0]
		for j := i; j < min(n, i+batch); j++ {
			id := uuid.NewString()
			due := base.Add(time.Duration(rand.Int64N(int64(24 * time.Hour))))
			enc, err := message.Encode(nil, &amqp.Publishing{MessageId: id, DeliveryMode: amqp.Persistent, Body: body,
				Headers: amqp.Table{"x-destination": "bench-0a1b2c-scale-dest", "x-due-at": due.UTC().Format(time.RFC3339Nano),
					"bench-due": due.UnixNano(), "bench-seq": int64(j)}})
			if err != nil {
				t.Fatal(err)
			}
			tm := storage.Timeout{ID: id, Destination: "bench-0a1b2c-scale-dest", DueAt: due, ReceivedAt: time.Now(), Message: enc}
			msgBytes += int64(len(enc))
			rowBytes += int64(len(enc) + len(id) + len(tm.Destination))
			ts = append(ts, tm)
		}
		if _, err := s.Insert(ctx, ts); err != nil {
			t.Fatal(err)
		}
		if i > 0 && i%(n/10/batch*batch+batch) == 0 {
			t.Logf("%d inserted, %.0f/s", i, float64(i)/time.Since(start).Seconds())
		}
	}
	took := time.Since(start)
	var fill runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&fill)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	t.Logf("Go heap at the end of the fill, after a GC: %.1f MiB in use; %d reopens, the last took %s",
		float64(fill.HeapInuse)/(1<<20), s.renew.renewals, s.renew.took)
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	runtime.GC()
	t1 := time.Now()
	s, err = Open(path, Options{})
	openTook := time.Since(t1)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.NextDue(ctx); err != nil {
		t.Fatal(err)
	}
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	err = s.db.View(func(tx *bolt.Tx) error {
		for _, name := range [][]byte{bucketRows, bucketIDs, bucketReady, bucketHeld} {
			st := tx.Bucket(name).Stats()
			t.Logf("bucket %-6s: %d keys, %.0f B/row allocated, leaf pages %.0f%% in use, %d overflow pages", name, st.KeyN,
				float64(st.BranchAlloc+st.LeafAlloc)/float64(n), 100*float64(st.LeafInuse)/float64(max(st.LeafAlloc, 1)), st.LeafOverflowN)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("free pages %d (%.0f B/row)", s.db.Stats().FreePageN, float64(s.db.Stats().FreePageN*4096)/float64(n))
	_ = s.Close()
	t.Logf("rows %d: file %d bytes = %.0f B/row; message %.0f B/row (file %.2fx); message+id+destination %.0f B/row (file %.2fx)",
		n, fi.Size(), float64(fi.Size())/float64(n), float64(msgBytes)/float64(n), float64(fi.Size())/float64(msgBytes),
		float64(rowBytes)/float64(n), float64(fi.Size())/float64(rowBytes))
	t.Logf("insert %.0f rows/s (%s); Open on the full file %s; Go heap after Open %s",
		float64(n)/took.Seconds(), took.Round(time.Millisecond), openTook.Round(time.Microsecond), fmt.Sprintf("%.1f MiB", float64(ms.HeapAlloc)/(1<<20)))
}

// BenchmarkConvertFile times the conversion of the format-1 file at
// BOLTSTORE_CONVERT_PATH (made, say, by TestScaleFile of an earlier build)
// and samples the Go heap while it runs: go test -run '^$' -bench
// ConvertFile -benchtime 1x. A measurement of a file the caller provides,
// so a benchmark; TestConvertFormat1 checks the conversion itself.
func BenchmarkConvertFile(t *testing.B) {
	path := os.Getenv("BOLTSTORE_CONVERT_PATH")
	if path == "" {
		t.Skip("BOLTSTORE_CONVERT_PATH not set")
	}
	before, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	peak := make(chan uint64)
	go func() {
		var top uint64
		var ms runtime.MemStats
		for {
			runtime.ReadMemStats(&ms)
			top = max(top, ms.HeapAlloc)
			select {
			case <-done:
				peak <- top
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	start := time.Now()
	s, err := Open(path, Options{})
	took := time.Since(start)
	close(done)
	top := <-peak
	if err != nil {
		t.Fatal(err)
	}
	pending, _, err := s.Stats(ctx)
	_ = s.Close()
	if err != nil {
		t.Fatal(err)
	}
	after, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("converted %d rows in %s (%.0f rows/s); file %d -> %d bytes; Go heap peak %.1f MiB",
		pending, took.Round(time.Millisecond), float64(pending)/took.Seconds(), before.Size(), after.Size(), float64(top)/(1<<20))
}
