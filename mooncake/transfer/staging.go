package transfer

import (
	"context"
	"errors"
	"math/bits"
	"sync"
	"syscall"
)

// weighted is a FIFO counting semaphore over bytes. Waiters are served in arrival order so a
// large request is not starved by a stream of small ones.
type weighted struct {
	mu      sync.Mutex
	size    int64
	cur     int64
	waiters []*waiter
}

type waiter struct {
	n     int64
	ready chan struct{}
}

func newWeighted(size int64) *weighted { return &weighted{size: size} }

// acquire takes n units, waiting until they are free or ctx ends. n never exceeds size
// (NewServer raises StagingBytes to MaxRequestSize).
func (w *weighted) acquire(ctx context.Context, n int64) error {
	w.mu.Lock()
	if len(w.waiters) == 0 && w.size-w.cur >= n {
		w.cur += n
		w.mu.Unlock()
		return nil
	}
	wt := &waiter{n: n, ready: make(chan struct{})}
	w.waiters = append(w.waiters, wt)
	w.mu.Unlock()
	select {
	case <-wt.ready:
		return nil
	case <-ctx.Done():
		w.mu.Lock()
		select {
		case <-wt.ready:
			// Granted while we gave up: hand it back.
			w.cur -= n
			w.wakeLocked()
		default:
			for i, x := range w.waiters {
				if x == wt {
					w.waiters = append(w.waiters[:i], w.waiters[i+1:]...)
					break
				}
			}
			// Removing the head may let the next waiters in.
			w.wakeLocked()
		}
		w.mu.Unlock()
		return ctx.Err()
	}
}

func (w *weighted) release(n int64) {
	w.mu.Lock()
	w.cur -= n
	w.wakeLocked()
	w.mu.Unlock()
}

func (w *weighted) wakeLocked() {
	for len(w.waiters) > 0 {
		wt := w.waiters[0]
		if w.size-w.cur < wt.n {
			return
		}
		w.cur += wt.n
		w.waiters = w.waiters[1:]
		close(wt.ready)
	}
}

// bufferPool recycles staging buffers in power-of-two size classes from 64 KiB up.
type bufferPool struct {
	classes [48]sync.Pool
}

const minClassShift = 16

func classOf(n int) int {
	if n <= 1<<minClassShift {
		return 0
	}
	return bits.Len(uint(n-1)) - minClassShift
}

// get returns a buffer of length n. Its contents are unspecified.
func (p *bufferPool) get(n int) []byte {
	c := classOf(n)
	if c >= len(p.classes) {
		return make([]byte, n)
	}
	if v := p.classes[c].Get(); v != nil {
		b := *(v.(*[]byte))
		return b[:n]
	}
	return make([]byte, n, 1<<(c+minClassShift))
}

func (p *bufferPool) put(b []byte) {
	c := classOf(cap(b))
	if c >= len(p.classes) || cap(b) != 1<<(c+minClassShift) {
		return
	}
	b = b[:cap(b)]
	p.classes[c].Put(&b)
}

// isTemporaryAccept reports accept errors worth retrying: out of descriptors or a connection
// reset before it was accepted.
func isTemporaryAccept(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) ||
		errors.Is(err, syscall.ECONNABORTED) || errors.Is(err, syscall.ECONNRESET)
}
