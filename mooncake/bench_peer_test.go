package mooncake_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/kvctl/kvctl/mooncake"
	"github.com/kvctl/kvctl/mooncake/mooncaketest"
	"github.com/kvctl/kvctl/pool"
)

// BenchmarkNativePeerConns measures gets from one peer's segment (a helper process) with four
// goroutines, 32 pages of 64 KiB per get and 8 transfers per get, for several PeerConns bounds
// in the same run: below 32 the four gets in flight queue for connections, at 32 they all run
// and no batch dials.
//
//	go test -run '^$' -bench BenchmarkNativePeerConns -benchtime 5x -count 3 ./mooncake/
func BenchmarkNativePeerConns(b *testing.B) {
	const (
		goroutines = 4
		batch      = 32
		perG       = 128
		page       = 64 << 10
	)
	m := mooncaketest.StartMaster(b, mooncaketest.MasterOptions{})
	startHelper(b, m, "peer-conns-holder", 0, 0, 256<<20)
	w := newNative(b, m, 0)
	ctx := context.Background()
	keys := make([][]string, goroutines)
	buf := make([]byte, page)
	for g := range keys {
		for i := range perG {
			k := fmt.Sprintf("peer-conns/%d/%d", g, i)
			buf[0], buf[1] = byte(g), byte(i)
			if c := w.BatchPut(ctx, []string{k}, [][]byte{buf}, pool.ReplicateConfig{}); c[0] != pool.OK {
				b.Fatalf("put %s: %v", k, c[0])
			}
			keys[g] = append(keys[g], k)
		}
	}
	for _, conns := range []int{8, 16, 32} {
		b.Run(fmt.Sprintf("peer-conns=%d", conns), func(b *testing.B) {
			r, err := mooncake.NewNative(ctx, mooncake.NativeOptions{MasterAddr: m.RPCAddr, MetadataURL: m.MetadataURL,
				Transfers: 8, PeerConns: conns})
			if err != nil {
				b.Fatal(err)
			}
			defer r.Close()
			bufs := make([][][]byte, goroutines)
			for g := range bufs {
				bufs[g] = make([][]byte, batch)
				for j := range bufs[g] {
					bufs[g][j] = make([]byte, page)
				}
			}
			b.SetBytes(goroutines * perG * page)
			b.ResetTimer()
			for range b.N {
				err := atOnce(goroutines, func(g int) error {
					for s := 0; s < perG; s += batch {
						ks := keys[g][s : s+batch]
						for j, n := range r.BatchGet(ctx, ks, bufs[g]) {
							if n != page || bufs[g][j][0] != byte(g) || bufs[g][j][1] != byte(s+j) {
								return fmt.Errorf("get %s: %d bytes, tag %d/%d", ks[j], n, bufs[g][j][0], bufs[g][j][1])
							}
						}
					}
					return nil
				})
				if err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkLookupThenGet measures what the connector does for each request it loads from a
// peer's segment (a helper process): probe a request's 64 keys, then get its 64 pages of
// 64 KiB, four goroutines at once, each its own requests. "exist" probes with BatchIsExist and
// the get asks the master for the replica lists; "locate" probes with BatchLocate and the get
// reads from the lists the probe kept. Both run in the same process against the same pages,
// alternating a round at a time, so both see the same host. In "master-rtt=..." the reader
// reaches the master through a proxy that holds every chunk for half that long each way (a
// master across a network); the pages still come straight from the peer.
//
//	go test -run '^$' -bench BenchmarkLookupThenGet -benchtime 100x -count 3 ./mooncake/
func BenchmarkLookupThenGet(b *testing.B) {
	for _, rtt := range []time.Duration{0, 200 * time.Microsecond, 1 * time.Millisecond} {
		b.Run(fmt.Sprintf("master-rtt=%s", rtt), func(b *testing.B) { benchLookupThenGet(b, rtt) })
	}
}

func benchLookupThenGet(b *testing.B, rtt time.Duration) {
	const (
		goroutines = 4
		requests   = 8 // a goroutine's requests a round
		blocks     = 64
		page       = 64 << 10
	)
	m := mooncaketest.StartMaster(b, mooncaketest.MasterOptions{})
	startHelper(b, m, "lookup-get-holder", 0, 0, 256<<20)
	w := newNative(b, m, 0)
	ctx := context.Background()
	keys := make([][][]string, goroutines)
	buf := make([]byte, page)
	for g := range keys {
		keys[g] = make([][]string, requests)
		for r := range requests {
			for i := range blocks {
				k := fmt.Sprintf("lookup-get/%d/%d/%d", g, r, i)
				buf[0], buf[1] = byte(g), byte(r*blocks+i)
				if c := w.BatchPut(ctx, []string{k}, [][]byte{buf}, pool.ReplicateConfig{}); c[0] != pool.OK {
					b.Fatalf("put %s: %v", k, c[0])
				}
				keys[g][r] = append(keys[g][r], k)
			}
		}
	}
	master := m.RPCAddr
	if rtt > 0 {
		master = mooncaketest.DelayProxy(b, m.RPCAddr, rtt/2)
	}
	// A reader for each way: a reader that located pages reads them from its lists whichever
	// way probed last.
	readers := make([]*mooncake.Native, 2)
	for k := range readers {
		rd, err := mooncake.NewNative(ctx, mooncake.NativeOptions{MasterAddr: master, MetadataURL: m.MetadataURL})
		if err != nil {
			b.Fatal(err)
		}
		defer rd.Close()
		readers[k] = rd
	}
	bufs := make([][][]byte, goroutines)
	for g := range bufs {
		bufs[g] = make([][]byte, blocks)
		for j := range bufs[g] {
			bufs[g][j] = make([]byte, page)
		}
	}
	round := func(rd *mooncake.Native, probe func(context.Context, []string) []int) error {
		return atOnce(goroutines, func(g int) error {
			for r, ks := range keys[g] {
				for i, v := range probe(ctx, ks) {
					if v != 1 {
						return fmt.Errorf("probe %s: %d", ks[i], v)
					}
				}
				for j, n := range rd.BatchGet(ctx, ks, bufs[g]) {
					if n != page || bufs[g][j][0] != byte(g) || bufs[g][j][1] != byte(r*blocks+j) {
						return fmt.Errorf("get %s: %d bytes, tag %d/%d", ks[j], n, bufs[g][j][0], bufs[g][j][1])
					}
				}
			}
			return nil
		})
	}
	ways := []struct {
		name  string
		rd    *mooncake.Native
		probe func(context.Context, []string) []int
	}{{"exist", readers[0], readers[0].BatchIsExist}, {"locate", readers[1], readers[1].BatchLocate}}
	took := make([]time.Duration, len(ways))
	for _, w := range ways { // one untimed round each
		if err := round(w.rd, w.probe); err != nil {
			b.Fatal(w.name, err)
		}
	}
	b.SetBytes(goroutines * requests * blocks * page)
	b.ResetTimer()
	for i := range b.N {
		for k := range ways {
			k = (k + i) % len(ways)
			start := time.Now()
			if err := round(ways[k].rd, ways[k].probe); err != nil {
				b.Fatal(ways[k].name, err)
			}
			took[k] += time.Since(start)
		}
	}
	b.StopTimer()
	for k, w := range ways {
		b.ReportMetric(float64(took[k].Microseconds())/float64(b.N), w.name+"-us/round")
	}
	b.ReportMetric(took[0].Seconds()/took[1].Seconds(), "locate-speedup")
}

// BenchmarkNativeGetTransfers measures gets from one peer's segment (a helper process) by one
// loader (one engine's load) or four at once, each getting its own batch of pages in one
// BatchGet, for several NativeOptions.Transfers bounds (the transfers one batch runs at once),
// reading pages that lie back to back in one transfer (coalesce=256KiB, as kvctl does) or one
// page a transfer (coalesce=0KiB), in the same run; PeerConns is the default, so at most 32
// transfers to the peer run at once across the loaders. slowest-ms is the row's slowest round, where a get that stalls shows.
// Every page's first bytes are checked.
//
//	go test -run '^$' -bench BenchmarkNativeGetTransfers -benchtime 20x -count 2 ./mooncake/
func BenchmarkNativeGetTransfers(b *testing.B) {
	const maxLoaders = 4
	m := mooncaketest.StartMaster(b, mooncaketest.MasterOptions{})
	startHelper(b, m, "get-transfers-holder", 0, 0, 768<<20)
	w := newNative(b, m, 0)
	ctx := context.Background()
	for _, c := range []struct{ page, batch int }{{64 << 10, 256}, {256 << 10, 192}, {1 << 20, 64}} {
		keys := make([][]string, maxLoaders)
		buf := make([]byte, c.page)
		for g := range keys {
			for i := range c.batch {
				k := fmt.Sprintf("get-transfers/%d/%d/%d", c.page, g, i)
				buf[0], buf[1] = byte(g), byte(i)
				if code := w.BatchPut(ctx, []string{k}, [][]byte{buf}, pool.ReplicateConfig{}); code[0] != pool.OK {
					b.Fatalf("put %s: %v", k, code[0])
				}
				keys[g] = append(keys[g], k)
			}
		}
		for _, loaders := range []int{1, maxLoaders} {
			for _, row := range []struct{ transfers, coalesce int }{
				{8, 0}, {8, mooncake.MaxCoalesced}, {16, mooncake.MaxCoalesced}, {32, 0}, {32, mooncake.MaxCoalesced},
			} {
				name := fmt.Sprintf("page=%dKiB/batch=%d/loaders=%d/transfers=%d/coalesce=%dKiB", c.page>>10, c.batch, loaders, row.transfers, row.coalesce>>10)
				b.Run(name, func(b *testing.B) {
					r, err := mooncake.NewNative(ctx, mooncake.NativeOptions{MasterAddr: m.RPCAddr, MetadataURL: m.MetadataURL,
						Transfers: row.transfers})
					if err != nil {
						b.Fatal(err)
					}
					defer r.Close()
					mooncake.SetCoalesced(r, row.coalesce)
					bufs := make([][][]byte, loaders)
					for g := range bufs {
						bufs[g] = make([][]byte, c.batch)
						for j := range bufs[g] {
							bufs[g][j] = make([]byte, c.page)
						}
					}
					b.SetBytes(int64(loaders * c.batch * c.page))
					// The slowest get of the row: a get that stalls shows here, not in the mean.
					var slowest time.Duration
					b.ResetTimer()
					for range b.N {
						t0 := time.Now()
						err := atOnce(loaders, func(g int) error {
							for j, n := range r.BatchGet(ctx, keys[g], bufs[g]) {
								if n != int64(c.page) || bufs[g][j][0] != byte(g) || bufs[g][j][1] != byte(j) {
									return fmt.Errorf("get %s: %d bytes, tag %d/%d", keys[g][j], n, bufs[g][j][0], bufs[g][j][1])
								}
							}
							return nil
						})
						slowest = max(slowest, time.Since(t0))
						if err != nil {
							b.Fatal(err)
						}
					}
					b.ReportMetric(float64(slowest.Microseconds())/1e3, "slowest-ms")
				})
			}
		}
	}
}

// BenchmarkNativePutCoalesced measures puts into one peer's segment (a helper process; the
// writer has no segment, so every replica is a Transfer Engine WRITE) by one writer or four at
// once, each putting its own batch of 64 KiB pages in one BatchPut, writing pages the master
// lays out back to back in one transfer (coalesce=256KiB, as kvctl does) or one page a transfer
// (coalesce=0KiB), in the same run. The keys are removed between rounds, untimed.
//
//	go test -run '^$' -bench BenchmarkNativePutCoalesced -benchtime 20x -count 2 ./mooncake/
func BenchmarkNativePutCoalesced(b *testing.B) {
	const page, batch = 64 << 10, 256
	m := mooncaketest.StartMaster(b, mooncaketest.MasterOptions{})
	startHelper(b, m, "put-coalesced-holder", 0, 0, 256<<20)
	ctx := context.Background()
	for _, writers := range []int{1, 4} {
		for _, limit := range []int{0, mooncake.MaxCoalesced} {
			b.Run(fmt.Sprintf("page=%dKiB/batch=%d/writers=%d/coalesce=%dKiB", page>>10, batch, writers, limit>>10), func(b *testing.B) {
				w := newNative(b, m, 0)
				mooncake.SetCoalesced(w, limit)
				vals := make([][]byte, batch)
				for i := range vals {
					vals[i] = make([]byte, page)
					_, _ = rand.Read(vals[i])
				}
				keys := make([][]string, writers)
				for g := range keys {
					for i := range batch {
						keys[g] = append(keys[g], fmt.Sprintf("put-coalesced/%d/%d/%d", limit, g, i))
					}
				}
				b.SetBytes(int64(writers * batch * page))
				b.ResetTimer()
				for range b.N {
					err := atOnce(writers, func(g int) error {
						for i, c := range w.BatchPut(ctx, keys[g], vals, pool.ReplicateConfig{}) {
							if c != pool.OK {
								return fmt.Errorf("put %s: %v", keys[g][i], c)
							}
						}
						return nil
					})
					b.StopTimer()
					if err != nil {
						b.Fatal(err)
					}
					for _, ks := range keys {
						for _, k := range ks {
							if c := w.Remove(ctx, k, true); c != pool.OK {
								b.Fatalf("remove %s: %v", k, c)
							}
						}
					}
					b.StartTimer()
				}
			})
		}
	}
}

// atOnce runs f(0) .. f(n-1), each in a goroutine of its own, and returns their errors joined
// once all have returned.
func atOnce(n int, f func(g int) error) error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for g := range n {
		wg.Go(func() { errs[g] = f(g) })
	}
	wg.Wait()
	return errors.Join(errs...)
}
