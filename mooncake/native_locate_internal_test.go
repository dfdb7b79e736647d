package mooncake

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvctl/kvctl/mooncake/masterrpc"
)

// TestLocatedListsBound checks the bound on the kept replica lists: a full set keeps nothing
// more while its lists are valid, drops the expired ones when it is full (at most once every
// sweepEvery), and take serves only lists still within their time.
func TestLocatedListsBound(t *testing.T) {
	now := time.Now()
	c := locatedLists{clock: func() time.Time { return now }}
	keys := func(prefix string, n int) ([]string, []masterrpc.ReplicaList) {
		ks := make([]string, n)
		for i := range ks {
			ks[i] = fmt.Sprintf("%s-%d", prefix, i)
		}
		return ks, make([]masterrpc.ReplicaList, n)
	}
	soon, _ := keys("soon", maxLocated/2)
	later, _ := keys("later", maxLocated/2)
	c.keep(soon, make([]masterrpc.ReplicaList, len(soon)), now.Add(50*time.Millisecond))
	c.keep(later, make([]masterrpc.ReplicaList, len(later)), now.Add(time.Hour))
	if c.len() != maxLocated {
		t.Fatalf("%d lists kept, want the bound %d", c.len(), maxLocated)
	}
	more, lists := keys("more", 10)
	c.keep(more, lists, now.Add(time.Hour))
	if c.len() != maxLocated {
		t.Fatalf("a full set grew to %d", c.len())
	}
	got := make([]masterrpc.ReplicaListResult, len(more))
	if asked := c.take(more, got); len(asked) != len(more) {
		t.Fatalf("lists kept beyond the bound: %d of %d keys served", len(more)-len(asked), len(more))
	}
	// Once the first half has expired, the next keep at the bound drops it and keeps the new.
	now = now.Add(sweepEvery)
	c.keep(more, lists, now.Add(time.Hour))
	if want := maxLocated/2 + len(more); c.len() != want {
		t.Fatalf("%d lists kept after the expired ones went, want %d", c.len(), want)
	}
	got = make([]masterrpc.ReplicaListResult, 2)
	if asked := c.take([]string{"more-3", "soon-3"}, got); len(asked) != 1 || asked[0] != 1 {
		t.Fatalf("take served %v as not kept; want only the expired key", asked)
	}
}
