package mooncake

import (
	"context"
	"sync"
	"time"

	"github.com/kvctl/kvctl/mooncake/masterrpc"
)

// maxLocated bounds the replica lists a Native keeps from its lookups for the gets that follow
// them. Past it a lookup keeps nothing more until older entries are read or expire: the get of
// a key not kept asks the master, as it would without the lookup.
const maxLocated = 1 << 16

// located is the replica list a lookup got for a key, usable until until.
type located struct {
	list  masterrpc.ReplicaList
	until time.Time
}

// locatedLists holds the replica lists BatchLocate learned, each for the BatchGets of its key
// within half the read lease the master granted with it.
type locatedLists struct {
	mu    sync.Mutex
	m     map[string]located
	swept time.Time        // the last drop of expired lists at the bound
	clock func() time.Time // time.Now when nil (tests set it)
}

func (c *locatedLists) now() time.Time {
	if c.clock != nil {
		return c.clock()
	}
	return time.Now()
}

// sweepEvery is the least time between two drops of expired lists at the bound.
const sweepEvery = 100 * time.Millisecond

// keep remembers the lists of keys (one each) until until, within the bound. When the bound is
// reached the expired lists are dropped, at most once every sweepEvery, so a host whose lookups
// find more pages than the bound within a lease does not walk the whole map on every lookup;
// what does not fit is not kept.
func (c *locatedLists) keep(keys []string, lists []masterrpc.ReplicaList, until time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = make(map[string]located)
	}
	if len(c.m)+len(keys) > maxLocated {
		if now := c.now(); now.Sub(c.swept) >= sweepEvery {
			c.swept = now
			for k, e := range c.m {
				if !now.Before(e.until) {
					delete(c.m, k)
				}
			}
		}
	}
	for i, k := range keys {
		if _, ok := c.m[k]; !ok && len(c.m) >= maxLocated {
			continue
		}
		c.m[k] = located{list: lists[i], until: until}
	}
}

// take fills lists with the still valid lists of keys, forgetting expired ones; asked lists
// the indices of keys with none, whose lists only the master can give. A list stays for the
// other gets of its key within its time (two requests loading a shared prefix).
func (c *locatedLists) take(keys []string, lists []masterrpc.ReplicaListResult) (asked []int) {
	c.mu.Lock()
	now := c.now()
	defer c.mu.Unlock()
	for i, k := range keys {
		e, ok := c.m[k]
		if ok && now.Before(e.until) {
			lists[i] = masterrpc.ReplicaListResult{List: e.list}
			continue
		}
		if ok {
			delete(c.m, k)
		}
		asked = append(asked, i)
	}
	return asked
}

// len is the number of lists kept.
func (c *locatedLists) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.m)
}

// BatchLocate answers as BatchIsExist (1 present and readable, 0 absent, a negative Code when
// the probe failed) from the master's replica lists instead of its existence check, and keeps
// each present key's list for the BatchGets of that key: a get within half the read lease the
// master granted with the list reads the replica without asking the master again. That
// lease, like the one an existence check grants, keeps the object where the list says until it
// runs out (only a forced Remove may take it earlier). This is the lookup a load follows: the
// load then goes straight to the transfers.
//
// A key whose only complete replica this client cannot read (not in memory) or whose segment is
// marked unhealthy answers 0, so no request is offered pages its load would fail to read.
func (n *Native) BatchLocate(ctx context.Context, keys []string) []int {
	out := make([]int, len(keys))
	if len(keys) == 0 {
		return out
	}
	n.stats.existProbes.Add(int64(len(keys)))
	ctx, cancel := n.callCtx(ctx)
	defer cancel()
	sent := time.Now()
	lists, err := n.rpc.BatchGetReplicaList(ctx, keys, n.opts.Tenant)
	if err != nil {
		n.log.Warn("mooncake BatchGetReplicaList failed", "err", err)
		for i := range out {
			out[i] = int(rpcCode(err))
		}
		return out
	}
	var keep []string
	var kept []masterrpc.ReplicaList
	var lease uint64
	for i, l := range lists {
		switch l.Code {
		case 0:
		case int32(ErrObjectNotFound), int32(ErrReplicaNotReady):
			continue
		default:
			out[i] = int(l.Code)
			continue
		}
		rep, ok := readable(l.List.Replicas)
		if !ok || n.peerUnhealthy(rep.Endpoint) {
			continue
		}
		out[i] = 1
		if l.List.LeaseTTLms > 0 {
			if lease == 0 || l.List.LeaseTTLms < lease {
				lease = l.List.LeaseTTLms
			}
			keep, kept = append(keep, keys[i]), append(kept, l.List)
		}
	}
	if len(keep) > 0 {
		// The lease runs from when the master answered, which is after sent; half of the
		// shortest leaves the other half for the transfer itself.
		n.located.keep(keep, kept, sent.Add(time.Duration(lease)*time.Millisecond/2))
	}
	return out
}

// replicaLists returns a replica list per key for BatchGet: those a recent BatchLocate kept,
// and the master's for the rest. When the master call fails, each key it was asked for carries
// the failure's code.
func (n *Native) replicaLists(ctx context.Context, keys []string) []masterrpc.ReplicaListResult {
	lists := make([]masterrpc.ReplicaListResult, len(keys))
	asked := n.located.take(keys, lists)
	if len(asked) == 0 {
		return lists
	}
	ask := keys
	if len(asked) < len(keys) {
		ask = make([]string, len(asked))
		for j, i := range asked {
			ask[j] = keys[i]
		}
	}
	got, err := n.rpc.BatchGetReplicaList(ctx, ask, n.opts.Tenant)
	if err != nil {
		n.log.Warn("mooncake BatchGetReplicaList failed", "err", err)
		code := int32(rpcCode(err))
		for _, i := range asked {
			lists[i] = masterrpc.ReplicaListResult{Code: code}
		}
		return lists
	}
	for j, i := range asked {
		lists[i] = got[j]
	}
	return lists
}

// Located is the number of replica lists BatchLocate keeps (some may have expired, and go at
// the next get of their key or when the bound is reached).
func (n *Native) Located() int { return n.located.len() }
