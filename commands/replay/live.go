package replay

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/kvctl/kvctl/commands/cmdutil"
	"github.com/kvctl/kvctl/core/replay"
)

func runLive(ctx context.Context, opts *Options, tr *replay.Trace, p replay.Params, c replay.Config) (*replay.Report, error) {
	lo := replay.LiveOptions{Socket: opts.Target, Engines: opts.Engines, AsFastAsPossible: opts.Pace == PaceMax, Speed: opts.Speed}
	rep, err := replay.Live(ctx, tr, p, c, lo)
	if errors.Is(err, replay.ErrUnreachable) {
		return nil, cmdutil.Unreachable(err)
	}
	return rep, err
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
