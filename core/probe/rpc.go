package probe

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/kvctl/kvctl/mooncake/masterrpc"
)

// KindMasterRPC is the kind of a Mooncake master reached at its RPC address.
const KindMasterRPC = "mooncake-master-rpc"

// RPCScheme marks an address as a master's RPC address: rpc://host:port.
const RPCScheme = "rpc://"

// DefaultMetadataPort is mooncake_master's default --http_metadata_server_port.
const DefaultMetadataPort = "8080"

// ExplicitRPC returns host:port when addr is written rpc://host:port.
func ExplicitRPC(addr string) (string, bool) {
	rest, ok := strings.CutPrefix(addr, RPCScheme)
	return strings.TrimSuffix(rest, "/"), ok
}

// DialMaster connects to a master's RPC address and checks its protocol version, within
// timeout. Its callers make one call at a time, so it opens one connection.
func DialMaster(ctx context.Context, addr string, timeout time.Duration) (*masterrpc.Client, error) {
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return nil, fmt.Errorf("master RPC address %q: want host:port", addr)
	}
	return masterrpc.Dial(ctx, masterrpc.Options{Addr: addr, CallTimeout: timeout, DialTimeout: timeout, Conns: 1})
}

// LooksLikeRPC reports whether addr may be a master's RPC port that refused an HTTP request:
// a bare host:port whose HTTP answer was a dropped connection (a coro_rpc server closes a
// connection that does not start with its magic byte).
func LooksLikeRPC(addr string, httpErr error) bool {
	if strings.Contains(addr, "://") || httpErr == nil {
		return false
	}
	var op *net.OpError
	if errors.As(httpErr, &op) && op.Op == "dial" {
		return false // nothing listens: no point asking again over RPC
	}
	return true
}

// DefaultMetadataURL is the HTTP metadata server a master at rpcAddr serves with its default
// port.
func DefaultMetadataURL(rpcAddr string) string {
	host, _, err := net.SplitHostPort(rpcAddr)
	if err != nil {
		host = rpcAddr
	}
	return "http://" + net.JoinHostPort(host, DefaultMetadataPort) + "/metadata"
}

// RPCExists asks the master which keys it holds with BatchExistKey, in batches. Like an
// engine's existence check, it grants each present key a read lease.
func RPCExists(ctx context.Context, c *masterrpc.Client, keys []string) ([]bool, error) {
	out := make([]bool, len(keys))
	const batch = 4096
	for lo := 0; lo < len(keys); lo += batch {
		hi := min(lo+batch, len(keys))
		res, err := c.BatchExistKey(ctx, keys[lo:hi], masterrpc.DefaultTenant)
		if err != nil {
			return nil, err
		}
		for i, v := range res {
			if v < 0 {
				return nil, fmt.Errorf("BatchExistKey %q: %w", keys[lo+i], &masterrpc.CodeError{Method: "BatchExistKey", Code: int32(v)})
			}
			out[lo+i] = v == 1
		}
	}
	return out, nil
}
