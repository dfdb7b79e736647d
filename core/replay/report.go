package replay

import "github.com/kvctl/kvctl/core/stats"

// Report is the outcome of a replay: the trace, the run-wide parameters and one run per
// configuration. Everything but the Wall fields is a function of the trace, the parameters,
// the configurations and the seed.
type Report struct {
	Mode   string      `json:"mode"`
	Trace  TraceInfo   `json:"trace"`
	Params ParamsInfo  `json:"params"`
	Runs   []RunReport `json:"runs"`
	// Live is set by a live replay.
	Live *LiveInfo `json:"live,omitempty"`
}

// TraceInfo describes the replayed trace.
type TraceInfo struct {
	Name         string      `json:"name"`
	Format       string      `json:"format"`
	Requests     int         `json:"requests"`
	InputTokens  int64       `json:"input_tokens"`
	OutputTokens int64       `json:"output_tokens"`
	Blocks       int64       `json:"blocks"`
	DurationSec  float64     `json:"duration_seconds"`
	SkippedLines []LineError `json:"skipped_lines"`
}

// ParamsInfo are the run-wide parameters.
type ParamsInfo struct {
	Seed                   uint64  `json:"seed"`
	TraceBlockTokens       int     `json:"trace_block_tokens"`
	TokensPerBlock         int     `json:"tokens_per_block"`
	PageBytes              int64   `json:"page_bytes"`
	SimPageBytes           int     `json:"sim_page_bytes"`
	LoadBandwidth          float64 `json:"load_bandwidth_bytes_per_second"`
	SaveBandwidth          float64 `json:"save_bandwidth_bytes_per_second"`
	PrefillTokensPerSecond float64 `json:"prefill_tokens_per_second"`
	DecodeTokensPerSecond  float64 `json:"decode_tokens_per_second"`
	MaxActiveRequests      int     `json:"max_active_requests"`
	TickMs                 float64 `json:"eviction_tick_ms"`
}

// RunReport is one configuration's replay.
type RunReport struct {
	Name     string    `json:"name"`
	Settings []Setting `json:"settings"`
	Ranks    int       `json:"ranks"`
	Router   string    `json:"router"`
	// PoolBytes is the configured capacity in real bytes; 0 is unlimited.
	PoolBytes int64 `json:"pool_bytes"`

	Requests       int `json:"requests"`
	FailedRequests int `json:"failed_requests"`
	// FailedLoads counts loads that lost a page the lookup had offered (evicted meanwhile):
	// each restarted its request without the offer, and the request was looked up again.
	// Offline only an asynchronous transfer can lose one, since a synchronous load follows its
	// lookup at the same virtual time.
	FailedLoads int `json:"failed_loads"`

	Tokens   TokenCounts     `json:"tokens"`
	Blocks   BlockCounts     `json:"blocks"`
	HitRate  HitRates        `json:"hit_rate"`
	Holes    stats.HoleStats `json:"holes"`
	Pool     PoolCounts      `json:"pool"`
	Moved    MovedBytes      `json:"moved"`
	Time     PhaseTimes      `json:"time"`
	Latency  Latency         `json:"latency"`
	RankLoad []RankLoad      `json:"rank_load"`
	Balance  Balance         `json:"balance"`
	Wall     WallTimes       `json:"wall"`
	// Scheduler is what the scheduler model did; set only with --set scheduler=true.
	Scheduler *SchedulerCounts `json:"scheduler,omitempty"`

	// Timeline is the run over trace time, in equal intervals: what --plot draws, in -o json
	// so that anyone can plot it again.
	Timeline []TimePoint `json:"timeline"`
}

// TokenCounts are in trace tokens.
type TokenCounts struct {
	Input      int64 `json:"input"`
	LocalHit   int64 `json:"local_hit"`
	PoolHit    int64 `json:"pool_hit"`
	Recomputed int64 `json:"recomputed"`
}

// BlockCounts count whole trace blocks: a block is a hit when every token of it is restored.
type BlockCounts struct {
	Input    int64 `json:"input"`
	LocalHit int64 `json:"local_hit"`
	PoolHit  int64 `json:"pool_hit"`
}

// HitRates are fractions of input tokens.
type HitRates struct {
	Local float64 `json:"local"`
	Pool  float64 `json:"pool"`
	Total float64 `json:"total"`
}

// HoleCounts are the connector's prefix-hole stats summed over ranks, in trace tokens: the one
// prefix-hole stats type of core/stats, under the name the replay code uses.
type HoleCounts = stats.HoleStats

// PoolCounts describe the pool, in objects (pages) and real bytes.
type PoolCounts struct {
	CapacityBytes     int64   `json:"capacity_bytes"`
	PeakUsedBytes     int64   `json:"peak_used_bytes"`
	FinalUsedBytes    int64   `json:"final_used_bytes"`
	PeakOccupancy     float64 `json:"peak_occupancy"`
	Objects           int64   `json:"objects"`
	Puts              int64   `json:"puts"`
	PutFailures       int64   `json:"put_failures"`
	EvictionRounds    int64   `json:"eviction_rounds"`
	Evicted           int64   `json:"evicted"`
	EvictedSoftPinned int64   `json:"evicted_soft_pinned"`
	EvictedGrouped    int64   `json:"evicted_grouped"`
}

// MovedBytes are real bytes between engines and the pool.
type MovedBytes struct {
	LoadedPages int64 `json:"loaded_pages"`
	SavedPages  int64 `json:"saved_pages"`
	LoadedBytes int64 `json:"loaded_bytes"`
	SavedBytes  int64 `json:"saved_bytes"`
}

// PhaseTimes are modelled seconds summed over requests: loads and saves at the configured
// bandwidths, prefill at the configured rate, and queueing before a rank starts a request.
type PhaseTimes struct {
	LoadSec    float64 `json:"load_seconds"`
	SaveSec    float64 `json:"save_seconds"`
	PrefillSec float64 `json:"prefill_seconds"`
	QueueSec   float64 `json:"queue_seconds"`
}

// Latency is the modelled time to first token (queueing, load and prefill).
type Latency struct {
	MeanTTFTSec float64 `json:"mean_ttft_seconds"`
	P50TTFTSec  float64 `json:"p50_ttft_seconds"`
	P99TTFTSec  float64 `json:"p99_ttft_seconds"`
}

// RankLoad is what one rank did.
type RankLoad struct {
	Rank             int     `json:"rank"`
	Requests         int     `json:"requests"`
	InputTokens      int64   `json:"input_tokens"`
	RecomputedTokens int64   `json:"recomputed_tokens"`
	EstimatedTokens  int64   `json:"estimated_tokens"`
	BusySec          float64 `json:"busy_seconds"`
}

// Balance summarises rank balance: the busiest rank over the mean, for recomputed tokens
// and busy time (1 is perfect balance).
type Balance struct {
	RecomputedMaxOverMean float64 `json:"recomputed_max_over_mean"`
	BusyMaxOverMean       float64 `json:"busy_max_over_mean"`
}

// WallTimes are measured on this machine and vary from run to run.
type WallTimes struct {
	TotalSec  float64 `json:"total_seconds"`
	LookupSec float64 `json:"lookup_seconds"`
	AllocSec  float64 `json:"alloc_seconds"`
	LoadSec   float64 `json:"load_seconds"`
	SaveSec   float64 `json:"save_seconds"`
	EvictSec  float64 `json:"evict_seconds"`
}

// TimePoint is one interval of the timeline: hit rates of the requests that arrived in it and
// pool occupancy at its end.
type TimePoint struct {
	AtSec     float64 `json:"at_seconds"`
	Requests  int     `json:"requests"`
	LocalRate float64 `json:"local_hit_rate"`
	PoolRate  float64 `json:"pool_hit_rate"`
	Occupancy float64 `json:"occupancy"`
}
