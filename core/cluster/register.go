package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"time"

	"github.com/kvctl/kvctl/core/config"
	"github.com/kvctl/kvctl/core/statsapi"
	"github.com/kvctl/kvctl/mooncake"
	"github.com/kvctl/kvctl/pool"
)

// defaultCallTimeout bounds one call to the master or a peer when the plan's pool-timeout is
// zero; it is the daemon's default pool timeout.
const defaultCallTimeout = 5 * time.Second

func init() {
	pool.Register(pool.Backend{
		Name:    config.PoolBackendMooncake,
		Summary: "join a Mooncake cluster: this host donates a segment and reads every host's",
		ConfigKeys: []string{config.ServeKeyPool, config.ServeKeyMaster, config.ServeKeyMetadata, config.ServeKeyHostAddress,
			config.ServeKeyLocalBufferSize, config.ServeKeyProtocol, config.ServeKeyDeviceName, config.ServeKeyMooncakeConfig,
			config.ServeKeyMasterAdmin, config.ServeKeyTransferPort, config.ServeKeyObjectChecksum, config.ServeKeyLocateWindow},
		StatsDetail: mooncake.NativeStatsDetail,
		New:         newServePool,
	})
}

// newServePool builds the mooncake backend's pool from a resolved plan. It dials nothing: the
// daemon mounts the segment once the master answers. It warns, at start, for each address of
// the backend's unauthenticated traffic that is on a non-private network.
func newServePool(ctx context.Context, s pool.Spec) (pool.Pool, statsapi.BackendInfo, error) {
	if s.Plan.Cluster == nil {
		return nil, statsapi.BackendInfo{}, fmt.Errorf("pool-backend %s: the plan has no cluster settings", config.PoolBackendMooncake)
	}
	c := *s.Plan.Cluster
	c.SegmentBytes = s.Plan.PoolBytes
	if c.HostAddress == "" {
		host, err := config.RouteAddress(ctx, c.Master)
		if err != nil {
			return nil, statsapi.BackendInfo{}, fmt.Errorf("host-address: %w; give --host-address", err)
		}
		c.HostAddress = host
		if c.Sources != nil {
			c.Sources[config.ServeKeyHostAddress] = "route to the master"
		}
	}
	dataAddr := ""
	segment := net.JoinHostPort(c.HostAddress, "(port chosen at mount)")
	if c.TransferPort > 0 {
		dataAddr = net.JoinHostPort(c.HostAddress, strconv.Itoa(c.TransferPort))
		segment = dataAddr
	}
	timeout := s.Plan.Config.PoolTimeout
	if timeout <= 0 {
		timeout = defaultCallTimeout
	}
	if s.Logger != nil {
		warnExposure(ctx, s.Logger, c)
	}
	p, err := New(Options{Logger: s.Logger, AdminDerived: c.MasterAdminDerived, Native: mooncake.NativeOptions{
		MasterAddr: c.Master, MetadataURL: c.Metadata, AdminURL: c.MasterAdmin, SegmentSize: c.SegmentBytes,
		Host: c.HostAddress, DataAddr: dataAddr, CallTimeout: timeout, Logger: s.Logger, ObjectChecksum: s.Plan.Config.ObjectChecksum,
		LocateWindow: s.Plan.Config.LocateWindow,
	}})
	if err != nil {
		return nil, statsapi.BackendInfo{}, err
	}
	return p, statsapi.BackendInfo{
		Kind: statsapi.BackendMooncake, Master: c.Master, Metadata: c.Metadata, HostAddress: c.HostAddress,
		Protocol: c.Protocol, Segment: segment, SegmentBytes: c.SegmentBytes, LocalBufferBytes: c.LocalBufferBytes,
	}, nil
}

// warnExposure warns for each address of the backend's unauthenticated traffic that is on a
// non-private network (docs/SECURITY.md "Mooncake mode"). Names are resolved with a short
// bound so a slow resolver does not hold the start.
func warnExposure(ctx context.Context, log *slog.Logger, c config.Cluster) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	for _, e := range CheckExposure(ctx, c.HostAddress, c.Metadata, c.Master, nil) {
		log.Warn("Mooncake traffic on a non-private address: it is unauthenticated, so whoever reaches it can read and overwrite every tenant's KV pages or redirect other hosts; keep it on an isolated network (docs/SECURITY.md, Mooncake mode)",
			"traffic", e.What, "address", e.Addr, "ip", e.IP.String())
	}
}
