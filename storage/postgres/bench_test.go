package postgres

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/storage/postgres/pgtest"
	"github.com/delaybridge/delaybridge/storage/storetest"
)

// BenchmarkInsert: one op = one Insert (one transaction) of 256 rows with
// 512-byte bodies, the size of an ingest group commit.
func BenchmarkInsert(b *testing.B) {
	storetest.BenchInsert(b, open(b, nil), "b", 256)
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
	storetest.BenchLeaseRemove(b, s, 1000)
	b.ReportMetric(float64(b.N*1000)/b.Elapsed().Seconds(), "msgs/s")
}

// BenchmarkInsertSmall: one op = one Insert of 10 rows, as ingest commits
// them at a steady low rate, on a store of one connection whose server
// process's CPU time is reported per message (pg-us/msg, from
// /proc/<backend pid>/stat: the server must run on this host).
func BenchmarkInsertSmall(b *testing.B) {
	s, err := Open(ctx, pgtest.Require(b), Options{Schema: pgtest.Schema(b), MaxConns: 1})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	var pid int
	if err := s.pool.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		b.Fatal(err)
	}
	cpu0, ok := procCPU(pid) // the server's: making the rows costs it nothing
	storetest.BenchInsert(b, s, "s", 10)
	b.StopTimer()
	if cpu1, ok1 := procCPU(pid); ok && ok1 {
		b.ReportMetric((cpu1-cpu0).Seconds()*1e6/float64(b.N*10), "pg-us/msg")
	}
	b.ReportMetric(float64(b.N*10)/b.Elapsed().Seconds(), "msgs/s")
}

// procCPU is the user and system CPU time of process pid, from /proc.
func procCPU(pid int) (time.Duration, bool) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	// The fields after the command's closing parenthesis: utime and stime
	// are the 12th and 13th, in clock ticks (100 a second on Linux).
	f := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+1:]))
	if len(f) < 13 {
		return 0, false
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return time.Duration(u+st) * 10 * time.Millisecond, true
}
