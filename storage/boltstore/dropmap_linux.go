package boltstore

import (
	"bytes"
	"os"
	"strconv"
	"syscall"
	"time"
	"unsafe"

	bolt "go.etcd.io/bbolt"
)

// bbolt reads through mmap, so every page of the file the bridge touches
// stays in its resident set until memory pressure reclaims it. With large
// messages that is most of the RSS: 300 forwards of 8 MiB peaked at 522–633
// MiB against a 512 MiB target, the bytes above the budget being mapped
// file pages, read to forward a message or to rewrite the leaf that holds
// it. The pages stay in the page cache when dropped from the map; a later
// read maps them again (a minor fault).

// dropMapped drops the whole pages of v, a value just copied out of the
// file's map. Only pages inside the map are dropped: a value written in
// this transaction lives on the heap, where MADV_DONTNEED would zero it.
func dropMapped(tx *bolt.Tx, v []byte) {
	if len(v) < dropMappedAbove {
		return
	}
	start := uintptr(unsafe.Pointer(unsafe.SliceData(v)))
	end := start + uintptr(len(v))
	base := tx.DB().Info().Data
	if start < base || end > base+uintptr(tx.Size()) {
		return
	}
	ps := uintptr(os.Getpagesize())
	lo, hi := (start+ps-1)&^(ps-1), end&^(ps-1)
	if hi <= lo {
		return
	}
	_ = syscall.Madvise(unsafe.Slice((*byte)(unsafe.Add(unsafe.Pointer(unsafe.SliceData(v)), lo-start)), hi-lo), syscall.MADV_DONTNEED)
}

// mapTrimmer drops the file's whole map from the resident set when the
// process's mapped file pages exceed limit, at most once per interval. It
// runs after commits (commitLoop), which is when leaves holding large
// values were rewritten, and only after a commit that touched a large
// record: with small records the mapped pages are the indexes' working
// set, which every insert touches at random. Dropping them there cost the
// 10 M fill a third of the bridge's CPU in page faults (docs/scaling.md).
// The pages of a large record rewritten only because a small neighbour in
// its leaf changed stay mapped until the next large write; they are clean
// file pages the kernel reclaims under pressure.
type mapTrimmer struct {
	limit    int64 // bytes
	interval time.Duration
	last     time.Time
	buf      []byte
	large    bool // a commit touched a large record since the last trim
	trims    int  // for tests
}

// mappedFileBytes returns the process's resident shared (file-backed)
// memory, from /proc/self/statm.
func (m *mapTrimmer) mappedFileBytes() int64 {
	f, err := os.Open("/proc/self/statm")
	if err != nil {
		return 0
	}
	defer f.Close()
	if m.buf == nil {
		m.buf = make([]byte, 128)
	}
	n, _ := f.Read(m.buf)
	fields := bytes.Fields(m.buf[:n])
	if len(fields) < 3 {
		return 0
	}
	pages, err := strconv.ParseInt(string(fields[2]), 10, 64)
	if err != nil {
		return 0
	}
	return pages * int64(os.Getpagesize())
}

// maybeTrim trims db's map if it is due; large tells whether the commit
// just made touched a large record.
func (m *mapTrimmer) maybeTrim(db *bolt.DB, now time.Time, large bool) {
	m.large = m.large || large
	if !m.large || now.Sub(m.last) < m.interval || m.mappedFileBytes() <= m.limit {
		return
	}
	m.last, m.large = now, false
	m.trims++
	// Inside a read transaction: bbolt remaps only under its exclusive mmap
	// lock, so the map cannot move while it is dropped.
	_ = db.View(func(tx *bolt.Tx) error {
		info := tx.DB().Info()
		if info.Data == 0 || tx.Size() <= 0 {
			return nil
		}
		// The map is not Go memory: reading the address as a pointer is
		// sound, and the GC ignores it.
		base := *(*unsafe.Pointer)(unsafe.Pointer(&info.Data))
		_ = syscall.Madvise(unsafe.Slice((*byte)(base), tx.Size()), syscall.MADV_DONTNEED)
		return nil
	})
}
