package connector

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/kvctl/kvctl/pool"
	"github.com/kvctl/kvctl/pool/embedded"
)

// testPool is what the engine tests need of a pool: the pool itself, plus reading a stored
// value back, evicting one key, listing keys and two call counters. memPool and embPool
// implement it, so the lifecycle tests run against the test double and the embedded pool.
type testPool interface {
	pool.Pool
	get(key string) ([]byte, bool)
	has(key string) bool
	evict(key string) bool
	keys() []string
	written() int    // objects the pool has stored (puts of existing keys excluded)
	existCalls() int // BatchIsExist calls
}

func (p *memPool) written() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.counter.written
}

func (p *memPool) existCalls() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.counter.existCalls
}

// embTestCapacity is the embedded pool's capacity in the engine tests: a few hundred test
// pages (12 to 48 bytes each). The test that stores most uses under 5 KB of it.
const embTestCapacity = 16 << 10

// embPool is the embedded pool on a manual clock with no eviction goroutine: eviction runs only
// through EvictNow, and leases and soft pins move only when the test advances the clock.
type embPool struct {
	*embedded.Embedded
	clock *embedded.ManualClock

	mu     sync.Mutex
	exists int
}

func newEmbPool(tb testing.TB, capacity int64, tune ...func(*embedded.Options)) *embPool {
	tb.Helper()
	p, err := makeEmbPool(capacity, tune...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = p.Close() })
	return p
}

// makeEmbPool is newEmbPool without the cleanup: the caller closes the pool.
func makeEmbPool(capacity int64, tune ...func(*embedded.Options)) (*embPool, error) {
	clock := embedded.NewManualClock(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
	o := embedded.DefaultOptions()
	o.Segments = []embedded.SegmentSpec{{Name: "connector-test", Capacity: capacity}}
	o.EvictionPeriod = 0
	o.Clock = clock
	for _, f := range tune {
		f(&o)
	}
	e, err := embedded.NewEmbedded(o)
	if err != nil {
		return nil, err
	}
	return &embPool{Embedded: e, clock: clock}, nil
}

func (p *embPool) BatchIsExist(ctx context.Context, keys []string) []int {
	p.mu.Lock()
	p.exists++
	p.mu.Unlock()
	return p.Embedded.BatchIsExist(ctx, keys)
}

func (p *embPool) existCalls() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exists
}

// get reads a value back through BatchGet (which grants a lease, as any reader's get does).
func (p *embPool) get(key string) ([]byte, bool) {
	q := p.BatchQuery(context.Background(), []string{key})[key]
	if !q.OK || len(q.Replicas) == 0 {
		return nil, false
	}
	buf := make([]byte, q.Replicas[0].Size)
	n := p.BatchGet(context.Background(), []string{key}, [][]byte{buf})[0]
	if n < 0 {
		return nil, false
	}
	return buf[:n], true
}

func (p *embPool) has(key string) bool {
	return p.BatchQuery(context.Background(), []string{key})[key].OK
}

// evict takes the key out as an eviction would, whatever its lease.
func (p *embPool) evict(key string) bool {
	return p.Remove(context.Background(), key, true) == pool.OK
}

func (p *embPool) keys() []string {
	ks, err := p.Keys(context.Background())
	if err != nil {
		panic(err)
	}
	return ks
}

func (p *embPool) written() int {
	st, err := p.Stats(context.Background())
	if err != nil {
		panic(err)
	}
	return int(st.Puts)
}

func (p *embPool) stats(tb testing.TB) pool.Stats {
	tb.Helper()
	st, err := p.Stats(context.Background())
	if err != nil {
		tb.Fatal(err)
	}
	return st
}

// poolKinds runs fn once per pool implementation, each as a subtest; newPool returns a fresh,
// empty pool of that kind.
func poolKinds(t *testing.T, fn func(t *testing.T, newPool func() testPool)) {
	t.Run("mem", func(t *testing.T) {
		fn(t, func() testPool { return newMemPool() })
	})
	t.Run("embedded", func(t *testing.T) {
		fn(t, func() testPool {
			p := newEmbPool(t, embTestCapacity)
			// Runs before the pool's Close: no test may lose a save for lack of room, and no
			// page may fail its checksum.
			t.Cleanup(func() {
				st := p.stats(t)
				if st.AllocFailures != 0 || st.ChecksumErrors != 0 {
					t.Errorf("embedded pool: %d allocation failures, %d checksum errors", st.AllocFailures, st.ChecksumErrors)
				}
			})
			return p
		})
	})
}

var (
	_ testPool = (*memPool)(nil)
	_ testPool = (*embPool)(nil)
)
