package connector

import "sync"

// fifo is an unbounded first-in first-out queue shared by producer and consumer goroutines.
type fifo[T any] struct {
	mu     sync.Mutex
	cond   *sync.Cond
	items  []T
	closed bool
	drain  bool // after close, hand out what is left
}

func newFIFO[T any]() *fifo[T] {
	q := &fifo[T]{}
	q.cond = sync.NewCond(&q.mu)
	return q
}

// push appends v; it reports false once the queue is closed.
func (q *fifo[T]) push(v T) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return false
	}
	q.items = append(q.items, v)
	q.cond.Signal()
	return true
}

// pop blocks for the next item; it reports false once the queue is closed and, unless it
// drains, at once even if items are left.
func (q *fifo[T]) pop() (T, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for len(q.items) == 0 && !q.closed {
		q.cond.Wait()
	}
	var zero T
	if len(q.items) == 0 || (q.closed && !q.drain) {
		return zero, false
	}
	v := q.items[0]
	q.items[0] = zero
	q.items = q.items[1:]
	return v, true
}

// close wakes every consumer. With drain, consumers still get the items left; without, they
// are skipped and returned.
func (q *fifo[T]) close(drain bool) (skipped []T) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed, q.drain = true, drain
	if !drain {
		skipped, q.items = q.items, nil
	}
	q.cond.Broadcast()
	return skipped
}
