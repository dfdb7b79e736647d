package replay

import (
	"context"
	"fmt"
	"os"

	"github.com/kvctl/kvctl/commands/cmdutil"
	"github.com/kvctl/kvctl/core/replay"
)

func runLive(ctx context.Context, opts *Options, tr *replay.Trace, p replay.Params, c replay.Config) (*replay.Report, error) {
	return nil, cmdutil.FlagErrorf("live mode is not available in this build")
}

func writePlot(path string, rep *replay.Report) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := replay.WritePlot(f, rep); err != nil {
		f.Close()
		return fmt.Errorf("plot: %w", err)
	}
	return f.Close()
}
