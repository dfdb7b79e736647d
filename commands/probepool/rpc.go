package probepool

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/kvctl/kvctl/commands/cmdutil"
	"github.com/kvctl/kvctl/commands/hash"
	"github.com/kvctl/kvctl/core/probe"
	"github.com/kvctl/kvctl/mooncake"
	"github.com/kvctl/kvctl/mooncake/masterrpc"
)

// MaxDumpBytes bounds the object --dump-key fetches.
const MaxDumpBytes = 1 << 30

// QueryBatchExistKey is the query a probe over the master's RPC address makes.
const QueryBatchExistKey = "BatchExistKey"

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

func rpcError(addr string, err error) error {
	switch {
	case errors.Is(err, context.Canceled):
		return err
	case errors.Is(err, masterrpc.ErrUnavailable):
		return cmdutil.Unreachable(fmt.Errorf("pool %s%s: %w", probe.RPCScheme, addr, err))
	}
	return fmt.Errorf("pool %s%s: %w", probe.RPCScheme, addr, err)
}

// runRPC probes a master through its RPC address, once or every --watch seconds.
func runRPC(ctx context.Context, opts *Options, addr string, layout *hash.Result) error {
	c, err := probe.DialMaster(ctx, addr, opts.Timeout)
	if err != nil {
		return rpcError(addr, err)
	}
	defer func() { _ = c.Close() }()
	pool := probe.RPCScheme + addr
	probeOnce := func(ctx context.Context) (*Result, error) {
		res, err := analyze(ctx, pool, probe.KindMasterRPC, QueryBatchExistKey, layout, func(ctx context.Context, keys []string) ([]bool, error) {
			return probe.RPCExists(ctx, c, keys)
		})
		if err != nil {
			return nil, rpcError(addr, err)
		}
		res.Diagnosis = diagnose(ctx, func(context.Context) ([]string, error) {
			return nil, errors.New("a master's RPC address lists no keys; probe its HTTP admin address (port 9003) to say more")
		}, res)
		return res, nil
	}
	if opts.Watch > 0 {
		return watch(ctx, opts, pool, probeOnce)
	}
	res, err := probeOnce(ctx)
	if err != nil {
		return err
	}
	if err := write(opts, res); err != nil {
		return err
	}
	if opts.HasExpectHit && res.Summary.HitBlocks < opts.ExpectHit {
		return cmdutil.ValidationErrorf("expected at least %s to hit, got %d of %d from %s", plural(opts.ExpectHit, "block", "blocks"), res.Summary.HitBlocks, res.Summary.Blocks, pool)
	}
	return nil
}

// DumpResult is the output of `kvctl probe-pool --dump-key`.
type DumpResult struct {
	Pool  string `json:"pool"`
	Key   string `json:"key"`
	Bytes int64  `json:"bytes"`
	Out   string `json:"out"`
}

// RunDump fetches the object --dump-key names through the data path and writes it to --out.
func RunDump(ctx context.Context, opts *Options) error {
	if ctx == nil {
		ctx = context.Background()
	}
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
		return rpcError(addr, err)
	}
	defer func() { _ = n.Close() }()
	data, code := n.Fetch(ctx, opts.DumpKey, MaxDumpBytes)
	switch code {
	case mooncake.OK:
	case mooncake.ErrObjectNotFound:
		return cmdutil.ValidationErrorf("key %q is not in the pool at %s", opts.DumpKey, probe.RPCScheme+addr)
	case mooncake.ErrInvalidParams:
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
