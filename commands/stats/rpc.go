package stats

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/kvctl/kvctl/commands/cmdutil"
	"github.com/kvctl/kvctl/core/probe"
	"github.com/kvctl/kvctl/mooncake"
	"github.com/kvctl/kvctl/mooncake/masterrpc"
)

// Pool is one --pool: an admin address (Target) or a Mooncake master's RPC address.
type Pool struct {
	Target  *probe.Target
	RPCAddr string
	Timeout time.Duration
}

// gatherAny reads one pool. A bare host:port that drops HTTP requests is asked over RPC.
func gatherAny(ctx context.Context, p Pool) (Source, error) {
	if p.RPCAddr != "" {
		s, err := gatherRPC(ctx, p.RPCAddr, p.Timeout)
		if err != nil {
			return Source{}, rpcError(p.RPCAddr, err)
		}
		return s, nil
	}
	s, err := gatherPool(ctx, p.Target)
	if err == nil {
		return s, nil
	}
	host := strings.TrimPrefix(p.Target.Addr(), "http://")
	if errors.Is(err, mooncake.ErrUnreachable) && probe.LooksLikeRPC(host, err) {
		if s, rerr := gatherRPC(ctx, host, p.Timeout); rerr == nil {
			return s, nil
		}
	}
	return Source{}, poolError(p.Target, err)
}

func rpcError(addr string, err error) error {
	switch {
	case errors.Is(err, context.Canceled):
		return err
	case errors.Is(err, masterrpc.ErrUnavailable):
		return cmdutil.Unreachable(fmt.Errorf("pool %s%s: %w", probe.RPCScheme, addr, err))
	}
	return fmt.Errorf("pool %s%s: %w", probe.RPCScheme, addr, err)
}

// gatherRPC reports what a master's RPC service tells: that it serves, its store protocol
// version and its storage configuration.
func gatherRPC(ctx context.Context, addr string, timeout time.Duration) (Source, error) {
	c, err := probe.DialMaster(ctx, addr, timeout)
	if err != nil {
		return Source{}, err
	}
	defer func() { _ = c.Close() }()
	version, err := c.ServiceReady(ctx)
	if err != nil {
		return Source{}, err
	}
	if _, err := c.GetStorageConfig(ctx); err != nil {
		return Source{}, err
	}
	ready := true
	return Source{Source: probe.RPCScheme + addr, Kind: probe.KindMasterRPC, Version: version, Ready: &ready}, nil
}
