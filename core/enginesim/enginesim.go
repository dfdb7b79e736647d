package enginesim

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"time"

	"github.com/kvctl/kvctl/core/engineapi"
	"github.com/kvctl/kvctl/core/engineapi/enginepb"
	"github.com/kvctl/kvctl/core/kvmem"
)

// Config describes the simulated engine.
type Config struct {
	// Socket is the daemon's engine socket.
	Socket string
	// Name prefixes the rank names it registers ("<name>/rank<r>").
	Name     string
	ModelKey string
	// Namespace is the key namespace it registers ("" = the default).
	Namespace string
	// World is the tensor-parallel size; every rank registers, rank 0 runs the scheduler.
	World int
	// TokensPerBlock is the block size T.
	TokensPerBlock int
	// Slots is the number of page slots per layer group and rank.
	Slots int
	// PageBytes is the sharded page size of each layer group; ReplicatedBytes, when set, gives
	// group g a replicated region of that many bytes too (0 = none).
	PageBytes       []int
	ReplicatedBytes []int
	// Chunk is the number of tokens a request computes per pass (chunked prefill).
	Chunk int
	// GroupBlocks and SoftPinTTLms are passed to Register.
	GroupBlocks  bool
	SoftPinTTLms uint64
	// Memory is the kind of KV memory each rank registers: MemoryShared (the default) or
	// MemoryCUDAFD, which Device allocates.
	Memory string
	// Device allocates MemoryCUDAFD memory (the gpu package's CUDA); nil refuses that kind.
	Device kvmem.DeviceAllocator
	// SkipVerify leaves allocated pages unpoisoned and loaded pages unchecked, for benchmarks
	// that time the daemon rather than the simulator; tests leave it false so that every
	// loaded byte is checked.
	SkipVerify bool
	// AsyncLoad registers every rank with async_load: a pool hit parks the request while each
	// rank's load workers fetch its shard, and the request resumes once every rank reported it
	// finished. AsyncLoadWorkers is passed to Register (0: the daemon's default).
	AsyncLoad        bool
	AsyncLoadWorkers int
	// AfterBuild, when set, sees every pass's metadata after it is built and before any rank
	// binds it: tests use it to lose pages between a lookup and its load.
	AfterBuild func(meta *enginepb.Metadata)
}

func (c *Config) defaults() {
	if c.World == 0 {
		c.World = 1
	}
	if c.TokensPerBlock == 0 {
		c.TokensPerBlock = 16
	}
	if c.Slots == 0 {
		c.Slots = 256
	}
	if len(c.PageBytes) == 0 {
		c.PageBytes = []int{4096}
	}
	if c.Chunk == 0 {
		c.Chunk = 4 * c.TokensPerBlock
	}
	if c.Name == "" {
		c.Name = "sim"
	}
}

// Request is one request to run: its prompt.
type Request struct {
	ID     string
	Tokens []int64
}

// Result counts what happened over a Run.
type Result struct {
	Requests       int `json:"requests"`
	Passes         int `json:"passes"`
	PromptTokens   int `json:"prompt_tokens"`
	MatchedTokens  int `json:"matched_tokens"`  // offered by the pool and honoured
	LoadedBlocks   int `json:"loaded_blocks"`   // blocks restored from the pool, checked byte for byte
	ComputedBlocks int `json:"computed_blocks"` // blocks the engine computed
	Restarts       int `json:"restarts"`        // requests restarted after a failed load
	Parked         int `json:"parked"`          // requests parked for an asynchronous load
}

type rank struct {
	name   string
	client *engineapi.Client
	mem    *rankMemory // its mover is the engine's own view, to write and check KV
}

type req struct {
	Request
	phase      int
	pages      [][]int
	sentPages  int
	computed   int
	restore    int
	written    int
	saved      map[int]bool
	loaded     map[int]bool // ranks that reported a parked load finished
	loadFailed bool         // a rank handed the parked load back as failed
}

const (
	phaseWaiting = iota
	phaseRunning
	phaseSaving
	phaseDone
	phaseParked
)

// Engine is a registered simulated engine.
type Engine struct {
	cfg    Config
	layout kvmem.Layout
	ranks  []*rank
	free   [][]int
}

// Layout returns the KV layout the engine registers: per group, one sharded region (and a
// replicated one where configured), slots laid out one after the other.
func (c Config) Layout() (kvmem.Layout, uint64) {
	var off uint64
	l := kvmem.Layout{TokensPerBlock: c.TokensPerBlock}
	for g, pb := range c.PageBytes {
		gl := kvmem.GroupLayout{ID: g, Slots: c.Slots}
		gl.Regions = []kvmem.Region{{Offset: off, Stride: uint64(pb), Size: uint64(pb)}}
		off += uint64(pb) * uint64(c.Slots)
		if g < len(c.ReplicatedBytes) && c.ReplicatedBytes[g] > 0 {
			rb := uint64(c.ReplicatedBytes[g])
			gl.ReplicatedRegions = []kvmem.Region{{Offset: off, Stride: rb, Size: rb}}
			off += rb * uint64(c.Slots)
		}
		l.Groups = append(l.Groups, gl)
	}
	return l, off
}

// Start registers every rank with the daemon.
func Start(ctx context.Context, cfg Config) (*Engine, error) {
	cfg.defaults()
	layout, size := cfg.Layout()
	e := &Engine{cfg: cfg, layout: layout}
	ok := false
	defer func() {
		if !ok {
			_ = e.Close(context.Background())
		}
	}()
	for r := 0; r < cfg.World; r++ {
		rk := &rank{name: fmt.Sprintf("%s/rank%d", cfg.Name, r)}
		e.ranks = append(e.ranks, rk)
		var err error
		if rk.mem, err = newRankMemory(cfg.Memory, cfg.Device, size, layout); err != nil {
			return nil, err
		}
		if rk.client, err = engineapi.Dial(cfg.Socket); err != nil {
			return nil, err
		}
		req := &enginepb.RegisterRequest{
			Engine: rk.name, ModelKey: cfg.ModelKey, Namespace: cfg.Namespace, WorldSize: int32(cfg.World), Rank: int32(r),
			Role: "both", Scheduler: r == 0, Layout: layoutPB(layout),
			GroupBlocks: cfg.GroupBlocks, SoftPinTtlMs: cfg.SoftPinTTLms,
			AsyncLoad: cfg.AsyncLoad, AsyncLoadWorkers: int32(cfg.AsyncLoadWorkers),
		}
		if cfg.Memory == MemoryCUDAFD {
			_, err = rk.client.RegisterCUDAFD(ctx, req, rk.mem.fd, rk.mem.size, rk.mem.device)
		} else {
			_, err = rk.client.RegisterSharedMemory(ctx, req, rk.mem.fd, rk.mem.size)
		}
		if err != nil {
			return nil, fmt.Errorf("register %s: %w", rk.name, err)
		}
	}
	e.free = make([][]int, len(layout.Groups))
	for g := range e.free {
		for i := cfg.Slots - 1; i >= 0; i-- {
			e.free[g] = append(e.free[g], i)
		}
	}
	ok = true
	return e, nil
}

func layoutPB(l kvmem.Layout) *enginepb.Layout {
	out := &enginepb.Layout{TokensPerBlock: int32(l.TokensPerBlock)}
	conv := func(rs []kvmem.Region) []*enginepb.Region {
		var o []*enginepb.Region
		for _, r := range rs {
			o = append(o, &enginepb.Region{Offset: r.Offset, Stride: r.Stride, Size: r.Size})
		}
		return o
	}
	for _, g := range l.Groups {
		out.Groups = append(out.Groups, &enginepb.LayerGroup{Id: int32(g.ID), Slots: int32(g.Slots), Regions: conv(g.Regions), ReplicatedRegions: conv(g.ReplicatedRegions)})
	}
	return out
}

// Close unregisters every rank (draining its saves within ctx) and releases its memory.
func (e *Engine) Close(ctx context.Context) error {
	var errs []error
	for _, rk := range e.ranks {
		if rk.client != nil {
			if _, err := rk.client.Unregister(ctx, &enginepb.EngineRef{Engine: rk.name}); err != nil {
				errs = append(errs, fmt.Errorf("unregister %s: %w", rk.name, err))
			}
			errs = append(errs, rk.client.Close())
		}
		if rk.mem != nil {
			errs = append(errs, rk.mem.release())
		}
	}
	return errors.Join(errs...)
}

// KVBytes is the content of a computed page: a function of the tokens block b depends on, the
// rank (sharded bytes only), the group and whether it is the replicated value.
func KVBytes(tokens []int64, b, T, rank, group int, replicated bool, n int) []byte {
	h := fnv.New64a()
	var buf [8]byte
	for _, t := range tokens[:(b+1)*T] {
		binary.LittleEndian.PutUint64(buf[:], uint64(t))
		h.Write(buf[:])
	}
	if replicated {
		rank = -1
	}
	binary.LittleEndian.PutUint64(buf[:], uint64(int64(rank)<<32|int64(group)<<1|boolInt(replicated)))
	h.Write(buf[:])
	seed := h.Sum64()
	out := make([]byte, n)
	for i := 0; i < n; i += 8 {
		seed ^= seed << 13
		seed ^= seed >> 7
		seed ^= seed << 17
		binary.LittleEndian.PutUint64(buf[:], seed)
		copy(out[i:], buf[:])
	}
	return out
}

func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

func (e *Engine) refs(r *req, b int) []kvmem.PageRef {
	var out []kvmem.PageRef
	for g, gl := range e.layout.Groups {
		out = append(out, kvmem.PageRef{Group: g, Slot: r.pages[g][b]})
		if gl.ReplicatedBytesPerPage() > 0 {
			out = append(out, kvmem.PageRef{Group: g, Slot: r.pages[g][b], Replicated: true})
		}
	}
	return out
}

func (e *Engine) size(ref kvmem.PageRef) int {
	g := e.layout.Groups[ref.Group]
	if ref.Replicated {
		return int(g.ReplicatedBytesPerPage())
	}
	return int(g.BytesPerPage())
}

func (e *Engine) writeBlock(ctx context.Context, r *req, b int) error {
	for ri, rk := range e.ranks {
		for _, ref := range e.refs(r, b) {
			v := KVBytes(r.Tokens, b, e.cfg.TokensPerBlock, ri, ref.Group, ref.Replicated, e.size(ref))
			if err := rk.mem.mover.Scatter(ctx, [][]byte{v}, []kvmem.PageRef{ref}); err != nil {
				return err
			}
		}
	}
	return nil
}

// ErrWrongBytes means a page the daemon loaded does not hold the KV a cold run computed.
var ErrWrongBytes = errors.New("loaded page holds wrong bytes")

func (e *Engine) checkBlock(ctx context.Context, r *req, b int) error {
	if e.cfg.SkipVerify {
		return nil
	}
	for ri, rk := range e.ranks {
		for _, ref := range e.refs(r, b) {
			got := make([]byte, e.size(ref))
			if err := rk.mem.mover.Gather(ctx, []kvmem.PageRef{ref}, [][]byte{got}); err != nil {
				return err
			}
			if !bytes.Equal(got, KVBytes(r.Tokens, b, e.cfg.TokensPerBlock, ri, ref.Group, ref.Replicated, len(got))) {
				return fmt.Errorf("%w: request %s block %d rank %d page %+v", ErrWrongBytes, r.ID, b, ri, ref)
			}
		}
	}
	return nil
}

func (e *Engine) allocate(ctx context.Context, r *req) error {
	T := e.cfg.TokensPerBlock
	blocks := (len(r.Tokens) + T - 1) / T
	r.pages = make([][]int, len(e.layout.Groups))
	for g := range r.pages {
		n := len(e.free[g])
		if n < blocks {
			return fmt.Errorf("request %s needs %d page slots, %d free: raise Slots", r.ID, blocks, n)
		}
		r.pages[g] = slices.Clone(e.free[g][n-blocks:])
		slices.Reverse(r.pages[g])
		e.free[g] = e.free[g][:n-blocks]
	}
	// Poison the pages, so a load that writes nothing is caught (no check, no poison).
	for b := 0; b < blocks && !e.cfg.SkipVerify; b++ {
		for _, rk := range e.ranks {
			for _, ref := range e.refs(r, b) {
				if err := rk.mem.mover.Scatter(ctx, [][]byte{bytes.Repeat([]byte{0xEE}, e.size(ref))}, []kvmem.PageRef{ref}); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

func (e *Engine) release(r *req) {
	for g := range r.pages {
		e.free[g] = append(e.free[g], r.pages[g]...)
	}
	r.pages = nil
}

func blockIDs(pages [][]int, from int) []*enginepb.BlockIDs {
	out := make([]*enginepb.BlockIDs, len(pages))
	for g, p := range pages {
		ids := make([]int32, 0, len(p)-from)
		for _, id := range p[from:] {
			ids = append(ids, int32(id))
		}
		out[g] = &enginepb.BlockIDs{Ids: ids}
	}
	return out
}

// Run drives reqs to completion, MaxRunning at a time (0 = all at once), and returns what
// happened. Every loaded page is checked; a wrong byte is an error wrapping ErrWrongBytes.
func (e *Engine) Run(ctx context.Context, reqs []Request, maxRunning int) (Result, error) {
	res := Result{Requests: len(reqs)}
	all := make([]*req, len(reqs))
	byID := map[string]*req{}
	for i, r := range reqs {
		all[i] = &req{Request: r, saved: map[int]bool{}}
		byID[r.ID] = all[i]
		res.PromptTokens += len(r.Tokens)
	}
	sched := e.ranks[0]
	T := e.cfg.TokensPerBlock
	deadline := time.Now().Add(10 * time.Minute)
	for {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		if time.Now().After(deadline) {
			return res, errors.New("engine made no progress for 10 minutes")
		}
		done, running := true, 0
		for _, r := range all {
			done = done && r.phase == phaseDone
			if r.phase == phaseRunning || r.phase == phaseSaving || r.phase == phaseParked {
				running++
			}
		}
		if done {
			return res, nil
		}
		res.Passes++

		// Admit waiting requests.
		var started []string
		for _, r := range all {
			if r.phase != phaseWaiting || (maxRunning > 0 && running >= maxRunning) {
				continue
			}
			lr, err := sched.client.Lookup(ctx, &enginepb.LookupRequest{Engine: sched.name, Request: &enginepb.Request{Id: r.ID, TokensPacked: engineapi.TokensView(r.Tokens), ContextOnly: true}})
			if err != nil {
				return res, fmt.Errorf("lookup %s: %w", r.ID, err)
			}
			if err := e.allocate(ctx, r); err != nil {
				return res, err
			}
			h := int(lr.GetMatchedTokens())
			if _, err := sched.client.UpdateStateAfterAlloc(ctx, &enginepb.AllocRequest{Engine: sched.name, RequestId: r.ID, BlockIdsByGroup: blockIDs(r.pages, 0), HonouredTokens: int32(h)}); err != nil {
				return res, fmt.Errorf("allocation report %s: %w", r.ID, err)
			}
			r.phase, r.restore = phaseRunning, h
			if lr.GetAsync() {
				// Parked: out of the batch until every rank's load finished.
				r.phase, r.restore, r.computed, r.loaded = phaseParked, 0, h, map[int]bool{}
				started = append(started, r.ID)
				res.Parked++
			}
			res.MatchedTokens += h
			running++
		}

		// Build this pass's metadata.
		bm := &enginepb.BuildMetaRequest{Engine: sched.name}
		scheduled := map[*req]int{}
		for _, r := range all {
			if r.phase != phaseRunning {
				continue
			}
			n := min(e.cfg.Chunk, len(r.Tokens)-r.computed-r.restore)
			rd := &enginepb.RequestData{Id: r.ID, ComputedPosition: int32(r.computed), NumScheduledTokens: int32(n), NewBlockIdsByGroup: blockIDs(r.pages, r.sentPages)}
			if r.sentPages == 0 {
				bm.NewRequests = append(bm.NewRequests, rd)
			} else {
				bm.CachedRequests = append(bm.CachedRequests, rd)
			}
			r.sentPages = len(r.pages[0])
			scheduled[r] = n
		}
		for i, rk := range e.ranks {
			ids, err := rk.client.TakeSubmittedSaves(ctx, &enginepb.EngineRef{Engine: rk.name})
			if err != nil {
				return res, err
			}
			if i == 0 {
				bm.SubmittedSaves = ids.GetIds()
			}
		}
		meta, err := sched.client.BuildMeta(ctx, bm)
		if err != nil {
			return res, fmt.Errorf("build metadata: %w", err)
		}
		if e.cfg.AfterBuild != nil {
			e.cfg.AfterBuild(meta)
		}
		failed := map[string]bool{}
		for _, rk := range e.ranks {
			if _, err := rk.client.BindMeta(ctx, &enginepb.BindMetaRequest{Engine: rk.name, Metadata: meta}); err != nil {
				return res, err
			}
			if _, err := rk.client.StartLoad(ctx, &enginepb.EngineRef{Engine: rk.name}); err != nil {
				return res, fmt.Errorf("start load on %s: %w", rk.name, err)
			}
			f, err := rk.client.TakeFailedLoads(ctx, &enginepb.EngineRef{Engine: rk.name})
			if err != nil {
				return res, err
			}
			for _, id := range f.GetIds() {
				failed[id] = true
			}
		}
		for id := range failed {
			r := byID[id]
			delete(scheduled, r)
			if _, err := sched.client.RequestReset(ctx, &enginepb.RequestRef{Engine: sched.name, RequestId: id}); err != nil {
				return res, err
			}
			e.release(r)
			res.MatchedTokens -= r.restore
			*r = req{Request: r.Request, saved: map[int]bool{}}
			res.Restarts++
		}

		// Compute: check restored blocks, write the KV of newly computed ones.
		var finishedGen []string
		for _, r := range all {
			n, ok := scheduled[r]
			if !ok {
				continue
			}
			if r.restore > 0 {
				for b := r.computed / T; b < (r.computed+r.restore)/T; b++ {
					if err := e.checkBlock(ctx, r, b); err != nil {
						return res, err
					}
					res.LoadedBlocks++
				}
				r.written = (r.computed + r.restore) / T
			}
			r.computed += r.restore + n
			r.restore = 0
			for b := r.written; b < r.computed/T; b++ {
				if err := e.writeBlock(ctx, r, b); err != nil {
					return res, err
				}
				res.ComputedBlocks++
			}
			r.written = max(r.written, r.computed/T)
			if r.computed == len(r.Tokens) {
				fr, err := sched.client.RequestFinished(ctx, &enginepb.RequestRef{Engine: sched.name, RequestId: r.ID})
				if err != nil {
					return res, err
				}
				if fr.GetAsyncSaving() {
					r.phase = phaseSaving
					finishedGen = append(finishedGen, r.ID)
				} else {
					r.phase = phaseDone
					e.release(r)
				}
			}
		}
		for ri, rk := range e.ranks {
			if _, err := rk.client.WaitForSave(ctx, &enginepb.EngineRef{Engine: rk.name}); err != nil {
				return res, fmt.Errorf("wait for save on %s: %w", rk.name, err)
			}
			gf, err := rk.client.GetFinished(ctx, &enginepb.GetFinishedRequest{Engine: rk.name, FinishedGen: finishedGen, StartedLoading: started})
			if err != nil {
				return res, err
			}
			for _, id := range gf.GetFinishedSaving() {
				if r := byID[id]; r != nil {
					r.saved[ri] = true
				}
			}
			fa, err := rk.client.TakeFailedAsyncLoads(ctx, &enginepb.EngineRef{Engine: rk.name})
			if err != nil {
				return res, err
			}
			for _, id := range fa.GetIds() {
				if r := byID[id]; r != nil {
					r.loadFailed = true
				}
			}
			for _, id := range gf.GetFinishedLoading() {
				if r := byID[id]; r != nil && r.phase == phaseParked {
					r.loaded[ri] = true
				}
			}
		}
		// A parked request resumes once every rank reported its load (under tensor
		// parallelism the runtime acts on the intersection over ranks).
		for _, r := range all {
			if r.phase != phaseParked || len(r.loaded) < len(e.ranks) {
				continue
			}
			if r.loadFailed {
				if _, err := sched.client.RequestReset(ctx, &enginepb.RequestRef{Engine: sched.name, RequestId: r.ID}); err != nil {
					return res, err
				}
				e.release(r)
				res.MatchedTokens -= r.computed
				*r = req{Request: r.Request, saved: map[int]bool{}}
				res.Restarts++
				continue
			}
			for b := range r.computed / T {
				if err := e.checkBlock(ctx, r, b); err != nil {
					return res, err
				}
				res.LoadedBlocks++
			}
			r.written = r.computed / T
			r.phase, r.loaded = phaseRunning, nil
		}
		idle := true
		for _, r := range all {
			if r.phase == phaseSaving && len(r.saved) == len(e.ranks) {
				r.phase = phaseDone
				e.release(r)
			}
			if r.phase == phaseRunning || r.phase == phaseWaiting {
				idle = false
			}

		}
		if idle {
			// Only saves in flight: give the daemon's save goroutines a moment.
			time.Sleep(200 * time.Microsecond)
		}
	}
}

// Abandon closes the engine's connections without unregistering, as a crashed engine process
// would, and releases its local memory. The daemon must notice and release the registration.
func (e *Engine) Abandon() {
	for _, rk := range e.ranks {
		if rk.client != nil {
			_ = rk.client.Close()
			rk.client = nil
		}
		if rk.mem != nil {
			_ = rk.mem.release()
			rk.mem = nil
		}
	}
}

// Client is rank r's connection to the daemon. A registration can be named only over the
// connection that made it, so tests that send a rank calls of their own use this one.
func (e *Engine) Client(r int) *engineapi.Client { return e.ranks[r].client }
