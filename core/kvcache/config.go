package kvcache

import (
	"errors"
	"fmt"

	"github.com/kvctl/kvctl/core/radix"
)

// ErrConfig reports an invalid manager configuration.
var ErrConfig = errors.New("invalid kv cache manager config")

// PoolConfig is one layer group's GPU pool.
type PoolConfig struct {
	// Group names the layer group.
	Group string
	// GPUSlots is the number of pages the pool holds.
	GPUSlots int
}

// AdmissionQueryConfig is kv_connector_config.admission_query.
type AdmissionQueryConfig struct {
	// MaxOfferDeferrals is how many scheduling passes a first chunk may be skipped because
	// the pool cannot cover its shifted window.
	MaxOfferDeferrals int
	// MaxUnchargedParks is how many chunks that will park may be admitted per pass without a
	// token charge.
	MaxUnchargedParks int
}

// Config configures a Manager.
type Config struct {
	// TokensPerBlock is T.
	TokensPerBlock int
	// Pools are the GPU pools, one per layer group.
	Pools []PoolConfig
	// HostSlots is the size of the host tier; 0 means no host tier.
	HostSlots int
	// ReuseMatchBackoff drops tokens from the tail of every local match.
	ReuseMatchBackoff int
	// ReuseMatchAlignment trims local matches to a multiple of itself; 0 means 1.
	ReuseMatchAlignment int
	// EnablePartialReuse lets a match end inside a block.
	EnablePartialReuse bool
	// DraftPromptLookahead is the one-model draft's prompt lookahead, kept for KV sharing even
	// when the backoff is dropped.
	DraftPromptLookahead int
	// MaxGenerationLead is how many tokens a generation request may run ahead of its output
	// limit (a draft's lead); generation init reserves through it.
	MaxGenerationLead int
	// EnableCompletionReservation is kv_cache_config.enable_disagg_completion_reservation.
	EnableCompletionReservation bool
	// Disaggregated marks a manager of a disaggregated server (one with a cache transceiver).
	// Completion reservations apply only there.
	Disaggregated bool
	// BeamWidth is the server's beam width; 0 means 1.
	BeamWidth int
	// PipelineStages is pipeline_parallel_size; 0 means 1.
	PipelineStages int
	// WindowedLayers marks a model with sliding-window or recurrent layers (not full attention
	// on every layer).
	WindowedLayers bool
	// AdmissionQuery, when set, enables admission-time connector queries.
	AdmissionQuery *AdmissionQueryConfig
}

// Validate returns every problem with the config at once.
func (c Config) Validate() error {
	var errs []error
	bad := func(key, format string, a ...any) {
		errs = append(errs, fmt.Errorf("%w: %s: %s", ErrConfig, key, fmt.Sprintf(format, a...)))
	}
	if c.TokensPerBlock < 1 || c.TokensPerBlock > radix.MaxTokensPerBlock {
		bad("tokens_per_block", "%d not in 1..%d", c.TokensPerBlock, radix.MaxTokensPerBlock)
	}
	if len(c.Pools) == 0 {
		bad("pools", "at least one GPU pool is needed")
	}
	seen := map[string]bool{}
	for i, p := range c.Pools {
		if p.GPUSlots < 1 {
			bad(fmt.Sprintf("pools[%d].gpu_slots", i), "%d, want at least 1", p.GPUSlots)
		}
		if seen[p.Group] {
			bad(fmt.Sprintf("pools[%d].group", i), "duplicate group %q", p.Group)
		}
		seen[p.Group] = true
	}
	if c.HostSlots < 0 {
		bad("host_slots", "%d is negative", c.HostSlots)
	}
	if c.BeamWidth < 0 {
		bad("beam_width", "%d is negative", c.BeamWidth)
	}
	if c.PipelineStages < 0 {
		bad("pipeline_parallel_size", "%d is negative", c.PipelineStages)
	}
	if c.ReuseMatchBackoff < 0 {
		bad("reuse_match_backoff", "%d is negative", c.ReuseMatchBackoff)
	}
	if c.TokensPerBlock >= 1 {
		if err := radix.ValidateAlignment(max(c.ReuseMatchAlignment, 1), c.TokensPerBlock); err != nil || c.ReuseMatchAlignment < 0 {
			bad("reuse_match_alignment", "%d is not a positive divisor of tokens_per_block %d", c.ReuseMatchAlignment, c.TokensPerBlock)
		}
	}
	if c.DraftPromptLookahead < 0 {
		bad("draft_prompt_lookahead", "%d is negative", c.DraftPromptLookahead)
	}
	if c.MaxGenerationLead < 0 {
		bad("max_generation_lead", "%d is negative", c.MaxGenerationLead)
	}
	if q := c.AdmissionQuery; q != nil {
		if q.MaxOfferDeferrals < 0 {
			bad("admission_query.max_offer_deferrals", "%d is negative", q.MaxOfferDeferrals)
		}
		if q.MaxUnchargedParks < 0 {
			bad("admission_query.max_uncharged_parks", "%d is negative", q.MaxUnchargedParks)
		}
	}
	return errors.Join(errs...)
}

// Declarations are a connector's class-level declarations. A nil field is undeclared; only an
// explicit true counts.
type Declarations struct {
	// CapacityOnly marks a connector in the capacity role: it never offers, and its
	// declarations are ignored.
	CapacityOnly                  bool
	SupportsAttentionDP           *bool
	RequiresBlockAlignedReuse     *bool
	DropsReuseMatchBackoff        *bool
	ReportsFailedLoads            *bool
	SupportsSpeculativePrefill    *bool
	RequiresCompletionReservation *bool
	SupportsAdmissionQuery        *bool
}

// declares reads one declaration; a nil Declarations (no connector) declares nothing.
func (d *Declarations) declares(field func(*Declarations) *bool) bool {
	if d == nil || d.CapacityOnly {
		return false
	}
	v := field(d)
	return v != nil && *v
}

// BlockAlignedReuse reports requires_block_aligned_reuse.
func (d *Declarations) BlockAlignedReuse() bool {
	return d.declares(func(d *Declarations) *bool { return d.RequiresBlockAlignedReuse })
}

// DropsBackoff reports drops_reuse_match_backoff.
func (d *Declarations) DropsBackoff() bool {
	return d.declares(func(d *Declarations) *bool { return d.DropsReuseMatchBackoff })
}

// CompletionReservation reports requires_completion_reservation.
func (d *Declarations) CompletionReservation() bool {
	return d.declares(func(d *Declarations) *bool { return d.RequiresCompletionReservation })
}

// AdmissionQuery reports supports_admission_query.
func (d *Declarations) AdmissionQuery() bool {
	return d.declares(func(d *Declarations) *bool { return d.SupportsAdmissionQuery })
}

// EffectiveReuse returns the backoff and alignment a manager applies to local matches. A
// target manager drops its backoff when the connector declares drops_reuse_match_backoff; a
// draft manager never drops its own. When a backoff is in effect, partial reuse is off and
// the connector declares requires_block_aligned_reuse, matches align to a whole block.
func EffectiveReuse(cfg Config, decl *Declarations, isDraft bool) (backoff, alignment int) {
	backoff = cfg.ReuseMatchBackoff
	if !isDraft && decl.DropsBackoff() {
		backoff = 0
	}
	alignment = max(cfg.ReuseMatchAlignment, 1)
	if backoff > 0 && !cfg.EnablePartialReuse && decl.BlockAlignedReuse() {
		alignment = cfg.TokensPerBlock
	}
	return backoff, alignment
}

// PromptLookahead is what a KV-sharing lender reads ahead: the larger of the raw draft
// lookahead and the backoff in effect. Dropping the backoff does not shrink it below the
// draft's lookahead.
func PromptLookahead(cfg Config, decl *Declarations, isDraft bool) int {
	b, _ := EffectiveReuse(cfg, decl, isDraft)
	return max(cfg.DraftPromptLookahead, b)
}

// ReservationApplies reports whether completion reservations are in force for a manager, and
// a warning when one was asked for but cannot apply.
func ReservationApplies(cfg Config, decl *Declarations, isDraft bool) (bool, string) {
	asked := cfg.EnableCompletionReservation || decl.CompletionReservation()
	if !asked || isDraft {
		return false, ""
	}
	// Seed commit 6: "beyond either opt-in, the reservation applies only to a disaggregated
	// target manager with no tier below GPU, beam width 1, a single pipeline stage and full
	// attention on every layer". An aggregated server keeps preempting, as TensorRT-LLM does.
	switch {
	case !cfg.Disaggregated:
		return false, "completion reservation ignored: it applies only to a disaggregated server"
	case cfg.HostSlots > 0:
		return false, "completion reservation ignored: the manager has a host tier below GPU"
	case cfg.BeamWidth > 1:
		return false, fmt.Sprintf("completion reservation ignored: it needs beam width 1, found %d", cfg.BeamWidth)
	case cfg.PipelineStages > 1:
		return false, fmt.Sprintf("completion reservation ignored: it needs a single pipeline stage, found %d", cfg.PipelineStages)
	case cfg.WindowedLayers:
		return false, "completion reservation ignored: it needs full attention on every layer"
	}
	return true, ""
}

// AdmissionQueryApplies reports whether admission-time queries are on: configured, declared
// by a connector that is not capacity-only, and not under attention DP.
func AdmissionQueryApplies(cfg Config, decl *Declarations, attentionDP bool) bool {
	return cfg.AdmissionQuery != nil && decl.AdmissionQuery() && !attentionDP
}
