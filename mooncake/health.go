package mooncake

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvctl/kvctl/core/backoff"
)

// Peer segment health.
//
// A peer host that dies keeps its segment listed by the master until the master's client TTL
// runs out (tens of seconds by default). Without a memory of the failure, every lookup in that
// window offers the dead host's pages again, every load of them fails, and the request that
// was offered them restarts, once per lookup: a restart storm. Native therefore keeps a health
// state per peer segment:
//
//   - healthy (the default, no entry): its pages are offered and read.
//   - unhealthy: a transfer to or from it failed. BatchIsExist answers its pages as misses and
//     BatchGet fails them without a transfer, so a request restarts at most once per lost
//     host (the load that found the host dead). After a jittered, doubling backoff a probe
//     resolves the segment on the metadata server again and reads one byte of it; an answer
//     makes it healthy, a failure waits the next, longer backoff.
//   - forgotten: the master no longer lists the segment (its pages are gone with it), so
//     there is nothing left to avoid; a host that comes back mounts a fresh segment.

// Health backoff bounds when NativeOptions leave them zero.
const (
	DefaultHealthMinBackoff = 250 * time.Millisecond
	DefaultHealthMaxBackoff = 5 * time.Second
)

// probeInterval is how often the prober looks for segments whose backoff ran out.
const probeInterval = 50 * time.Millisecond

// SegmentHealthStats reports the peer segment health state. Counters only grow.
type SegmentHealthStats struct {
	// Unhealthy is the number of peer segments whose pages are not offered now.
	Unhealthy int `json:"unhealthy_segments"`
	// ToUnhealthy counts healthy → unhealthy transitions (a transfer failed).
	ToUnhealthy int64 `json:"to_unhealthy"`
	// ToHealthy counts unhealthy → healthy transitions (a probe or a transfer succeeded).
	ToHealthy int64 `json:"to_healthy"`
	// Forgotten counts unhealthy segments dropped because the master no longer lists them.
	Forgotten int64 `json:"forgotten"`
	// Probes counts the probes of unhealthy segments, successful or not.
	Probes int64 `json:"probes"`
}

type segState struct {
	bo      backoff.Backoff
	until   time.Time // no probe before this
	probing bool
}

// segmentHealth is the per-segment state; safe for concurrent use. The fast path (no
// segment unhealthy) is one atomic load.
type segmentHealth struct {
	min, max time.Duration
	now      func() time.Time

	n    atomic.Int64 // len(segs), read without the lock
	mu   sync.Mutex
	segs map[string]*segState

	toUnhealthy, toHealthy, forgotten, probes atomic.Int64
}

func newSegmentHealth(lo, hi time.Duration) *segmentHealth {
	if lo <= 0 {
		lo = DefaultHealthMinBackoff
	}
	if hi < lo {
		hi = max(DefaultHealthMaxBackoff, lo)
	}
	return &segmentHealth{min: lo, max: hi, now: time.Now, segs: map[string]*segState{}}
}

// fail records a failed transfer with seg. A segment already unhealthy keeps its backoff:
// the transfers that were in flight when it died fail together and count as one failure.
func (h *segmentHealth) fail(seg string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.segs[seg]; ok {
		return
	}
	if len(h.segs) >= maxUnhealthySegments {
		return
	}
	s := &segState{bo: backoff.Backoff{Min: h.min, Max: h.max}}
	s.until = h.now().Add(s.bo.Next())
	h.segs[seg] = s
	h.n.Store(int64(len(h.segs)))
	h.toUnhealthy.Add(1)
}

// maxUnhealthySegments bounds the state: a cluster has far fewer hosts; past it a failing
// segment is simply not remembered (its loads fail as before the health state existed).
const maxUnhealthySegments = 4096

// ok records a successful transfer with seg.
func (h *segmentHealth) ok(seg string) {
	if h.n.Load() == 0 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.segs[seg]; ok {
		h.drop(seg)
		h.toHealthy.Add(1)
	}
}

func (h *segmentHealth) drop(seg string) {
	delete(h.segs, seg)
	h.n.Store(int64(len(h.segs)))
}

// unhealthy reports whether seg's pages are not to be offered.
func (h *segmentHealth) unhealthy(seg string) bool {
	if h.n.Load() == 0 {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	_, ok := h.segs[seg]
	return ok
}

// any reports whether some segment is unhealthy.
func (h *segmentHealth) any() bool { return h.n.Load() > 0 }

// due returns the unhealthy segments whose backoff ran out and marks them probing.
func (h *segmentHealth) due() []string {
	if h.n.Load() == 0 {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.now()
	var out []string
	for name, s := range h.segs {
		if !s.probing && !now.Before(s.until) {
			s.probing = true
			out = append(out, name)
		}
	}
	return out
}

// probed records a probe's outcome; listed is false when the master no longer lists seg.
func (h *segmentHealth) probed(seg string, err error, listed bool) {
	h.probes.Add(1)
	h.mu.Lock()
	defer h.mu.Unlock()
	s, ok := h.segs[seg]
	if !ok {
		return
	}
	switch {
	case !listed:
		h.drop(seg)
		h.forgotten.Add(1)
	case err == nil:
		h.drop(seg)
		h.toHealthy.Add(1)
	default:
		s.probing = false
		s.until = h.now().Add(s.bo.Next())
	}
}

func (h *segmentHealth) stats() SegmentHealthStats {
	return SegmentHealthStats{Unhealthy: int(h.n.Load()), ToUnhealthy: h.toUnhealthy.Load(), ToHealthy: h.toHealthy.Load(),
		Forgotten: h.forgotten.Load(), Probes: h.probes.Load()}
}

// SegmentHealth reports the peer segment health state.
func (n *Native) SegmentHealth() SegmentHealthStats { return n.health.stats() }

// prober probes unhealthy segments whose backoff ran out, until Close.
func (n *Native) prober() {
	defer n.wg.Done()
	t := time.NewTicker(probeInterval)
	defer t.Stop()
	for {
		select {
		case <-n.stop:
			return
		case <-t.C:
		}
		due := n.health.due()
		if len(due) == 0 {
			continue
		}
		listed := n.listedSegments()
		for _, seg := range due {
			in := true
			if listed != nil {
				_, in = listed[seg]
			}
			var err error
			if in {
				err = n.probe(seg)
			}
			n.health.probed(seg, err, in)
			if err == nil && in {
				n.log.Info("mooncake peer segment answers again; its pages are offered", "segment", seg)
			} else if in {
				n.log.Debug("mooncake peer segment probe failed", "segment", seg, "err", err)
			}
		}
	}
}

// listedSegments is the master's segment list, or nil when it is unknown (no admin URL, or
// the admin server did not answer): then every segment counts as listed.
func (n *Native) listedSegments() map[string]struct{} {
	admin := n.admin.Load()
	if admin == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), n.opts.CallTimeout)
	defer cancel()
	names, err := admin.AllSegments(ctx)
	if err != nil {
		return nil
	}
	out := make(map[string]struct{}, len(names))
	for _, s := range names {
		out[s] = struct{}{}
	}
	return out
}

// probe resolves seg on the metadata server again (a host that came back publishes a new
// descriptor) and reads the first byte of its first buffer over the Transfer Engine.
func (n *Native) probe(seg string) error {
	ctx, cancel := context.WithTimeout(context.Background(), n.opts.CallTimeout)
	defer cancel()
	ep, err := n.meta.Resolve(ctx, seg)
	if err != nil {
		return fmt.Errorf("segment %q: %w", seg, err)
	}
	if len(ep.Segment.Buffers) == 0 || ep.Segment.Buffers[0].Length == 0 {
		return fmt.Errorf("segment %q publishes no buffer", seg)
	}
	var b [1]byte
	if err := n.te.Read(ctx, ep.Addr, ep.Segment.Buffers[0].Addr, b[:]); err != nil {
		return err
	}
	n.epMu.Lock()
	n.endpoints[seg] = peerSegment{addr: ep.Addr, desc: ep.Segment}
	n.epMu.Unlock()
	return nil
}
