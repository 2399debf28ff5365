package boltstore

import (
	"os"
	"syscall"
	"unsafe"

	bolt "go.etcd.io/bbolt"
)

// dropMapped tells the kernel this process no longer needs the pages of v, a
// value just copied out of the file's map: a large message read for its
// forward would otherwise stay in the process's resident set (bbolt reads
// through mmap) until memory pressure reclaims it, and 300 forwards of 8 MiB
// showed as 2.4 GiB more RSS. The pages stay in the page cache; a later read
// maps them again. Only whole pages inside the map are dropped: a value
// written in this transaction lives on the heap, where MADV_DONTNEED would
// zero it.
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
