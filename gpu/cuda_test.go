//go:build cgo && linux

package gpu_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kvctl/kvctl/core/kvmem"
	"github.com/kvctl/kvctl/core/kvmem/movertest"
	"github.com/kvctl/kvctl/gpu"
)

// openCUDA opens device 0 or skips the test where there is none.
func openCUDA(tb testing.TB) *gpu.CUDADevice {
	tb.Helper()
	d, err := gpu.OpenCUDA(0)
	if errors.Is(err, gpu.ErrNoCUDA) {
		tb.Skip("no CUDA device")
	}
	if err != nil {
		tb.Fatalf("open CUDA device: %v", err)
	}
	tb.Cleanup(func() {
		if err := d.Close(); err != nil {
			tb.Errorf("close device: %v", err)
		}
	})
	return d
}

type cudaEngine struct {
	mem  *gpu.EngineMemory
	d    *gpu.CUDADevice
	opts gpu.CUDAMoverOptions
}

func (e cudaEngine) Size() int                     { return int(e.mem.Size()) }
func (e cudaEngine) Write(off int, p []byte) error { return e.mem.CopyIn(uint64(off), p) }
func (e cudaEngine) Read(off int, p []byte) error  { return e.mem.CopyOut(uint64(off), p) }
func (e cudaEngine) Close() error                  { return e.mem.Close() }
func (e cudaEngine) NewMover(l kvmem.Layout) (kvmem.Mover, error) {
	return e.d.NewMover(e.mem, l, e.opts)
}

func cudaBackend(d *gpu.CUDADevice, opts gpu.CUDAMoverOptions) movertest.Backend {
	return movertest.Backend{Name: "cuda", NewEngine: func(t *testing.T, size int) movertest.Engine {
		mem, err := d.AllocDeviceMemory(uint64(size))
		if err != nil {
			t.Fatalf("device memory: %v", err)
		}
		return cudaEngine{mem: mem, d: d, opts: opts}
	}, LiveAllocations: gpu.PinnedAllocations}
}

// TestCUDAMover runs the Mover suite on device memory allocated as an engine does, with one
// stream, the default and four, and with a bounce buffer small enough to be flushed mid-batch.
func TestCUDAMover(t *testing.T) {
	d := openCUDA(t)
	t.Logf("device %d: %s, NUMA node %d, batch copy API %v", d.Ordinal(), d.Name(), d.NUMANode(), gpu.HasBatchCopy())
	before := gpu.PinnedAllocations()
	for _, o := range []gpu.CUDAMoverOptions{{Streams: 1}, {}, {Streams: 3, BounceBytes: 5000}, {PerCopy: true, Streams: 1}, {PerCopy: true, Streams: 4, BounceBytes: 5000},
		{Scatter: gpu.ScatterKernel}, {Scatter: gpu.ScatterKernel, BounceBytes: 5000}, {Scatter: gpu.ScatterCopyEngines}} {
		t.Run(fmt.Sprintf("streams=%d,bounce=%d,percopy=%v,scatter=%d", o.Streams, o.BounceBytes, o.PerCopy, o.Scatter), func(t *testing.T) {
			movertest.Run(t, cudaBackend(d, o))
		})
	}
	if got := gpu.PinnedAllocations(); got != before {
		t.Errorf("%d pinned allocations live after the suite, %d before", got, before)
	}
}

// TestCUDAPinned allocates and registers pinned memory, copies through it and checks that every
// allocation is released.
func TestCUDAPinned(t *testing.T) {
	d := openCUDA(t)
	before := gpu.PinnedAllocations()
	mem, err := d.AllocDeviceMemory(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	var bufs []*gpu.PinnedBuffer
	for _, register := range []bool{false, true, false, true} {
		p, err := d.AllocPinned(1<<20, register)
		if err != nil {
			t.Fatalf("pinned (register %v): %v", register, err)
		}
		if p.Registered() != (register || d.NUMANode() >= 0) {
			t.Errorf("registered = %v, asked %v with NUMA node %d", p.Registered(), register, d.NUMANode())
		}
		bufs = append(bufs, p)
	}
	if got := gpu.PinnedAllocations(); got != before+len(bufs) {
		t.Fatalf("%d pinned allocations live, want %d", got, before+len(bufs))
	}
	r := rand.New(rand.NewPCG(1, 2))
	for i, p := range bufs {
		b := p.Bytes()
		for j := range b {
			b[j] = byte(r.Uint32())
		}
		if err := mem.CopyIn(0, b); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, len(b))
		if err := mem.CopyOut(0, got); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, b) {
			t.Fatalf("buffer %d did not round-trip through the device", i)
		}
	}
	for _, p := range bufs {
		if err := p.Close(); err != nil {
			t.Fatalf("close pinned: %v", err)
		}
	}
	if got := gpu.PinnedAllocations(); got != before {
		t.Fatalf("%d pinned allocations live after close, %d before", got, before)
	}
}

// twoRegionLayout lays size bytes out as pages of two 4 KiB regions, the second 4 KiB after the
// first, so each page value interleaves with its neighbour in memory.
func twoRegionLayout(size uint64) kvmem.Layout {
	slots := int(size / 8192)
	return kvmem.Layout{TokensPerBlock: 32, Groups: []kvmem.GroupLayout{{ID: 0, Slots: slots, Regions: []kvmem.Region{
		{Offset: 0, Stride: 8192, Size: 4096}, {Offset: 4096, Stride: 8192, Size: 4096}}}}}
}

func pattern(n int, seed int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte((int64(i)*int64(2*seed+1) + int64(seed)) % 251)
	}
	return b
}

// exerciseEngine gathers every page and checks pattern seed 1, then scatters pattern seed 2.
func exerciseEngine(t *testing.T, m kvmem.Mover, size int) {
	t.Helper()
	ctx := context.Background()
	l := m.Layout()
	var pages []kvmem.PageRef
	var bufs [][]byte
	st, err := m.NewStaging(l.Groups[0].Slots, int(l.MaxValueSize()))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for s := range l.Groups[0].Slots {
		pages = append(pages, kvmem.PageRef{Slot: s})
		bufs = append(bufs, st.Slot(s))
	}
	if err := m.Gather(ctx, pages, bufs); err != nil {
		t.Fatalf("gather: %v", err)
	}
	// Page s holds bytes [8192·s, 8192·(s+1)) in memory order.
	want := pattern(size, 1)
	for s, b := range bufs {
		if !bytes.Equal(b, want[8192*s:8192*(s+1)]) {
			t.Fatalf("page %d does not hold the engine's bytes", s)
		}
	}
	next := pattern(size, 2)
	for s, b := range bufs {
		copy(b, next[8192*s:])
	}
	if err := m.Scatter(ctx, bufs, pages); err != nil {
		t.Fatalf("scatter: %v", err)
	}
}

// TestCUDAIPCFromPython imports a tensor that a separate PyTorch process exports with a CUDA IPC
// handle, reads its bytes and writes new ones that the process then checks.
func TestCUDAIPCFromPython(t *testing.T) {
	if os.Getenv("KVCTL_GPU_IPC_TEST") != "1" {
		t.Skip("set KVCTL_GPU_IPC_TEST=1 to run (needs python3 with PyTorch and a GPU)")
	}
	openCUDA(t)
	script, _ := filepath.Abs("testdata/ipc_engine.py")
	if s := os.Getenv("KVCTL_GPU_IPC_SCRIPT"); s != "" {
		script = s
	}
	const size = 4 << 20
	cmd := exec.Command("python3", script, fmt.Sprint(size))
	cmd.Stderr = os.Stderr
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatalf("start engine: %v", err)
	}
	defer cmd.Wait()
	defer stdin.Close()
	out := bufio.NewScanner(stdout)
	if !out.Scan() {
		t.Fatalf("engine printed nothing: %v", out.Err())
	}
	var msg struct {
		Handle string `json:"handle"`
		Offset uint64 `json:"offset"`
		Size   uint64 `json:"size"`
	}
	if err := json.Unmarshal(out.Bytes(), &msg); err != nil {
		t.Fatalf("engine said %q: %v", out.Text(), err)
	}
	h, err := hex.DecodeString(msg.Handle)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("handle of %d bytes, offset %d, size %d", len(h), msg.Offset, msg.Size)
	before := gpu.PinnedAllocations()
	m, err := gpu.OpenMover(kvmem.EngineHandle{Kind: kvmem.HandleCUDAIPC, IPC: h, Offset: msg.Offset, Size: msg.Size}, twoRegionLayout(msg.Size), gpu.CUDAMoverOptions{})
	if err != nil {
		t.Fatalf("open mover: %v", err)
	}
	exerciseEngine(t, m, size)
	if err := m.Close(); err != nil {
		t.Fatalf("close mover: %v", err)
	}
	if got := gpu.PinnedAllocations(); got != before {
		t.Errorf("%d pinned allocations live after close, %d before", got, before)
	}
	fmt.Fprintln(stdin, 2)
	if !out.Scan() || out.Text() != "OK" {
		t.Fatalf("engine check: %q %v", out.Text(), out.Err())
	}
}

// TestCUDAFDImport runs an engine in a child process that allocates exportable device memory and
// passes its file descriptor over a unix socket; this process imports it, reads and writes it,
// and the child checks what was written.
func TestCUDAFDImport(t *testing.T) {
	openCUDA(t)
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	mine, theirs := os.NewFile(uintptr(fds[0]), "engine-socket"), os.NewFile(uintptr(fds[1]), "kvctl-socket")
	defer mine.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCUDAFDEngineChild$", "-test.v")
	cmd.Env = append(os.Environ(), "KVCTL_GPU_FD_CHILD=1")
	cmd.ExtraFiles = []*os.File{theirs}
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	theirs.Close()
	defer cmd.Wait()

	buf, oob := make([]byte, 8), make([]byte, unix.CmsgSpace(4))
	n, oobn, _, _, err := unix.Recvmsg(int(mine.Fd()), buf, oob, 0)
	if err != nil || n != 8 {
		t.Fatalf("receive fd: %d bytes, %v", n, err)
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		t.Fatalf("control message: %v", err)
	}
	rights, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(rights) != 1 {
		t.Fatalf("rights: %v", err)
	}
	size := binary.LittleEndian.Uint64(buf)
	before := gpu.PinnedAllocations()
	m, err := gpu.OpenMover(kvmem.EngineHandle{Kind: kvmem.HandleCUDAFD, FD: rights[0], Size: size}, twoRegionLayout(size), gpu.CUDAMoverOptions{})
	unix.Close(rights[0])
	if err != nil {
		t.Fatalf("open mover: %v", err)
	}
	exerciseEngine(t, m, int(size))
	if err := m.Close(); err != nil {
		t.Fatalf("close mover: %v", err)
	}
	if got := gpu.PinnedAllocations(); got != before {
		t.Errorf("%d pinned allocations live after close, %d before", got, before)
	}
	if _, err := mine.Write([]byte{2}); err != nil {
		t.Fatal(err)
	}
	reply := make([]byte, 64)
	n, _ = mine.Read(reply)
	if got := string(reply[:n]); got != "OK" {
		t.Fatalf("engine check: %q", got)
	}
}

// TestCUDAFDEngineChild is the engine side of TestCUDAFDImport.
func TestCUDAFDEngineChild(t *testing.T) {
	if os.Getenv("KVCTL_GPU_FD_CHILD") != "1" {
		t.Skip("runs as the child of TestCUDAFDImport")
	}
	sock := os.NewFile(3, "socket")
	report := func(s string) { sock.Write([]byte(s)) }
	d := openCUDA(t)
	mem, fd, err := d.AllocExportable(4 << 20)
	if err != nil {
		report("alloc: " + err.Error())
		t.Fatal(err)
	}
	defer mem.Close()
	size := int(mem.Size())
	if err := mem.CopyIn(0, pattern(size, 1)); err != nil {
		t.Fatal(err)
	}
	var buf [8]byte
	binary.LittleEndian.PutUint64(buf[:], uint64(size))
	if err := unix.Sendmsg(int(sock.Fd()), buf[:], unix.UnixRights(fd), nil, 0); err != nil {
		t.Fatal(err)
	}
	unix.Close(fd)
	var seed [1]byte
	if _, err := sock.Read(seed[:]); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, size)
	if err := mem.CopyOut(0, got); err != nil {
		report(err.Error())
		t.Fatal(err)
	}
	if want := pattern(size, int(seed[0])); !bytes.Equal(got, want) {
		i := 0
		for got[i] == want[i] {
			i++
		}
		report(fmt.Sprintf("mismatch at byte %d", i))
		return
	}
	report("OK")
}

func TestCUDAImportErrors(t *testing.T) {
	d := openCUDA(t)
	if _, err := d.ImportIPC(make([]byte, 10), 0, 4096); err == nil || !strings.Contains(err.Error(), "handle of 10 bytes") {
		t.Errorf("short handle: %v", err)
	}
	if _, err := d.ImportIPC(make([]byte, 64), 0, 4096); err == nil {
		t.Error("an all-zero IPC handle opened")
	}
	if _, err := d.ImportFD(-1, 2<<20); err == nil {
		t.Error("fd -1 imported")
	}
	if _, err := gpu.OpenMover(kvmem.EngineHandle{Kind: "bogus"}, kvmem.Layout{}, gpu.CUDAMoverOptions{}); err == nil {
		t.Error("unknown kind accepted")
	}
}

// TestCUDARegisterHost registers ordinary mapped memory (as the connector registers the pool's
// segments), scatters pages from it and gathers them back into it, checks the bytes on the
// device, and checks the registration count: a second registration of the same range is
// counted, one of another size at the same address refused, and the range stays usable until
// the last Close.
func TestCUDARegisterHost(t *testing.T) {
	d := openCUDA(t)
	const size = 1 << 20
	l := twoRegionLayout(size)
	mem, err := d.AllocDeviceMemory(size)
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	m, err := d.NewMover(mem, l, gpu.CUDAMoverOptions{BounceBytes: 4096})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	host, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(host)
	r1, err := m.(kvmem.HostRegistrar).RegisterHost(host)
	if err != nil {
		t.Fatalf("register: %v", err)
	}
	r2, err := d.RegisterHost(host)
	if err != nil {
		t.Fatalf("second registration: %v", err)
	}
	if _, err := d.RegisterHost(host[:size/2]); err == nil {
		t.Fatal("a registration of another size at the same address was accepted")
	}
	want := pattern(size, 5)
	copy(host, want)
	slots := l.Groups[0].Slots
	var pages []kvmem.PageRef
	var bufs [][]byte
	for s := range slots {
		pages = append(pages, kvmem.PageRef{Slot: s})
		bufs = append(bufs, host[s*8192:(s+1)*8192])
	}
	ctx := context.Background()
	if err := m.Scatter(ctx, bufs, pages); err != nil {
		t.Fatalf("scatter from registered memory: %v", err)
	}
	if err := r1.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r1.Close(); err != nil { // a second Close of one holder does nothing
		t.Fatal(err)
	}
	got := make([]byte, size)
	if err := mem.CopyOut(0, got); err != nil {
		t.Fatal(err)
	}
	// Page s's value is its two 4 KiB regions: memory [8192s, 8192s+4096) and [8192s+4096, 8192(s+1)).
	if !bytes.Equal(got, want) {
		t.Fatal("device memory differs from the registered host bytes scattered into it")
	}
	clear(host)
	if err := m.Gather(ctx, pages, bufs); err != nil { // still registered through r2
		t.Fatalf("gather into registered memory: %v", err)
	}
	if !bytes.Equal(host, want) {
		t.Fatal("gathered bytes differ")
	}
	if err := r2.Close(); err != nil {
		t.Fatalf("unregister: %v", err)
	}
	// Unregistered memory still works, through the bounce buffer.
	clear(host)
	if err := m.Gather(ctx, pages, bufs); err != nil {
		t.Fatalf("gather after unregistering: %v", err)
	}
	if !bytes.Equal(host, want) {
		t.Fatal("gathered bytes differ after unregistering")
	}
}

// TestCUDARegisterHostSharedByDevices is two engines of one GPU, each with a device of its own
// (as kvctl serve opens one per registered engine), registering the same pool memory: the
// driver registers it once for the GPU's context, and the first engine leaving must not unpin
// it under the second, whose copy kernel reads it through the device's mapping. The second
// engine's scatter after the first closed its registration and its device must land the bytes.
func TestCUDARegisterHostSharedByDevices(t *testing.T) {
	first := openCUDA(t)
	second := openCUDA(t)
	const size = 4 << 20
	l := twoRegionLayout(size)
	host, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(host)
	r1, err := first.RegisterHost(host)
	if err != nil {
		t.Fatalf("first engine's registration: %v", err)
	}
	r2, err := second.RegisterHost(host)
	if err != nil {
		t.Fatalf("second engine's registration: %v", err)
	}
	mem, err := second.AllocDeviceMemory(size)
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	// The copy kernel reads registered memory in place; it is what an unpinned range breaks.
	m, err := second.NewMover(mem, l, gpu.CUDAMoverOptions{Scatter: gpu.ScatterKernel})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := r1.Close(); err != nil {
		t.Fatalf("first engine's registration closed: %v", err)
	}
	if err := first.Close(); err != nil {
		t.Fatalf("first engine's device closed: %v", err)
	}
	want := pattern(size, 7)
	copy(host, want)
	var pages []kvmem.PageRef
	var bufs [][]byte
	for s := range l.Groups[0].Slots {
		pages = append(pages, kvmem.PageRef{Slot: s})
		bufs = append(bufs, host[s*8192:(s+1)*8192])
	}
	if err := m.Scatter(context.Background(), bufs, pages); err != nil {
		t.Fatalf("second engine's scatter after the first left: %v", err)
	}
	got := make([]byte, size)
	if err := mem.CopyOut(0, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("device memory differs from the pool bytes scattered into it after the first engine left")
	}
	if err := r2.Close(); err != nil {
		t.Fatalf("second engine's registration closed: %v", err)
	}
	// Unregistered now: registering the range again is a fresh registration that succeeds.
	r3, err := second.RegisterHost(host)
	if err != nil {
		t.Fatalf("registration after the last holder closed: %v", err)
	}
	if err := r3.Close(); err != nil {
		t.Fatal(err)
	}
}
