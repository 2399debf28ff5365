package testenv

import (
	"context"
	"sync"
	"testing"
	"time"
)

// Eventually polls cond every 5 ms until it holds, for at most timeout,
// and reports whether it held (WaitFor when failing the test is all there
// is to do).
func Eventually(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
}

// WaitFor polls cond every 5 ms until it holds; when it does not hold within
// timeout, the test fails with "timed out waiting for " what.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Eventually(timeout, cond) {
		t.Fatalf("timed out waiting for %s", what)
	}
}

// WaitNil waits up to timeout for the result on done of what a test runs
// in a goroutine (Run, typically), and fails the test unless it comes and
// is nil; what names it ("Run to return after Close").
func WaitNil(t testing.TB, done <-chan error, timeout time.Duration, what string) {
	t.Helper()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("waiting for %s: %v", what, err)
		}
	case <-time.After(timeout):
		t.Fatalf("timed out waiting for %s", what)
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
