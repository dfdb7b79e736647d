//go:build cgo && linux

package connector

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kvctl/kvctl/core/keys"
	"github.com/kvctl/kvctl/core/kvmem"
	"github.com/kvctl/kvctl/gpu"
	"github.com/kvctl/kvctl/pool"
)

// TestGPUCheckedLoadOnDevice loads pages from the embedded pool into device memory through a
// worker with the CUDA mover, which checks every page on the GPU where it lands. Pages corrupted
// in the pool fail exactly the requests that need them; every other page lands with the stored
// bytes; the loads went through the GPU checks, in many batches. Needs a CUDA device.
func TestGPUCheckedLoadOnDevice(t *testing.T) {
	d, err := gpu.OpenCUDA(0)
	if errors.Is(err, gpu.ErrNoCUDA) {
		t.Skip("no CUDA device")
	}
	if err != nil {
		t.Fatal(err)
	}
	// Cleanups, not defers: the worker and its mover close in cleanups, and the device and the
	// engine memory must outlive them (cleanups run last first).
	t.Cleanup(func() { _ = d.Close() })
	old := directCheckedBatchBytes
	directCheckedBatchBytes = 1 << 20
	defer func() { directCheckedBatchBytes = old }()
	const page, slots, n = 64 << 10, 512, 200
	half := uint64(page / 2)
	l := kvmem.Layout{TokensPerBlock: 32, Groups: []kvmem.GroupLayout{{ID: 0, Slots: slots, Regions: []kvmem.Region{
		{Offset: 0, Stride: half, Size: half}, {Offset: half * slots, Stride: half, Size: half}}}}}
	mem, err := d.AllocDeviceMemory(page * slots)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mem.Close() })
	pl := newEmbPool(t, 64<<20)
	opts := benchOptions()
	c, _ := keys.NewChain(keys.ChainConfig{TokensPerBlock: 32})
	hs, _ := c.Extend(prompt(11, 0, n*32))
	rng := rand.New(rand.NewPCG(7, 8))
	vals := make([][]byte, n)
	ks := make([]string, n)
	for i := range vals {
		vals[i] = make([]byte, page)
		for j := range vals[i] {
			vals[i][j] = byte(rng.Uint32())
		}
		ks[i] = opts.Namespace.PageKey(0, 32, page, hs[i])
	}
	for i, code := range pl.BatchPut(context.Background(), ks, vals, pool.ReplicateConfig{}) {
		if code != pool.OK {
			t.Fatalf("put %d: %v", i, code)
		}
	}
	corrupt := map[int]bool{3: true, 77: true, 150: true, 199: true}
	for i := range corrupt {
		pl.CorruptForTest(ks[i])
	}
	cm, err := d.NewMover(mem, l, gpu.CUDAMoverOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := cm.(kvmem.PageChecker).PageCheckError(); err != nil {
		t.Fatalf("the CUDA mover cannot check this layout: %v", err)
	}
	m := &timedMover{Mover: cm}
	t.Cleanup(func() { _ = m.Close() }) // after the worker's (cleanups run last first)
	w := registeredWorkerWith(t, opts, pl, m, l)
	var reqs []RequestTransfers
	slotOf := func(i int) int { return (i * 37) % slots }
	for i := range n {
		reqs = append(reqs, RequestTransfers{RequestID: fmt.Sprintf("r%03d", i), Pages: []PageTransfer{{Hash: keys.PageHashOf(hs[i]), Group: 0, Page: slotOf(i)}}})
	}
	w.BindMeta(Metadata{Loads: reqs})
	if err := w.StartLoad(context.Background()); err != nil {
		t.Fatal(err)
	}
	if m.checked < 10 {
		t.Fatalf("%d batches checked on the GPU, want many", m.checked)
	}
	failed := w.TakeFailedLoadRequests()
	slices.Sort(failed)
	var want []string
	for i := range n {
		if corrupt[i] {
			want = append(want, fmt.Sprintf("r%03d", i))
		}
	}
	if !slices.Equal(failed, want) {
		t.Fatalf("failed loads %v, want %v", failed, want)
	}
	got := make([]byte, page)
	for i := range n {
		if corrupt[i] {
			continue
		}
		s := uint64(slotOf(i))
		if err := mem.CopyOut(s*half, got[:half]); err != nil {
			t.Fatal(err)
		}
		if err := mem.CopyOut(half*slots+s*half, got[half:]); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, vals[i]) {
			t.Fatalf("page %d in slot %d differs from what was stored", i, s)
		}
	}
	if st := pl.stats(t); st.ChecksumErrors != int64(len(corrupt)) {
		t.Fatalf("pool counted %d checksum errors, want %d", st.ChecksumErrors, len(corrupt))
	}
}
