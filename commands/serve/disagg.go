package serve

import (
	"context"
	"fmt"
	"os"

	"github.com/kvctl/kvctl/commands/cmdutil"
	"github.com/kvctl/kvctl/core/config"
	"github.com/kvctl/kvctl/core/disagg"
)

// FlagDisaggConfig is the flag that turns serve into the disaggregated front.
const FlagDisaggConfig = config.ServeKeyDisaggConfig

// maxDisaggConfigBytes bounds the disagg_config.yaml serve reads.
const maxDisaggConfigBytes = 4 << 20

// runDisagg checks TensorRT-LLM's disagg_config.yaml with the validate-config loader and runs
// the disaggregated front it describes until ctx is cancelled.
func runDisagg(ctx context.Context, opts *Options) error {
	fi, err := os.Stat(opts.DisaggConfig)
	if err != nil {
		return cmdutil.ValidationErrorf("--%s: %v", FlagDisaggConfig, err)
	}
	if fi.Size() > maxDisaggConfigBytes {
		return cmdutil.ValidationErrorf("--%s: %s is %d bytes; not a disagg config", FlagDisaggConfig, opts.DisaggConfig, fi.Size())
	}
	data, err := os.ReadFile(opts.DisaggConfig)
	if err != nil {
		return cmdutil.ValidationErrorf("--%s: %v", FlagDisaggConfig, err)
	}
	f, diags := config.Load(opts.DisaggConfig, data, config.LoadOptions{Kind: config.KindDisagg})
	if err = report(opts, diags); err != nil {
		return err
	}
	c := f.Disagg
	log := opts.Factory.Logger()
	err = disagg.Run(ctx, disagg.RunOptions{
		Options:      disagg.Options{Config: c, Logger: log},
		DrainTimeout: opts.DrainTimeout,
		Ready: func(addr string) {
			fmt.Fprintf(opts.IO.ErrOut, "kvctl serve (disaggregated front)\n  context     %v (router %s)\n  generation  %v (router %s)\n  kv_transfer_timeout_ms %d\n  listen   http://%s\n  ready\n",
				c.Context.URLs, c.Context.Router.Type, c.Generation.URLs, c.Generation.Router.Type, c.KVTransferTimeoutMs, addr)
		},
	})
	if err != nil {
		return err
	}
	return nil
}
