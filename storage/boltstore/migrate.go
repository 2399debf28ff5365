package boltstore

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/rs/zerolog"
	bolt "go.etcd.io/bbolt"
)

// Format 1, written by builds before format 2, kept rows in bucket
// "timeouts" keyed by id (records of versions 1 to 3, codec.go), with
// indexes "ready" and "leased" (time + seq -> id), "due" (due + id), "sagas"
// and "cancelled" as now. Its pages were about half full, since ids arrive
// in random order: about 1.4 KiB of file per 256-byte message.
//
// migrate1 converts it by copying: the rows go, in chunks of one
// transaction each, into a new file beside it (path + ".format2"), which
// then replaces it. Until the rename the old file is untouched, so a crash
// or a full disk part-way leaves it as it was, readable by older builds,
// and the next Open starts the copy again. The copy is written without
// fsyncs and synced once before the rename. Leases in the old file belonged
// to a predecessor that died: the rows come over free, and migrate1 returns
// how many were leased. The old file stays open (and locked) throughout;
// the caller closes it and opens path again.
const migrateChunk = 2000

var bucketTimeoutsV1 = []byte("timeouts")

func migrate1(old *bolt.DB, path string, log zerolog.Logger) (recovered int, err error) {
	start := time.Now()
	tmp := path + ".format2"
	if err := os.Remove(tmp); err != nil && !errors.Is(err, os.ErrNotExist) {
		return 0, fmt.Errorf("convert format 1: %w", err)
	}
	nw, err := bolt.Open(tmp, 0o600, &bolt.Options{Timeout: time.Second, NoSync: true})
	if err != nil {
		return 0, fmt.Errorf("convert format 1: create %s: %w", tmp, err)
	}
	defer func() {
		if nw != nil {
			_ = nw.Close()
			_ = os.Remove(tmp)
		}
	}()
	var c counts
	err = old.View(func(otx *bolt.Tx) error {
		if err := nw.Update(createLayout); err != nil {
			return err
		}
		if src := otx.Bucket(bucketTimeoutsV1); src != nil {
			log.Warn().Str("path", path).Str("copy", tmp).Int("rows", src.Stats().KeyN).
				Msg("converting the store file from format 1 to 2, once; it is not ready until this is done")
			cur := src.Cursor()
			lastLog := time.Now()
			k, v := cur.First()
			for k != nil {
				err := nw.Update(func(tx *bolt.Tx) error {
					b, err := buckets(tx, &c)
					if err != nil {
						return err
					}
					b.ids.FillPercent = 1 // the rows come in id order
					for n := 0; k != nil && n < migrateChunk; n++ {
						r, err := decodeRecord(v)
						if err != nil {
							return fmt.Errorf("record %q: %w", k, err)
						}
						if r.index == idxLeased {
							recovered++
						}
						if err := b.add(&r.Timeout); err != nil {
							return fmt.Errorf("record %q: %w", k, err)
						}
						k, v = cur.Next()
					}
					return nil
				})
				if err != nil {
					return err
				}
				if time.Since(lastLog) >= 10*time.Second {
					lastLog = time.Now()
					log.Info().Int64("rows", c.pending).Dur("elapsed", time.Since(start)).Msg("converting the store file")
				}
			}
		}
		return nw.Update(func(tx *bolt.Tx) error {
			if src := otx.Bucket(bucketCancelled); src != nil {
				dst := tx.Bucket(bucketCancelled)
				if err := src.ForEach(dst.Put); err != nil {
					return err
				}
			}
			return writeCounts(tx.Bucket(bucketMeta), c)
		})
	})
	if err == nil {
		err = nw.Sync()
	}
	if err == nil {
		err = nw.Close()
		nw = nil
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err == nil {
		err = syncDir(filepath.Dir(path))
	}
	if err != nil {
		_ = os.Remove(tmp)
		return 0, fmt.Errorf("convert format 1: %w", err)
	}
	log.Warn().Str("path", path).Int64("rows", c.pending).Int("leases_freed", recovered).Dur("took", time.Since(start)).
		Msg("store file converted to format 2; older builds cannot read it")
	return recovered, nil
}

// syncDir makes a rename in dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}
