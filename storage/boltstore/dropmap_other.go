//go:build !linux

package boltstore

import bolt "go.etcd.io/bbolt"

// dropMapped is a no-op where MADV_DONTNEED is not known to keep a shared
// file map's data (see dropmap_linux.go).
func dropMapped(*bolt.Tx, []byte) {}
