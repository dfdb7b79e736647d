package radix

import (
	"bufio"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/kvctl/kvctl/core/keys"
)

// The benchmark tree comes from the Mooncake conversation trace: each request's hash_ids
// name its 512-token blocks, and equal ids mean a shared prefix. One pass over the trace
// yields about 183K distinct blocks, so the trace is replayed under several scope seeds (as
// if from several tenants) until the tree holds at least benchTargetBlocks.
const (
	benchTrace        = "testdata/conversation_trace.jsonl"
	benchTargetBlocks = 1_000_000
	benchT            = 512
)

type traceSet struct {
	chains [][]keys.Hash // one per request and replica
	blocks int           // distinct blocks over all chains
	steps  int           // total blocks over all chains
}

var (
	traceOnce sync.Once
	traceData *traceSet
	traceErr  error
)

func loadTrace(b *testing.B) *traceSet {
	b.Helper()
	traceOnce.Do(func() { traceData, traceErr = buildTraceSet() })
	if traceErr != nil {
		b.Skipf("trace not available: %v", traceErr)
	}
	return traceData
}

func buildTraceSet() (*traceSet, error) {
	f, err := os.Open(benchTrace)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var reqs [][]int64
	distinct := map[int64]struct{}{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var r struct {
			HashIDs []int64 `json:"hash_ids"`
		}
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return nil, err
		}
		reqs = append(reqs, r.HashIDs)
		for _, h := range r.HashIDs {
			distinct[h] = struct{}{}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	replicas := (benchTargetBlocks + len(distinct) - 1) / len(distinct)
	ts := &traceSet{blocks: replicas * len(distinct)}
	var buf [keys.HashSize + 8]byte
	for r := 0; r < replicas; r++ {
		var seed keys.Hash
		binary.LittleEndian.PutUint64(seed[:], uint64(r)+1)
		for _, ids := range reqs {
			chain := make([]keys.Hash, len(ids))
			parent := seed
			for i, h := range ids {
				copy(buf[:], parent[:])
				binary.LittleEndian.PutUint64(buf[keys.HashSize:], uint64(h))
				sum := sha256.Sum256(buf[:])
				copy(parent[:], sum[:keys.HashSize])
				chain[i] = parent
			}
			ts.chains = append(ts.chains, chain)
			ts.steps += len(chain)
		}
	}
	return ts, nil
}

func buildTraceTree(b *testing.B, ts *traceSet, cfg Config) *Tree {
	b.Helper()
	tr, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	blocks := make([]Block, 0, 256)
	for _, c := range ts.chains {
		blocks = blocks[:0]
		for _, k := range c {
			blocks = append(blocks, Block{Key: k, NumTokens: benchT})
		}
		if _, err := tr.InsertChain(nil, Root, blocks); err != nil {
			b.Fatal(err)
		}
	}
	if tr.Len() != ts.blocks {
		b.Fatalf("tree holds %d blocks, trace has %d", tr.Len(), ts.blocks)
	}
	return tr
}

// BenchmarkMatch1M matches every request of the replayed trace against the full tree. Each
// request's prefix is in the tree, so every key of a query is one block step.
func BenchmarkMatch1M(b *testing.B) {
	ts := loadTrace(b)
	tr := buildTraceTree(b, ts, Config{TokensPerBlock: benchT})
	buf := make([]NodeID, 0, 256)
	steps := 0
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		c := ts.chains[i%len(ts.chains)]
		m, err := tr.MatchAppend(buf, Query{Keys: c}, MatchOptions{})
		if err != nil {
			b.Fatal(err)
		}
		steps += len(m.Blocks)
	}
	elapsed := time.Since(start)
	b.ReportMetric(float64(steps)/elapsed.Seconds(), "blocksteps/s")
	b.ReportMetric(float64(tr.Len()), "treeblocks")
}

// BenchmarkInsert inserts the replayed trace's chains into a tree, restarting with an empty
// tree when the trace is used up. A block insert that finds its key present counts too.
func BenchmarkInsert(b *testing.B) {
	ts := loadTrace(b)
	blocks := make([][]Block, len(ts.chains))
	for i, c := range ts.chains {
		for _, k := range c {
			blocks[i] = append(blocks[i], Block{Key: k, NumTokens: benchT})
		}
	}
	tr, _ := New(Config{TokensPerBlock: benchT})
	buf := make([]NodeID, 0, 256)
	inserts := 0
	var paused time.Duration
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		j := i % len(blocks)
		if j == 0 && i > 0 {
			p := time.Now()
			b.StopTimer()
			tr, _ = New(Config{TokensPerBlock: benchT})
			b.StartTimer()
			paused += time.Since(p)
		}
		var err error
		if buf, err = tr.InsertChain(buf[:0], Root, blocks[j]); err != nil {
			b.Fatal(err)
		}
		inserts += len(blocks[j])
	}
	elapsed := time.Since(start) - paused
	b.ReportMetric(float64(inserts)/elapsed.Seconds(), "blockinserts/s")
	b.ReportMetric(float64(tr.Len()), "treeblocks")
}

// BenchmarkMemoryPerBlock reports the heap the trace tree takes per block: nodes, key index
// and LRU heap (key-only blocks, as in the pool index; pages are not the tree's).
func BenchmarkMemoryPerBlock(b *testing.B) {
	ts := loadTrace(b)
	for _, c := range []struct {
		name string
		cfg  Config
	}{
		{"tree", Config{TokensPerBlock: benchT}},
		{"tree-nolru", Config{TokensPerBlock: benchT, DisableLRU: true}},
	} {
		b.Run(c.name, func(b *testing.B) {
			var perBlock float64
			for i := 0; i < b.N; i++ {
				before := heapInUse()
				tr := buildTraceTree(b, ts, c.cfg)
				after := heapInUse()
				perBlock = float64(after-before) / float64(tr.Len())
				runtime.KeepAlive(tr)
			}
			b.ReportMetric(perBlock, "bytes/block")
		})
	}
	b.Run("poolindex", func(b *testing.B) {
		var perBlock float64
		for i := 0; i < b.N; i++ {
			before := heapInUse()
			p := NewPoolIndex(0)
			for _, c := range ts.chains {
				if _, err := p.Insert(c); err != nil {
					b.Fatal(err)
				}
			}
			after := heapInUse()
			perBlock = float64(after-before) / float64(p.Len())
			runtime.KeepAlive(p)
		}
		b.ReportMetric(perBlock, "bytes/block")
	})
}

func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}
