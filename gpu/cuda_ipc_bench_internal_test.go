//go:build cgo && linux

package gpu

import (
	"bufio"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/kvctl/kvctl/core/keys"
	"github.com/kvctl/kvctl/core/kvmem"
)

// ipcChild is the other process of BenchmarkCUDAScatterIPC: it allocates argv[1] bytes of
// device memory with PyTorch (inside a larger allocation, as an engine's KV pool is), prints
// its CUDA IPC handle and offset as JSON, and holds the memory until its stdin closes; for each
// line it reads it runs a small kernel on its own context, waits for it and answers "ok".
const ipcChild = `
import json, sys, torch
n = int(sys.argv[1])
base = torch.empty(4096 + n, dtype=torch.uint8, device="cuda")
mem = base[4096:]
mem.fill_(0)
torch.cuda.synchronize()
shared = mem.untyped_storage()._share_cuda_()
x = torch.zeros(1 << 20, device="cuda")
torch.cuda.synchronize()
print(json.dumps({"handle": shared[1].hex(), "offset": shared[3] + mem.storage_offset()}), flush=True)
for line in sys.stdin:
    x.add_(1)
    torch.cuda.synchronize()
    print("ok", flush=True)
`

// BenchmarkCUDAScatterIPC times checked scatters of the batches a StartLoad through kvctl serve
// moves (12 MiB of 64 KiB pages in 2 regions, 48 MiB of 256 KiB pages in 8) into device memory
// another process allocated with PyTorch and exported over CUDA IPC, as the PyTorch engine's KV
// memory reaches the daemon, and into memory this process allocated; each with the GPU idle
// for 40 ms before every batch (as between a serving engine's passes in TestGPUTorchEngine) or
// not, and into the imported memory right after the other process ran a kernel on its own
// context ("touched", as the engine checks and writes its pages between StartLoads). It tells
// whether imported memory, or a GPU shared with another process's context, is what slows the
// daemon's loads against the mover's benchmarks. "prep" spends prepWork on the host before the
// scatter (in the timed load), as a load looks its keys and pool memory up first; "woken" wakes
// the device as that work begins (WakeDevice), as the connector's loads do. ms/load is the median of the timed loads
// (ScatterChecked and its wait); gpu-copy-ms and gpu-check-ms the device's own time (GPUTime).
// Needs KVCTL_IPC_PYTHON, a Python with PyTorch.
// prepWork is about the host's work before a StartLoad's first copy through kvctl serve on the
// H200 (keys, the pool's view, the batch's descriptors: 0.15–0.2 ms at 190 pages, run 43).
const prepWork = 150 * time.Microsecond

func BenchmarkCUDAScatterIPC(b *testing.B) {
	py := os.Getenv("KVCTL_IPC_PYTHON")
	if py == "" {
		b.Skip("set KVCTL_IPC_PYTHON to a Python with PyTorch")
	}
	d, err := OpenCUDA(0)
	if errors.Is(err, ErrNoCUDA) {
		b.Skip("no CUDA device")
	}
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	const memBytes = 48 << 20
	cmd := exec.Command(py, "-c", ipcChild, strconv.Itoa(memBytes))
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = in.Close(); _ = cmd.Wait() }()
	rd := bufio.NewReader(out)
	line, err := rd.ReadBytes('\n')
	if err != nil {
		b.Fatalf("the PyTorch process said nothing: %v", err)
	}
	var exported struct {
		Handle string `json:"handle"`
		Offset uint64 `json:"offset"`
	}
	if err := json.Unmarshal(line, &exported); err != nil {
		b.Fatalf("the PyTorch process said %q: %v", line, err)
	}
	handle, err := hex.DecodeString(exported.Handle)
	if err != nil {
		b.Fatal(err)
	}
	ipc, err := d.ImportIPC(handle, exported.Offset, memBytes)
	if err != nil {
		b.Fatal(err)
	}
	defer ipc.Close()
	local, err := d.AllocDeviceMemory(memBytes)
	if err != nil {
		b.Fatal(err)
	}
	defer local.Close()

	for _, c := range []struct{ pageKiB, regions, batchMiB int }{{64, 2, 12}, {256, 8, 48}} {
		size := c.pageKiB << 10
		slots := memBytes / size
		piece := uint64(size / c.regions)
		var regions []kvmem.Region
		for r := range c.regions {
			regions = append(regions, kvmem.Region{Offset: uint64(r*slots) * piece, Stride: piece, Size: piece})
		}
		l := kvmem.Layout{TokensPerBlock: 32, Groups: []kvmem.GroupLayout{{ID: 0, Slots: slots, Regions: regions}}}
		n := (c.batchMiB << 20) / size
		st, err := d.AllocPinned(n*size, true)
		if err != nil {
			b.Fatal(err)
		}
		src := make([][]byte, n)
		refs := make([]kvmem.PageRef, n)
		sums := make([]uint64, n)
		for i := range src {
			src[i] = st.Bytes()[i*size : (i+1)*size]
			for j := range src[i] {
				src[i][j] = byte(i*31 + j)
			}
			sums[i] = uint64(keys.PageChecksum(src[i]))
			refs[i] = kvmem.PageRef{Slot: (i * 7919) % slots}
		}
		for _, idle := range []time.Duration{0, 40 * time.Millisecond} {
			for _, dest := range []struct {
				name    string
				mem     *EngineMemory
				touched bool // the other process runs a kernel right before each load
				prep    bool // the load spends prepWork on the host before its scatter
				woken   bool // ... after WakeDevice
			}{{"local", local, false, false, false}, {"ipc", ipc, false, false, false}, {"ipc,touched", ipc, true, false, false},
				{"local,prep", local, false, true, false}, {"local,prep,woken", local, false, true, true},
				{"ipc,touched,prep", ipc, true, true, false}, {"ipc,touched,prep,woken", ipc, true, true, true}} {
				mv, err := d.NewMover(dest.mem, l, CUDAMoverOptions{})
				if err != nil {
					b.Fatal(err)
				}
				m := mv.(*cudaMover)
				b.Run(fmt.Sprintf("page=%dKiB/regions=%d/batch=%dMiB/idle=%v/%s", c.pageKiB, c.regions, c.batchMiB, idle, dest.name), func(b *testing.B) {
					b.SetBytes(int64(n * size))
					var each []time.Duration
					g0 := m.GPUTime()
					for b.Loop() {
						if idle > 0 || dest.touched {
							b.StopTimer()
							time.Sleep(idle)
							if dest.touched {
								if _, err := in.Write([]byte("t\n")); err != nil {
									b.Fatal(err)
								}
								if ok, err := rd.ReadString('\n'); err != nil || ok != "ok\n" {
									b.Fatalf("the PyTorch process answered %q: %v", ok, err)
								}
							}
							b.StartTimer()
						}
						t0 := time.Now()
						if dest.woken {
							if err := m.WakeDevice(); err != nil {
								b.Fatal(err)
							}
						}
						//nolint:revive // empty-block: a busy wait stands for the engine's CPU work before the step
						for dest.prep && time.Since(t0) < prepWork {
						}
						wait, err := m.ScatterChecked(context.Background(), src, refs, sums)
						if err != nil {
							b.Fatal(err)
						}
						bad, err := wait()
						if err != nil {
							b.Fatal(err)
						}
						each = append(each, time.Since(t0))
						if slices.Contains(bad, true) {
							b.Fatal("a page failed its check")
						}
					}
					slices.Sort(each)
					b.ReportMetric(float64(each[len(each)/2].Microseconds())/1e3, "ms/load")
					g := m.GPUTime()
					b.ReportMetric((g.Copy-g0.Copy).Seconds()*1e3/float64(len(each)), "gpu-copy-ms/load")
					b.ReportMetric((g.Check-g0.Check).Seconds()*1e3/float64(len(each)), "gpu-check-ms/load")
				})
				mv.Close()
			}
		}
		st.Close()
	}
}
