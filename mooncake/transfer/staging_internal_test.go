package transfer

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestWeightedWaitsInOrderAndGivesUp(t *testing.T) {
	w := newWeighted(10)
	ctx := context.Background()
	if err := w.acquire(ctx, 8); err != nil {
		t.Fatal(err)
	}
	// A waiter that gives up leaves nothing behind.
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if err := w.acquire(short, 5); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("acquire beyond the budget: %v", err)
	}
	// FIFO: a small waiter that would fit does not overtake a large one queued before it.
	granted := make(chan int, 2)
	go func() { _ = w.acquire(ctx, 6); granted <- 6 }()
	waitWaiters(t, w, 1)
	go func() { _ = w.acquire(ctx, 1); granted <- 1 }()
	waitWaiters(t, w, 2)
	w.release(2) // 6 held: the 6-unit head still does not fit, so nobody goes
	time.Sleep(20 * time.Millisecond)
	select {
	case n := <-granted:
		t.Fatalf("waiter %d got in ahead of the queue head", n)
	default:
	}
	w.release(6)
	if a, b := <-granted, <-granted; a+b != 7 {
		t.Fatalf("granted %d and %d", a, b)
	}
	w.release(7)
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.cur != 0 || len(w.waiters) != 0 {
		t.Fatalf("after all releases: cur %d, %d waiters", w.cur, len(w.waiters))
	}
}

func TestBufferPoolClasses(t *testing.T) {
	var p bufferPool
	for _, n := range []int{1, 1 << 16, 1<<16 + 1, 1 << 20, 3 << 20} {
		b := p.get(n)
		if len(b) != n || cap(b) < n {
			t.Fatalf("get(%d): len %d cap %d", n, len(b), cap(b))
		}
		p.put(b)
		if again := p.get(n); len(again) != n {
			t.Fatalf("recycled get(%d): len %d", n, len(again))
		}
	}
}

func waitWaiters(t *testing.T, w *weighted, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		w.mu.Lock()
		got := len(w.waiters)
		w.mu.Unlock()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d waiters, want %d", got, n)
		}
	}
}
