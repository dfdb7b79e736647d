package gpu

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// MaxStagingBytes is the most pinned staging memory one direction (loads or saves) may take.
const MaxStagingBytes = 1 << 30

// StagingPlan is the geometry of a staging pool: how wide a slot is, how many slots each worker
// gets and how many pages one transfer may move.
type StagingPlan struct {
	// SlotBytes is the largest page value over all groups, sharded or replicated.
	SlotBytes int64 `json:"slot_bytes"`
	// Workers is the number of pools (1 for synchronous transfers, async_load_workers else).
	Workers int `json:"workers"`
	// SlotsPerWorker is the slot count of each worker's pool.
	SlotsPerWorker int `json:"slots_per_worker"`
	// Batch is the effective transfer batch: min(transfer_batch_size, SlotsPerWorker).
	Batch int `json:"batch"`
	// BytesPerWorker is SlotsPerWorker·SlotBytes, the pinned memory of one pool.
	BytesPerWorker int64 `json:"bytes_per_worker"`
	// Warnings name what the plan lowered or could not honour.
	Warnings []string `json:"warnings,omitempty"`
}

// TotalBytes is the pinned memory of all the plan's pools.
func (p StagingPlan) TotalBytes() int64 { return p.BytesPerWorker * int64(p.Workers) }

// PlanStaging computes the staging pool of one direction for layout: slots as wide as the
// largest page value, num_slots = max(1, min(transferBatch, budget/slot)) where budget is
// stagingBytes capped at MaxStagingBytes. With workers > 1 (asynchronous loads) every worker
// gets an even share of the budget but keeps at least min(64, transferBatch) slots, and a share
// below one page is reported in Warnings.
func PlanStaging(layout Layout, transferBatch int, stagingBytes int64, workers int) (StagingPlan, error) {
	if transferBatch < 1 {
		return StagingPlan{}, fmt.Errorf("staging: transfer_batch_size must be at least 1, got %d", transferBatch)
	}
	if stagingBytes <= 0 {
		return StagingPlan{}, fmt.Errorf("staging: staging_buffer_bytes must be positive, got %d", stagingBytes)
	}
	if workers < 1 {
		return StagingPlan{}, fmt.Errorf("staging: need at least one worker, got %d", workers)
	}
	if len(layout.Groups) == 0 {
		return StagingPlan{}, fmt.Errorf("staging: layout has no layer groups")
	}
	slot := int64(layout.MaxValueSize())
	if slot <= 0 {
		return StagingPlan{}, fmt.Errorf("staging: layout has no page bytes")
	}
	p := StagingPlan{SlotBytes: slot, Workers: workers}
	budget := stagingBytes
	if budget > MaxStagingBytes {
		p.Warnings = append(p.Warnings, fmt.Sprintf("staging_buffer_bytes %d is above the %d-byte limit per direction; using the limit", stagingBytes, int64(MaxStagingBytes)))
		budget = MaxStagingBytes
	}
	share := budget / int64(workers)
	slots := max(1, min(int64(transferBatch), share/slot))
	if workers > 1 {
		if share < slot {
			p.Warnings = append(p.Warnings, fmt.Sprintf("each of %d async load workers gets %d staging bytes, less than one %d-byte page", workers, share, slot))
		}
		if floor := int64(min(64, transferBatch)); slots < floor {
			p.Warnings = append(p.Warnings, fmt.Sprintf("raising each async load worker's staging pool from %d to %d slots (%d bytes each, above its share of %d)", slots, floor, floor*slot, share))
			slots = floor
		}
	}
	p.SlotsPerWorker = int(slots)
	p.BytesPerWorker = slots * slot
	p.Batch = min(transferBatch, p.SlotsPerWorker)
	if p.Batch < transferBatch {
		p.Warnings = append(p.Warnings, fmt.Sprintf("transfer_batch_size %d lowered to %d: %d staging bytes hold %d slots of %d bytes", transferBatch, p.Batch, share, p.SlotsPerWorker, slot))
	}
	return p, nil
}

// NodeReserveBytes is the memory the node budget leaves to everything else on the machine.
const NodeReserveBytes = 32 << 30

// ErrNodeBudget is wrapped by CheckNodeBudget's error when the claim does not fit.
var ErrNodeBudget = errors.New("node memory budget exceeded")

// NodeBudgetError says by how much a node's claim exceeds its budget and what would fit.
type NodeBudgetError struct {
	Ranks        int
	SegmentSize  int64
	StagingBytes int64 // ranks·directions·MaxStagingBytes, 0 without staging
	Claimed      int64
	Budget       int64 // available − NodeReserveBytes
}

func (e *NodeBudgetError) Error() string {
	msg := fmt.Sprintf("%v: %d ranks claim %d bytes (segments %d·%d + staging %d) but the budget is %d (available memory − 32 GiB)",
		ErrNodeBudget, e.Ranks, e.Claimed, e.Ranks, e.SegmentSize, e.StagingBytes, e.Budget)
	if fit := (e.Budget - e.StagingBytes) / int64(e.Ranks); fit > 0 {
		msg += fmt.Sprintf("; use segment_size <= %d, fewer ranks, or turn staging off", fit)
	} else {
		msg += "; use fewer ranks or turn staging off"
	}
	return msg
}

func (e *NodeBudgetError) Unwrap() error { return ErrNodeBudget }

// CheckNodeBudget checks that ranks processes on one node can each mount a segment of
// segmentSize bytes and, when stageThroughHost, directions staging pools of MaxStagingBytes
// (directions = loads + saves, 0 for a capacity role), within memAvailable − 32 GiB. ranks below
// 1 count as 1 and a negative segment as 0. memAvailable 0 means unknown: the check passes and
// the caller should warn (see MemAvailable).
func CheckNodeBudget(ranks int, segmentSize int64, stageThroughHost bool, directions int, memAvailable uint64) error {
	ranks = max(ranks, 1)
	segmentSize = max(segmentSize, 0)
	if directions < 0 {
		return fmt.Errorf("node budget: directions must be 0, 1 or 2, got %d", directions)
	}
	if memAvailable == 0 {
		return nil
	}
	var staging int64
	if stageThroughHost {
		staging = int64(ranks) * int64(directions) * MaxStagingBytes
	}
	claimed, budget := mulAddSat(int64(ranks), segmentSize, staging), int64(min(memAvailable, 1<<62))-NodeReserveBytes
	if claimed > budget {
		return &NodeBudgetError{Ranks: ranks, SegmentSize: segmentSize, StagingBytes: staging, Claimed: claimed, Budget: budget}
	}
	return nil
}

// mulAddSat returns a·b + c for non-negative operands, saturating instead of overflowing.
func mulAddSat(a, b, c int64) int64 {
	const limit = 1<<63 - 1
	if b != 0 && a > (limit-c)/b {
		return limit
	}
	return a*b + c
}

// MemAvailable returns the memory available for new allocations: MemAvailable of /proc/meminfo,
// or else free pages times the page size. false means neither is known.
func MemAvailable() (uint64, bool) {
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		if v, ok := parseMemAvailable(string(b)); ok {
			return v, true
		}
	}
	var si unix.Sysinfo_t
	if err := unix.Sysinfo(&si); err == nil && si.Freeram > 0 {
		return si.Freeram * uint64(si.Unit), true
	}
	return 0, false
}

func parseMemAvailable(meminfo string) (uint64, bool) {
	for line := range strings.Lines(meminfo) {
		rest, ok := strings.CutPrefix(line, "MemAvailable:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			return 0, false
		}
		kb, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			return 0, false
		}
		return kb * 1024, true
	}
	return 0, false
}
