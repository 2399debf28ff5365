package budget

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestNilIsUnlimited(t *testing.T) {
	var b *Budget
	if New(0) != nil || New(-1) != nil {
		t.Fatal("New(≤0) is not nil")
	}
	if err := b.Acquire(context.Background(), 1<<40); err != nil || !b.TryAcquire(1<<40) {
		t.Fatal("a nil budget refused")
	}
	b.Release(1 << 40)
	if b.Total() != 0 || b.Held() != 0 {
		t.Fatal("a nil budget holds something")
	}
}

// acquireAsync acquires n in a goroutine; the channel reports its result.
func acquireAsync(ctx context.Context, b *Budget, n int64) <-chan error {
	c := make(chan error, 1)
	go func() { c <- b.Acquire(ctx, n) }()
	return c
}

func mustWait(t *testing.T, c <-chan error) {
	t.Helper()
	select {
	case err := <-c:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Acquire still waits after its bytes were released")
	}
}

func mustBlock(t *testing.T, c <-chan error) {
	t.Helper()
	select {
	case err := <-c:
		t.Fatalf("Acquire returned (%v) while the budget was full", err)
	case <-time.After(100 * time.Millisecond):
	}
}

func TestAcquireBlocksUntilReleased(t *testing.T) {
	b := New(100)
	ctx := context.Background()
	if err := b.Acquire(ctx, 60); err != nil {
		t.Fatal(err)
	}
	if b.TryAcquire(41) {
		t.Fatal("TryAcquire(41) with 40 left succeeded")
	}
	c := acquireAsync(ctx, b, 50)
	mustBlock(t, c)
	b.Release(60)
	mustWait(t, c)
	if b.Held() != 50 {
		t.Fatalf("held %d, want 50", b.Held())
	}
}

// A message larger than the budget is admitted once it is alone, and holds
// the whole budget meanwhile; it is never refused or left waiting forever.
func TestOversizedIsAdmittedAlone(t *testing.T) {
	b := New(100)
	ctx := context.Background()
	if err := b.Acquire(ctx, 1); err != nil {
		t.Fatal(err)
	}
	big := acquireAsync(ctx, b, 1000)
	mustBlock(t, big)
	// Waiters are served in order: a small one behind the big one waits.
	small := acquireAsync(ctx, b, 1)
	mustBlock(t, small)
	b.Release(1)
	mustWait(t, big)
	if b.Held() != 100 {
		t.Fatalf("held %d while the oversized message is in, want the whole budget 100", b.Held())
	}
	mustBlock(t, small)
	b.Release(1000)
	mustWait(t, small)
	b.Release(1)
	if b.Held() != 0 {
		t.Fatalf("held %d after every release", b.Held())
	}
}

func TestAcquireEndsWithItsContext(t *testing.T) {
	b := New(10)
	if err := b.Acquire(context.Background(), 10); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := acquireAsync(ctx, b, 5)
	mustBlock(t, c)
	cancel()
	select {
	case err := <-c:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Acquire after cancel: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Acquire outlived its context")
	}
	b.Release(10)
	if b.Held() != 0 || !b.TryAcquire(10) {
		t.Fatal("a cancelled Acquire kept bytes")
	}
}

func TestZeroBytesNeverWait(t *testing.T) {
	b := New(10)
	if !b.TryAcquire(10) {
		t.Fatal("TryAcquire of the whole budget failed")
	}
	if err := b.Acquire(context.Background(), 0); err != nil || !b.TryAcquire(0) {
		t.Fatal("an empty message waited")
	}
	b.Release(0)
	b.Release(10)
}
