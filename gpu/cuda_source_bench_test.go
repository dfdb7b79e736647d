//go:build cgo && linux

package gpu_test

import (
	"context"
	"fmt"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kvctl/kvctl/core/kvmem"
	"github.com/kvctl/kvctl/gpu"
)

// BenchmarkCUDAScatterSource scatters 64 MiB of pages into device memory from three kinds of
// host memory: pinned memory the driver allocated ("pinned", as staging is), and anonymous
// memory registered with the device as the embedded pool's segments are, with and without
// transparent huge pages ("registered,thp", "registered"); with the copy kernel and with the
// copy engines. Loads read the pool's memory in place, so this is where a scatter's sources
// come from through kvctl serve.
func BenchmarkCUDAScatterSource(b *testing.B) {
	d := openCUDA(b)
	const total = 64 << 20
	for _, c := range []struct{ pageKiB, regions int }{{64, 2}, {256, 8}, {1024, 2}} {
		size := c.pageKiB << 10
		n := total / size
		piece := uint64(size / c.regions)
		var regions []kvmem.Region
		for r := range c.regions {
			regions = append(regions, kvmem.Region{Offset: uint64(r*n) * piece, Stride: piece, Size: piece})
		}
		l := kvmem.Layout{TokensPerBlock: 32, Groups: []kvmem.GroupLayout{{ID: 0, Slots: n, Regions: regions}}}
		mem, err := d.AllocDeviceMemory(total)
		if err != nil {
			b.Fatal(err)
		}
		for _, src := range []string{"pinned", "registered", "registered,thp"} {
			var host []byte
			switch src {
			case "pinned":
				p, err := d.AllocPinned(total, false)
				if err != nil {
					b.Fatal(err)
				}
				defer p.Close()
				host = p.Bytes()
			default:
				m, err := unix.Mmap(-1, 0, total, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON)
				if err != nil {
					b.Fatal(err)
				}
				defer unix.Munmap(m)
				if src == "registered,thp" {
					_ = unix.Madvise(m, unix.MADV_HUGEPAGE)
				}
				for i := range m {
					m[i] = byte(i)
				}
				reg, err := d.RegisterHost(m)
				if err != nil {
					b.Fatal(err)
				}
				defer reg.Close()
				host = m
			}
			refs := make([]kvmem.PageRef, n)
			bufs := make([][]byte, n)
			for i := range refs {
				refs[i] = kvmem.PageRef{Slot: (i * 7919) % n}
				bufs[i] = host[i*size : (i+1)*size]
			}
			for _, kernel := range []bool{true, false} {
				mv, err := d.NewMover(mem, l, gpu.CUDAMoverOptions{Scatter: scatterPath(kernel)})
				if err != nil {
					b.Fatal(err)
				}
				b.Run(fmt.Sprintf("page=%dKiB/regions=%d/%s/kernel=%v", c.pageKiB, c.regions, src, kernel), func(b *testing.B) {
					b.SetBytes(total)
					for b.Loop() {
						if err := mv.Scatter(context.Background(), bufs, refs); err != nil {
							b.Fatal(err)
						}
					}
				})
				mv.Close()
			}
		}
		mem.Close()
	}
}
