package enginesim

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kvctl/kvctl/core/connector"
	"github.com/kvctl/kvctl/core/engineapi"
	"github.com/kvctl/kvctl/core/engineapi/enginepb"
	"github.com/kvctl/kvctl/core/kvmem"
	"github.com/kvctl/kvctl/core/simkv"
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
	// Format and KeyParams are the registration's key scheme ("" = trtllm) and, for a vLLM
	// format, its key inputs (RegisterRequest.format and key_params).
	Format    string
	KeyParams *enginepb.KeyParams
	// TokensPerBlock is the block size T.
	TokensPerBlock int
	// Slots is the number of page slots per layer group and rank.
	Slots int
	// PageBytes is the sharded page size of each layer group; ReplicatedBytes, when set, gives
	// group g a replicated region of that many bytes too (0 = none).
	PageBytes       []int
	ReplicatedBytes []int
	// SplitRegions lays each group's sharded page out as that many regions of equal size, each
	// a tensor of its own (K and V apart, or one region a layer), so that a page's value lies
	// in that many pieces of engine memory; 0 or 1 is one region. Every page size must divide
	// by it. The values are the same bytes either way: engines of either layout share them.
	SplitRegions int
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
	// EarlyLoads registers the (single) rank with early_loads: a hit's load starts at its
	// allocation report, so the pass's next admissions overlap it (engine API 1.4).
	EarlyLoads bool
	// AdmitPerPass caps the requests one pass admits (connector.DriverOptions.MaxAdmitPerPass;
	// 0 is no cap).
	AdmitPerPass int
	// FinishedWait is how long an engine with nothing to run but parked or saving requests
	// waits in GetFinished for one of them to finish (connector.Driver.WaitIdle; at most
	// connector.MaxFinishedWait). 0 polls instead: a pass every idlePoll.
	FinishedWait time.Duration
	// NoPromptArena makes the scheduler rank send every prompt in tokens_packed instead of
	// through a prompt arena (engineapi.RemoteRankOptions).
	NoPromptArena bool
	// NoCallChannels makes every rank call the daemon over its gRPC connection only; by default
	// each rank's client uses call channels (engineapi.Client.UseCallChannels), the engine API's
	// faster path.
	NoCallChannels bool
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
	// Admit, Load and Rest are the wall time of the run's passes by part
	// (connector.DriverStats).
	Admit, Load, Rest time.Duration `json:"-"`
}

type rank struct {
	name   string
	client *engineapi.Client
	remote *engineapi.RemoteRank
	token  string      // the scheduler token its registration returned (rank 0)
	mem    *rankMemory // its mover is the engine's own view, to write and check KV
}

// Engine is a registered simulated engine.
type Engine struct {
	cfg    Config
	layout kvmem.Layout
	ranks  []*rank
	slots  *simkv.Slots
	kv     *simkv.Memory
}

// Layout returns the KV layout the engine registers: per group, one sharded region (and a
// replicated one where configured), slots laid out one after the other.
func (c Config) Layout() (kvmem.Layout, uint64) {
	var off uint64
	l := kvmem.Layout{TokensPerBlock: c.TokensPerBlock}
	split := uint64(max(1, c.SplitRegions))
	for g, pb := range c.PageBytes {
		gl := kvmem.GroupLayout{ID: g, Slots: c.Slots}
		part := uint64(pb) / split
		for range split {
			gl.Regions = append(gl.Regions, kvmem.Region{Offset: off, Stride: part, Size: part})
			off += part * uint64(c.Slots)
		}
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
	for g, pb := range cfg.PageBytes {
		if cfg.SplitRegions > 1 && pb%cfg.SplitRegions != 0 {
			return nil, fmt.Errorf("group %d: page of %d bytes does not split into %d regions of equal size", g, pb, cfg.SplitRegions)
		}
	}
	layout, size := cfg.Layout()
	e := &Engine{cfg: cfg, layout: layout, kv: &simkv.Memory{Layout: layout}}
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
		if !cfg.NoCallChannels {
			if err = rk.client.UseCallChannels(ctx, 0); err != nil {
				return nil, fmt.Errorf("%s: %w", rk.name, err)
			}
		}
		req := &enginepb.RegisterRequest{
			Engine: rk.name, ModelKey: cfg.ModelKey, Namespace: cfg.Namespace, WorldSize: int32(cfg.World), Rank: int32(r),
			Role: string(connector.RoleBoth), Scheduler: r == 0, Layout: engineapi.LayoutToPB(layout),
			GroupBlocks: cfg.GroupBlocks, SoftPinTtlMs: cfg.SoftPinTTLms,
			AsyncLoad: cfg.AsyncLoad, AsyncLoadWorkers: int32(cfg.AsyncLoadWorkers), EarlyLoads: cfg.EarlyLoads && r == 0,
			Format: cfg.Format, KeyParams: cfg.KeyParams,
		}
		var resp *enginepb.RegisterResponse
		if cfg.Memory == MemoryCUDAFD {
			resp, err = rk.client.RegisterCUDAFD(ctx, req, rk.mem.fd, rk.mem.size, rk.mem.device)
		} else {
			resp, err = rk.client.RegisterSharedMemory(ctx, req, rk.mem.fd, rk.mem.size)
		}
		if err != nil {
			return nil, fmt.Errorf("register %s: %w", rk.name, err)
		}
		rk.remote = engineapi.NewRemoteRankWith(rk.client, resp, connector.RoleBoth, engineapi.RemoteRankOptions{NoPromptArena: cfg.NoPromptArena})
		rk.token = resp.GetSchedulerToken()
		e.kv.Ranks = append(e.kv.Ranks, rk.mem.mover)
	}
	e.slots = simkv.NewSlots(len(layout.Groups), cfg.Slots)
	ok = true
	return e, nil
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

// KVBytes is the content of a computed page: simkv.KVBytes without a prompt lookahead, the
// bytes Run writes for block b on rank rank and checks after every load.
func KVBytes(tokens []int64, b, T, rank, group int, replicated bool, n int) []byte {
	return simkv.KVBytes(tokens, b, T, 0, rank, group, replicated, n)
}

// ErrWrongBytes means a page the daemon loaded does not hold the KV a cold run computed.
var ErrWrongBytes = simkv.ErrWrongBytes

// hooks are the simulated engine's side of the connector's Driver: page slots from the
// engine's free lists (poisoned, so a load that writes nothing is caught), KV bytes written
// for every computed block and checked for every restored one, counted in res.
func (e *Engine) hooks(res *Result) connector.DriverHooks {
	verify := !e.cfg.SkipVerify
	return connector.DriverHooks{
		Allocate: func(ctx context.Context, r *connector.DrivenRequest, matched int, _ bool) (int, error) {
			T := e.cfg.TokensPerBlock
			blocks := (len(r.Tokens) + T - 1) / T
			pages, err := e.slots.Take(blocks)
			if err != nil {
				return 0, fmt.Errorf("request %s needs %d page slots: raise Slots: %w", r.ID, blocks, err)
			}
			r.Pages = pages
			if verify {
				if err := e.kv.Poison(ctx, pages, blocks); err != nil {
					return 0, err
				}
			}
			return matched, nil
		},
		Built: func(_ context.Context, meta connector.Metadata) error {
			if e.cfg.AfterBuild != nil {
				e.cfg.AfterBuild(engineapi.MetadataToPB(meta))
			}
			return nil
		},
		Restored: func(ctx context.Context, r *connector.DrivenRequest, first, end int) error {
			if verify {
				if err := e.kv.Check(ctx, r.ID, r.Tokens, r.Pages, first, end); err != nil {
					return err
				}
			}
			res.LoadedBlocks += end - first
			return nil
		},
		Computed: func(ctx context.Context, r *connector.DrivenRequest, first, end int) error {
			res.ComputedBlocks += end - first
			return e.kv.Write(ctx, r.Tokens, r.Pages, first, end)
		},
		Release: func(r *connector.DrivenRequest) {
			e.slots.Put(r.Pages)
			r.Pages = nil
		},
	}
}

// idlePoll is the pause between an idle engine's passes when it does not wait in GetFinished.
const idlePoll = 200 * time.Microsecond

// Run drives reqs to completion, MaxRunning at a time (0 = all at once), and returns what
// happened. Every loaded page is checked; a wrong byte is an error wrapping ErrWrongBytes.
func (e *Engine) Run(ctx context.Context, reqs []Request, maxRunning int) (res Result, err error) {
	res.Requests = len(reqs)
	ranks := make([]connector.Rank, len(e.ranks))
	for i, rk := range e.ranks {
		ranks[i] = rk.remote
	}
	d, err := connector.NewDriver(ranks, connector.DriverOptions{
		TokensPerBlock: e.cfg.TokensPerBlock, Chunk: e.cfg.Chunk, MaxRunning: maxRunning, MaxAdmitPerPass: e.cfg.AdmitPerPass, Hooks: e.hooks(&res),
	})
	if err != nil {
		return res, err
	}
	for _, r := range reqs {
		d.Add(connector.Request{ID: r.ID, Tokens: r.Tokens, ContextOnly: true})
		res.PromptTokens += len(r.Tokens)
	}
	defer func() {
		st := d.Stats()
		res.Passes, res.MatchedTokens, res.Parked, res.Restarts = st.Passes, st.MatchedTokens, st.Parked, st.Restarts
		res.Admit, res.Load, res.Rest = st.Admit, st.Load, st.Rest
	}()
	deadline := time.Now().Add(10 * time.Minute)
	for d.Pending() > 0 {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		if time.Now().After(deadline) {
			return res, errors.New("engine made no progress for 10 minutes")
		}
		if err := d.Step(ctx); err != nil {
			return res, err
		}
		// Only saves or parked loads in flight: wait for one to finish, or give the daemon's
		// goroutines a moment.
		if err := d.WaitIdle(ctx, e.cfg.FinishedWait, idlePoll); err != nil {
			return res, err
		}
	}
	return res, nil
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

// SchedulerToken is the scheduler token rank r's registration returned ("" on a rank without
// the scheduler adapter): what a scheduler in another process presents to AttachScheduler.
func (e *Engine) SchedulerToken(r int) string { return e.ranks[r].token }

// Remote is rank r's engineapi.RemoteRank, the connector.Rank its runs call.
func (e *Engine) Remote(r int) *engineapi.RemoteRank { return e.ranks[r].remote }
