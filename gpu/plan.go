package gpu

import (
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
