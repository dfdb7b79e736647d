package connector

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/kvctl/kvctl/core/kvmem"
	"github.com/kvctl/kvctl/pool"
)

// memPool is a test double of pool.Pool: an in-memory map with the pool's put-never-
// overwrites rule, its error codes, per-put options recorded per key, eviction by deleting a
// key, and call counters. The lifecycle and feature tests run against it and against the
// embedded pool (poolKinds in pools_test.go); its per-key records of groups and soft-pin TTLs
// let tests read what each put asked for.
type memPool struct {
	mu      sync.Mutex
	objs    map[string][]byte
	group   map[string]string
	pinTTL  map[string]time.Duration
	maxTTL  time.Duration
	putErr  map[string]pool.Code // injected per-key put failures
	onGet   func(keys []string)  // called before a BatchGet is answered, without the lock
	counter struct {
		existCalls, existKeys int
		putCalls, putKeys     int
		written               int
		getCalls, getKeys     int
		getBytes              int64
	}
}

func newMemPool() *memPool {
	return &memPool{objs: map[string][]byte{}, group: map[string]string{}, pinTTL: map[string]time.Duration{},
		maxTTL: 24 * time.Hour, putErr: map[string]pool.Code{}}
}

func (p *memPool) BatchIsExist(_ context.Context, keys []string) []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.counter.existCalls++
	p.counter.existKeys += len(keys)
	out := make([]int, len(keys))
	for i, k := range keys {
		if _, ok := p.objs[k]; ok {
			out[i] = 1
		}
	}
	return out
}

func (p *memPool) BatchPut(_ context.Context, keys []string, bufs [][]byte, cfg pool.ReplicateConfig) []pool.Code {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.counter.putCalls++
	p.counter.putKeys += len(keys)
	out := make([]pool.Code, len(keys))
	if len(bufs) != len(keys) || (cfg.GroupIDs != nil && len(cfg.GroupIDs) != len(keys)) {
		for i := range out {
			out[i] = pool.ErrInvalidParams
		}
		return out
	}
	if cfg.SoftPinTTL > 0 && (cfg.SoftPinAction != pool.SoftPinEnable || cfg.SoftPinTTL > p.maxTTL) {
		for i := range out {
			out[i] = pool.ErrInvalidParams
		}
		return out
	}
	for i, k := range keys {
		if c, ok := p.putErr[k]; ok {
			out[i] = c
			continue
		}
		if _, ok := p.objs[k]; ok {
			continue // never overwritten
		}
		p.objs[k] = append([]byte(nil), bufs[i]...)
		p.counter.written++
		if cfg.GroupIDs != nil {
			p.group[k] = cfg.GroupIDs[i]
		}
		if cfg.SoftPinAction == pool.SoftPinEnable {
			p.pinTTL[k] = cfg.SoftPinTTL
		}
	}
	return out
}

func (p *memPool) BatchGet(_ context.Context, keys []string, bufs [][]byte) []int64 {
	if p.onGet != nil {
		p.onGet(keys)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.counter.getCalls++
	p.counter.getKeys += len(keys)
	out := make([]int64, len(keys))
	for i, k := range keys {
		v, ok := p.objs[k]
		switch {
		case !ok:
			out[i] = int64(pool.ErrObjectNotFound)
		case len(bufs[i]) < len(v):
			out[i] = int64(pool.ErrInvalidParams)
		default:
			out[i] = int64(copy(bufs[i], v))
			p.counter.getBytes += int64(len(v))
		}
	}
	return out
}

func (p *memPool) Remove(_ context.Context, key string, _ bool) pool.Code {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.objs[key]; !ok {
		return pool.ErrObjectNotFound
	}
	delete(p.objs, key)
	return pool.OK
}

func (p *memPool) Segments(context.Context) ([]pool.Segment, error) { return nil, nil }

func (p *memPool) Stats(context.Context) (pool.Stats, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return pool.Stats{Objects: int64(len(p.objs))}, nil
}

func (p *memPool) get(key string) ([]byte, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	v, ok := p.objs[key]
	return v, ok
}

func (p *memPool) has(key string) bool { _, ok := p.get(key); return ok }

func (p *memPool) evict(key string) bool {
	return p.Remove(context.Background(), key, true) == pool.OK
}

func (p *memPool) keys() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]string, 0, len(p.objs))
	for k := range p.objs {
		out = append(out, k)
	}
	return out
}

// hostMover is a test double of kvmem.Mover over a plain byte slice: regions are copied byte for
// byte, as the host-memory backend does.
type hostMover struct {
	mem      []byte
	layout   kvmem.Layout
	gatherFn func() error // injected failure
	closed   bool
}

func newHostMover(l kvmem.Layout) *hostMover {
	var size uint64
	for _, g := range l.Groups {
		for _, set := range [][]kvmem.Region{g.Regions, g.ReplicatedRegions} {
			for _, r := range set {
				size = max(size, r.Offset+r.Stride*uint64(g.Slots-1)+r.Size)
			}
		}
	}
	return &hostMover{mem: make([]byte, size), layout: l}
}

func (m *hostMover) Layout() kvmem.Layout { return m.layout }

func (m *hostMover) regions(p kvmem.PageRef) ([]kvmem.Region, error) {
	if p.Group < 0 || p.Group >= len(m.layout.Groups) {
		return nil, fmt.Errorf("group %d out of range", p.Group)
	}
	g := m.layout.Groups[p.Group]
	if p.Slot < 0 || p.Slot >= g.Slots {
		return nil, fmt.Errorf("slot %d out of range", p.Slot)
	}
	if p.Replicated {
		return g.ReplicatedRegions, nil
	}
	return g.Regions, nil
}

func (m *hostMover) copyPage(p kvmem.PageRef, buf []byte, toMem bool) error {
	rs, err := m.regions(p)
	if err != nil {
		return err
	}
	var want uint64
	for _, r := range rs {
		want += r.Size
	}
	if uint64(len(buf)) != want {
		return fmt.Errorf("buffer of %d bytes for a %d-byte page", len(buf), want)
	}
	off := 0
	for _, r := range rs {
		at := r.Offset + r.Stride*uint64(p.Slot)
		if toMem {
			copy(m.mem[at:at+r.Size], buf[off:])
		} else {
			copy(buf[off:], m.mem[at:at+r.Size])
		}
		off += int(r.Size)
	}
	return nil
}

func (m *hostMover) Gather(_ context.Context, pages []kvmem.PageRef, dst [][]byte) error {
	if m.gatherFn != nil {
		if err := m.gatherFn(); err != nil {
			return err
		}
	}
	for i, p := range pages {
		if err := m.copyPage(p, dst[i], false); err != nil {
			return err
		}
	}
	return nil
}

func (m *hostMover) Scatter(_ context.Context, src [][]byte, pages []kvmem.PageRef) error {
	for i, p := range pages {
		if err := m.copyPage(p, src[i], true); err != nil {
			return err
		}
	}
	return nil
}

func (m *hostMover) NewStaging(slots, slotBytes int) (kvmem.Staging, error) {
	if slots < 1 || slotBytes < 1 {
		return nil, errors.New("empty staging")
	}
	return &hostStaging{buf: make([]byte, slots*slotBytes), slots: slots, slotBytes: slotBytes}, nil
}

func (m *hostMover) Clone() (kvmem.Mover, error) {
	return &hostMover{mem: m.mem, layout: m.layout, gatherFn: m.gatherFn}, nil
}

func (m *hostMover) Close() error { m.closed = true; return nil }

type hostStaging struct {
	mu        sync.Mutex
	buf       []byte
	slots     int
	slotBytes int
	closed    bool
	// failClose, when set, is a release that fails (a pinned buffer whose unregistration from
	// the device fails): the buffer stays as it is.
	failClose error
}

func (s *hostStaging) Slots() int     { return s.slots }
func (s *hostStaging) SlotBytes() int { return s.slotBytes }
func (s *hostStaging) Slot(i int) []byte {
	return s.buf[i*s.slotBytes : (i+1)*s.slotBytes : (i+1)*s.slotBytes]
}
func (s *hostStaging) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errors.New("staging closed twice")
	}
	if s.failClose != nil {
		return s.failClose
	}
	s.closed = true
	return nil
}

type (
	gpuStaging = kvmem.Staging
	gpuMover   = kvmem.Mover
)

func mooncakeConfig() pool.ReplicateConfig { return pool.ReplicateConfig{} }
