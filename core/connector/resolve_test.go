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
// lists passed in are reused, and nothing of a longer earlier load lingers in them.
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
			var lists loadLists
			for round, n := range []int{5, 2} {
				var ts []RequestTransfers
				for r := range n {
					ts = append(ts, RequestTransfers{RequestID: fmt.Sprintf("r%d", r), Pages: []PageTransfer{
						{Hash: keys.PageHashOf(directHash(10*round + r)), Group: 1, Page: r},
						{Hash: keys.PageHashOf(directHash(10*round + r + 100)), Group: 0, Page: 15 - r},
					}})
				}
				before := lists.items
				if err := w.resolveLoads(&lists, ts); err != nil {
					t.Fatal(err)
				}
				type value struct {
					req  int
					key  string
					ref  kvmem.PageRef
					size int
				}
				var want []value
				for ri, tr := range ts {
					for _, p := range tr.Pages {
						lg := l.Groups[p.Group]
						want = append(want, value{ri, ns.PageKey(p.Group, testT, lg.BytesPerPage(), trtHash(t, p.Hash)),
							kvmem.PageRef{Group: p.Group, Slot: p.Page}, int(lg.BytesPerPage())})
						if lg.ReplicatedBytesPerPage() > 0 {
							want = append(want, value{ri, ns.ReplicatedPageKey(p.Group, testT, lg.ReplicatedBytesPerPage(), trtHash(t, p.Hash)),
								kvmem.PageRef{Group: p.Group, Slot: p.Page, Replicated: true}, int(lg.ReplicatedBytesPerPage())})
						}
					}
				}
				if len(lists.items) != len(want) {
					t.Fatalf("round %d: %d values, want %d", round, len(lists.items), len(want))
				}
				end := 0
				for i := range want {
					it := &lists.items[i]
					if got := (value{it.req, string(lists.key(it)), it.ref, it.size}); got != want[i] {
						t.Fatalf("round %d: value %d is %+v, want %+v", round, i, got, want[i])
					}
					end = it.end
				}
				if end != len(lists.keyBuf) {
					t.Fatalf("round %d: %d bytes of keys, the last key ends at %d", round, len(lists.keyBuf), end)
				}
				if round > 0 && &lists.items[0] != &before[0] {
					t.Fatal("the lists passed in were not reused")
				}
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
		if err := w.resolveLoads(new(loadLists), []RequestTransfers{{RequestID: "ok", Pages: []PageTransfer{{Group: 0, Page: 1}}}, {RequestID: "bad", Pages: []PageTransfer{p}}}); err == nil {
			t.Fatalf("page %+v resolved", p)
		} else if !strings.HasPrefix(err.Error(), "request bad:") {
			t.Fatalf("page %+v: error %q does not name the request", p, err)
		}
	}
}

// trtHash returns a TensorRT-LLM block hash carried as a PageHash.
func trtHash(t testing.TB, p keys.PageHash) keys.Hash {
	t.Helper()
	h, ok := p.Hash()
	if !ok {
		t.Fatalf("block hash of %d bytes: want TensorRT-LLM's %d", p.Len(), keys.HashSize)
	}
	return h
}
