package pool

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"sync"

	"github.com/kvctl/kvctl/core/config"
	"github.com/kvctl/kvctl/core/statsapi"
)

// Backend is one pool backend's registry entry: what `kvctl serve --pool-backend NAME` builds,
// which settings it reads, and what /v1/stats shows of it. A backend package registers its
// entry in an init function; commands/serve looks the resolved plan's backend up and calls New.
type Backend struct {
	// Name is the pool-backend value (config.PoolBackends lists the names a serve config
	// accepts).
	Name string
	// Summary is one line for --help and shell completion.
	Summary string
	// ConfigKeys are the serve config keys (each also a `kvctl serve` flag) only this backend
	// reads, beside pool-backend and pool-size, which every backend reads.
	ConfigKeys []string
	// StatsDetail names the figures the backend's pools report in Stats.Detail: fields of
	// /v1/stats's pool object (statsapi.PoolStats) by their JSON names.
	StatsDetail []string
	// New builds the backend's pool from a resolved serve plan, with what /v1/stats's backend
	// object shows of it. It dials nothing: a remote backend connects when the daemon mounts
	// it. An error names the setting at fault; `kvctl serve` exits 3 for it.
	New func(ctx context.Context, s Spec) (Pool, statsapi.BackendInfo, error)
}

// Spec is what a backend is built from.
type Spec struct {
	// Plan is the serve config as config.ServeConfig.Resolve resolved it: the pool size
	// (Plan.PoolBytes) and every setting of the backend.
	Plan   config.ServePlan
	Logger *slog.Logger
}

var (
	regMu    sync.RWMutex
	registry = map[string]Backend{}
)

// Register adds a backend. It panics on an empty name, a missing constructor or a name
// registered twice: each is a programming error found at start.
func Register(b Backend) {
	regMu.Lock()
	defer regMu.Unlock()
	switch {
	case b.Name == "":
		panic("pool.Register: a backend without a name")
	case b.New == nil:
		panic(fmt.Sprintf("pool.Register: backend %q without a constructor", b.Name))
	}
	if _, dup := registry[b.Name]; dup {
		panic(fmt.Sprintf("pool.Register: backend %q registered twice", b.Name))
	}
	registry[b.Name] = b
}

// Lookup returns the backend registered under name.
func Lookup(name string) (Backend, bool) {
	regMu.RLock()
	defer regMu.RUnlock()
	b, ok := registry[name]
	return b, ok
}

// Backends returns every registered backend, by name.
func Backends() []Backend {
	regMu.RLock()
	defer regMu.RUnlock()
	out := make([]Backend, 0, len(registry))
	for _, b := range registry {
		out = append(out, b)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Names returns the registered backends' names, sorted.
func Names() []string {
	bs := Backends()
	out := make([]string, len(bs))
	for i, b := range bs {
		out[i] = b.Name
	}
	return out
}
