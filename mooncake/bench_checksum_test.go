package mooncake_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/kvctl/kvctl/mooncake"
	"github.com/kvctl/kvctl/mooncake/mooncaketest"
	"github.com/kvctl/kvctl/pool"
)

// BenchmarkObjectChecksumCost measures what NativeOptions.ObjectChecksum (serve's
// --object-checksum) costs: batches of 16 pages of 64 KiB put and got by two Native clients of
// one process, one with checksums and one without, against the same real master and the same
// segment holder (a helper process), so every byte crosses the Transfer Engine over loopback.
// The off and on rows alternate within one run; docs/PERFORMANCE.md records their ratio.
//
//	go test -run '^$' -bench BenchmarkObjectChecksumCost -benchtime 200x -count 3 ./mooncake/
func BenchmarkObjectChecksumCost(b *testing.B) {
	m := mooncaketest.StartMaster(b, mooncaketest.MasterOptions{})
	startHelper(b, m, "ck-holder", 0, 0, benchSegment)
	clients := map[string]*mooncake.Native{"off": newNative(b, m, 0), "on": checksumNative(b, m, 0)}
	ctx := context.Background()
	const batch, size = 16, 64 << 10
	bufs := make([][]byte, batch)
	for j := range bufs {
		bufs[j] = interopPage(fmt.Sprint("ck", j), size)
	}
	round := 0
	stored := map[string][2]int{} // mode: the last put round and its page batches
	for _, mode := range []string{"off", "on"} {
		b.Run("put_batch/16x64KiB/"+mode, func(b *testing.B) {
			if b.N*batch*size > benchSegment/3 {
				b.Fatalf("use a smaller -benchtime")
			}
			round++
			keys := make([]string, batch)
			b.SetBytes(batch * size)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				for j := range keys {
					keys[j] = fmt.Sprintf("ck/%s/%d/%d/%d", mode, round, i, j)
				}
				for _, c := range clients[mode].BatchPut(ctx, keys, bufs, pool.ReplicateConfig{}) {
					if c != pool.OK {
						b.Fatalf("put = %v", c)
					}
				}
			}
			b.StopTimer()
			// The pages stay for the get rows, which remove them.
			if old, ok := stored[mode]; ok {
				removeRound(ctx, clients[mode], mode, old)
			}
			stored[mode] = [2]int{round, b.N}
		})
	}
	for _, mode := range []string{"off", "on"} {
		b.Run("get_batch/16x64KiB/"+mode, func(b *testing.B) {
			keys := make([]string, batch)
			dst := make([][]byte, batch)
			for j := range dst {
				dst[j] = make([]byte, size)
			}
			b.SetBytes(batch * size)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				for j := range keys {
					keys[j] = fmt.Sprintf("ck/%s/%d/%d/%d", mode, stored[mode][0], i%stored[mode][1], j)
				}
				for j, got := range clients[mode].BatchGet(ctx, keys, dst) {
					if got != size {
						b.Fatalf("get %s = %d", keys[j], got)
					}
				}
			}
		})
	}
	for mode, r := range stored {
		removeRound(ctx, clients[mode], mode, r)
	}
}

// removeRound removes the pages one put row stored, so runs of -count fit the segment.
func removeRound(ctx context.Context, n *mooncake.Native, mode string, r [2]int) {
	for i := 0; i < r[1]; i++ {
		for j := 0; j < 16; j++ {
			_ = n.Remove(ctx, fmt.Sprintf("ck/%s/%d/%d/%d", mode, r[0], i, j), true)
		}
	}
}
