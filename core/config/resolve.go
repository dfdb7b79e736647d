package config

import (
	"fmt"
)

// MinPoolBytes is the smallest pool, or Mooncake segment, `kvctl serve` runs with: below it a
// single 64-layer page set of a small model does not fit.
const MinPoolBytes = 16 << 20

// ServePlan is a serve config resolved into what `kvctl serve` starts: every size parsed once,
// the backend chosen, the pool sized (automatically when pool-size is auto), and the memory
// warnings worth a line. `kvctl serve` and `kvctl validate-config` both build it with
// ServeConfig.Resolve, so a config one accepts the other starts.
type ServePlan struct {
	Config  ServeConfig
	Backend string // PoolBackendEmbedded or PoolBackendMooncake
	// PoolBytes is the embedded pool's capacity or this host's Mooncake segment. It is 0 only
	// when the size is automatic and the resolver was given no memory to size it from.
	PoolBytes int64
	// AutoSized is true when PoolBytes is a quarter of the available memory (pool-size auto).
	AutoSized bool
	// Cluster is the mooncake backend's merged settings (nil for the embedded pool).
	Cluster *Cluster
	// Memory is what the resolver knew about memory, and Warnings what it has to say about it.
	MemAvailable uint64
	MemKnown     bool
	Warnings     []MemoryWarning
}

// MemoryWarning is one memory warning: a message and its slog attributes.
type MemoryWarning struct {
	Msg  string
	Args []any
}

// ResolveOptions are what Resolve reads from outside the config.
type ResolveOptions struct {
	// ReadFile reads the mooncake.json and pool manifest a mooncake config names (nil:
	// os.ReadFile).
	ReadFile func(string) ([]byte, error)
	// MemAvailable reads the memory this process may take; nil leaves an automatic size
	// unresolved (PoolBytes 0) and says nothing about memory, as validate-config does on a
	// machine other than the one that will run serve.
	MemAvailable func() (uint64, bool)
	// MemSource names where MemAvailable reads from, for the warnings.
	MemSource string
	// GPUs is the number of GPUs on the node: engines run here and need their reserve.
	GPUs int
}

// Resolve checks s as `kvctl serve` would start it and returns the plan, with every problem at
// once. A plan whose diagnostics hold an error must not be started.
func (s ServeConfig) Resolve(o ResolveOptions) (ServePlan, Diagnostics) {
	p := ServePlan{Config: s, Backend: s.PoolBackend}
	diags := s.Validate()
	d := newDec("")
	size, sized, sizeErr := s.PoolSizeBytes()
	what := "pool"
	switch s.PoolBackend {
	case PoolBackendMooncake:
		what = "segment"
		c, cd := s.ResolveCluster(o.ReadFile)
		seen := map[string]bool{}
		for _, x := range diags {
			seen[x.Path+"\x00"+x.Message] = true
		}
		for _, x := range cd {
			if !seen[x.Path+"\x00"+x.Message] {
				diags = append(diags, x)
			}
		}
		p.Cluster = &c
		size, sized = c.SegmentBytes, c.SegmentBytes > 0
	case PoolBackendEmbedded:
	default:
		return p, diags
	}
	if sizeErr != nil {
		return p, diags
	}
	if o.MemAvailable != nil {
		p.MemAvailable, p.MemKnown = o.MemAvailable()
	}
	if !sized && o.MemAvailable != nil {
		if !p.MemKnown {
			d.at(SeverityError, ServeKeyPoolSize, "auto: the available memory is unknown here", "give pool-size, for example 16GiB")
		} else {
			size, p.AutoSized = AutoPoolSize(p.MemAvailable), true
		}
	}
	if size != 0 && size < MinPoolBytes {
		how := "pool-size " + FormatSize(size) + " is"
		if p.AutoSized {
			how = "pool-size auto (a quarter of " + FormatSizeHuman(int64(min(p.MemAvailable, 1<<62))) + " available) is " + FormatSize(size) + ","
		}
		d.at(SeverityError, ServeKeyPoolSize, fmt.Sprintf("%s below the %s minimum %s", how, FormatSize(MinPoolBytes), what),
			"give pool-size of at least "+FormatSize(MinPoolBytes))
	}
	p.PoolBytes = size
	if p.MemKnown && size > 0 {
		p.Warnings = memoryWarnings(size, s.StagingBufferBytes, p.MemAvailable, o.MemSource, o.GPUs, !p.AutoSized)
	}
	return p, append(diags, d.diags...)
}

// AutoPoolSize is the pool pool-size auto gives: a quarter of the memory this process may take
// (the host's available memory bounded by its cgroup's limit), in whole MiB; enough to be useful
// on a workstation, small enough to leave the engines theirs.
func AutoPoolSize(avail uint64) int64 {
	return int64(avail/4) &^ (1<<20 - 1)
}

// memoryWarnings returns the memory warnings worth a line. Only what matters is said: a pool
// that does not fit in the memory this process may take (it will be swapped or killed), or, on
// a GPU node, a chosen pool that leaves the engines less than the node reserve TensorRT-LLM's
// mooncake_store keeps for them.
func memoryWarnings(pool, staging int64, avail uint64, source string, gpus int, chosen bool) []MemoryWarning {
	claim, err := CheckNodeBudget(BudgetInput{RanksOnNode: 1, SegmentSize: pool, StageThroughHost: true,
		Role: RoleBoth, StagingBufferBytes: staging, MemAvailable: avail, MemKnown: true})
	args := []any{"pool", FormatSizeHuman(pool), "staging", FormatSizeHuman(claim.Claimed - pool),
		"available", FormatSizeHuman(int64(min(avail, 1<<62))), "available_from", source}
	switch {
	case uint64(claim.Claimed) > avail:
		return []MemoryWarning{{"the pool and one rank's staging are larger than the memory this process may take; pages will be swapped or the daemon killed", args}}
	case err != nil && chosen && gpus > 0:
		return []MemoryWarning{{"node memory budget: the pool leaves the engines on this node less than the reserve",
			append(args, "reserve", FormatSizeHuman(NodeReserve), "max_pool", FormatSizeHuman(max(claim.MaxSegmentSize, 0)))}}
	}
	return nil
}
