//go:build cgo && linux

package gpu_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kvctl/kvctl/core/kvmem"
	"github.com/kvctl/kvctl/gpu"
)

var benchSizes = []struct {
	name string
	n    int
}{{"64KiB", 64 << 10}, {"256KiB", 256 << 10}, {"1MiB", 1 << 20}, {"4MiB", 4 << 20}}

const (
	benchEngineBytes = 1 << 30   // engine memory the pages live in
	benchCopyBytes   = 256 << 20 // bytes one raw-copy operation moves
)

func reportGBs(b *testing.B, bytesPerOp int) {
	b.SetBytes(int64(bytesPerOp))
	b.ReportMetric(float64(bytesPerOp)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
}

// BenchmarkPinnedCopy is the baseline: 256 MiB between pinned host memory and the device in
// chunks of the page size, one cuMemcpyAsync per chunk on one stream, one wait per operation.
func BenchmarkPinnedCopy(b *testing.B) {
	d := openCUDA(b)
	mem, err := d.AllocDeviceMemory(benchCopyBytes)
	if err != nil {
		b.Fatal(err)
	}
	defer mem.Close()
	host, err := d.AllocPinned(benchCopyBytes, false)
	if err != nil {
		b.Fatal(err)
	}
	defer host.Close()
	s, err := d.NewStream()
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	for _, dir := range []string{"H2D", "D2H"} {
		for _, sz := range append(benchSizes, struct {
			name string
			n    int
		}{"64MiB", 64 << 20}) {
			b.Run(dir+"/"+sz.name, func(b *testing.B) {
				for b.Loop() {
					if err := s.CopyChunks(dir == "H2D", mem.Pointer(), host.Bytes(), sz.n); err != nil {
						b.Fatal(err)
					}
				}
				reportGBs(b, benchCopyBytes)
			})
		}
	}
}

type moverVariant struct {
	name   string
	opts   gpu.CUDAMoverOptions
	batch  int  // pages per call
	bounce bool // buffers in ordinary Go memory instead of pinned staging
	// batchBytes, when set, raises the pages per call until a call moves this many bytes (the
	// connector's rule for loads read in place).
	batchBytes int
	// registered puts the buffers in ordinary mapped memory registered with RegisterHost, as
	// the pool's segments are when loads read them in place.
	registered bool
}

// BenchmarkMover moves batches of pages at random slots of 1 GiB of engine memory between pinned
// staging slots and the device, as the connector does after the pool filled the slots (Scatter,
// a load) or before it reads them (Gather, a save). "default" is what the connector gets: the
// default options and transfer_batch_size's default of 64 pages.
func BenchmarkMover(b *testing.B) {
	benchMover(b, []moverVariant{
		{name: "default", batch: 64},
		{name: "batch=256", batch: 256},
		{name: "streams=8", opts: gpu.CUDAMoverOptions{Streams: 8}, batch: 64},
		{name: "streams=1", opts: gpu.CUDAMoverOptions{Streams: 1}, batch: 64},
		{name: "percopy,streams=1", opts: gpu.CUDAMoverOptions{PerCopy: true, Streams: 1}, batch: 64},
		{name: "percopy,streams=4", opts: gpu.CUDAMoverOptions{PerCopy: true, Streams: 4}, batch: 64},
		{name: "go-memory", batch: 64, bounce: true},
	})
}

// BenchmarkMoverConnector is the mover as the connector drives it now that loads read the pool
// in place: buffers in ordinary mapped memory registered with the device (the pool's segments),
// default options, and 64 MiB per call (the connector's in-place batch; at least 64 pages).
// "staging" is the same batch from pinned staging slots, to show registered memory moves as
// fast; the 32 MiB and 64-page rows show what the batch size is worth.
func BenchmarkMoverConnector(b *testing.B) {
	benchMover(b, []moverVariant{
		{name: "registered,64MiB", batch: 64, batchBytes: 64 << 20, registered: true},
		{name: "staging,64MiB", batch: 64, batchBytes: 64 << 20},
		{name: "registered,32MiB", batch: 64, batchBytes: 32 << 20, registered: true},
		{name: "registered,64pages", batch: 64, registered: true},
	})
}

func benchMover(b *testing.B, variants []moverVariant) {
	d := openCUDA(b)
	mem, err := d.AllocDeviceMemory(benchEngineBytes)
	if err != nil {
		b.Fatal(err)
	}
	defer mem.Close()
	for _, op := range []string{"Scatter", "Gather"} {
		for _, sz := range benchSizes {
			for _, v := range variants {
				b.Run(fmt.Sprintf("%s/%s/%s", op, sz.name, v.name), func(b *testing.B) {
					slots := benchEngineBytes / sz.n
					l := kvmem.Layout{TokensPerBlock: 32, Groups: []kvmem.GroupLayout{{ID: 0, Slots: slots,
						Regions: []kvmem.Region{{Stride: uint64(sz.n), Size: uint64(sz.n)}}}}}
					m, err := d.NewMover(mem, l, v.opts)
					if err != nil {
						b.Fatal(err)
					}
					defer m.Close()
					batch := v.batch
					if v.batchBytes > 0 {
						batch = max(batch, v.batchBytes/sz.n)
					}
					st, err := m.NewStaging(batch, sz.n)
					if err != nil {
						b.Fatal(err)
					}
					defer st.Close()
					var host []byte
					if v.registered {
						host, err = unix.Mmap(-1, 0, batch*sz.n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
						if err != nil {
							b.Fatal(err)
						}
						defer unix.Munmap(host)
						reg, err := d.RegisterHost(host)
						if err != nil {
							b.Fatal(err)
						}
						defer reg.Close()
					}
					bufs := make([][]byte, batch)
					for i := range bufs {
						switch {
						case v.bounce:
							bufs[i] = make([]byte, sz.n)
						case v.registered:
							bufs[i] = host[i*sz.n : (i+1)*sz.n]
						default:
							bufs[i] = st.Slot(i)
						}
					}
					order := rand.New(rand.NewPCG(uint64(sz.n), 1)).Perm(slots)
					pages := make([]kvmem.PageRef, batch)
					ctx, next := context.Background(), 0
					for b.Loop() {
						for i := range pages {
							pages[i] = kvmem.PageRef{Slot: order[next%slots]}
							next++
						}
						if op == "Scatter" {
							err = m.Scatter(ctx, bufs, pages)
						} else {
							err = m.Gather(ctx, pages, bufs)
						}
						if err != nil {
							b.Fatal(err)
						}
					}
					reportGBs(b, batch*sz.n)
				})
			}
		}
	}
}
