package serve

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"time"

	"github.com/spf13/pflag"

	"github.com/kvctl/kvctl/commands/cmdutil"
	"github.com/kvctl/kvctl/core/cluster"
	"github.com/kvctl/kvctl/core/config"
	"github.com/kvctl/kvctl/core/daemon"
	"github.com/kvctl/kvctl/core/statsapi"
	"github.com/kvctl/kvctl/mooncake"
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
	fl.DurationVar(&k.PoolTimeout, config.ServeKeyPoolTimeout, 0, "longest an engine waits for one pool call; a lookup past it answers miss (default 5s)")
}

// clusterBackend builds the mooncake backend's pool from a resolved plan. It dials nothing:
// the daemon mounts the segment once the master answers.
func clusterBackend(sc config.ServeConfig, plan config.ServePlan, log *slog.Logger) (*daemon.Backend, error) {
	c := *plan.Cluster
	c.SegmentBytes = plan.PoolBytes
	if c.HostAddress == "" {
		host, err := config.RouteAddress(c.Master)
		if err != nil {
			return nil, cmdutil.ValidationErrorf("host-address: %v; give --host-address", err)
		}
		c.HostAddress, c.Sources[config.ServeKeyHostAddress] = host, "route to the master"
	}
	dataAddr := ""
	segment := net.JoinHostPort(c.HostAddress, "(port chosen at mount)")
	if c.TransferPort > 0 {
		dataAddr = net.JoinHostPort(c.HostAddress, strconv.Itoa(c.TransferPort))
		segment = dataAddr
	}
	timeout := sc.PoolTimeout
	if timeout <= 0 {
		timeout = daemon.DefaultPoolTimeout
	}
	if log != nil {
		warnExposure(log, c)
	}
	p, err := cluster.New(cluster.Options{Logger: log, AdminDerived: c.MasterAdminDerived, Native: mooncake.NativeOptions{
		MasterAddr: c.Master, MetadataURL: c.Metadata, AdminURL: c.MasterAdmin, SegmentSize: c.SegmentBytes,
		Host: c.HostAddress, DataAddr: dataAddr, CallTimeout: timeout, Logger: log, ObjectChecksum: sc.ObjectChecksum,
	}})
	if err != nil {
		return nil, cmdutil.ValidationErrorf("%v", err)
	}
	return &daemon.Backend{Pool: p, Info: statsapi.BackendInfo{
		Kind: statsapi.BackendMooncake, Master: c.Master, Metadata: c.Metadata, HostAddress: c.HostAddress,
		Protocol: c.Protocol, Segment: segment, SegmentBytes: c.SegmentBytes, LocalBufferBytes: c.LocalBufferBytes,
	}}, nil
}

// warnExposure warns, at start, for each address of the mooncake backend's unauthenticated
// traffic that is on a non-private network (docs/SECURITY.md "Mooncake mode"). Names are
// resolved with a short bound so a slow resolver does not hold the start.
func warnExposure(log *slog.Logger, c config.Cluster) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for _, e := range cluster.CheckExposure(ctx, c.HostAddress, c.Metadata, c.Master, nil) {
		log.Warn("Mooncake traffic on a non-private address: it is unauthenticated, so whoever reaches it can read and overwrite every tenant's KV pages or redirect other hosts; keep it on an isolated network (docs/SECURITY.md, Mooncake mode)",
			"traffic", e.What, "address", e.Addr, "ip", e.IP.String())
	}
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
