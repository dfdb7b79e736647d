package connector

import (
	"bytes"
	"context"
	"errors"
	"io"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvctl/kvctl/core/keys"
	"github.com/kvctl/kvctl/core/kvmem"
	"github.com/kvctl/kvctl/pool"
	"github.com/kvctl/kvctl/pool/embedded"
)

// registeringMover is the host mover double with kvmem.HostRegistrar: it counts the live
// registrations, which a GPU mover would hold as page-locked pool memory.
type registeringMover struct {
	*hostMover
	live, made *atomic.Int32
}

func (m registeringMover) RegisterHost(mem []byte) (io.Closer, error) {
	m.live.Add(1)
	m.made.Add(1)
	return closerFunc(func() error { m.live.Add(-1); return nil }), nil
}

func (m registeringMover) Clone() (kvmem.Mover, error) {
	c, _ := m.hostMover.Clone()
	return registeringMover{c.(*hostMover), m.live, m.made}, nil
}

type closerFunc func() error

func (f closerFunc) Close() error { return f() }

func newRegisteringMover(l kvmem.Layout) registeringMover {
	return registeringMover{newHostMover(l), new(atomic.Int32), new(atomic.Int32)}
}

func directHash(i int) keys.Hash {
	var h keys.Hash
	h[0], h[1] = 0xD1, byte(i)
	return h
}

// pageBytes reads slot's value of group g from the double's memory.
func pageBytes(m *hostMover, g, slot int, replicated bool) []byte {
	var out []byte
	rs := m.layout.Groups[g].Regions
	if replicated {
		rs = m.layout.Groups[g].ReplicatedRegions
	}
	for _, r := range rs {
		off := r.Offset + r.Stride*uint64(slot)
		out = append(out, m.mem[off:off+r.Size]...)
	}
	return out
}

// saveDirectPages saves n pages of both groups (slots 0..n-1, hashes directHash(i)) from an
// engine whose memory holds a pattern, and returns that engine's mover.
func saveDirectPages(t testing.TB, pl pool.Pool, l kvmem.Layout, n int) *hostMover {
	t.Helper()
	m := newHostMover(l)
	for i := range m.mem {
		m.mem[i] = byte(i*7 + 3)
	}
	w, err := NewWorker(baseOptions(), pl, m)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.RegisterLayout(l); err != nil {
		t.Fatal(err)
	}
	var pages []PageTransfer
	for i := range n {
		pages = append(pages, PageTransfer{Hash: keys.PageHashOf(directHash(i)), Group: 0, Page: i}, PageTransfer{Hash: keys.PageHashOf(directHash(i)), Group: 1, Page: i})
	}
	w.BindMeta(Metadata{Saves: []RequestTransfers{{RequestID: "saver", Pages: pages}}})
	if err := w.WaitForSave(context.Background()); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		done, _, err := w.GetFinished([]string{"saver"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if slices.Contains(done, "saver") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("saves did not finish")
		}
		time.Sleep(time.Millisecond)
	}
	if err := w.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	return m
}

// TestLoadsReadPoolMemoryInPlace loads the same saved pages once straight from the embedded
// pool's registered memory (the default) and once through staging (StagedTransfers): both deliver
// the saved bytes into the right slots; only the direct worker registers the pool's segment, and
// Close releases the registration.
func TestLoadsReadPoolMemoryInPlace(t *testing.T) {
	const n = 6
	pl := newEmbPool(t, 1<<20)
	l := testLayout(16)
	src := saveDirectPages(t, pl, l, n)
	for _, staged := range []bool{false, true} {
		m := newRegisteringMover(l)
		for i := range m.mem {
			m.mem[i] = 0xEE
		}
		o := baseOptions()
		o.StagedTransfers = staged
		w, err := NewWorker(o, pl, m)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.RegisterLayout(l); err != nil {
			t.Fatal(err)
		}
		wantRegs := int32(1)
		if staged {
			wantRegs = 0
		}
		if got := m.live.Load(); got != wantRegs {
			t.Fatalf("staged=%v: %d live registrations, want %d", staged, got, wantRegs)
		}
		var pages []PageTransfer
		for i := range n {
			pages = append(pages, PageTransfer{Hash: keys.PageHashOf(directHash(i)), Group: 0, Page: 10 - i}, PageTransfer{Hash: keys.PageHashOf(directHash(i)), Group: 1, Page: 10 - i})
		}
		w.BindMeta(Metadata{Loads: []RequestTransfers{{RequestID: "r", Pages: pages}}})
		if err := w.StartLoad(context.Background()); err != nil {
			t.Fatal(err)
		}
		if f := w.TakeFailedLoadRequests(); len(f) != 0 {
			t.Fatalf("staged=%v: failed loads %v", staged, f)
		}
		for i := range n {
			for g := range 2 {
				if !bytes.Equal(pageBytes(m.hostMover, g, 10-i, false), pageBytes(src, g, i, false)) {
					t.Fatalf("staged=%v: group %d page %d holds other bytes than were saved", staged, g, i)
				}
			}
			if !bytes.Equal(pageBytes(m.hostMover, 1, 10-i, true), pageBytes(src, 1, i, true)) {
				t.Fatalf("staged=%v: replicated value of page %d differs", staged, i)
			}
		}
		if err := w.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		if got := m.live.Load(); got != 0 {
			t.Fatalf("staged=%v: %d registrations live after Close", staged, got)
		}
	}
}

// TestDirectLoadNeverDeliversCorruptedPages corrupts one stored page: the request that needs it
// fails and is handed back, the slot it would have filled keeps its poison, and another
// request's page in the same call lands.
func TestDirectLoadNeverDeliversCorruptedPages(t *testing.T) {
	pl := newEmbPool(t, 1<<20)
	l := testLayout(16)
	src := saveDirectPages(t, pl, l, 4)
	ns := baseOptions().Namespace
	bad := ns.PageKey(0, testT, l.Groups[0].BytesPerPage(), directHash(2))
	if !pl.CorruptForTest(bad) {
		t.Fatalf("no stored page %q", bad)
	}
	m := newRegisteringMover(l)
	for i := range m.mem {
		m.mem[i] = 0xEE
	}
	w := registeredWorker(t, pl, m, l)
	if m.made.Load() != 1 {
		t.Fatal("the pool's memory was not registered: the direct path is not under test")
	}
	w.BindMeta(Metadata{Loads: []RequestTransfers{
		{RequestID: "b", Pages: []PageTransfer{{Hash: keys.PageHashOf(directHash(2)), Group: 0, Page: 12}}},
		{RequestID: "c", Pages: []PageTransfer{{Hash: keys.PageHashOf(directHash(3)), Group: 0, Page: 13}}},
	}})
	if err := w.StartLoad(context.Background()); err != nil {
		t.Fatal(err)
	}
	if f := w.TakeFailedLoadRequests(); !slices.Equal(f, []string{"b"}) {
		t.Fatalf("failed loads %v, want [b]", f)
	}
	if got := pageBytes(m.hostMover, 0, 12, false); !bytes.Equal(got, bytes.Repeat([]byte{0xEE}, len(got))) {
		t.Fatal("bytes of the corrupted page reached engine memory")
	}
	if !bytes.Equal(pageBytes(m.hostMover, 0, 13, false), pageBytes(src, 0, 3, false)) {
		t.Fatal("the good page of the same call did not land")
	}
	if st := pl.stats(t); st.ChecksumErrors != 1 {
		t.Fatalf("pool counted %d checksum errors, want 1", st.ChecksumErrors)
	}
}

// TestSavesWriteIntoPoolMemory saves pages through a worker whose mover can register the
// embedded pool (the in-place path) and through one that copies through staging: both store the
// engine's bytes under the same keys, readable and verified, and the in-place worker leaves no
// reservation behind when a gather fails.
func TestSavesWriteIntoPoolMemory(t *testing.T) {
	l := testLayout(16)
	src := newHostMover(l)
	for i := range src.mem {
		src.mem[i] = byte(i*5 + 1)
	}
	ns := baseOptions().Namespace
	stored := map[bool]map[string][]byte{}
	for _, staged := range []bool{false, true} {
		pl := newEmbPool(t, 1<<20)
		m := registeringMover{&hostMover{mem: src.mem, layout: l}, new(atomic.Int32), new(atomic.Int32)}
		o := baseOptions()
		o.StagedTransfers = staged
		// Staging of two slots per direction: an in-place batch (all 15 values) is larger than
		// the staging, which it must not touch.
		o.StagingBufferBytes = 2 * 48
		w, err := NewWorker(o, pl, m)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.RegisterLayout(l); err != nil {
			t.Fatal(err)
		}
		if got, want := m.made.Load() > 0, !staged; got != want {
			t.Fatalf("staged=%v: pool registered %v", staged, got)
		}
		var pages []PageTransfer
		for i := range 5 {
			pages = append(pages, PageTransfer{Hash: keys.PageHashOf(directHash(i)), Group: 0, Page: i}, PageTransfer{Hash: keys.PageHashOf(directHash(i)), Group: 1, Page: i})
		}
		w.BindMeta(Metadata{Saves: []RequestTransfers{{RequestID: "s", Pages: pages}}})
		if err := w.WaitForSave(context.Background()); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			done, _, err := w.GetFinished([]string{"s"}, nil)
			if err != nil {
				t.Fatal(err)
			}
			if len(done) == 1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("saves did not finish")
			}
			time.Sleep(time.Millisecond)
		}
		if err := w.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		stored[staged] = map[string][]byte{}
		for _, k := range pl.keys() {
			v, ok := pl.get(k)
			if !ok {
				t.Fatalf("staged=%v: stored key %q does not read back", staged, k)
			}
			stored[staged][k] = v
		}
		if len(stored[staged]) != 15 { // 5 pages × (group 0 + group 1 + group 1 replicated)
			t.Fatalf("staged=%v: %d values stored, want 15", staged, len(stored[staged]))
		}
		k := ns.PageKey(0, testT, l.Groups[0].BytesPerPage(), directHash(3))
		if !bytes.Equal(stored[staged][k], pageBytes(src, 0, 3, false)) {
			t.Fatalf("staged=%v: stored page differs from the engine's", staged)
		}
		if st := pl.stats(t); st.Detail[embedded.DetailPendingObjects] != 0 || st.ChecksumErrors != 0 {
			t.Fatalf("staged=%v: %d pending objects, %d checksum errors", staged, st.Detail[embedded.DetailPendingObjects], st.ChecksumErrors)
		}
	}
	for k, v := range stored[true] {
		if !bytes.Equal(stored[false][k], v) {
			t.Fatalf("value %q differs between the in-place and the staged save", k)
		}
	}

	// A failing gather revokes the reservation: nothing stays pending or allocated.
	pl := newEmbPool(t, 1<<20)
	m := registeringMover{newHostMover(l), new(atomic.Int32), new(atomic.Int32)}
	m.gatherFn = func() error { return errors.New("device lost") }
	w, err := NewWorker(baseOptions(), pl, m)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.RegisterLayout(l); err != nil {
		t.Fatal(err)
	}
	w.BindMeta(Metadata{Saves: []RequestTransfers{{RequestID: "s", Pages: []PageTransfer{{Hash: keys.PageHashOf(directHash(9)), Group: 0, Page: 1}}}}})
	if err := w.WaitForSave(context.Background()); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for w.Err() == nil && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if w.Err() == nil {
		t.Fatal("the gather failure was not kept")
	}
	_ = w.Close(context.Background())
	if st := pl.stats(t); st.Detail[embedded.DetailPendingObjects] != 0 || st.UsedBytes != 0 || st.Objects != 0 {
		t.Fatalf("after a failed gather: %d pending, %d objects, %d bytes used", st.Detail[embedded.DetailPendingObjects], st.Objects, st.UsedBytes)
	}
}
