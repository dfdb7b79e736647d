package replay

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/kvctl/kvctl/commands/cmdutil"
	"github.com/kvctl/kvctl/core/replay"
)

func runLive(ctx context.Context, opts *Options, tr *replay.Trace, p replay.Params, c replay.Config) (*replay.Report, error) {
	// Say what to do about a daemon that is not there, rather than which of its sockets failed.
	if fi, err := os.Stat(opts.Target); err != nil || fi.Mode().Type() != os.ModeSocket {
		return nil, cmdutil.Unreachable(fmt.Errorf("no kvctl serve is listening on %s: start `kvctl serve` or pass --target with its socket", opts.Target))
	}
	lo := replay.LiveOptions{Socket: opts.Target, Engines: opts.Engines, AsFastAsPossible: opts.Pace == PaceMax, Speed: opts.Speed,
		NoCallChannels: opts.NoCallChannels, Admin: opts.Admin,
		Warn: func(msg string) { fmt.Fprintf(opts.IO.ErrOut, "warning: %s\n", msg) }}
	rep, err := replay.Live(ctx, tr, p, c, lo)
	if errors.Is(err, replay.ErrUnreachable) {
		return nil, cmdutil.Unreachable(err)
	}
	return rep, err
}

// liveProblems is the error a live replay exits with when the daemon was not ready or saves
// failed: the report is printed, but its pool figures do not measure the pool as configured.
func liveProblems(rep *replay.Report) error {
	if rep.Live == nil {
		return nil
	}
	p := rep.Live.Daemon.Problems()
	if len(p) == 0 {
		return nil
	}
	return cmdutil.ValidationErrorf("%s: the pool figures above do not measure the pool", strings.Join(p, "; "))
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
