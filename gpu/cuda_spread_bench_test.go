//go:build cgo && linux

package gpu_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kvctl/kvctl/core/kvmem"
	"github.com/kvctl/kvctl/gpu"
)

// BenchmarkCUDAScatterSpread scatters batches of the sizes a StartLoad through kvctl serve moves
// (8 and 48 MiB) from one large registered host area, as the embedded pool's segment is (anonymous
// memory with MADV_HUGEPAGE, registered with the device): "compact" takes the batch's pages from
// the first bytes of the area, "spread" from random page-aligned places over all of it, as a warm
// load's pages lie in a pool of several GiB. BenchmarkCUDAScatterSource's sources are always
// compact; the copy kernel reads host memory through the GPU's page tables, so this tells whether
// where the pages lie slows it.
func BenchmarkCUDAScatterSpread(b *testing.B) {
	d := openCUDA(b)
	const area = 4 << 30
	host, err := unix.Mmap(-1, 0, area, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON|unix.MAP_NORESERVE)
	if err != nil {
		b.Fatal(err)
	}
	defer unix.Munmap(host)
	_ = unix.Madvise(host, unix.MADV_HUGEPAGE)
	if err := unix.Madvise(host, unix.MADV_POPULATE_WRITE); err != nil {
		for i := 0; i < len(host); i += 4096 {
			host[i] = 1
		}
	}
	if thp, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/enabled"); err == nil {
		b.Logf("transparent huge pages: %s", strings.TrimSpace(string(thp)))
	}
	reg, err := d.RegisterHost(host)
	if err != nil {
		b.Fatal(err)
	}
	defer reg.Close()
	const maxBatch = 48 << 20
	for _, c := range []struct{ pageKiB, regions int }{{64, 2}, {256, 8}} {
		size := c.pageKiB << 10
		n := maxBatch / size
		piece := uint64(size / c.regions)
		var regions []kvmem.Region
		for r := range c.regions {
			regions = append(regions, kvmem.Region{Offset: uint64(r*n) * piece, Stride: piece, Size: piece})
		}
		l := kvmem.Layout{TokensPerBlock: 32, Groups: []kvmem.GroupLayout{{ID: 0, Slots: n, Regions: regions}}}
		mem, err := d.AllocDeviceMemory(maxBatch)
		if err != nil {
			b.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(1, uint64(size)))
		for _, batchMiB := range []int{8, 48} {
			pages := (batchMiB << 20) / size
			refs := make([]kvmem.PageRef, pages)
			for i := range refs {
				refs[i] = kvmem.PageRef{Slot: (i * 7919) % n}
			}
			for _, place := range []string{"compact", "spread"} {
				bufs := make([][]byte, pages)
				for i := range bufs {
					at := i * size
					if place == "spread" {
						at = rng.IntN(area/size) * size
					}
					bufs[i] = host[at : at+size]
				}
				for _, kernel := range []bool{true, false} {
					mv, err := d.NewMover(mem, l, gpu.CUDAMoverOptions{Scatter: scatterPath(kernel)})
					if err != nil {
						b.Fatal(err)
					}
					b.Run(fmt.Sprintf("page=%dKiB/regions=%d/batch=%dMiB/%s/kernel=%v", c.pageKiB, c.regions, batchMiB, place, kernel), func(b *testing.B) {
						b.SetBytes(int64(pages * size))
						for b.Loop() {
							if err := mv.Scatter(context.Background(), bufs, refs); err != nil {
								b.Fatal(err)
							}
						}
					})
					mv.Close()
				}
			}
		}
		mem.Close()
	}
}
