package serve

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/spf13/pflag"

	"github.com/kvctl/kvctl/commands/cmdutil"
	"github.com/kvctl/kvctl/core/config"
	"github.com/kvctl/kvctl/core/daemon"
	"github.com/kvctl/kvctl/core/statsapi"
	"github.com/kvctl/kvctl/pool"
)

// addClusterFlags registers the mooncake backend's flags, which are also serve config keys.
func addClusterFlags(fl *pflag.FlagSet, k *config.ClusterKeys) {
	fl.StringVar(&k.Master, config.ServeKeyMaster, "", "mooncake backend: the master's RPC `host:port` (its --rpc_port, 50051 by default)")
	fl.StringVar(&k.Metadata, config.ServeKeyMetadata, "", "mooncake backend: the HTTP metadata server `URL`, e.g. http://MASTER:8080/metadata")
	fl.StringVar(&k.HostAddress, config.ServeKeyHostAddress, "", "mooncake backend: the `address` peers reach this host at (default: the local address of the route to the master)")
	fl.IntVar(&k.TransferPort, config.ServeKeyTransferPort, 0, "mooncake backend: TCP `port` this host serves its segment to peers on (0 = a free port)")
	fl.StringVar(&k.LocalBufferSize, config.ServeKeyLocalBufferSize, "", "mooncake backend: the client's transfer buffer size, as mooncake.json's local_buffer_size (default 16MiB)")
	fl.StringVar(&k.Protocol, config.ServeKeyProtocol, "", "mooncake backend: transfer protocol; only tcp")
	fl.StringVar(&k.DeviceName, config.ServeKeyDeviceName, "", "mooncake backend: RDMA device names, accepted from mooncake.json and unused by tcp")
	fl.StringVar(&k.MooncakeConfig, config.ServeKeyMooncakeConfig, "", "mooncake backend: read master, metadata, segment and buffer sizes from a TensorRT-LLM mooncake.json `FILE`; flags win over it")
	fl.StringVar(&k.MasterAdmin, config.ServeKeyMasterAdmin, "", "mooncake backend: the master's HTTP admin `URL`, for the cluster's segments (default http://MASTER-HOST:9003, dropped when it serves another master)")
	fl.BoolVar(&k.ObjectChecksum, config.ServeKeyObjectChecksum, false, "mooncake backend: fill Mooncake's per-object checksum (CRC-64) on every put and verify it on every get; a page changed in its segment is refused and recomputed")
	fl.DurationVar(&k.LocateWindow, config.ServeKeyLocateWindow, 0, "mooncake backend: how long the replica lists a lookup fetched serve its load without asking the master again, at most half the master's read lease; in its first half they also answer lookups of the same pages (default 1s; negative: every lookup and load asks)")
	fl.DurationVar(&k.PoolTimeout, config.ServeKeyPoolTimeout, 0, "longest an engine waits for one pool call; a lookup past it answers miss (default 5s)")
}

// buildBackend builds the plan's backend through the backend registry (pool.Lookup). It
// dials nothing: a remote backend connects when the daemon mounts it. A backend that cannot be
// built is an invalid configuration (exit 3), as it was when the daemon built the pool.
func buildBackend(ctx context.Context, plan config.ServePlan, log *slog.Logger) (*daemon.Backend, error) {
	b, ok := pool.Lookup(plan.Backend)
	if !ok {
		return nil, cmdutil.ValidationErrorf("pool-backend: unknown pool backend %q (this kvctl has %s)", plan.Backend, strings.Join(pool.Names(), ", "))
	}
	p, info, err := b.New(ctx, pool.Spec{Plan: plan, Logger: log})
	if err != nil {
		return nil, cmdutil.ValidationErrorf("%v", err)
	}
	return &daemon.Backend{Pool: p, Info: info}, nil
}

// clusterBanner is the backend part of the startup banner.
func clusterBanner(info statsapi.BackendInfo) string {
	return fmt.Sprintf("  pool     mooncake, master %s, metadata %s\n  segment  %s, %s donated, transfer %s\n",
		info.Master, info.Metadata, info.Segment, config.FormatSize(info.SegmentBytes), info.Protocol)
}

// waitMessage says what a mooncake serve waits for before /readyz answers 200.
func waitMessage(info statsapi.BackendInfo) string {
	return fmt.Sprintf("  listening; ready once the segment is mounted with the master at %s (GET /readyz)\n", info.Master)
}
