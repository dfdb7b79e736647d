package serve

import (
	"fmt"

	"github.com/kvctl/kvctl/core/config"
)

// memoryCheck is what serve knows about memory when it sizes the pool.
type memoryCheck struct {
	Pool    int64  // the pool's capacity
	Staging int64  // staging per direction for one engine rank
	Avail   uint64 // memory this process may still take (cgroup limit included)
	Known   bool
	Source  string // where Avail comes from
	GPUs    int    // GPUs on the node: engines run here and need their reserve
	Chosen  bool   // the operator gave --pool-size (auto always fits)
}

// gib writes n bytes in GiB with one decimal, the unit operators size pools in.
func gib(n int64) string { return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30)) }

// memoryWarning is one warning line: its message and its attributes.
type memoryWarning struct {
	Msg  string
	Args []any
}

// warnings returns the memory warnings worth a line. Only what matters is said: a pool that
// does not fit in the memory this process may take (it will be swapped or killed), or, on a GPU
// node, a chosen pool that leaves the engines less than the node reserve TensorRT-LLM's
// mooncake_store keeps for them. Sizes are in GiB.
func (c memoryCheck) warnings() []memoryWarning {
	if !c.Known {
		return nil
	}
	claim, err := config.CheckNodeBudget(config.BudgetInput{RanksOnNode: 1, SegmentSize: c.Pool, StageThroughHost: true,
		Role: config.RoleBoth, StagingBufferBytes: c.Staging, MemAvailable: c.Avail, MemKnown: true})
	args := []any{"pool", gib(c.Pool), "staging", gib(claim.Claimed - c.Pool),
		"available", gib(int64(min(c.Avail, 1<<62))), "available_from", c.Source}
	switch {
	case uint64(claim.Claimed) > c.Avail:
		return []memoryWarning{{"the pool and one rank's staging are larger than the memory this process may take; pages will be swapped or the daemon killed", args}}
	case err != nil && c.Chosen && c.GPUs > 0:
		return []memoryWarning{{"node memory budget: the pool leaves the engines on this node less than the reserve",
			append(args, "reserve", gib(config.NodeReserve), "max_pool", gib(max(claim.MaxSegmentSize, 0)))}}
	}
	return nil
}
