package statsapi

import (
	"reflect"
	"time"

	"github.com/kvctl/kvctl/core/stats"
)

// StatsJSON is the body of GET /v1/stats.
type StatsJSON struct {
	Version       string    `json:"version"`
	UptimeSeconds float64   `json:"uptime_seconds"`
	Ready         bool      `json:"ready"`
	Pool          PoolStats `json:"pool"`
	// Backend names the pool backend, its master, this host's segment and the cluster's
	// capacity, and says why the daemon is not ready when it is not.
	Backend     BackendStatusJSON `json:"backend"`
	PrefixHoles stats.HoleStats   `json:"prefix_holes"`
	Loads       LoadStatsJSON     `json:"loads"`
	Engines     []EngineJSON      `json:"engines"`
	HitRates    HitRatesJSON      `json:"hit_rates"`
	Saves       SaveStatsJSON     `json:"saves"`
}

// PoolStats is the "pool" object of /v1/stats: the pool's objects, traffic and evictions. The
// fields every backend reports are pool.Stats's; the rest are a backend's own figures
// (pool.Stats.Detail, by these JSON names), zero for a backend that does not have them.
type PoolStats struct {
	CapacityBytes int64 `json:"capacity_bytes"`
	UsedBytes     int64 `json:"used_bytes"`
	Objects       int64 `json:"objects"`
	SoftPinned    int64 `json:"soft_pinned_objects"`
	HardPinned    int64 `json:"hard_pinned_objects"`
	Grouped       int64 `json:"grouped_objects"`

	Hits            int64 `json:"hits"`
	Misses          int64 `json:"misses"`
	Puts            int64 `json:"puts"`
	SkippedExisting int64 `json:"skipped_existing"`
	PutFailures     int64 `json:"put_failures"`
	BytesIn         int64 `json:"bytes_in"`
	BytesOut        int64 `json:"bytes_out"`
	ChecksumErrors  int64 `json:"checksum_errors"`

	EvictionRounds    int64 `json:"eviction_rounds"`
	EvictedPass1      int64 `json:"evicted_pass1"`
	EvictedPass2      int64 `json:"evicted_pass2"`
	EvictedSoftPinned int64 `json:"evicted_soft_pinned"`
	EvictedGrouped    int64 `json:"evicted_grouped"`
	FailedEvictions   int64 `json:"failed_evictions"`
	ExistProbes       int64 `json:"exist_probes"`

	// AllocFailures counts puts refused because no segment had a free range large enough.
	AllocFailures int64 `json:"alloc_failures"`
	// PendingObjects are objects whose put has allocated memory but not finished copying.
	PendingObjects int64 `json:"pending_objects"`
	// FreeExtents, LargestFreeBytes and FragmentedBytes describe free space: FragmentedBytes is
	// free space that the largest free range does not cover, summed over segments.
	FreeExtents      int64 `json:"free_extents"`
	LargestFreeBytes int64 `json:"largest_free_bytes"`
	FragmentedBytes  int64 `json:"fragmented_bytes"`
}

// poolDetailFields maps a PoolStats JSON name to its field index.
var poolDetailFields = func() map[string]int {
	t := reflect.TypeFor[PoolStats]()
	m := make(map[string]int, t.NumField())
	for i := range t.NumField() {
		m[t.Field(i).Tag.Get("json")] = i
	}
	return m
}()

// HasField reports whether the pool object has a field of this JSON name.
func (PoolStats) HasField(name string) bool {
	_, ok := poolDetailFields[name]
	return ok
}

// SetDetail sets the fields named by a backend's Detail figures; names the pool object does
// not have are ignored.
func (p *PoolStats) SetDetail(detail map[string]int64) {
	v := reflect.ValueOf(p).Elem()
	for name, x := range detail {
		if i, ok := poolDetailFields[name]; ok {
			v.Field(i).SetInt(x)
		}
	}
}

// PhaseJSON is one load phase's time. CPUSeconds is the loading thread's CPU time; synchronous
// loads count it only while serve runs with --stats-interval (reading a thread's CPU clock pins
// the load to its OS thread, which slows loads that wait on a remote pool).
type PhaseJSON struct {
	WallSeconds float64 `json:"wall_seconds"`
	CPUSeconds  float64 `json:"cpu_seconds"`
}

// LoadStatsJSON is the load-phase stats part of /v1/stats. Phases is keyed by the phase names
// of core/stats (stats.Phase.String).
type LoadStatsJSON struct {
	Loads           int64                `json:"loads"`
	AsyncLoads      int64                `json:"async_loads"`
	Pages           int64                `json:"pages"`
	StoreCalls      int64                `json:"store_calls"`
	LandedBytes     int64                `json:"landed_bytes"`
	FailedPages     int64                `json:"failed_pages"`
	TransferSeconds float64              `json:"transfer_seconds"`
	TransferMaxSecs float64              `json:"transfer_max_seconds"`
	WaitSeconds     float64              `json:"wait_seconds"`
	WaitMaxSeconds  float64              `json:"wait_max_seconds"`
	Phases          map[string]PhaseJSON `json:"phases"`
	// GPUCopySeconds and GPUCheckSeconds are the device's own time on pages checked on the GPU
	// (CUDA events): from each batch's first copy to its last copy done, and from then to its
	// check's digests back on the host. 0 where pages are checked on the host.
	GPUCopySeconds  float64 `json:"gpu_copy_seconds"`
	GPUCheckSeconds float64 `json:"gpu_check_seconds"`
}

// EngineJSON describes one registered engine rank in /v1/stats.
type EngineJSON struct {
	Engine       string          `json:"engine"`
	ModelKey     string          `json:"model_key"`
	Rank         int             `json:"rank"`
	Shard        string          `json:"shard"`
	Role         string          `json:"role"`
	Scheduler    bool            `json:"scheduler"`
	RegisteredAt time.Time       `json:"registered_at"`
	PrefixHoles  stats.HoleStats `json:"prefix_holes"`
	Loads        LoadStatsJSON   `json:"loads"`
}

// HitRatesJSON is where the prompt tokens of Lookup calls came from: the engine's own cache
// (local), the pool, or neither (computed). Rates are fractions of the prompt tokens, 0 to 1.
type HitRatesJSON struct {
	Lookups      int64   `json:"lookups"`
	PromptTokens int64   `json:"prompt_tokens"`
	LocalTokens  int64   `json:"local_tokens"`
	PoolTokens   int64   `json:"pool_tokens"`
	Local        float64 `json:"local"`
	Pool         float64 `json:"pool"`
	Total        float64 `json:"total"`
}

// SaveStatsJSON is the save part of /v1/stats.
type SaveStatsJSON struct {
	Saves        int64   `json:"saves"`
	FailedSaves  int64   `json:"failed_saves"`
	Pages        int64   `json:"pages"`
	SkippedPages int64   `json:"skipped_pages"`
	PutPages     int64   `json:"put_pages"`
	PutBytes     int64   `json:"put_bytes"`
	FailedPages  int64   `json:"failed_pages"`
	RefusedPages int64   `json:"refused_pages"`
	Seconds      float64 `json:"seconds"`
	// NotJoinedSaves and NotJoinedPages were not saved because this host had not joined the
	// pool yet (its Mooncake segment not mounted): the pool was not asked, so they are not
	// failed saves (another host may hold the pages).
	NotJoinedSaves int64 `json:"not_joined_saves"`
	NotJoinedPages int64 `json:"not_joined_pages"`
}
