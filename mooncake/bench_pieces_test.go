package mooncake_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/kvctl/kvctl/mooncake"
	"github.com/kvctl/kvctl/mooncake/mooncaketest"
	"github.com/kvctl/kvctl/pool"
)

// BenchmarkNativeGetPieces measures gets of 64 KiB values from a peer's segment (a helper
// process) into engine memory where each value lies in pieces: 2 (K and V apart) or 64 (K and
// V of 32 layers, 1 KiB each), four batches of 64 values a round, one after another. "pieces"
// reads each value straight into its pieces (BatchGetPieces, readv); "staged" reads it into a
// buffer of its own and then copies it into the pieces, as a load did before; "whole" reads
// each value into one buffer and copies nothing, the raw get both are held to. The cases take
// turns within each iteration, in an order that rotates, so they see the same host; each is
// reported in ms a round and as a ratio to "whole" (x-whole, higher is faster).
//
//	go test -run '^$' -bench BenchmarkNativeGetPieces -benchtime 40x -count 3 ./mooncake/
func BenchmarkNativeGetPieces(b *testing.B) {
	const (
		page   = 64 << 10
		batch  = 64
		rounds = 4
		values = batch * rounds
	)
	m := mooncaketest.StartMaster(b, mooncaketest.MasterOptions{})
	startHelper(b, m, "pieces-holder", 0, 0, 64<<20)
	w := newNative(b, m, 0)
	ctx := context.Background()
	keys := make([]string, values)
	for i := range keys {
		keys[i] = fmt.Sprintf("pieces/%d", i)
		if c := w.BatchPut(ctx, keys[i:i+1], [][]byte{interopPage(keys[i], page)}, pool.ReplicateConfig{}); c[0] != pool.OK {
			b.Fatalf("put %s: %v", keys[i], c[0])
		}
	}
	for _, split := range []int{2, 64} {
		b.Run(fmt.Sprintf("pieces=%d", split), func(b *testing.B) {
			r, err := mooncake.NewNative(ctx, mooncake.NativeOptions{MasterAddr: m.RPCAddr, MetadataURL: m.MetadataURL})
			if err != nil {
				b.Fatal(err)
			}
			defer r.Close()
			// Engine memory as a split layout lays it out: piece p of value v in region p.
			part := page / split
			mem := make([]byte, values*page)
			pieces := make([][][]byte, values)
			for v := range pieces {
				for p := range split {
					at := (p*values + v) * part
					pieces[v] = append(pieces[v], mem[at:at+part])
				}
			}
			whole := make([][]byte, values)
			for v := range whole {
				whole[v] = make([]byte, page)
			}
			stage := make([][]byte, batch)
			for j := range stage {
				stage[j] = make([]byte, page)
			}
			check := func(what string, got []int64, ks []string) {
				for j, n := range got {
					if n != page {
						b.Fatalf("%s: get %s: %d", what, ks[j], n)
					}
				}
			}
			cases := []struct {
				name string
				run  func()
			}{
				{"whole", func() {
					for s := 0; s < values; s += batch {
						check("whole", r.BatchGet(ctx, keys[s:s+batch], whole[s:s+batch]), keys[s:s+batch])
					}
				}},
				{"pieces", func() {
					for s := 0; s < values; s += batch {
						check("pieces", r.BatchGetPieces(ctx, keys[s:s+batch], pieces[s:s+batch]), keys[s:s+batch])
					}
				}},
				{"staged", func() {
					for s := 0; s < values; s += batch {
						check("staged", r.BatchGet(ctx, keys[s:s+batch], stage), keys[s:s+batch])
						for j := range batch {
							src := stage[j]
							for _, p := range pieces[s+j] {
								src = src[copy(p, src):]
							}
						}
					}
				}},
			}
			spent := make([]time.Duration, len(cases))
			b.ResetTimer()
			for i := range b.N {
				for k := range cases {
					c := (i + k) % len(cases)
					began := time.Now()
					cases[c].run()
					spent[c] += time.Since(began)
				}
			}
			b.StopTimer()
			for c := range cases {
				b.ReportMetric(float64(spent[c].Microseconds())/1e3/float64(b.N), cases[c].name+"-ms")
				b.ReportMetric(float64(spent[0])/float64(spent[c]), cases[c].name+"-x-whole")
			}
			// The last round's bytes, whichever case wrote them last, are the values.
			for v := range values {
				want := interopPage(keys[v], page)
				for p, piece := range pieces[v] {
					if string(piece) != string(want[p*part:(p+1)*part]) {
						b.Fatalf("value %d piece %d holds other bytes", v, p)
					}
				}
			}
		})
	}
}
