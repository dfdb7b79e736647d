package replay

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"time"

	"github.com/kvctl/kvctl/pool/embedded"
)

// Params are the run-wide replay parameters.
type Params struct {
	// TokensPerBlock is the replay block size: tokens synthesised per Mooncake trace block, or
	// the block size a token trace is keyed with.
	TokensPerBlock int
	// PageBytes is the real size of one block's page; SimPageBytes what offline pages hold.
	PageBytes    int64
	SimPageBytes int
	// LoadBandwidth and SaveBandwidth are bytes per second between an engine and the pool.
	LoadBandwidth float64
	SaveBandwidth float64
	// PrefillTokensPerSecond is a rank's prefill rate; DecodeTokensPerSecond a request's
	// decode rate.
	PrefillTokensPerSecond float64
	DecodeTokensPerSecond  float64
	// MaxActiveRequests caps a rank's requests for the router; 0 is no cap.
	MaxActiveRequests int
	// TickInterval is the pool eviction thread's period in virtual time.
	TickInterval time.Duration
	// Seed picks the synthesised token ids.
	Seed uint64
	// TimelineBuckets is the number of timeline intervals (for --plot).
	TimelineBuckets int
	// Progress, when set, is called with the requests replayed so far over all runs.
	Progress func(done, total int)
	// Logger receives the connector's lines; nil discards them.
	Logger *slog.Logger

	// observe, when set (tests), sees every request's trace index and whole hit blocks.
	observe func(i, hitBlocks int)
}

// DefaultParams returns the defaults: 16 tokens per replay block, 64 MiB real pages (512
// tokens of a Llama-3-8B-sized model in fp16) held as 64-byte pages, 25 GiB/s each way, 50 000
// prefill tokens/s, 50 decode tokens/s, the master's 10 ms eviction tick.
func DefaultParams() Params {
	return Params{
		TokensPerBlock:         16,
		PageBytes:              64 << 20,
		SimPageBytes:           64,
		LoadBandwidth:          25 << 30,
		SaveBandwidth:          25 << 30,
		PrefillTokensPerSecond: 50000,
		DecodeTokensPerSecond:  50,
		TickInterval:           embedded.DefaultEvictionPeriod,
		Seed:                   1,
		TimelineBuckets:        120,
	}
}

// Validate reports every problem with the parameters at once.
func (p Params) Validate() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if p.TokensPerBlock < 1 || p.TokensPerBlock > 1<<16 {
		bad("tokens per block %d: want 1 to 65536", p.TokensPerBlock)
	}
	if p.PageBytes < 1 {
		bad("page size %d: must be positive", p.PageBytes)
	}
	if p.SimPageBytes < 1 || p.SimPageBytes > 1<<20 {
		bad("simulated page size %d: want 1 to 1 MiB", p.SimPageBytes)
	}
	for name, v := range map[string]float64{"load bandwidth": p.LoadBandwidth, "save bandwidth": p.SaveBandwidth,
		"prefill rate": p.PrefillTokensPerSecond, "decode rate": p.DecodeTokensPerSecond} {
		if !(v > 0) || math.IsInf(v, 0) {
			bad("%s %v: must be positive and finite", name, v)
		}
	}
	if p.MaxActiveRequests < 0 {
		bad("max active requests %d is negative", p.MaxActiveRequests)
	}
	if p.TickInterval <= 0 {
		bad("eviction tick %v: must be positive", p.TickInterval)
	}
	slices.SortFunc(errs, func(a, b error) int {
		if a.Error() < b.Error() {
			return -1
		}
		return 1
	})
	return errors.Join(errs...)
}

func (p Params) info() ParamsInfo {
	return ParamsInfo{
		Seed: p.Seed, TraceBlockTokens: TraceBlockTokens, TokensPerBlock: p.TokensPerBlock,
		PageBytes: p.PageBytes, SimPageBytes: p.SimPageBytes,
		LoadBandwidth: p.LoadBandwidth, SaveBandwidth: p.SaveBandwidth,
		PrefillTokensPerSecond: p.PrefillTokensPerSecond, DecodeTokensPerSecond: p.DecodeTokensPerSecond,
		MaxActiveRequests: p.MaxActiveRequests, TickMs: float64(p.TickInterval) / float64(time.Millisecond),
	}
}

// Describe returns the trace summary a report starts with.
func Describe(t *Trace, p Params) TraceInfo {
	ti := TraceInfo{Name: t.Name, Format: t.Format, Requests: len(t.Requests), SkippedLines: t.Skipped}
	if ti.SkippedLines == nil {
		ti.SkippedLines = []LineError{}
	}
	for _, r := range t.Requests {
		ti.InputTokens += int64(r.InputLength)
		ti.OutputTokens += int64(r.OutputLength)
		ti.Blocks += int64(blocksOf(t.Format, r, p.TokensPerBlock))
	}
	if n := len(t.Requests); n > 0 {
		ti.DurationSec = t.Requests[n-1].Arrival.Seconds()
	}
	return ti
}

// blocksOf is the number of trace blocks of r: hash ids, or the replay blocks of a token
// trace (a partial tail counts).
func blocksOf(format string, r Request, T int) int {
	if format == FormatMooncake {
		return len(r.HashIDs)
	}
	return (len(r.Tokens) + T - 1) / T
}
