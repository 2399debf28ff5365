package testenv

import (
	"context"
	"sync"
	"testing"
	"time"
)

// Eventually polls cond every 10 ms until it holds, for at most timeout,
// and reports whether it held.
func Eventually(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

// WaitUntil fails the test unless cond holds within timeout; what names
// what it waited for.
func WaitUntil(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Eventually(timeout, cond) {
		t.Fatalf("timed out after %s waiting for %s", timeout, what)
	}
}

// Start runs run in a goroutine, with a context that stop cancels; stop
// then waits for run to return and returns its error. When the test ends
// without having stopped it, it is stopped then, and an error it returns
// fails the test.
func Start(t testing.TB, run func(context.Context) error) (stop func() error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	var once sync.Once
	var err error
	wait := func() { cancel(); err = <-done }
	t.Cleanup(func() {
		atEnd := false
		once.Do(func() { atEnd = true; wait() })
		if atEnd && err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return func() error {
		once.Do(wait)
		return err
	}
}
