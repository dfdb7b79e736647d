package replay

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvctl/kvctl/core/config"
	"github.com/kvctl/kvctl/core/connector"
	"github.com/kvctl/kvctl/core/router"
	"github.com/kvctl/kvctl/pool/embedded"
)

var (
	// ErrUnknownSetting is wrapped by the error for a --set key the replay does not know.
	ErrUnknownSetting = errors.New("unknown setting")
	// ErrBadSetting is wrapped by the error for a malformed --set or an invalid value.
	ErrBadSetting = errors.New("invalid setting")
)

// Config is one configuration a replay runs the trace under: the connector, pool, KV cache
// manager and router settings that --set can vary.
type Config struct {
	// Name is "base" or the varied settings, "key=value" joined by spaces.
	Name string
	// Settings are the varied settings in --set order.
	Settings []Setting

	SoftPinTTL        time.Duration
	GroupBlocks       bool
	LocalReuseBackoff connector.ReuseBackoff
	// DraftLookahead is a one-model draft's prompt lookahead: the KV cache manager's reuse
	// match backoff (which local_reuse_backoff drops or aligns) and draft prompt lookahead.
	DraftLookahead    int
	TransferBatchSize int

	// PoolBytes is the pool's capacity in real bytes; 0 is unlimited.
	PoolBytes            int64
	LeaseTTL             time.Duration
	EvictionRatio        float64
	HighWatermark        float64
	AllowEvictSoftPinned bool
	ExistRenewsLease     bool

	// Scheduler runs each rank's scheduling passes over its KV cache (see SchedulerCounts);
	// the fields after it are its switches.
	Scheduler             bool
	CompletionReservation bool
	AdmissionQuery        bool
	MaxOfferDeferrals     int
	MaxUnchargedParks     int
	FreeRefusedGeneration bool
	AsyncLoad             bool
	MaxNumTokens          int
	MaxBatchSize          int
	// LongPrefillTokens is the V2 scheduler's long-prefill demotion (seed commit 20): a waiting
	// request whose uncached-prefill count, the router's estimate published with its placement
	// (TensorRT-LLM's py_uncached_prefill_tokens), exceeds it, in trace tokens, is admitted only
	// after the waiting requests that do not; 0 turns the demotion off.
	LongPrefillTokens int
	// Server is what a rank serves in the scheduler model: ServerAggregated (whole requests),
	// ServerContext (a disaggregated context server: the prompt only) or ServerGeneration (a
	// disaggregated generation server: the prompt's KV arrives by transfer, then it decodes).
	Server string

	// Ranks is the number of attention-DP ranks; Router the placement policy.
	Ranks  int
	Router string
	// GPUBlocks is each rank's local KV cache, in blocks.
	GPUBlocks int
}

// Setting is one key=value a configuration was given.
type Setting struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

// DefaultConfig returns the defaults: the connector's and pool master's defaults, an unlimited
// pool, one rank and the work-aware router.
func DefaultConfig() Config {
	d := embedded.DefaultOptions()
	return Config{
		Name:                 "base",
		LocalReuseBackoff:    connector.ReuseBackoffOff,
		TransferBatchSize:    connector.DefaultTransferBatchSize,
		LeaseTTL:             d.LeaseTTL,
		EvictionRatio:        d.EvictionRatio,
		HighWatermark:        d.HighWatermark,
		AllowEvictSoftPinned: d.AllowEvictSoftPinned,
		ExistRenewsLease:     d.ExistRenewsLease,
		Ranks:                1,
		Router:               router.PolicyWorkAware,

		CompletionReservation: true,
		AdmissionQuery:        true,
		MaxOfferDeferrals:     DefaultMaxOfferDeferrals,
		FreeRefusedGeneration: true,
		MaxNumTokens:          DefaultMaxNumTokens,
		MaxBatchSize:          DefaultMaxBatchSize,
		Server:                ServerAggregated,
		GPUBlocks:             6144,
	}
}

type knob struct {
	help  string
	apply func(c *Config, v string) error
}

func parseBool(v string) (bool, error) {
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, fmt.Errorf("%q is not a boolean", v)
	}
	return b, nil
}

func parseMs(v string) (time.Duration, error) {
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 || n > math.MaxInt64/int64(time.Millisecond) {
		return 0, fmt.Errorf("%q is not a non-negative number of milliseconds", v)
	}
	return time.Duration(n) * time.Millisecond, nil
}

func parseInt(v string, floor int) (int, error) {
	n, err := strconv.Atoi(v)
	if err != nil || n < floor {
		return 0, fmt.Errorf("%q is not an integer of at least %d", v, floor)
	}
	return n, nil
}

// Bounds of the replay's counts: each is far past any real deployment, and small enough that
// what a replay allocates per rank or per block cannot exhaust the machine before it starts.
const (
	// MaxRanks bounds --ranks: each rank holds engine memory (a memfd live, pages offline).
	MaxRanks = 1024
	// MaxGPUBlocks bounds a rank's local KV cache in blocks.
	MaxGPUBlocks = 1 << 24
)

func parseBounded(v string, lo, hi int) (int, error) {
	n, err := strconv.Atoi(v)
	if err != nil || n < lo || n > hi {
		return 0, fmt.Errorf("%q is not an integer from %d to %d", v, lo, hi)
	}
	return n, nil
}

func parseRatio(v string, zeroOK bool) (float64, error) {
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || math.IsNaN(f) || f < 0 || f > 1 || (!zeroOK && f == 0) {
		return 0, fmt.Errorf("%q is not a ratio in (0, 1]", v)
	}
	return f, nil
}

// ParsePoolSize reads a pool size: "unlimited" (0) or a size such as 64GiB or 500000000.
func ParsePoolSize(v string) (int64, error) {
	if strings.EqualFold(v, "unlimited") {
		return 0, nil
	}
	// Strict, as serve's --pool-size: a decimal unit (GB) is refused, not read as 1000-based.
	n, err := config.ParseSize(v, true)
	if err != nil {
		return 0, err
	}
	if n <= 0 {
		return 0, fmt.Errorf("%q: want a positive size or unlimited", v)
	}
	return n, nil
}

var knobs = map[string]knob{
	"soft_pin_ttl_ms": {"soft pin every saved page for this long; 0 is off", func(c *Config, v string) (err error) {
		c.SoftPinTTL, err = parseMs(v)
		return
	}},
	"group_blocks": {"one eviction group per block (true/false)", func(c *Config, v string) (err error) {
		c.GroupBlocks, err = parseBool(v)
		return
	}},
	"local_reuse_backoff": {"off or align", func(c *Config, v string) error {
		switch connector.ReuseBackoff(v) {
		case connector.ReuseBackoffOff, connector.ReuseBackoffAlign:
			c.LocalReuseBackoff = connector.ReuseBackoff(v)
			return nil
		}
		return fmt.Errorf("%q: want off or align", v)
	}},
	"draft_lookahead": {"one-model draft prompt lookahead in tokens (the local reuse backoff)", func(c *Config, v string) (err error) {
		c.DraftLookahead, err = parseInt(v, 0)
		return
	}},
	"transfer_batch_size": {"most pages per pool call", func(c *Config, v string) (err error) {
		c.TransferBatchSize, err = parseInt(v, 1)
		return
	}},
	"pool_size": {"pool capacity in real bytes (64GiB, ...) or unlimited", func(c *Config, v string) (err error) {
		c.PoolBytes, err = ParsePoolSize(v)
		return
	}},
	"lease_ttl_ms": {"read lease of a probe or get", func(c *Config, v string) error {
		d, err := parseMs(v)
		if err == nil && d == 0 {
			err = fmt.Errorf("%q: the lease must be positive", v)
		}
		c.LeaseTTL = d
		return err
	}},
	"eviction_ratio": {"fraction of objects an eviction round aims at", func(c *Config, v string) (err error) {
		c.EvictionRatio, err = parseRatio(v, true)
		return
	}},
	"eviction_high_watermark_ratio": {"used/capacity above which eviction runs", func(c *Config, v string) (err error) {
		c.HighWatermark, err = parseRatio(v, false)
		return
	}},
	"allow_evict_soft_pinned_objects": {"let eviction pass 2 take soft-pinned objects", func(c *Config, v string) (err error) {
		c.AllowEvictSoftPinned, err = parseBool(v)
		return
	}},
	"exist_key_grant_lease": {"an existence probe grants a read lease", func(c *Config, v string) (err error) {
		c.ExistRenewsLease, err = parseBool(v)
		return
	}},
	"ranks": {"attention-DP ranks (engines)", func(c *Config, v string) (err error) {
		c.Ranks, err = parseBounded(v, 1, MaxRanks)
		return
	}},
	"router": {"work-aware, prompt-length or pool-aware (a live run asks the daemon's pool through --admin)", func(c *Config, v string) error {
		p, err := router.ParsePolicy(v)
		if err != nil {
			return fmt.Errorf("%q: want one of %s (work_aware and the like are accepted too)", v, strings.Join(router.Policies, ", "))
		}
		c.Router = p
		return nil
	}},
	"gpu_blocks": {"each rank's local KV cache in blocks", func(c *Config, v string) (err error) {
		c.GPUBlocks, err = parseBounded(v, 1, MaxGPUBlocks)
		return
	}},
	"scheduler": {"run each rank's scheduling passes: admissions, chunked prefill, decode, preemption (true/false)", func(c *Config, v string) (err error) {
		c.Scheduler, err = parseBool(v)
		return
	}},
	"completion_reservation": {"scheduler: the connector's requires_completion_reservation (true/false)", func(c *Config, v string) (err error) {
		c.CompletionReservation, err = parseBool(v)
		return
	}},
	"admission_query": {"scheduler: ask the connector at admission (true/false; off with more than one rank)", func(c *Config, v string) (err error) {
		c.AdmissionQuery, err = parseBool(v)
		return
	}},
	"max_offer_deferrals": {"scheduler: passes a first chunk may be deferred for an offer the pool cannot cover", func(c *Config, v string) (err error) {
		c.MaxOfferDeferrals, err = parseInt(v, 0)
		return
	}},
	"max_uncharged_parks": {"scheduler: parking chunks per pass admitted without a token charge", func(c *Config, v string) (err error) {
		c.MaxUnchargedParks, err = parseInt(v, 0)
		return
	}},
	"free_refused_generation": {"scheduler: free a refused request's cache instead of keeping it suspended (true/false)", func(c *Config, v string) (err error) {
		c.FreeRefusedGeneration, err = parseBool(v)
		return
	}},
	"async_load": {"scheduler: load pool hits asynchronously; the chunk parks meanwhile (true/false)", func(c *Config, v string) (err error) {
		c.AsyncLoad, err = parseBool(v)
		return
	}},
	"max_num_tokens": {"scheduler: token budget of a pass", func(c *Config, v string) (err error) {
		c.MaxNumTokens, err = parseInt(v, 1)
		return
	}},
	"max_batch_size": {"scheduler: requests a pass may schedule", func(c *Config, v string) (err error) {
		c.MaxBatchSize, err = parseInt(v, 1)
		return
	}},
	"long_prefill_tokens": {"scheduler: demote a waiting request whose uncached prefill (the router's estimate, in trace tokens) exceeds this behind the others; 0 is off", func(c *Config, v string) (err error) {
		c.LongPrefillTokens, err = parseInt(v, 0)
		return
	}},
	"server": {"scheduler: aggregated (whole requests; no completion reservations, as in TensorRT-LLM), context (disaggregated context server, bound through the prompt) or generation (disaggregated generation server, prompt KV transferred in, bound through the output)", func(c *Config, v string) error {
		switch v {
		case ServerAggregated, ServerContext, ServerGeneration:
			c.Server = v
			return nil
		}
		return fmt.Errorf("%q: want aggregated, context or generation", v)
	}},
}

// SettingKeys returns the keys --set accepts, sorted.
func SettingKeys() []string {
	out := make([]string, 0, len(knobs))
	for k := range knobs {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// SettingHelp returns one line per key, "key: help".
func SettingHelp() []string {
	var out []string
	for _, k := range SettingKeys() {
		out = append(out, k+": "+knobs[k].help)
	}
	return out
}

// Set applies key=value to c.
func (c *Config) Set(key, value string) error {
	k, ok := knobs[key]
	if !ok {
		return fmt.Errorf("%w %q: known settings are %s", ErrUnknownSetting, key, strings.Join(SettingKeys(), ", "))
	}
	if err := k.apply(c, value); err != nil {
		return fmt.Errorf("%w: %s: %w", ErrBadSetting, key, err)
	}
	return nil
}

// Expand returns the configurations a list of "key=v1,v2,..." settings describes over base:
// the cartesian product, the first setting varying slowest. No settings give base alone.
func Expand(base Config, sets []string) ([]Config, error) {
	type axis struct {
		key    string
		values []string
	}
	var axes []axis
	for _, s := range sets {
		key, vals, ok := strings.Cut(s, "=")
		key = strings.TrimSpace(key)
		if !ok || key == "" {
			return nil, fmt.Errorf("%w: --set %q: want key=value[,value...]", ErrBadSetting, s)
		}
		if _, known := knobs[key]; !known {
			return nil, fmt.Errorf("%w %q: known settings are %s", ErrUnknownSetting, key, strings.Join(SettingKeys(), ", "))
		}
		for _, a := range axes {
			if a.key == key {
				return nil, fmt.Errorf("%w: %s is set twice; give its values as one comma-separated list", ErrBadSetting, key)
			}
		}
		var values []string
		for _, v := range strings.Split(vals, ",") {
			v = strings.TrimSpace(v)
			if v == "" {
				return nil, fmt.Errorf("%w: --set %q has an empty value", ErrBadSetting, s)
			}
			probe := base
			if err := probe.Set(key, v); err != nil {
				return nil, err
			}
			values = append(values, v)
		}
		axes = append(axes, axis{key, values})
	}
	// Count the configurations before building them: the product of a few long value lists
	// is far more than the limit, and building it first allocates without bound.
	const maxConfigs = 256
	total := 1
	for _, a := range axes {
		total *= len(a.values)
		if total > maxConfigs {
			counts := make([]string, len(axes))
			for i, a := range axes {
				counts[i] = strconv.Itoa(len(a.values))
			}
			return nil, fmt.Errorf("%w: the --set lists multiply out to %s configurations, more than the %d a run allows", ErrBadSetting, strings.Join(counts, "×"), maxConfigs)
		}
	}
	out := []Config{base}
	for _, a := range axes {
		next := make([]Config, 0, len(out)*len(a.values))
		for _, c := range out {
			for _, v := range a.values {
				n := c
				n.Settings = append(slices.Clone(c.Settings), Setting{a.key, v})
				_ = n.Set(a.key, v)
				next = append(next, n)
			}
		}
		out = next
	}
	for i := range out {
		if len(out[i].Settings) > 0 {
			parts := make([]string, len(out[i].Settings))
			for j, s := range out[i].Settings {
				parts[j] = s.Key + "=" + s.Value
			}
			out[i].Name = strings.Join(parts, " ")
		}
	}
	return out, nil
}
