package connector

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvctl/kvctl/core/keys"
	"github.com/kvctl/kvctl/core/kvmem"
	"github.com/kvctl/kvctl/core/stats"
	"github.com/kvctl/kvctl/pool"
)

// registeredWorker is a worker with the base options over pool and m, with layout l registered,
// closed when the test ends.
func registeredWorker(t testing.TB, pl pool.Pool, m kvmem.Mover, l kvmem.Layout) *Worker {
	t.Helper()
	return registeredWorkerWith(t, baseOptions(), pl, m, l)
}

// registeredWorkerWith is registeredWorker with options o.
func registeredWorkerWith(t testing.TB, o Options, pl pool.Pool, m kvmem.Mover, l kvmem.Layout) *Worker {
	t.Helper()
	w, err := NewWorker(o, pl, m)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close(context.Background()) })
	if err := w.RegisterLayout(l); err != nil {
		t.Fatal(err)
	}
	return w
}

// checkingMover stands in for the CUDA mover's page checks (kvmem.PageChecker) where there is no
// GPU: after the scatter it hashes each page where it landed in engine memory, as the kernel
// does on the device (gpu/kernels/pagesum.cu), and compares with the checksum taken at put. The
// result is handed out by wait, after the next scatter, as the GPU's overlapped check is.
type checkingMover struct {
	registeringMover
	calls, pending *atomic.Int32
}

func newCheckingMover(l kvmem.Layout) checkingMover {
	return checkingMover{newRegisteringMover(l), new(atomic.Int32), new(atomic.Int32)}
}

func (m checkingMover) PageCheckError() error { return nil }

func (m checkingMover) ScatterChecked(ctx context.Context, src [][]byte, pages []kvmem.PageRef, sums []uint64) (func() ([]bool, error), error) {
	if len(sums) != len(pages) {
		return nil, fmt.Errorf("%d pages, %d sums", len(pages), len(sums))
	}
	if err := m.Scatter(ctx, src, pages); err != nil {
		return nil, err
	}
	m.calls.Add(1)
	bad := make([]bool, len(pages))
	for i, ref := range pages {
		bad[i] = uint64(keys.PageChecksum(pageBytes(m.hostMover, ref.Group, ref.Slot, ref.Replicated))) != sums[i]
	}
	m.pending.Add(1)
	return func() ([]bool, error) { m.pending.Add(-1); return bad, nil }, nil
}

func (m checkingMover) Clone() (kvmem.Mover, error) {
	c, _ := m.registeringMover.Clone()
	return checkingMover{c.(registeringMover), m.calls, m.pending}, nil
}

// TestGPUCheckedLoadNeverReportsCorruptedPages: with a mover that checks pages where they land,
// loads take the pool's pages unchecked and the mover's check decides. Pages corrupted in the
// pool, in several batches, fail exactly the requests that need them (handed back, counted by
// the pool as checksum errors); every other request's pages land with the saved bytes; every
// check is read before the load returns.
func TestGPUCheckedLoadNeverReportsCorruptedPages(t *testing.T) {
	old := directCheckedBatchBytes
	directCheckedBatchBytes = 4 * 64 // a few pages a batch: many batches, checks overlapping copies
	defer func() { directCheckedBatchBytes = old }()
	const n = 14
	pl := newEmbPool(t, 1<<20)
	l := testLayout(32)
	src := saveDirectPages(t, pl, l, n)
	ns := baseOptions().Namespace
	corrupt := map[int]bool{2: true, 9: true, 13: true}
	for i := range corrupt {
		k := ns.PageKey(0, testT, l.Groups[0].BytesPerPage(), directHash(i))
		if !pl.CorruptForTest(k) {
			t.Fatalf("no stored page %q", k)
		}
	}
	m := newCheckingMover(l)
	w := registeredWorker(t, pl, m, l)
	loadSavedPairs(t, w, n)
	if m.calls.Load() < 3 {
		t.Fatalf("%d checked scatters: the GPU-checked path with several batches is not under test", m.calls.Load())
	}
	if p := m.pending.Load(); p != 0 {
		t.Fatalf("%d checks not read when the load returned", p)
	}
	checkCorruptLoad(t, w, pl, m.hostMover, src, n, corrupt)
}

// checkCorruptLoad checks a load of n requests (request i's pages are saved page i of groups 0
// and 1, loaded into slot 16+i) whose pages in corrupt were corrupted in the pool: exactly those
// requests failed, every other page landed with the saved bytes, and the pool counted one
// checksum error per corrupted page.
func checkCorruptLoad(t *testing.T, w *Worker, pl *embPool, got, src *hostMover, n int, corrupt map[int]bool) {
	t.Helper()
	failed := w.TakeFailedLoadRequests()
	slices.Sort(failed)
	var want []string
	for i := range n {
		if corrupt[i] {
			want = append(want, fmt.Sprintf("r%02d", i))
		}
	}
	if !slices.Equal(failed, want) {
		t.Fatalf("failed loads %v, want %v", failed, want)
	}
	for i := range n {
		if corrupt[i] {
			continue
		}
		for g := range 2 {
			if !bytes.Equal(pageBytes(got, g, 16+i, false), pageBytes(src, g, i, false)) {
				t.Fatalf("request r%02d: group %d page holds other bytes than were saved", i, g)
			}
		}
	}
	if st := pl.stats(t); st.ChecksumErrors != int64(len(corrupt)) {
		t.Fatalf("pool counted %d checksum errors, want %d", st.ChecksumErrors, len(corrupt))
	}
}

// TestGPUPageChecksOff: with GPU checks turned off the same mover's pages are checked by the
// pool on the host, and the mover's check is never called.
func TestGPUPageChecksOff(t *testing.T) {
	gpuPageChecksOff = true
	defer func() { gpuPageChecksOff = false }()
	pl := newEmbPool(t, 1<<20)
	l := testLayout(16)
	saveDirectPages(t, pl, l, 3)
	ns := baseOptions().Namespace
	pl.CorruptForTest(ns.PageKey(0, testT, l.Groups[0].BytesPerPage(), directHash(1)))
	m := newCheckingMover(l)
	for i := range m.mem {
		m.mem[i] = 0xEE
	}
	w := registeredWorker(t, pl, m, l)
	w.BindMeta(Metadata{Loads: []RequestTransfers{
		{RequestID: "a", Pages: []PageTransfer{{Hash: keys.PageHashOf(directHash(0)), Group: 0, Page: 10}}},
		{RequestID: "b", Pages: []PageTransfer{{Hash: keys.PageHashOf(directHash(1)), Group: 0, Page: 11}}},
	}})
	if err := w.StartLoad(context.Background()); err != nil {
		t.Fatal(err)
	}
	if f := w.TakeFailedLoadRequests(); !slices.Equal(f, []string{"b"}) {
		t.Fatalf("failed loads %v, want [b]", f)
	}
	if m.calls.Load() != 0 {
		t.Fatal("the mover's check ran with GPU checks off")
	}
	if got := pageBytes(m.hostMover, 0, 11, false); !bytes.Equal(got, bytes.Repeat([]byte{0xEE}, len(got))) {
		t.Fatal("checked on the host, the corrupted page still reached engine memory")
	}
}

// timingMover is checkingMover with device times, as the CUDA mover's events give them: each
// check read adds copy and check time.
type timingMover struct {
	checkingMover
	read *atomic.Int32
}

const fakeGPUCopy, fakeGPUCheck = 3 * time.Millisecond, time.Millisecond

func (m timingMover) ScatterChecked(ctx context.Context, src [][]byte, pages []kvmem.PageRef, sums []uint64) (func() ([]bool, error), error) {
	wait, err := m.checkingMover.ScatterChecked(ctx, src, pages, sums)
	if err != nil {
		return nil, err
	}
	return func() ([]bool, error) { m.read.Add(1); return wait() }, nil
}

func (m timingMover) GPUTime() kvmem.GPUTime {
	n := time.Duration(m.read.Load())
	return kvmem.GPUTime{Copy: n * fakeGPUCopy, Check: n * fakeGPUCheck}
}

// TestGPUCheckedLoadRecordsGPUTime: a load checked on the GPU adds the mover's device time of
// its own checks to the load stats, and only that (the mover's totals before the load are not
// counted again).
func TestGPUCheckedLoadRecordsGPUTime(t *testing.T) {
	old := directCheckedBatchBytes
	directCheckedBatchBytes = 4 * 64
	defer func() { directCheckedBatchBytes = old }()
	pl := newEmbPool(t, 1<<20)
	l := testLayout(32)
	saveDirectPages(t, pl, l, 10)
	m := timingMover{newCheckingMover(l), new(atomic.Int32)}
	m.read.Store(7) // checks read before this worker's loads
	rep, err := stats.NewReporter(stats.ReporterOptions{Interval: time.Hour, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	o := baseOptions()
	o.Stats = rep
	w := registeredWorkerWith(t, o, pl, m, l)
	var reqs []RequestTransfers
	for i := range 10 {
		reqs = append(reqs, RequestTransfers{RequestID: fmt.Sprintf("r%02d", i), Pages: []PageTransfer{{Hash: keys.PageHashOf(directHash(i)), Group: 0, Page: 16 + i}}})
	}
	w.BindMeta(Metadata{Loads: reqs})
	if err := w.StartLoad(context.Background()); err != nil {
		t.Fatal(err)
	}
	checks := time.Duration(m.calls.Load())
	if checks < 2 {
		t.Fatalf("%d checked scatters", checks)
	}
	tot := rep.LoadTotals()
	if tot.GPUCopySum != checks*fakeGPUCopy || tot.GPUCheckSum != checks*fakeGPUCheck {
		t.Fatalf("load stats GPU time copy %v check %v, want %v and %v for %d checks", tot.GPUCopySum, tot.GPUCheckSum, checks*fakeGPUCopy, checks*fakeGPUCheck, checks)
	}
}

// issuingMover is checkingMover queueing its checked scatters (kvmem.AsyncPageChecker): the
// copy lands at once, and the check runs only when wait is called, so a page whose source the
// load gave back (its pool view released) before the wait would be checked too late.
type issuingMover struct {
	checkingMover
	issued  *atomic.Int32
	batches *[]int // pages per issued batch
}

func (m issuingMover) IssueChecked(ctx context.Context, src [][]byte, pages []kvmem.PageRef, sums []uint64) (func() ([]bool, error), error) {
	if len(sums) != len(pages) {
		return nil, fmt.Errorf("%d pages, %d sums", len(pages), len(sums))
	}
	if err := m.Scatter(ctx, src, pages); err != nil {
		return nil, err
	}
	m.issued.Add(1)
	m.pending.Add(1)
	*m.batches = append(*m.batches, len(pages))
	return func() ([]bool, error) {
		m.pending.Add(-1)
		bad := make([]bool, len(pages))
		for i, ref := range pages {
			bad[i] = uint64(keys.PageChecksum(pageBytes(m.hostMover, ref.Group, ref.Slot, ref.Replicated))) != sums[i]
		}
		return bad, nil
	}, nil
}

// TestGPUIssuedLoad: with a mover that queues checked scatters without waiting for them, a load
// issues a first batch of about a quarter of its bytes and the rest behind it, reads every
// check before it returns, fails exactly the requests whose pages were corrupted in the pool
// (counted by the pool as checksum errors) and lands every other page.
func TestGPUIssuedLoad(t *testing.T) {
	const n = 16
	pl := newEmbPool(t, 4<<20)
	l := testLayout(32)
	src := saveDirectPages(t, pl, l, n)
	ns := baseOptions().Namespace
	corrupt := map[int]bool{1: true, 12: true}
	for i := range corrupt {
		if !pl.CorruptForTest(ns.PageKey(0, testT, l.Groups[0].BytesPerPage(), directHash(i))) {
			t.Fatalf("no stored page %d", i)
		}
	}
	var batches []int
	m := issuingMover{newCheckingMover(l), new(atomic.Int32), &batches}
	oldMin, oldPages := issuedFirstBatchMin, issuedSplitMinPages
	issuedFirstBatchMin, issuedSplitMinPages = 1, 1
	defer func() { issuedFirstBatchMin, issuedSplitMinPages = oldMin, oldPages }()
	w := registeredWorker(t, pl, m, l)
	loadSavedPairs(t, w, n)
	if len(batches) != 2 || batches[0] > batches[1] {
		t.Fatalf("issued batches of %v pages, want a small first one and the rest", batches)
	}
	if m.calls.Load() != 0 {
		t.Fatalf("%d scatters waited for: an issuing mover's load queues them all", m.calls.Load())
	}
	if p := m.pending.Load(); p != 0 {
		t.Fatalf("%d checks not read when the load returned", p)
	}
	checkCorruptLoad(t, w, pl, m.hostMover, src, n, corrupt)
}

// TestFirstIssuedBatch pins which checked loads a queueing mover gets in two batches and how
// large the first is: many pages, or enough small ones, split a quarter first; fewer, or larger,
// pages go in one batch.
func TestFirstIssuedBatch(t *testing.T) {
	pages := func(n, size int) []loadItem {
		items := make([]loadItem, n)
		for i := range items {
			items[i].size = size
		}
		return items
	}
	for _, c := range []struct {
		name  string
		items []loadItem
		want  int
	}{
		{"190 pages of 64 KiB", pages(190, 64<<10), 190 * 64 << 10 / 4},
		{"128 pages of 128 KiB", pages(128, 128<<10), 4 << 20},
		{"127 pages of 64 KiB", pages(127, 64<<10), 0},
		{"190 pages of 256 KiB", pages(190, 256<<10), 0},
		{"255 pages of 256 KiB", pages(255, 256<<10), 0},
		{"256 pages of 256 KiB", pages(256, 256<<10), 16 << 20},
		{"768 pages of 64 KiB", pages(768, 64<<10), 12 << 20},
		{"256 pages of 4 KiB: at least 1 MiB first", pages(256, 4<<10), 1 << 20},
		{"none", nil, 0},
	} {
		if got := firstIssuedBatch(c.items); got != c.want {
			t.Errorf("%s: first batch of %d bytes, want %d", c.name, got, c.want)
		}
	}
}

// TestGPUIssuedLoadFewPages: a load of fewer pages than issuedSplitMinPages is queued in one
// batch (its check's wait is the load's only wait on the device), read before the load returns,
// and fails exactly the request whose page was corrupted in the pool.
func TestGPUIssuedLoadFewPages(t *testing.T) {
	const n = 8
	pl := newEmbPool(t, 4<<20)
	l := testLayout(32)
	src := saveDirectPages(t, pl, l, n)
	corrupt := map[int]bool{3: true}
	if !pl.CorruptForTest(baseOptions().Namespace.PageKey(0, testT, l.Groups[0].BytesPerPage(), directHash(3))) {
		t.Fatal("no stored page 3")
	}
	var batches []int
	m := issuingMover{newCheckingMover(l), new(atomic.Int32), &batches}
	w := registeredWorker(t, pl, m, l)
	loadSavedPairs(t, w, n)
	if m.calls.Load() != 0 || len(batches) != 1 {
		t.Fatalf("%d scatters waited for and batches of %v pages issued, want 0 and one batch", m.calls.Load(), batches)
	}
	if p := m.pending.Load(); p != 0 {
		t.Fatalf("%d checks not read when the load returned", p)
	}
	checkCorruptLoad(t, w, pl, m.hostMover, src, n, corrupt)
}

// loadSavedPairs binds the loads of n requests, request i loading saveDirectPages' page i of
// both groups into slot 16 + i, and runs StartLoad.
func loadSavedPairs(t *testing.T, w *Worker, n int) {
	t.Helper()
	var reqs []RequestTransfers
	for i := range n {
		reqs = append(reqs, RequestTransfers{RequestID: fmt.Sprintf("r%02d", i), Pages: []PageTransfer{
			{Hash: keys.PageHashOf(directHash(i)), Group: 0, Page: 16 + i}, {Hash: keys.PageHashOf(directHash(i)), Group: 1, Page: 16 + i}}})
	}
	w.BindMeta(Metadata{Loads: reqs})
	if err := w.StartLoad(context.Background()); err != nil {
		t.Fatal(err)
	}
}
