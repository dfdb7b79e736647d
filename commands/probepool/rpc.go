package probepool

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/kvctl/kvctl/commands/cmdutil"
	"github.com/kvctl/kvctl/core/probe"
	"github.com/kvctl/kvctl/mooncake"
	"github.com/kvctl/kvctl/mooncake/masterrpc"
	"github.com/kvctl/kvctl/pool"
)

// MaxDumpBytes bounds the object --dump-key fetches.
const MaxDumpBytes = 1 << 30

func addDumpFlags(cmd *cobra.Command, opts *Options) {
	fl := cmd.Flags()
	fl.StringVar(&opts.DumpKey, "dump-key", "", "fetch the object stored under `KEY` through the data path (needs the master's RPC address in --pool)")
	fl.StringVar(&opts.Out, "out", "", "write the --dump-key object's bytes to `FILE` (- for standard output)")
	fl.StringVar(&opts.Metadata, "metadata", "", "the master's HTTP metadata server, `URL` http://host:port/metadata (default: port 8080 on the master's host)")
}

func checkDumpFlags(opts *Options, args []string) error {
	switch {
	case opts.DumpKey == "":
		return cmdutil.FlagErrorf("--dump-key: want the key of a stored object")
	case opts.Out == "":
		return cmdutil.FlagErrorf("--dump-key needs --out FILE (- for standard output)")
	case len(args) > 0:
		return cmdutil.FlagErrorf("--dump-key takes no tokens")
	case opts.Pool == "":
		return cmdutil.FlagErrorf("--pool is required: the Mooncake master's RPC address, rpc://host:port")
	case opts.Timeout <= 0:
		return cmdutil.FlagErrorf("--timeout %v: must be positive", opts.Timeout)
	case opts.Watch != 0 || opts.HasExpectHit:
		return cmdutil.FlagErrorf("--dump-key fetches one object; it cannot be combined with --watch or --expect-hit")
	}
	return nil
}

// runRPC probes a master through its RPC address, once or every --watch seconds.
func runRPC(ctx context.Context, opts *Options, addr string, prompt *probe.PromptKeys) error {
	c, err := probe.DialMaster(ctx, addr, opts.Timeout)
	if err != nil {
		return cmdutil.PoolError(&probe.PoolError{Addr: probe.RPCScheme + addr, RPC: true, Err: err})
	}
	defer func() { _ = c.Close() }()
	return report(ctx, opts, probe.RPCScheme+addr, func(ctx context.Context) (*probe.Report, error) {
		return probe.RPC(ctx, c, addr, prompt)
	})
}

// DumpResult is the output of `kvctl probe-pool --dump-key`.
type DumpResult struct {
	Pool  string `json:"pool"`
	Key   string `json:"key"`
	Bytes int64  `json:"bytes"`
	Out   string `json:"out"`
}

// runDump fetches the object --dump-key names through the data path and writes it to --out.
func runDump(ctx context.Context, opts *Options) error {
	addr, ok := probe.ExplicitRPC(opts.Pool)
	if !ok {
		addr = opts.Pool
	}
	if !ok {
		// A bare host:port that answers HTTP is an admin address, not the RPC port.
		if t, err := probe.NewTarget(addr, opts.Timeout); err == nil {
			if kind, err := t.Kind(ctx); err == nil {
				return cmdutil.FlagErrorf("--dump-key needs the master's RPC address in --pool (rpc://host:port, --rpc_port): %s is a %s HTTP admin address", addr, kind)
			}
		}
	}
	meta := opts.Metadata
	if meta == "" {
		meta = probe.DefaultMetadataURL(addr)
	}
	n, err := mooncake.NewNative(ctx, mooncake.NativeOptions{MasterAddr: addr, MetadataURL: meta, CallTimeout: opts.Timeout})
	if err != nil {
		if errors.Is(err, masterrpc.ErrProtocol) && !ok {
			return cmdutil.FlagErrorf("--dump-key needs the master's RPC address in --pool (rpc://host:port, --rpc_port): %s does not speak it: %v", addr, err)
		}
		return cmdutil.PoolError(&probe.PoolError{Addr: probe.RPCScheme + addr, RPC: true, Err: err})
	}
	defer func() { _ = n.Close() }()
	data, code := n.Fetch(ctx, opts.DumpKey, MaxDumpBytes)
	switch code {
	case pool.OK:
	case pool.ErrObjectNotFound:
		return cmdutil.ValidationErrorf("key %q is not in the pool at %s", opts.DumpKey, probe.RPCScheme+addr)
	case pool.ErrInvalidParams:
		return fmt.Errorf("key %q: the object is larger than %d bytes", opts.DumpKey, MaxDumpBytes)
	default:
		return fmt.Errorf("key %q: the fetch failed with Mooncake code %d (metadata server %s)", opts.DumpKey, code, meta)
	}
	res := &DumpResult{Pool: probe.RPCScheme + addr, Key: opts.DumpKey, Bytes: int64(len(data)), Out: opts.Out}
	if opts.Out == "-" {
		_, err := opts.IO.Out.Write(data)
		return err
	}
	if err := os.WriteFile(opts.Out, data, 0o600); err != nil {
		return err
	}
	return cmdutil.Print(opts.IO, opts.OutputFormat, res, func() cmdutil.Table {
		return cmdutil.Table{
			Header: []string{"KEY", "BYTES", "OUT"},
			Rows:   [][]string{{res.Key, strconv.FormatInt(res.Bytes, 10), res.Out}},
		}
	})
}
