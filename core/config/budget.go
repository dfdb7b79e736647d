package config

import (
	"fmt"
	"strings"

	"github.com/kvctl/kvctl/core/sysmem"
)

// NodeReserve is the memory left to everything else on a node before segments and staging
// buffers are counted (validate_node_budget in TensorRT-LLM's
// mooncake_store/validation.py, https://github.com/NVIDIA/TensorRT-LLM/pull/21195; docs/SEED.md).
const NodeReserve = 32 << 30

// BudgetInput is what the node memory check reads.
type BudgetInput struct {
	RanksOnNode        int   // ranks sharing the node; values below 1 count as 1
	SegmentSize        int64 // per rank; negative counts as 0
	StageThroughHost   bool  // effective value
	Role               Role
	StagingBufferBytes int64 // per direction
	MemAvailable       uint64
	MemKnown           bool // false: the node's available memory could not be read
}

// BudgetReport is the outcome of CheckNodeBudget.
type BudgetReport struct {
	Claimed   int64 `json:"claimed"`   // segments plus pinned staging on the node
	Available int64 `json:"available"` // MemAvailable
	Budget    int64 `json:"budget"`    // Available minus NodeReserve
	Known     bool  `json:"known"`
	// MaxSegmentSize is the largest per-rank segment that fits: (budget - staging) / ranks.
	MaxSegmentSize int64 `json:"max_segment_size"`
}

// CheckNodeBudget is TensorRT-LLM's node budget check (validate_node_budget in
// mooncake_store/validation.py, https://github.com/NVIDIA/TensorRT-LLM/pull/21195), with the configurable
// staging: claimed = ranks*max(0, segment) + (staging ? ranks*directions*staging_bytes : 0),
// budget = MemAvailable - 32 GiB. It returns an error wrapping ErrNodeBudget when the claim
// exceeds the budget; when the available memory is unknown it only reports Known=false.
func CheckNodeBudget(in BudgetInput) (BudgetReport, error) {
	ranks := int64(max(in.RanksOnNode, 1))
	seg := max(in.SegmentSize, 0)
	var staging int64
	if in.StageThroughHost {
		staging = ranks * int64(in.Role.Directions()) * in.StagingBufferBytes
	}
	r := BudgetReport{Claimed: satAdd(satMul(ranks, seg), staging), Known: in.MemKnown}
	if !in.MemKnown {
		return r, nil
	}
	r.Available = int64(min(in.MemAvailable, 1<<62))
	r.Budget = r.Available - NodeReserve
	r.MaxSegmentSize = max((r.Budget-staging)/ranks, 0)
	if r.Claimed > r.Budget {
		return r, fmt.Errorf("%w: %d rank(s) claim %s (segments %s, staging %s) but the node has %s available, leaving a budget of %s after the %s reserve",
			ErrNodeBudget, ranks, FormatSize(r.Claimed), FormatSize(satMul(ranks, seg)), FormatSize(staging),
			FormatSize(r.Available), FormatSize(r.Budget), FormatSize(NodeReserve))
	}
	return r, nil
}

func satMul(a, b int64) int64 {
	if a != 0 && b > (1<<62)/a {
		return 1 << 62
	}
	return a * b
}

func satAdd(a, b int64) int64 { return min(a+b, 1<<62) }

// SystemMemAvailable reads the memory this process may take: MemAvailable of /proc/meminfo
// bounded by its cgroup's memory limit (else free pages); ok is false where none can be read.
func SystemMemAvailable() (uint64, bool) {
	if v, ok := sysmem.Available(); ok {
		return v, true
	}
	return sysmem.MemAvailable()
}

// nodeBudget runs the check for a loaded file and records its outcome at path.
func nodeBudget(d *dec, opts LoadOptions, path string, in BudgetInput) {
	mem := opts.MemAvailable
	if mem == nil {
		mem = SystemMemAvailable
	}
	in.MemAvailable, in.MemKnown = mem()
	in.RanksOnNode = opts.RanksOnNode
	r, err := CheckNodeBudget(in)
	switch {
	case !r.Known:
		d.at(SeverityWarning, path, "the node's available memory is unknown, so the node budget was not checked", "")
	case err != nil:
		d.at(SeverityError, path, strings.TrimPrefix(err.Error(), ErrNodeBudget.Error()+": "),
			fmt.Sprintf("lower the segment to at most %s per rank, run fewer ranks on the node, or turn staging off", FormatSizeFloor(r.MaxSegmentSize)))
	}
}

// FormatSizeFloor writes n rounded down to a whole GiB or MiB when it is that large, through
// FormatSize.
func FormatSizeFloor(n int64) string {
	switch {
	case n >= 1<<30:
		n = n >> 30 << 30
	case n >= 1<<20:
		n = n >> 20 << 20
	}
	return FormatSize(n)
}
