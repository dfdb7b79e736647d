package embedded

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
)

// Clock is the time source of an embedded pool. Leases, soft-pin deadlines and eviction order
// all read it, so tests and replays inject a clock they advance themselves.
type Clock interface {
	Now() time.Time
}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

// RealClock returns the wall clock.
func RealClock() Clock { return realClock{} }

// SegmentSpec describes one memory segment to mount in an embedded pool.
type SegmentSpec struct {
	Name     string
	Capacity int64
}

// Options configures an embedded pool. DefaultOptions holds the Mooncake master's code
// defaults (reference §2.1); every field can be overridden.
type Options struct {
	// Segments are the memory segments mounted at start. Their capacities add up to the pool's.
	Segments []SegmentSpec

	// LeaseTTL is the read lease an existence probe or a get grants (default_kv_lease_ttl).
	LeaseTTL time.Duration
	// SoftPinTTL is the soft-pin lifetime when SoftPinEnable gives no TTL
	// (default_kv_soft_pin_ttl).
	SoftPinTTL time.Duration
	// MaxSoftPinTTL is the ceiling for a requested soft-pin TTL (max_kv_soft_pin_ttl); a put
	// asking for more is refused with ErrInvalidParams.
	MaxSoftPinTTL time.Duration
	// AllowEvictSoftPinned lets eviction pass 2 take soft-pinned objects
	// (allow_evict_soft_pinned_objects).
	AllowEvictSoftPinned bool
	// EvictionRatio is the fraction of evictable objects a round aims to evict (eviction_ratio).
	EvictionRatio float64
	// HighWatermark is the used/capacity ratio above which eviction runs
	// (eviction_high_watermark_ratio).
	HighWatermark float64
	// EvictionPeriod is how often the eviction goroutine checks the trigger
	// (kEvictionThreadSleepMs). Zero or negative disables the goroutine: rounds then run only
	// through EvictNow, which is what replays on an injected clock use.
	EvictionPeriod time.Duration
	// ExistRenewsLease makes BatchIsExist grant a read lease as the master's ExistKey does.
	// Turning it off closes the hole of Mooncake issue #2187 (PR #3599, exist_key_grant_lease).
	ExistRenewsLease bool
	// GroupRefreshHalfTTL coalesces group lease refreshes as the master does: a hit refreshes
	// the other members only when the hit member's lease has less than half a TTL left.
	GroupRefreshHalfTTL bool
	// SyncEvictOnAllocFailure makes a put whose allocation fails run one eviction round at once
	// and retry. The master does not retry (the put fails with ErrNoAvailableHandle and the
	// next round is flagged); it is off by default for that reason.
	SyncEvictOnAllocFailure bool
	// MaxKeyLength bounds key length; longer keys are refused with ErrInvalidParams.
	MaxKeyLength int
	// InPlaceWorkers is how many goroutines check one BatchView or PutReservation.End batch;
	// 0 means GOMAXPROCS-1. Those checks read pool memory while the GPU's copy engines read or
	// write it too, so fewer checkers can leave the copies more of the memory's bandwidth.
	InPlaceWorkers int
	// Prefault makes every segment resident when the pool is made, spread over the CPUs, so
	// that no put pays for the first touch of pool memory (a page fault and the kernel zeroing
	// the page, which made a put into fresh memory several times slower than one into memory
	// used before: docs/perf/pool.md). The pool then holds its whole capacity from the start,
	// and NewEmbedded fails when the memory cannot be had. Off, memory becomes resident as puts
	// first write it.
	Prefault bool
	// Clock is the time source; nil means the wall clock.
	Clock Clock
}

// Master defaults, reference §2.1 and the recorded master's flags.
const (
	DefaultLeaseTTL       = 10 * time.Second
	DefaultSoftPinTTL     = 30 * time.Minute
	DefaultMaxSoftPinTTL  = 24 * time.Hour
	DefaultEvictionRatio  = 0.05
	DefaultHighWatermark  = 0.90
	DefaultEvictionPeriod = 10 * time.Millisecond
	// DefaultSegmentBytes is the Mooncake client's default global_segment_size (3.125 GiB).
	DefaultSegmentBytes = 3355443200
	// DefaultSegmentName is the name of the segment DefaultOptions mounts.
	DefaultSegmentName  = "embedded-0"
	DefaultMaxKeyLength = 4096
)

// DefaultOptions returns the master's defaults with one segment of the client's default size.
func DefaultOptions() Options {
	return Options{
		Segments:             []SegmentSpec{{Name: DefaultSegmentName, Capacity: DefaultSegmentBytes}},
		LeaseTTL:             DefaultLeaseTTL,
		SoftPinTTL:           DefaultSoftPinTTL,
		MaxSoftPinTTL:        DefaultMaxSoftPinTTL,
		AllowEvictSoftPinned: true,
		EvictionRatio:        DefaultEvictionRatio,
		HighWatermark:        DefaultHighWatermark,
		EvictionPeriod:       DefaultEvictionPeriod,
		ExistRenewsLease:     true,
		GroupRefreshHalfTTL:  true,
		MaxKeyLength:         DefaultMaxKeyLength,
		Clock:                realClock{},
	}
}

// ErrInvalidOptions is wrapped by every error Validate returns.
var ErrInvalidOptions = errors.New("invalid pool options")

// Validate reports every problem with the options at once, each naming its field.
func (o Options) Validate() error {
	var probs []string
	add := func(format string, a ...any) { probs = append(probs, fmt.Sprintf(format, a...)) }
	if len(o.Segments) == 0 {
		add("segments: at least one segment is required")
	}
	seen := map[string]bool{}
	for i, s := range o.Segments {
		if s.Name == "" {
			add("segments[%d].name: must not be empty", i)
		}
		if strings.ContainsAny(s.Name, "\n\r") {
			add("segments[%d].name: must not contain a line break", i)
		}
		if seen[s.Name] {
			add("segments[%d].name: duplicate name %q", i, s.Name)
		}
		seen[s.Name] = true
		if s.Capacity <= 0 {
			add("segments[%d].capacity: must be positive, got %d", i, s.Capacity)
		}
	}
	if o.LeaseTTL <= 0 {
		add("lease_ttl: must be positive, got %s", o.LeaseTTL)
	}
	if o.SoftPinTTL < 0 {
		add("soft_pin_ttl: must not be negative, got %s", o.SoftPinTTL)
	}
	if o.MaxSoftPinTTL <= 0 {
		add("max_soft_pin_ttl: must be positive, got %s", o.MaxSoftPinTTL)
	}
	if o.SoftPinTTL > o.MaxSoftPinTTL && o.MaxSoftPinTTL > 0 {
		add("soft_pin_ttl: %s is above max_soft_pin_ttl %s", o.SoftPinTTL, o.MaxSoftPinTTL)
	}
	if !(o.EvictionRatio >= 0 && o.EvictionRatio <= 1) {
		add("eviction_ratio: must be in [0, 1], got %v", o.EvictionRatio)
	}
	if !(o.HighWatermark > 0 && o.HighWatermark <= 1) {
		add("high_watermark: must be in (0, 1], got %v", o.HighWatermark)
	}
	if o.MaxKeyLength <= 0 {
		add("max_key_length: must be positive, got %d", o.MaxKeyLength)
	}
	if len(probs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s", ErrInvalidOptions, strings.Join(probs, "; "))
}

// ManualClock is a Clock that moves only when told to. Tests and trace replays use it to
// drive leases, soft pins and eviction deterministically. It is safe for concurrent use.
type ManualClock struct {
	mu sync.Mutex
	t  time.Time
}

// NewManualClock returns a clock reading start.
func NewManualClock(start time.Time) *ManualClock { return &ManualClock{t: start} }

// Now implements Clock.
func (c *ManualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Advance moves the clock forward by d.
func (c *ManualClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}
