package mooncake

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/kvctl/kvctl/mooncake/masterrpc"
)

// DefaultLocateWindow is how long a replica list a lookup fetched (BatchLocate) serves a get of
// the same object without asking the master again, when NativeOptions.LocateWindow is zero.
const DefaultLocateWindow = time.Second

// errWrongCount is a master answer with another number of results than keys asked.
var errWrongCount = errors.New("the master answered for another number of keys than it was asked")

// maxLocated bounds the replica lists kept between a lookup and its load. Past it a lookup's
// lists are not kept (its load asks the master, as without them).
const maxLocated = 1 << 16

// located is one object's replica list as a lookup found it, and the lease that came with it.
type located struct {
	rep  masterrpc.Replica
	list masterrpc.ReplicaList
	// fresh is the last moment a lookup may answer from it without asking the master (half
	// way through its window, so that the load that follows such a lookup still has half the
	// window to start in); use is the last moment a get may start from it; expires is when
	// the master's read lease ends. All are counted from before the lookup was sent (so never
	// later than the master's own).
	fresh, use, expires time.Time
	// gen is the master client's count of lost connections before the lookup was sent: once
	// it moves, the master may have restarted, forgotten the lease and handed the memory to
	// other objects.
	gen uint64
}

// locatedSet keeps the replica lists of the objects lookups found present, until their use
// window ends. It is safe for concurrent use.
type locatedSet struct {
	mu    sync.Mutex
	m     map[string]located
	swept time.Time
}

// put keeps l under key, unless the set is full of lists still in use.
func (s *locatedSet) put(now time.Time, key string, l located) {
	if s.m == nil {
		s.m = make(map[string]located)
	}
	if len(s.m) >= maxLocated {
		s.sweep(now)
		if len(s.m) >= maxLocated {
			return
		}
	}
	s.m[key] = l
}

// sweep drops the lists whose use window has ended.
func (s *locatedSet) sweep(now time.Time) {
	for k, l := range s.m {
		if !now.Before(l.use) {
			delete(s.m, k)
		}
	}
	s.swept = now
}

// take returns key's list when a get may still start from it and no master connection was lost
// since (gen, the count of lost connections now). The list stays for other gets of the same
// object within its window.
func (s *locatedSet) take(now time.Time, gen uint64, key string) (located, bool) {
	l, ok := s.m[key]
	if !ok {
		return located{}, false
	}
	if !now.Before(l.use) || l.gen != gen {
		delete(s.m, key)
		return located{}, false
	}
	return l, true
}

// answers reports whether key's kept list may answer a lookup now: inside its fresh part, no
// master connection lost since (gen) and its host not found unhealthy.
func (s *locatedSet) answers(now time.Time, gen uint64, key string, unhealthy func(string) bool) bool {
	l, ok := s.m[key]
	return ok && now.Before(l.fresh) && l.gen == gen && !unhealthy(l.rep.Endpoint)
}

// BatchLocate answers as BatchIsExist does (1 present and readable, 0 absent, a negative Code
// when the probe failed), asking the master for each key's replica list instead of its
// existence alone: the same round trip, and the master grants each present object a read lease
// (10 s by default) that keeps it from being evicted or removed (except by a forced remove).
// Each present object's list is kept for NativeOptions.LocateWindow, never past half its lease
// and only while no master connection is lost (a master that restarted has forgotten the
// lease), so that a BatchGet of the object in that window reads it without asking the master
// again. A lookup that is followed by a load (the connector's) uses it; a probe whose answer
// is only counted uses BatchIsExist.
//
// The lists are counted from before the call was sent, so the window always ends before the
// master's lease does; a get that starts inside it and finishes after the lease ended fails the
// page with ErrLeaseExpired, as Mooncake's own client fails such a read.
//
// A key whose list an earlier lookup kept is answered present from it, without asking the
// master, during the first half of the list's window (the lease still holds the object there,
// and the load that follows has the other half to start in); only the other keys are asked
// for. Engines look the same prefix up again and again (a shared system prompt, a
// conversation's earlier turns), and each lookup the master need not answer saves its round
// trip. Absent keys are always asked for, so a page saved since is found at once.
func (n *Native) BatchLocate(ctx context.Context, keys []string) []int {
	if n.opts.LocateWindow < 0 {
		return n.BatchIsExist(ctx, keys)
	}
	if len(keys) == 0 {
		return []int{}
	}
	n.stats.existProbes.Add(int64(len(keys)))
	sent, gen := time.Now(), n.rpc.Losses()
	out, ask, askKeys := n.keptAnswers(sent, gen, keys)
	if len(askKeys) == 0 {
		return out
	}
	ctx, cancel := n.callCtx(ctx)
	defer cancel()
	got := n.inParts(ctx, askKeys, func(ctx context.Context, sub []string) []int {
		return n.locate(ctx, sent, gen, sub)
	})
	if ask == nil {
		return got
	}
	for j, i := range ask {
		out[i] = got[j]
	}
	return out
}

// keptAnswers answers the keys that kept lists may answer (1 in out) and returns the others'
// indices and keys, for the master to be asked; ask is nil when every key is to be asked.
func (n *Native) keptAnswers(now time.Time, gen uint64, keys []string) (out, ask []int, askKeys []string) {
	out = make([]int, len(keys))
	n.located.mu.Lock()
	defer n.located.mu.Unlock()
	if len(n.located.m) == 0 {
		return out, nil, keys
	}
	for i, k := range keys {
		if n.located.answers(now, gen, k, n.peerUnhealthy) {
			out[i] = 1
			continue
		}
		ask, askKeys = append(ask, i), append(askKeys, k)
	}
	if len(ask) == len(keys) {
		return out, nil, keys
	}
	n.stats.keptAnswers.Add(int64(len(keys) - len(ask)))
	return out, ask, askKeys
}

// locate is one BatchGetReplicaList call of a lookup: each key's presence, keeping the lists
// of the present ones.
func (n *Native) locate(ctx context.Context, sent time.Time, gen uint64, keys []string) []int {
	out := make([]int, len(keys))
	lists, err := n.rpc.BatchGetReplicaList(ctx, keys, n.opts.Tenant)
	if err == nil && len(lists) != len(keys) {
		err = errWrongCount
	}
	if err != nil {
		n.log.Warn("mooncake BatchGetReplicaList for a lookup failed", "keys", len(keys), "err", err)
		for i := range out {
			out[i] = int(rpcCode(err))
		}
		return out
	}
	now := time.Now()
	n.located.mu.Lock()
	defer n.located.mu.Unlock()
	if now.Sub(n.located.swept) > n.opts.LocateWindow {
		n.located.sweep(now)
	}
	for i, l := range lists {
		switch l.Code {
		case 0:
		case int32(ErrObjectNotFound), int32(ErrReplicaNotReady):
			continue // absent, or still being written: a miss, as BatchExistKey answers
		default:
			out[i] = int(l.Code)
			continue
		}
		rep, ok := readable(l.List.Replicas)
		if !ok || n.peerUnhealthy(rep.Endpoint) {
			// Nothing readable yet, or held by a host whose loads fail: offering it would
			// only fail its load.
			continue
		}
		out[i] = 1
		lease := time.Duration(l.List.LeaseTTLms) * time.Millisecond
		window := min(n.opts.LocateWindow, lease/2)
		if use := sent.Add(window); now.Before(use) {
			n.located.put(now, keys[i], located{rep: rep, list: l.List, fresh: sent.Add(window / 2), use: use, expires: sent.Add(lease), gen: gen})
		}
	}
	return out
}

// inParts runs call over keys, as one call or, for a large batch, as sub-batches over several
// master connections at once (see existSplit): key i goes to sub-batch i mod k, so that each
// carries a like share of a prefix's present keys, which cost the master more than absent ones.
// A sub-batch that fails gives its own keys the code the whole batch would have had.
func (n *Native) inParts(ctx context.Context, keys []string, call func(context.Context, []string) []int) []int {
	parts := max(1, min(n.rpc.Conns(), len(keys)/n.existSplit))
	if parts == 1 {
		return call(ctx, keys)
	}
	out := make([]int, len(keys))
	part := func(p int) {
		sub := make([]string, 0, (len(keys)-p+parts-1)/parts)
		for i := p; i < len(keys); i += parts {
			sub = append(sub, keys[i])
		}
		for j, v := range call(ctx, sub) {
			out[p+j*parts] = v
		}
	}
	var wg sync.WaitGroup
	for p := range parts - 1 {
		wg.Go(func() { part(p) })
	}
	part(parts - 1)
	wg.Wait()
	return out
}

// takeLocated starts a get: each key whose list a lookup kept and whose window is still open
// becomes a job; the others' indices and keys are returned, for the master to be asked. A
// located replica that does not fit its buffer, or whose host has since been found unhealthy,
// gets its code in out, as it would from a fresh list.
func (n *Native) takeLocated(keys []string, dsts [][][]byte, out []int64, jobs *[]getJob) (ask []int, askKeys []string) {
	now := time.Now()
	n.located.mu.Lock()
	if len(n.located.m) == 0 {
		n.located.mu.Unlock()
		ask = make([]int, len(keys))
		for i := range ask {
			ask[i] = i
		}
		return ask, keys
	}
	n.located.mu.Unlock()
	// Outside the lock: it looks at every idle master connection.
	gen := n.rpc.Losses()
	n.located.mu.Lock()
	for i, k := range keys {
		l, ok := n.located.take(now, gen, k)
		if !ok {
			ask, askKeys = append(ask, i), append(askKeys, k)
			continue
		}
		if code := n.gettable(l.rep, true, dsts[i]); code != 0 {
			out[i] = int64(code)
			continue
		}
		*jobs = append(*jobs, getJob{i: i, rep: l.rep, list: l.list, expires: l.expires})
	}
	n.located.mu.Unlock()
	return ask, askKeys
}

// gettable is the Code a get of rep into buf fails with before any transfer (0: none): no
// readable replica, a buffer too small, a host found unhealthy.
func (n *Native) gettable(rep masterrpc.Replica, ok bool, dst [][]byte) Code {
	switch {
	case !ok:
		return ErrReplicaNotReady
	case rep.Size > piecesLen(dst):
		return ErrInvalidParams
	case n.peerUnhealthy(rep.Endpoint):
		// Offered before its host was found dead: fail it without waiting on the host.
		return ErrRPCFail
	}
	return 0
}
