package boltstore

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/storage"
)

// rssFileKiB is the process's file-backed resident memory (mapped file
// pages), from /proc/self/status.
func rssFileKiB(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "RssFile:" {
			n, err := strconv.Atoi(f[1])
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("no RssFile in /proc/self/status")
	return 0
}

// Reading large messages leaves their pages out of the process's resident
// set (300 forwards of 8 MiB once pinned 2.4 GiB of mapped pages), and
// the messages read are whole, also when read again.
func TestLargeReadsDropTheirMappedPages(t *testing.T) {
	path := filepath.Join(t.TempDir(), "db")
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const n, size = 40, 4 << 20 // 160 MiB
	msg := func(i int) []byte { return bytes.Repeat([]byte{byte('a' + i%26)}, size) }
	for i := range n {
		if _, err := s.Insert(ctx, []storage.Timeout{{ID: fmt.Sprint(i), Destination: "q", DueAt: t0, Message: msg(i)}}); err != nil {
			t.Fatal(err)
		}
	}
	// Reopened, so that no page is mapped yet: writing maps some.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, path, nil)
	before := rssFileKiB(t)
	for round := range 2 {
		for i := range n {
			got, err := s.Get(ctx, fmt.Sprint(i))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got.Message, msg(i)) {
				t.Fatalf("round %d: message %d read back wrong", round, i)
			}
		}
	}
	// Without dropping, every page read stays mapped: about 160 MiB more.
	if grown := rssFileKiB(t) - before; grown > 32<<10 {
		t.Fatalf("mapped file pages grew by %d KiB reading %d MiB of messages; want them dropped", grown, n*size>>20)
	}
}

// Writing large messages does not leave the file's pages in the resident set
// either: a commit that rewrites a leaf reads the values it holds through the
// map.
func TestLargeWritesDoNotPinMappedPages(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "db"), nil)
	ctx := context.Background()
	const n, size = 60, 4 << 20 // 240 MiB
	for i := range n {
		if _, err := s.Insert(ctx, []storage.Timeout{{ID: fmt.Sprint(i), Destination: "q", DueAt: t0, Message: bytes.Repeat([]byte{'x'}, size)}}); err != nil {
			t.Fatal(err)
		}
	}
	// The trim runs after a commit, at most every mapTrimInterval.
	time.Sleep(mapTrimInterval)
	if _, err := s.Insert(ctx, []storage.Timeout{{ID: "last", Destination: "q", DueAt: t0}}); err != nil {
		t.Fatal(err)
	}
	if kib := rssFileKiB(t); kib > (mapTrimLimit+size)>>10+64<<10 {
		t.Fatalf("mapped file pages %d KiB after writing %d MiB; want at most about %d MiB", kib, n*size>>20, mapTrimLimit>>20)
	}
}

// Small records never drop the whole map, whatever the mapped size: there
// the mapped pages are the indexes every insert touches, and dropping them
// made the 10 M fill fault them back in, a third of the bridge's CPU. A
// large record does.
func TestOnlyLargeRecordsTrimTheMap(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		large int // bytes of the one large message, 0 for none
		want  bool
	}{
		{"small", 0, false},
		{"large", dropMappedAbove, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Open(filepath.Join(t.TempDir(), "db"), Options{})
			if err != nil {
				t.Fatal(err)
			}
			// Before the first write, which orders it before commitLoop's reads.
			s.trim.limit, s.trim.interval = 0, 0
			for i := range 10 {
				batch := make([]storage.Timeout, 500)
				for j := range batch {
					batch[j] = storage.Timeout{ID: fmt.Sprintf("%d-%d", i, j), Destination: "q", DueAt: t0.Add(time.Duration(j) * time.Second), Message: bytes.Repeat([]byte{'m'}, 256)}
				}
				if _, err := s.Insert(ctx, batch); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := s.Remove(ctx, []storage.Ref{{ID: "3-7"}}); err != nil {
				t.Fatal(err)
			}
			if tc.large > 0 {
				if _, err := s.Insert(ctx, []storage.Timeout{{ID: "big", Destination: "q", DueAt: t0, Message: bytes.Repeat([]byte{'x'}, tc.large)}}); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := s.Insert(ctx, []storage.Timeout{{ID: "last", Destination: "q", DueAt: t0}}); err != nil {
				t.Fatal(err)
			}
			if err := s.Close(); err != nil { // commitLoop has returned
				t.Fatal(err)
			}
			if got := s.trim.trims > 0; got != tc.want {
				t.Fatalf("map trimmed %d times; want trimmed: %v", s.trim.trims, tc.want)
			}
		})
	}
}
