package connector

import (
	"fmt"

	"github.com/kvctl/kvctl/core/keys"
	"github.com/kvctl/kvctl/core/kvmem"
)

// geometry is the key-relevant shape of a registered layout.
type geometry struct {
	layout kvmem.Layout
	groups []keys.LayerGroupPages
	// keysPerBlock is how many keys a hit on one block needs.
	keysPerBlock int
	// prefixes are this rank's key prefixes of each group, by group: a page's keys are made
	// from them without formatting the namespace again (resolveLoads). The namespace and block
	// size are the options', fixed for the connector's life, and a geometry is made per layout.
	prefixes []groupPrefixes
	// lookup are the key prefixes of every page a hit on a block needs, by group: every
	// attention rank's (TensorRT-LLM) or key rank's (vLLM) sharded page, then the replicated
	// page when the group has one.
	lookup [][]string
	// lookupBlockBytes is about how many bytes the keys of one block's lookup take: the
	// prefixes and a 32-byte hash in hex per key (a longer hash only grows the buffer).
	lookupBlockBytes int
}

// groupPrefixes are the key prefixes of one layer group's pages: a page of block h has the key
// sharded+hex(h) and, when replicated is not empty, the key replicated+hex(h).
type groupPrefixes struct {
	sharded, replicated string
}

func newGeometry(l kvmem.Layout, o Options) (*geometry, error) {
	if l.TokensPerBlock != o.TokensPerBlock {
		return nil, fmt.Errorf("layout has %d tokens per block, the connector is configured with %d", l.TokensPerBlock, o.TokensPerBlock)
	}
	if len(l.Groups) == 0 {
		return nil, fmt.Errorf("layout has no layer groups")
	}
	g := &geometry{layout: l}
	world := o.Namespace.AttentionWorldSize()
	for i, lg := range l.Groups {
		if lg.ID != i {
			return nil, fmt.Errorf("layout group %d has id %d; ids must be dense from 0", i, lg.ID)
		}
		if len(lg.Regions) == 0 || lg.BytesPerPage() == 0 {
			return nil, fmt.Errorf("layout group %d has no sharded bytes per page", i)
		}
		p := keys.LayerGroupPages{Group: lg.ID, BytesPerPage: lg.BytesPerPage(), ReplicatedBytesPerPage: lg.ReplicatedBytesPerPage()}
		g.groups = append(g.groups, p)
		if v := o.VLLM; v != nil {
			if p.ReplicatedBytesPerPage > 0 {
				return nil, fmt.Errorf("layout group %d has replicated regions: format %s keys each rank's pages only", i, v.Scheme())
			}
			g.prefixes = append(g.prefixes, groupPrefixes{sharded: v.PageKeyPrefix(o.Namespace.Rank, lg.ID)})
			g.lookup = append(g.lookup, v.LookupKeyPrefixes(lg.ID))
		} else {
			pre := groupPrefixes{sharded: o.Namespace.PageKeyPrefix(lg.ID, o.TokensPerBlock, p.BytesPerPage)}
			lookup := make([]string, 0, world+1)
			for r := range world {
				peer := o.Namespace
				peer.Rank = r
				if peer.AttentionDP {
					peer.Rank = 0
				}
				lookup = append(lookup, peer.PageKeyPrefix(lg.ID, o.TokensPerBlock, p.BytesPerPage))
			}
			if p.ReplicatedBytesPerPage > 0 {
				pre.replicated = o.Namespace.ReplicatedPageKeyPrefix(lg.ID, o.TokensPerBlock, p.ReplicatedBytesPerPage)
				lookup = append(lookup, pre.replicated)
			}
			g.prefixes = append(g.prefixes, pre)
			g.lookup = append(g.lookup, lookup)
		}
		g.keysPerBlock += len(g.lookup[i])
		for _, pre := range g.lookup[i] {
			g.lookupBlockBytes += len(pre) + 2*32
		}
	}
	return g, nil
}

// appendLookupKeys appends the keys of every page a hit on block h needs (lookup's order) to
// buf, one after the other, and the end offset of each in buf to ends.
func (g *geometry) appendLookupKeys(buf []byte, ends []int, h keys.PageHash) ([]byte, []int) {
	for _, pres := range g.lookup {
		for _, pre := range pres {
			buf = h.AppendHex(append(buf, pre...))
			ends = append(ends, len(buf))
		}
	}
	return buf, ends
}

// checkPage reports whether page is a valid slot of group.
func (g *geometry) checkPage(group, page int) error {
	if group < 0 || group >= len(g.layout.Groups) {
		return fmt.Errorf("layer group %d: the layout has %d", group, len(g.layout.Groups))
	}
	if page < 0 || page >= g.layout.Groups[group].Slots {
		return fmt.Errorf("page %d of layer group %d: the group has %d slots", page, group, g.layout.Groups[group].Slots)
	}
	return nil
}
