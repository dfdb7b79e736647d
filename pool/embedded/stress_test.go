package embedded_test

import (
	"fmt"
	"math/rand"
	"sync"
	"testing"
	"time"

	"github.com/kvctl/kvctl/core/keys"
	"github.com/kvctl/kvctl/pool"
	"github.com/kvctl/kvctl/pool/embedded"
)

// stressPage is the content every writer of key stores, so any reader can check it.
func stressPage(key string, size int) []byte {
	b := make([]byte, size)
	r := rand.New(rand.NewSource(int64(len(key)) * 7919))
	for i := 0; i < len(key); i++ {
		r.Seed(r.Int63() ^ int64(key[i]))
	}
	r.Read(b)
	return b
}

// TestConcurrentStress runs writers, readers, probers and removers against a pool that is far
// too small, with the eviction goroutine running, and checks every byte a get returns against
// the checksum of what was put. Run it with -race.
func TestConcurrentStress(t *testing.T) {
	o := embedded.DefaultOptions()
	o.Segments = []embedded.SegmentSpec{{Name: "s0", Capacity: 1 << 20}, {Name: "s1", Capacity: 1 << 20}}
	o.EvictionPeriod = time.Millisecond
	o.LeaseTTL = 2 * time.Millisecond
	p, err := embedded.NewEmbedded(o)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()

	const nKeys = 200
	sizes := []int{4 << 10, 16 << 10, 64 << 10}
	type ref struct {
		size int
		sum  keys.Checksum
	}
	want := make(map[string]ref, nKeys)
	names := make([]string, nKeys)
	for i := range names {
		k := fmt.Sprintf("stress/%03d", i)
		names[i] = k
		n := sizes[i%len(sizes)]
		want[k] = ref{n, keys.PageChecksum(stressPage(k, n))}
	}
	pages := map[string][]byte{}
	for _, k := range names {
		pages[k] = stressPage(k, want[k].size)
	}

	var wg sync.WaitGroup
	var mu sync.Mutex
	var problems []string
	report := func(format string, a ...any) {
		mu.Lock()
		if len(problems) < 20 {
			problems = append(problems, fmt.Sprintf(format, a...))
		}
		mu.Unlock()
	}
	var hits, gets int
	const workers, ops = 8, 300
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			r := rand.New(rand.NewSource(int64(w)))
			for i := 0; i < ops; i++ {
				batch := make([]string, 1+r.Intn(4))
				for j := range batch {
					batch[j] = names[r.Intn(nKeys)]
				}
				switch r.Intn(8) {
				case 0, 1, 2:
					bufs := make([][]byte, len(batch))
					for j, k := range batch {
						bufs[j] = pages[k]
					}
					cfg := pool.ReplicateConfig{}
					if r.Intn(10) == 0 {
						cfg.SoftPinAction = pool.SoftPinEnable
					}
					for j, c := range p.BatchPut(bg, batch, bufs, cfg) {
						if c != pool.OK && c != pool.ErrNoAvailableHandle {
							report("put %s = %v", batch[j], c)
						}
					}
				case 3, 4, 5:
					bufs := make([][]byte, len(batch))
					for j := range bufs {
						bufs[j] = make([]byte, 64<<10)
					}
					res := p.BatchGet(bg, batch, bufs)
					mu.Lock()
					gets += len(batch)
					mu.Unlock()
					for j, n := range res {
						k := batch[j]
						switch {
						case n >= 0:
							if int(n) != want[k].size || keys.PageChecksum(bufs[j][:n]) != want[k].sum {
								report("get %s returned %d bytes that do not match the put", k, n)
							}
							mu.Lock()
							hits++
							mu.Unlock()
						case n == int64(pool.ErrObjectNotFound), n == int64(pool.ErrReplicaNotReady):
						default:
							report("get %s = %d", k, n)
						}
					}
				case 6:
					for j, v := range p.BatchIsExist(bg, batch) {
						if v != 0 && v != 1 {
							report("exist %s = %d", batch[j], v)
						}
					}
				case 7:
					c := p.Remove(bg, batch[0], r.Intn(2) == 0)
					switch c {
					case pool.OK, pool.ErrObjectNotFound, pool.ErrObjectHasLease, pool.ErrReplicaNotReady:
					default:
						report("remove %s = %v", batch[0], c)
					}
				}
			}
		}(w)
	}
	wg.Wait()
	for _, pr := range problems {
		t.Error(pr)
	}
	// The eviction goroutine keeps freeing memory after the workers stop, and Stats and
	// Segments each take the pool's lock on their own. With no more puts the usage only falls,
	// so a Stats read between two equal Segments reads saw that same usage.
	segUsed := func() int64 {
		segs, err := p.Segments(bg)
		if err != nil {
			t.Fatal(err)
		}
		var used int64
		for _, s := range segs {
			used += s.Used
		}
		return used
	}
	var st pool.Stats
	for try := 0; ; try++ {
		before := segUsed()
		var err error
		if st, err = p.Stats(bg); err != nil {
			t.Fatal(err)
		}
		if after := segUsed(); before == after {
			if after != st.UsedBytes {
				t.Fatalf("segments use %d, pool says %d", after, st.UsedBytes)
			}
			break
		}
		if try == 1000 {
			t.Fatal("the pool's usage never held still between two reads")
		}
	}
	if st.UsedBytes < 0 || st.UsedBytes > st.CapacityBytes || st.ChecksumErrors != 0 {
		t.Fatalf("stats after stress: %+v", st)
	}
	t.Logf("gets %d, hits %d, eviction rounds %d, evicted %d+%d, alloc failures %d",
		gets, hits, st.Detail[embedded.DetailEvictionRounds], st.Detail[embedded.DetailEvictedPass1], st.Detail[embedded.DetailEvictedPass2], st.AllocFailures)
	if hits == 0 || st.Detail[embedded.DetailEvictionRounds] == 0 {
		t.Fatal("the stress run had no hits or no eviction: it tested nothing")
	}
	// With every reader gone, removing everything returns all memory.
	for _, k := range names {
		p.Remove(bg, k, true)
	}
	if st, _ := p.Stats(bg); st.UsedBytes != 0 || st.Detail[embedded.DetailFreeExtents] != 2 {
		t.Fatalf("after removing all: used %d, %d free extents", st.UsedBytes, st.Detail[embedded.DetailFreeExtents])
	}
}
