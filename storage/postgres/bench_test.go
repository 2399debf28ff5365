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
	insertCPU(b, s, "s", 10)
	b.ReportMetric(float64(b.N*10)/b.Elapsed().Seconds(), "msgs/s")
}

// insertCPU runs b.N Inserts of rows rows each on s, a store of one
// connection, and reports its server process's CPU per row (pg-us/msg).
func insertCPU(b *testing.B, s *Store, prefix string, rows int) {
	var pid int
	if err := s.pool.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		b.Fatal(err)
	}
	cpu0, ok := procCPU(pid) // the server's: making the rows costs it nothing
	storetest.BenchInsert(b, s, prefix, rows)
	b.StopTimer()
	if cpu1, ok1 := procCPU(pid); ok && ok1 {
		b.ReportMetric((cpu1-cpu0).Seconds()*1e6/float64(b.N*rows), "pg-us/msg")
	}
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

// BenchmarkInsertFloor: what the insert costs the server per row, and how
// much of it the store's own checks and indexes are. One op = one Insert
// of 250 rows (512-byte bodies), on a store of one connection; pg-us/msg
// is its server process's CPU per row (the server must run on this host).
// "store" is Insert as it is, and "store-without-due" the same without
// the index timeouts_due (the price of the one index that only List, Bulk
// and the due-soon gauge read, destcount.go); the others run the same
// statement without the tombstone, later-send and pause checks, on the
// table as it is, with only its primary key, and with no index at all: the
// last is the heap, the WAL, the commit and the parameters alone.
func BenchmarkInsertFloor(b *testing.B) {
	unchecked := strings.NewReplacer(
		`WHERE NOT EXISTS (SELECT 1 FROM {{c}} c WHERE c.id = r.id COLLATE "C" AND c.expires_at > $10){{family}}`, `WHERE $10::timestamptz IS NOT NULL`,
		`(r.exchange, r.destination) IN (SELECT p.exchange, p.destination FROM {{p}} p WHERE NOT p.resuming)`, `false`,
		"{{conflict}}", "").Replace(insertSQL)
	if !strings.Contains(unchecked, "IS NOT NULL") || strings.Contains(unchecked, "{{p}}") {
		b.Fatal("the insert statement changed: update BenchmarkInsertFloor")
	}
	for _, v := range []struct {
		name string
		ddl  []string
	}{
		{"store", nil},
		{"store-without-due", []string{`DROP INDEX {{s}}.timeouts_due`}},
		{"unchecked", nil},
		{"primary-key-only", []string{`DROP INDEX {{s}}.timeouts_due`, `DROP INDEX {{s}}.timeouts_unpaused_ready`}},
		{"no-index", []string{`DROP INDEX {{s}}.timeouts_due`, `DROP INDEX {{s}}.timeouts_unpaused_ready`, `ALTER TABLE {{s}}.timeouts DROP CONSTRAINT timeouts_pkey`}},
	} {
		b.Run(v.name, func(b *testing.B) {
			s, err := Open(ctx, pgtest.Require(b), Options{Schema: pgtest.Schema(b), MaxConns: 1})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			for _, d := range v.ddl {
				if _, err := s.pool.Exec(ctx, strings.ReplaceAll(d, "{{s}}", s.qs)); err != nil {
					b.Fatal(err)
				}
			}
			if !strings.HasPrefix(v.name, "store") {
				s.q.insertNew = strings.NewReplacer("{{t}}", s.q.table).Replace(unchecked)
			}
			insertCPU(b, s, "f", 250)
		})
	}
}
