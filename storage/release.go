package storage

import (
	"context"
	"sync"
	"time"
)

// Releaser is the part of Store that ReleaseEach needs.
type Releaser interface {
	Release(ctx context.Context, id, lock string, notBefore time.Time) error
}

// releaseEachParallel bounds the releases ReleaseEach has under way at once.
// It is boltstore's group (its maxGroup): as many as one commit takes.
const releaseEachParallel = 64

// ReleaseEach releases the leases refs name, each as Release(ref.ID,
// ref.Lock, notBefore) would, and returns each one's answer: results[i] for
// refs[i]. The releases are under way together, not one after another: a
// store that commits the writes that queue together (boltstore's group
// commit) commits them in one or a few commits instead of one each, and a
// shared store runs them on its connections at once. A caller giving back
// the leases of a batch that was not published (a lost broker connection)
// makes them leasable again in about the time of one commit, not of one
// commit per lease.
func ReleaseEach(ctx context.Context, s Releaser, refs []Ref, notBefore time.Time) []error {
	results := make([]error, len(refs))
	switch len(refs) {
	case 0:
		return results
	case 1:
		results[0] = s.Release(ctx, refs[0].ID, refs[0].Lock, notBefore)
		return results
	}
	sem := make(chan struct{}, releaseEachParallel)
	var wg sync.WaitGroup
	for i, r := range refs {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			results[i] = s.Release(ctx, r.ID, r.Lock, notBefore)
		}()
	}
	wg.Wait()
	return results
}
