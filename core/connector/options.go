package connector

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/kvctl/kvctl/core/keys"
	"github.com/kvctl/kvctl/core/stats"
)

// Role says which transfers a connector makes.
type Role string

// Roles, as the client config spells them.
const (
	RoleBoth     Role = "both"     // looks up, loads and saves
	RoleProducer Role = "producer" // saves only
	RoleConsumer Role = "consumer" // looks up and loads only
	RoleCapacity Role = "capacity" // lends pool memory and transfers nothing
)

// Loads reports whether the role looks prefixes up and loads them.
func (r Role) Loads() bool { return r == RoleBoth || r == RoleConsumer }

// Saves reports whether the role writes pages.
func (r Role) Saves() bool { return r == RoleBoth || r == RoleProducer }

// Transfers reports whether the role moves any page.
func (r Role) Transfers() bool { return r.Loads() || r.Saves() }

func (r Role) valid() bool {
	return r == RoleBoth || r == RoleProducer || r == RoleConsumer || r == RoleCapacity
}

// ReuseBackoff is local_reuse_backoff: how the engine's local prefix reuse meets a one-model
// draft's reuse-match backoff.
type ReuseBackoff string

// Local reuse backoff modes.
const (
	// ReuseBackoffOff drops the backoff and takes local matches whole.
	ReuseBackoffOff ReuseBackoff = "off"
	// ReuseBackoffAlign keeps the backoff and aligns local matches down to a block boundary, so
	// the pool serves the trimmed block with the rest of the prefix.
	ReuseBackoffAlign ReuseBackoff = "align"
)

// Defaults.
const (
	DefaultTransferBatchSize  = 64
	DefaultStagingBufferBytes = 1 << 30 // per direction
	DefaultAsyncLoadWorkers   = 1
	// DefaultCloseTimeout bounds Close when its context has no deadline.
	DefaultCloseTimeout = 30 * time.Second
)

// Options configures a Scheduler and a Worker. Both halves of one engine rank are built from
// the same Options. It is a plain struct: the config loader fills it.
type Options struct {
	Role Role
	// Namespace is the key namespace of this rank: under tensor parallelism its attention shard,
	// under attention DP (Namespace.AttentionDP) shard 0 of 1 on every owner.
	Namespace keys.Namespace
	// Format and PromptLookahead select the block hash derivation (see package keys).
	Format keys.Format
	// VLLM, when set, names this rank's keys as vLLM's MooncakeStoreConnector does instead of
	// TensorRT-LLM's Format and Namespace (which then only name the rank's shard and
	// deployment): vLLM's block hashes and key layout. It needs PromptLookahead 0, no
	// GroupBlocks, no SpeculativePrefill and layer groups without replicated regions.
	VLLM            *keys.VLLMRank
	PromptLookahead int
	TokensPerBlock  int
	// TransferBatchSize is the most pages one pool call moves; staging may lower it.
	TransferBatchSize int
	// StagingBufferBytes is the host staging memory per direction (loads, saves). With async
	// loads every load worker gets an even share of the load direction's budget.
	StagingBufferBytes int64
	// SoftPinTTL, when positive, soft-pins every page this rank writes for that long.
	SoftPinTTL time.Duration
	// GroupBlocks puts every page of a block into one eviction group named by its group key.
	GroupBlocks bool
	// StatsInterval, when positive, turns on prefix-hole and load-phase stats and logs each
	// at most once per interval.
	StatsInterval time.Duration
	// AsyncLoad offers hits asynchronously: the engine parks the request while
	// AsyncLoadWorkers goroutines load its pages.
	AsyncLoad        bool
	AsyncLoadWorkers int
	// LocalReuseBackoff is "off" (the default when empty) or "align".
	LocalReuseBackoff ReuseBackoff
	// SpeculativePrefill is the speculative-prefill-only mode of a disaggregated context server
	// with a one-model draft: only context-only requests are accepted and keys cover
	// PromptLookahead tokens past each block.
	SpeculativePrefill bool
	// StagedTransfers copies pages through host staging even when the pool's memory can be used
	// in place (a pool that is a pool.Viewer and pool.Reserver, and a mover that is a
	// kvmem.HostRegistrar). By default such a pool's segments are registered with the mover: a
	// load verifies each page where it lies and copies it once, straight into engine memory,
	// and a save gathers each page straight into the pool memory reserved for it and takes its
	// checksum there (docs/perf/serve-gpu.md).
	StagedTransfers bool
	// EarlyLoads starts a request's load at its allocation report instead of at StartLoad (a
	// synchronous offer) or at the BindMeta that carries its parked transfer (an asynchronous
	// one), once LinkEarlyLoads has joined the rank's Scheduler and Worker. The engine promises
	// that pages it reports allocated are free of its own work from then on. Only for a single
	// rank (WorldSize 1, not attention DP) without a Fence.
	EarlyLoads bool

	// Logger receives the connector's lines; nil uses slog.Default().
	Logger *slog.Logger
	// Clock paces the stats lines and times asynchronous waits; nil uses time.Now.
	Clock func() time.Time
	// Stats, when set, is the reporter both halves of the rank record into (make it with
	// stats.NewReporter, Interval = StatsInterval, to export Prometheus metrics). When nil and
	// StatsInterval is positive, each half makes a log-only reporter of its own.
	Stats *stats.Reporter
	// Fence, when set, returns a fence on the engine's stream at the moment it is called: the
	// worker takes one when saves are queued (the KV is computed once it is passed), one when
	// asynchronous loads are queued and one when StartLoad starts synchronous loads (the
	// destination pages are allocated and free once it is passed: the allocation fence). Each
	// is passed before the first copy of that work. A fence that is a kvmem.DeviceFence is
	// handed to a mover that is a kvmem.FenceWaiter, which orders its copies after it on the
	// device without the host waiting; any other is waited for with Wait. Nil means work issued
	// before the call is already complete, as with host memory.
	Fence func() Fence
}

// Fence is a point in an engine's stream of work. Wait returns once the work issued before it
// is complete, or with ctx's error.
type Fence interface {
	Wait(ctx context.Context) error
}

// withDefaults fills zero values with their defaults.
func (o Options) withDefaults() Options {
	if o.Role == "" {
		o.Role = RoleBoth
	}
	if o.Format == "" {
		o.Format = keys.FormatTRTLLM
	}
	if o.TransferBatchSize == 0 {
		o.TransferBatchSize = DefaultTransferBatchSize
	}
	if o.StagingBufferBytes == 0 {
		o.StagingBufferBytes = DefaultStagingBufferBytes
	}
	if o.AsyncLoadWorkers == 0 {
		o.AsyncLoadWorkers = DefaultAsyncLoadWorkers
	}
	if o.LocalReuseBackoff == "" {
		o.LocalReuseBackoff = ReuseBackoffOff
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Clock == nil {
		o.Clock = time.Now
	}
	return o
}

// Validate returns every problem with the options at once, or nil. Zero values that have a
// default are accepted.
func (o Options) Validate() error {
	o = o.withDefaults()
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if !o.Role.valid() {
		bad("role %q: must be one of both, producer, consumer, capacity", o.Role)
	}
	if o.Role.Transfers() {
		if err := o.Namespace.Validate(); err != nil {
			bad("namespace: %w", err)
		}
		if o.VLLM == nil {
			cc := keys.ChainConfig{Format: o.Format, TokensPerBlock: o.TokensPerBlock, PromptLookahead: o.PromptLookahead}
			if err := cc.Validate(); err != nil {
				bad("key chain: %w", err)
			}
		} else {
			if o.TokensPerBlock != o.VLLM.BlockSize() {
				bad("tokens per block %d: the vLLM keys were made for blocks of %d", o.TokensPerBlock, o.VLLM.BlockSize())
			}
			if o.PromptLookahead != 0 || o.GroupBlocks || o.SpeculativePrefill {
				bad("format %s has no prompt lookahead, block groups or speculative prefill", o.VLLM.Scheme())
			}
		}
	}
	if o.TransferBatchSize < 1 {
		bad("transfer_batch_size %d: must be at least 1", o.TransferBatchSize)
	}
	if o.StagingBufferBytes < 1 {
		bad("staging_buffer_bytes %d: must be positive", o.StagingBufferBytes)
	}
	if o.SoftPinTTL < 0 {
		bad("soft_pin_ttl %v: must not be negative", o.SoftPinTTL)
	}
	if o.StatsInterval < 0 {
		bad("stats_interval %v: must not be negative", o.StatsInterval)
	}
	if o.AsyncLoadWorkers < 1 {
		bad("async_load_workers %d: must be at least 1", o.AsyncLoadWorkers)
	}
	if o.LocalReuseBackoff != ReuseBackoffOff && o.LocalReuseBackoff != ReuseBackoffAlign {
		bad("local_reuse_backoff %q: must be off or align", o.LocalReuseBackoff)
	}
	if o.EarlyLoads && (o.Namespace.WorldSize > 1 || o.Namespace.AttentionDP) {
		bad("early loads need a single rank: the allocation report reaches only the scheduler rank (world size %d, attention DP %t)", o.Namespace.WorldSize, o.Namespace.AttentionDP)
	}
	if o.EarlyLoads && o.Fence != nil {
		bad("early loads order by the host: a rank with an engine fence (engine_event) takes it at StartLoad")
	}
	if o.SpeculativePrefill && o.Role.Transfers() && o.PromptLookahead < 1 {
		bad("speculative prefill needs the draft's prompt lookahead (at least 1), got %d", o.PromptLookahead)
	}
	return errors.Join(errs...)
}

// recoverFailedLoads reports whether this rank can hand a request whose load failed back for a
// restart: it must hold whole pages and its own batch (a single rank or an attention-DP owner).
func (o Options) recoverFailedLoads() bool {
	return o.Namespace.AttentionDP || o.Namespace.WorldSize == 1
}
