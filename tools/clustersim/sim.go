package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
)

// TraceBlockTokens is the Mooncake trace's block: one hash id names 512 tokens.
const TraceBlockTokens = 512

// Bounds on what a trace and a configuration may ask for.
const (
	maxTraceRequests = 1 << 22
	maxRequestBlocks = 1 << 16
	maxLineBytes     = 8 << 20
	maxHosts         = 1 << 12
	maxCopies        = 1 << 10
	maxReplicas      = 16
)

// Request is one line of a Mooncake FAST'25 trace.
type Request struct {
	Timestamp   int64    `json:"timestamp"` // ms
	InputLength int      `json:"input_length"`
	Hashes      []uint64 `json:"hash_ids"`
}

// ReadTrace reads a Mooncake JSONL trace, refusing a request with no blocks, more blocks than its
// input covers, or a timestamp before the one before it.
func ReadTrace(r io.Reader) ([]Request, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxLineBytes)
	var out []Request
	line := 0
	for sc.Scan() {
		line++
		if len(sc.Bytes()) == 0 {
			continue
		}
		if len(out) >= maxTraceRequests {
			return nil, fmt.Errorf("trace line %d: more than %d requests", line, maxTraceRequests)
		}
		var q Request
		if err := json.Unmarshal(sc.Bytes(), &q); err != nil {
			return nil, fmt.Errorf("trace line %d: %w", line, err)
		}
		switch {
		case len(q.Hashes) == 0:
			return nil, fmt.Errorf("trace line %d: no hash_ids", line)
		case len(q.Hashes) > maxRequestBlocks:
			return nil, fmt.Errorf("trace line %d: %d hash_ids, at most %d", line, len(q.Hashes), maxRequestBlocks)
		case q.InputLength < 1 || q.InputLength > len(q.Hashes)*TraceBlockTokens || q.InputLength <= (len(q.Hashes)-1)*TraceBlockTokens:
			return nil, fmt.Errorf("trace line %d: input_length %d does not fit %d blocks of %d tokens", line, q.InputLength, len(q.Hashes), TraceBlockTokens)
		case len(out) > 0 && q.Timestamp < out[len(out)-1].Timestamp:
			return nil, fmt.Errorf("trace line %d: timestamp %d before the previous request's %d", line, q.Timestamp, out[len(out)-1].Timestamp)
		}
		out = append(out, q)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("trace line %d: %w", line+1, err)
	}
	if len(out) == 0 {
		return nil, errors.New("trace: no requests")
	}
	return out, nil
}

// Placement is where a saved block goes.
type Placement string

// Router is which host serves a request.
type Router string

const (
	// PlaceRandom puts a block in a random segment with room, as the master's random
	// allocation strategy does when the client names no preferred segment.
	PlaceRandom Placement = "random"
	// PlaceLocal puts a block in the saving host's own segment (a preferred segment).
	PlaceLocal Placement = "local"

	// RouteRandom sends each request to a random host.
	RouteRandom Router = "random"
	// RouteAffinity sends a request to the host its first two block ids hash to, so the turns
	// of one conversation (which share their prefix) meet on one host.
	RouteAffinity Router = "affinity"
)

// Config is one simulated cluster.
type Config struct {
	Hosts int
	// Copies replays the trace this many times at once, copy c with its block ids moved past
	// every id of copy c-1 (independent users with the trace's own statistics): the load grows
	// with the cluster instead of thinning out.
	Copies int
	// SegmentBytes is each host's share of the pool.
	SegmentBytes int64
	// TokenBytes is the KV cache of one token (all layers), which sizes a block.
	TokenBytes int64
	// LinkBandwidth is each host's network link, bytes/s in each direction; LocalBandwidth is
	// what a host reads from its own segment.
	LinkBandwidth  float64
	LocalBandwidth float64
	Placement      Placement
	Router         Router
	// Replicas is how many segments hold each saved block (replica_num): the first where
	// Placement says, the others in random other segments. A read takes a replica in its own
	// host's segment if there is one, else the one whose owner's link frees soonest.
	Replicas int
	Seed     uint64
}

// Validate refuses a configuration the simulation cannot run.
func (c Config) Validate() error {
	switch {
	case c.Hosts < 1 || c.Hosts > maxHosts:
		return fmt.Errorf("hosts %d: want 1..%d", c.Hosts, maxHosts)
	case c.Copies < 1 || c.Copies > maxCopies:
		return fmt.Errorf("copies %d: want 1..%d", c.Copies, maxCopies)
	case c.SegmentBytes < 1:
		return fmt.Errorf("segment bytes %d: must be positive", c.SegmentBytes)
	case c.TokenBytes < 1 || c.TokenBytes > 1<<30:
		return fmt.Errorf("token bytes %d: want 1..%d", c.TokenBytes, 1<<30)
	case !(c.LinkBandwidth > 0) || math.IsInf(c.LinkBandwidth, 0):
		return fmt.Errorf("link bandwidth %v: must be positive and finite", c.LinkBandwidth)
	case !(c.LocalBandwidth > 0) || math.IsInf(c.LocalBandwidth, 0):
		return fmt.Errorf("local bandwidth %v: must be positive and finite", c.LocalBandwidth)
	case c.Placement != PlaceRandom && c.Placement != PlaceLocal:
		return fmt.Errorf("placement %q: want %q or %q", c.Placement, PlaceRandom, PlaceLocal)
	case c.Router != RouteRandom && c.Router != RouteAffinity:
		return fmt.Errorf("router %q: want %q or %q", c.Router, RouteRandom, RouteAffinity)
	case c.Replicas < 1 || c.Replicas > c.Hosts || c.Replicas > maxReplicas:
		return fmt.Errorf("replicas %d: want 1..%d and at most the hosts", c.Replicas, maxReplicas)
	}
	return nil
}

// Result is what one simulated cluster did.
type Result struct {
	Hosts, Copies        int
	Replicas             int
	Placement            Placement
	Router               Router
	Requests             int
	InputTokens          int64
	HitTokens            int64
	HitRate              float64 // HitTokens / InputTokens
	RemoteHitBytes       int64   // hit bytes read from another host's segment
	LocalHitBytes        int64
	RemoteShare          float64 // RemoteHitBytes over all hit bytes
	Evictions            int64
	LoadMeanMs           float64 // per request with a hit: arrival to its last block loaded
	LoadP50Ms, LoadP99Ms float64
	// LoadGBps is a hit request's bytes over its load time, averaged over those requests.
	LoadGBps float64
	// LinkBusy is the busiest host link's busy time over the trace's span.
	LinkBusy float64
}

// block is one stored block: its segment and size.
type block struct {
	seg   int
	bytes int64
}

// segment is one host's share of the pool, with its blocks in least-recently-used order.
type segment struct {
	used int64
	lru  lruList
}

// link is one direction of a host's network link: busy until free (seconds), busy in all.
type link struct{ free, busy float64 }

// Run replays trace on the cluster c. Requests are taken in arrival order; each looks up the
// longest prefix of its blocks the pool holds (any segment), reads them (a block in its own
// host's segment at LocalBandwidth, one in another's over both hosts' links), and saves the
// blocks it computed, Replicas copies each. A transfer queues bytes/LinkBandwidth on the owner's outgoing and the
// reader's incoming link (transfer); the queueing on a shared link is what the model is for. The
// connector leaves the block holding the last prompt token
// to compute, so a prompt cached whole loads all but its last block. Saves go where Placement
// says; a full segment evicts its least recently used blocks.
func Run(trace []Request, c Config) (Result, error) {
	if err := c.Validate(); err != nil {
		return Result{}, err
	}
	rng := newRand(c.Seed)
	var span uint64
	for _, q := range trace {
		for _, h := range q.Hashes {
			span = max(span, h+1)
		}
	}
	if span > math.MaxUint64/uint64(c.Copies) {
		return Result{}, fmt.Errorf("block ids up to %d cannot be moved for %d copies", span-1, c.Copies)
	}
	segs := make([]segment, c.Hosts)
	for i := range segs {
		segs[i].lru.init()
	}
	stored := map[uint64][]*lruNode{} // a block's replicas
	out := make([]link, c.Hosts)
	in := make([]link, c.Hosts)
	r := Result{Hosts: c.Hosts, Copies: c.Copies, Replicas: c.Replicas, Placement: c.Placement, Router: c.Router}
	var loads []float64
	var rateSum float64
	blockBytes := func(q Request, i int) (int64, int64) {
		toks := int64(TraceBlockTokens)
		if i == len(q.Hashes)-1 {
			toks = int64(q.InputLength - (len(q.Hashes)-1)*TraceBlockTokens)
		}
		return toks, toks * c.TokenBytes
	}
	start := float64(trace[0].Timestamp) / 1e3
	end := start
	ids := make([]uint64, 0, 64)
	for _, q := range trace {
		for cp := range c.Copies {
			now := float64(q.Timestamp) / 1e3
			end = max(end, now)
			ids = ids[:0]
			for _, h := range q.Hashes {
				ids = append(ids, h+uint64(cp)*span)
			}
			host := route(c, ids, rng)
			r.Requests++
			r.InputTokens += int64(q.InputLength)
			// The longest stored prefix, less the block holding the last prompt token.
			hit := 0
			for hit < len(ids) && len(stored[ids[hit]]) > 0 {
				hit++
			}
			if hit == len(ids) {
				hit--
			}
			done := now
			var reqBytes int64
			for i := range hit {
				n := pick(stored[ids[i]], host, out)
				toks, bytes := blockBytes(q, i)
				r.HitTokens += toks
				reqBytes += bytes
				segs[n.b.seg].lru.moveToBack(n)
				if n.b.seg == host {
					r.LocalHitBytes += bytes
					done = max(done, now) + float64(bytes)/c.LocalBandwidth
					continue
				}
				r.RemoteHitBytes += bytes
				done = max(done, transfer(&out[n.b.seg], &in[host], now, float64(bytes)/c.LinkBandwidth))
			}
			if hit > 0 {
				loads = append(loads, done-now)
				if done > now {
					rateSum += float64(reqBytes) / (done - now) / 1e9
				}
			}
			// Save what was computed and is not stored yet.
			for i := hit; i < len(ids); i++ {
				if len(stored[ids[i]]) > 0 {
					continue
				}
				_, bytes := blockBytes(q, i)
				if bytes > c.SegmentBytes {
					continue // larger than a segment: never stored
				}
				for _, seg := range placeReplicas(c, host, rng) {
					for segs[seg].used+bytes > c.SegmentBytes {
						victim := segs[seg].lru.front()
						segs[seg].lru.remove(victim)
						segs[seg].used -= victim.b.bytes
						reps := slices.DeleteFunc(stored[victim.id], func(x *lruNode) bool { return x == victim })
						if len(reps) == 0 {
							delete(stored, victim.id)
							r.Evictions++ // the block is gone once its last replica is
						} else {
							stored[victim.id] = reps
						}
					}
					n := &lruNode{id: ids[i], b: block{seg: seg, bytes: bytes}}
					segs[seg].lru.pushBack(n)
					segs[seg].used += bytes
					stored[ids[i]] = append(stored[ids[i]], n)
					if seg != host {
						transfer(&out[host], &in[seg], now, float64(bytes)/c.LinkBandwidth)
					}
				}
			}
		}
	}
	if r.InputTokens > 0 {
		r.HitRate = float64(r.HitTokens) / float64(r.InputTokens)
	}
	if hb := r.RemoteHitBytes + r.LocalHitBytes; hb > 0 {
		r.RemoteShare = float64(r.RemoteHitBytes) / float64(hb)
	}
	if len(loads) > 0 {
		slices.Sort(loads)
		var sum float64
		for _, l := range loads {
			sum += l
		}
		r.LoadMeanMs = 1e3 * sum / float64(len(loads))
		r.LoadP50Ms = 1e3 * loads[len(loads)/2]
		r.LoadP99Ms = 1e3 * loads[min(len(loads)-1, len(loads)*99/100)]
		r.LoadGBps = rateSum / float64(len(loads))
	}
	if end > start {
		for i := range out {
			r.LinkBusy = max(r.LinkBusy, out[i].busy/(end-start), in[i].busy/(end-start))
		}
	}
	return r, nil
}

// newRand is the source of every random choice a run makes.
func newRand(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)) }

// transfer queues d seconds of work on each link, each a first-come first-served server of its
// own, and returns when the later of the two is done: the transfer is as slow as its more
// loaded end. (Holding both links at once from when both are free would leave each idle while
// it waits for the other and chain every link's queue to every other's.)
func transfer(from, to *link, now, d float64) float64 {
	from.free = max(now, from.free) + d
	to.free = max(now, to.free) + d
	from.busy += d
	to.busy += d
	return max(from.free, to.free)
}

// pick returns the replica a read on host takes: one in host's own segment, else the one whose
// owner's outgoing link frees soonest.
func pick(reps []*lruNode, host int, out []link) *lruNode {
	best := reps[0]
	for _, n := range reps {
		if n.b.seg == host {
			return n
		}
		if out[n.b.seg].free < out[best.b.seg].free {
			best = n
		}
	}
	return best
}

// placeReplicas returns the distinct segments a block saved on host goes to: the first where
// c.Placement says, then random others.
func placeReplicas(c Config, host int, rng *rand.Rand) []int {
	first := host
	if c.Placement == PlaceRandom {
		first = rng.IntN(c.Hosts)
	}
	segs := []int{first}
	for len(segs) < c.Replicas {
		if s := rng.IntN(c.Hosts); !slices.Contains(segs, s) {
			segs = append(segs, s)
		}
	}
	return segs
}

// route picks the host that serves a request with block ids ids.
func route(c Config, ids []uint64, rng *rand.Rand) int {
	if c.Router == RouteRandom {
		return rng.IntN(c.Hosts)
	}
	h := uint64(14695981039346656037)
	for _, id := range ids[:min(2, len(ids))] {
		h ^= id
		h *= 1099511628211
		h ^= h >> 29
	}
	return int(h % uint64(c.Hosts))
}

// lruNode is one stored block in its segment's LRU list.
type lruNode struct {
	id         uint64
	b          block
	prev, next *lruNode
}

// lruList is a doubly linked list with a sentinel: front is the least recently used.
type lruList struct{ root lruNode }

func (l *lruList) init()             { l.root.prev, l.root.next = &l.root, &l.root }
func (l *lruList) front() *lruNode   { return l.root.next }
func (l *lruList) remove(n *lruNode) { n.prev.next, n.next.prev = n.next, n.prev }
func (l *lruList) pushBack(n *lruNode) {
	n.prev, n.next = l.root.prev, &l.root
	l.root.prev.next = n
	l.root.prev = n
}
func (l *lruList) moveToBack(n *lruNode) { l.remove(n); l.pushBack(n) }
