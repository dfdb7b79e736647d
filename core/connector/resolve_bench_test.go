package connector

import (
	"context"
	"fmt"
	"testing"
)

// BenchmarkResolveLoads resolves the pool keys of a StartLoad of 190 pages of one group, as the
// PyTorch engine's warm StartLoads hold, before any copy can start.
func BenchmarkResolveLoads(b *testing.B) {
	l := testLayout(256)
	w, err := NewWorker(baseOptions(), newEmbPool(b, 1<<20), newRegisteringMover(l))
	if err != nil {
		b.Fatal(err)
	}
	defer w.Close(context.Background())
	if err := w.RegisterLayout(l); err != nil {
		b.Fatal(err)
	}
	var reqs []RequestTransfers
	for i := range 190 {
		if i%12 == 0 {
			reqs = append(reqs, RequestTransfers{RequestID: fmt.Sprintf("r%03d", i)})
		}
		r := &reqs[len(reqs)-1]
		r.Pages = append(r.Pages, PageTransfer{Hash: directHash(i), Group: 0, Page: i})
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := w.resolveLoads(reqs); err != nil {
			b.Fatal(err)
		}
	}
}
