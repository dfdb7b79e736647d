package connector

import (
	"fmt"
	"strings"
	"testing"

	"github.com/kvctl/kvctl/core/keys"
	"github.com/kvctl/kvctl/core/kvmem"
)

// TestResolveLoadsKeys: every value a load resolves carries exactly the key keys.Namespace gives
// its page (sharded and replicated, for the rank's own shard under tensor parallelism, shard 0
// of 1 under attention DP), its request, its reference and its size, in transfer order; the
// list passed in is reused, and the keys of a longer earlier load do not linger in it.
func TestResolveLoadsKeys(t *testing.T) {
	l := testLayout(16)
	for _, ns := range []keys.Namespace{
		{ModelKey: "test-model", WorldSize: 1},
		{Namespace: "prod", ModelKey: "m/fp8", WorldSize: 4, Rank: 3},
		{ModelKey: "test-model", WorldSize: 2, Rank: 1, AttentionDP: true},
	} {
		t.Run(fmt.Sprintf("%s-w%dr%d-dp%v", ns.Namespace, ns.WorldSize, ns.Rank, ns.AttentionDP), func(t *testing.T) {
			o := baseOptions()
			o.Namespace = ns
			w := registeredWorkerWith(t, o, newMemPool(), newHostMover(l), l)
			var dst []pageIO
			for round, n := range []int{5, 2} {
				var ts []RequestTransfers
				for r := range n {
					ts = append(ts, RequestTransfers{RequestID: fmt.Sprintf("r%d", r), Pages: []PageTransfer{
						{Hash: directHash(10*round + r), Group: 1, Page: r},
						{Hash: directHash(10*round + r + 100), Group: 0, Page: 15 - r},
					}})
				}
				items, err := w.resolveLoads(dst, ts)
				if err != nil {
					t.Fatal(err)
				}
				var want []pageIO
				for ri, tr := range ts {
					for _, p := range tr.Pages {
						lg := l.Groups[p.Group]
						want = append(want, pageIO{req: ri, key: ns.PageKey(p.Group, testT, lg.BytesPerPage(), p.Hash),
							ref: kvmem.PageRef{Group: p.Group, Slot: p.Page}, size: int(lg.BytesPerPage())})
						if lg.ReplicatedBytesPerPage() > 0 {
							want = append(want, pageIO{req: ri, key: ns.ReplicatedPageKey(p.Group, testT, lg.ReplicatedBytesPerPage(), p.Hash),
								ref: kvmem.PageRef{Group: p.Group, Slot: p.Page, Replicated: true}, size: int(lg.ReplicatedBytesPerPage())})
						}
					}
				}
				if len(items) != len(want) {
					t.Fatalf("round %d: %d values, want %d", round, len(items), len(want))
				}
				for i := range want {
					if items[i] != want[i] {
						t.Fatalf("round %d: value %d is %+v, want %+v", round, i, items[i], want[i])
					}
				}
				if round > 0 && &items[0] != &dst[0] {
					t.Fatal("the list passed in was not reused")
				}
				dst = items
			}
		})
	}
}

// TestResolveLoadsRejectsBadPages: a page outside the layout fails the resolve and names its
// request.
func TestResolveLoadsRejectsBadPages(t *testing.T) {
	l := testLayout(16)
	w := registeredWorker(t, newMemPool(), newHostMover(l), l)
	for _, p := range []PageTransfer{{Group: 2, Page: 0}, {Group: -1, Page: 0}, {Group: 0, Page: 16}, {Group: 1, Page: -1}} {
		if _, err := w.resolveLoads(nil, []RequestTransfers{{RequestID: "ok", Pages: []PageTransfer{{Group: 0, Page: 1}}}, {RequestID: "bad", Pages: []PageTransfer{p}}}); err == nil {
			t.Fatalf("page %+v resolved", p)
		} else if !strings.HasPrefix(err.Error(), "request bad:") {
			t.Fatalf("page %+v: error %q does not name the request", p, err)
		}
	}
}
