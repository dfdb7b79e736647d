package kvmem

import "fmt"

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
// largest page value, and stagingBytes (staging_buffer_bytes, which replaces the old fixed
// 1 GiB ceiling) split evenly over the workers (async_load_workers, or 1 for synchronous
// transfers); each worker gets min(transferBatch, share/slot) slots. The pinned memory is
// therefore never more than stagingBytes, the amount the node memory check counts for the
// direction, except in one case the seed keeps: a share below one page still gets one slot
// (staging.py's max(1, …)) and a warning that says the pool pins more than was counted.
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
	share := stagingBytes / int64(workers)
	if share < slot {
		p.Warnings = append(p.Warnings, fmt.Sprintf("staging_buffer_bytes %d gives each of %d worker(s) %d bytes, less than one %d-byte page: each pool pins one page anyway, %d bytes in all, more than the budget counts; raise it to at least %d",
			stagingBytes, workers, share, slot, slot*int64(workers), slot*int64(workers)))
	}
	slots := max(1, min(int64(transferBatch), share/slot))
	p.SlotsPerWorker = int(slots)
	p.BytesPerWorker = slots * slot
	p.Batch = min(transferBatch, p.SlotsPerWorker)
	if p.Batch < transferBatch {
		p.Warnings = append(p.Warnings, fmt.Sprintf("transfer_batch_size %d lowered to %d: %d staging bytes hold %d slots of %d bytes", transferBatch, p.Batch, share, p.SlotsPerWorker, slot))
	}
	return p, nil
}
