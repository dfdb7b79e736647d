package connector

import (
	"context"
	"fmt"
	"testing"

	"github.com/kvctl/kvctl/core/keys"
	"github.com/kvctl/kvctl/core/kvmem"
)

// BenchmarkResolveLoads resolves the pool keys of a StartLoad of 190 pages of one group, as the
// PyTorch engine's warm StartLoads hold, before any copy can start: into the list the previous
// load left, as StartLoad does.
func BenchmarkResolveLoads(b *testing.B) {
	l := testLayout(256)
	w, reqs := startLoadBench(b, newEmbPool(b, 1<<20), newRegisteringMover(l), l)
	var lists loadLists
	b.ReportAllocs()
	for b.Loop() {
		if err := w.resolveLoads(&lists, reqs); err != nil {
			b.Fatal(err)
		}
	}
}

// nullIssuer is a page-checking mover whose checked scatters do nothing and pass: what a
// StartLoad costs the host around the device's work.
type nullIssuer struct{ registeringMover }

func (nullIssuer) PageCheckError() error { return nil }

func (nullIssuer) ScatterChecked(_ context.Context, _ [][]byte, pages []kvmem.PageRef, _ []uint64) (func() ([]bool, error), error) {
	bad := make([]bool, len(pages))
	return func() ([]bool, error) { return bad, nil }, nil
}

func (m nullIssuer) IssueChecked(ctx context.Context, src [][]byte, pages []kvmem.PageRef, sums []uint64) (func() ([]bool, error), error) {
	return m.ScatterChecked(ctx, src, pages, sums)
}

// BenchmarkStartLoadHost is a warm StartLoad of 190 pages from the embedded pool, read in place
// and checked by a mover that does nothing: the host's own work per StartLoad (keys, the pool's
// view, the batch lists, the check's bookkeeping), which on a GPU comes before the first copy.
func BenchmarkStartLoadHost(b *testing.B) {
	pool := newEmbPool(b, 8<<20)
	l := testLayout(256)
	saveDirectPages(b, pool, l, startLoadBenchPages)
	w, reqs := startLoadBench(b, pool, nullIssuer{newRegisteringMover(l)}, l)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		w.BindMeta(Metadata{Loads: reqs})
		if err := w.StartLoad(ctx); err != nil {
			b.Fatal(err)
		}
		if f := w.TakeFailedLoadRequests(); len(f) != 0 {
			b.Fatalf("failed loads %v", f)
		}
	}
}

// startLoadBenchPages is how many pages the PyTorch engine's warm StartLoads hold, about.
const startLoadBenchPages = 190

// startLoadBench is a worker over pool and m with layout l registered (closed when the
// benchmark ends) and the loads of a StartLoad of startLoadBenchPages pages of group 0, 12 to a
// request.
func startLoadBench(b *testing.B, pool *embPool, m kvmem.Mover, l kvmem.Layout) (*Worker, []RequestTransfers) {
	w := registeredWorker(b, pool, m, l)
	var reqs []RequestTransfers
	for i := range startLoadBenchPages {
		if i%12 == 0 {
			reqs = append(reqs, RequestTransfers{RequestID: fmt.Sprintf("r%03d", i)})
		}
		r := &reqs[len(reqs)-1]
		r.Pages = append(r.Pages, PageTransfer{Hash: keys.PageHashOf(directHash(i)), Group: 0, Page: i})
	}
	return w, reqs
}
