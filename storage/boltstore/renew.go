package boltstore

import (
	"errors"
	"fmt"
	"os"
	"time"

	bolt "go.etcd.io/bbolt"
)

// bbolt's freelist remembers, for each page it hands out from the free
// pages, the transaction that took it (the allocs map in bbolt's
// internal/freelist/shared.go), and forgets it only when that page is freed
// again. A page written once and then kept stays remembered while the file
// is open: with 10 M pending (1.8 M pages) that map grew past 40 MiB of Go
// heap over a fill (docs/scaling.md). It only lets pages be freed early
// between two readers, so losing it is safe, and bbolt empties it only at
// Open. So the commit loop reopens the file, between two commits, once the
// pages allocated since the last open could make that map large. A file of
// fewer pages than that never reopens.

const (
	// renewAfterAllocs is how many page allocations since Open make a
	// reopen due: the map holds at most one entry (16 bytes, about 32 with
	// the map's slack) for each, about 16 MiB.
	renewAfterAllocs = 512 << 10
	// renewCheckInterval is the least time between two checks.
	renewCheckInterval = 10 * time.Second
	// renewMaxWait is how long a due reopen waits for a moment when no
	// read is in progress before it waits for the reads instead.
	renewMaxWait = 30 * time.Second
)

// renewer decides when the commit loop reopens the file; it is used by
// commitLoop only.
type renewer struct {
	limit    int64 // page allocations; also the least file size in pages
	interval time.Duration
	maxWait  time.Duration
	last     time.Time
	due      time.Time     // a reopen is due since; zero: none
	renewals int           // reopens tried, for tests
	hook     func()        // tests: runs between the close and the open
	took     time.Duration // the last reopen's pause
}

// maybeRenew reopens the file if it is due (see renewer). It runs between
// two commits, in the commit loop: no write is in flight, and reads wait on
// dbMu for the moment it takes.
func (s *Store) maybeRenew(now time.Time) {
	r := &s.renew
	if s.dbErr != nil {
		return
	}
	if r.due.IsZero() {
		if now.Sub(r.last) < r.interval {
			return
		}
		r.last = now
		st := s.db.Stats() // since this db's Open
		if st.TxStats.GetPageCount() < r.limit {
			return
		}
		fi, err := os.Stat(s.path)
		if err != nil || fi.Size()/int64(s.db.Info().PageSize) < r.limit {
			return
		}
		r.due = now
	}
	// Waiting for a read in progress (a walk over every row, as Pause's,
	// can take seconds at 10 M) would hold up every write and new read
	// behind it. So the reopen takes a moment with no read in progress,
	// after one of the next commits, and waits for the reads only once
	// renewMaxWait has passed without one.
	if !s.dbMu.TryLock() {
		if now.Sub(r.due) < r.maxWait {
			return
		}
		s.dbMu.Lock()
	}
	st := s.db.Stats()
	start := time.Now()
	err := s.reopen()
	s.dbMu.Unlock()
	r.renewals++
	r.took, r.due = time.Since(start), time.Time{}
	if err != nil {
		s.log.Error().Err(err).Msg("store file could not be reopened; every store call fails until the bridge restarts")
		return
	}
	// Info: at most one line per renewCheckInterval, and only from a file
	// of millions of rows; the pause is what an operator may look for.
	s.log.Info().Dur("took", r.took).Int64("page_allocations", st.TxStats.GetPageCount()).
		Msg("store file reopened to empty bbolt's page allocation map (reads and writes paused meanwhile)")
}

// reopen closes and opens the file; on failure every later call fails with
// dbErr. The caller holds dbMu.
func (s *Store) reopen() error {
	closeErr := s.db.Close()
	if s.renew.hook != nil {
		s.renew.hook()
	}
	db, err := openDB(s.path, s.openTimeout)
	if err != nil {
		s.db = nil
		s.dbErr = fmt.Errorf("%w: reopening the file (done now and then to free bbolt's memory) failed: %w", ErrReopen, err)
		if closeErr != nil {
			s.dbErr = fmt.Errorf("%w (closing it: %w)", s.dbErr, closeErr)
		}
		return s.dbErr
	}
	s.db = db
	return nil
}

// ErrReopen: the store closed its file to reopen it and could not; the
// bridge must restart (another process may have taken the file's lock).
var ErrReopen = errors.New("boltstore: store file unavailable")

// view runs fn in a read transaction.
func (s *Store) view(fn func(tx *bolt.Tx) error) error {
	s.dbMu.RLock()
	defer s.dbMu.RUnlock()
	if s.dbErr != nil {
		return s.dbErr
	}
	return s.db.View(fn)
}

// failed returns the error of a failed reopen, if any.
func (s *Store) failed() error {
	s.dbMu.RLock()
	defer s.dbMu.RUnlock()
	return s.dbErr
}
