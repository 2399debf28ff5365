//go:build !linux

package boltstore

import (
	"time"

	bolt "go.etcd.io/bbolt"
)

// dropMapped is a no-op where MADV_DONTNEED is not known to keep a shared
// file map's data (see dropmap_linux.go).
func dropMapped(*bolt.Tx, []byte) {}

type mapTrimmer struct {
	limit    int64
	interval time.Duration
}

func (*mapTrimmer) maybeTrim(*bolt.DB, time.Time, bool) {}
