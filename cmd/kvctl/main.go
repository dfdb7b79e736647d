// Command kvctl is the operator's tool for KV-cache offloading to a shared pool. See the README
// and `kvctl --help`.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/kvctl/kvctl/commands/cmdutil"
	"github.com/kvctl/kvctl/commands/root"
)

// Set by the linker: -X main.version=... -X main.commit=...
var (
	version = ""
	commit  = ""
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	ios := cmdutil.System()
	f := &cmdutil.Factory{IOStreams: ios, Version: version, Commit: commit, Now: time.Now, Getenv: os.Getenv}
	cmd := root.NewCmdRoot(f)
	cmd.SetContext(ctx)
	err := root.Execute(cmd, args)
	if err == nil {
		return cmdutil.ExitOK
	}
	code := cmdutil.ExitCode(err)
	if ctx.Err() != nil && code == cmdutil.ExitFailure {
		code = cmdutil.ExitInterrupted
	}
	if !cmdutil.IsSilent(err) && f.LogFormat == "json" {
		// With JSON logs every line on stderr is JSON, the final error included.
		f.Logger().Error(err.Error(), "exit_code", code)
		return code
	}
	if !cmdutil.IsSilent(err) {
		fmt.Fprintf(ios.ErrOut, "kvctl: %v\n", err)
		if code == cmdutil.ExitUsage {
			if c, _, ferr := cmd.Find(args); ferr == nil && c != nil {
				fmt.Fprintf(ios.ErrOut, "\n%s", c.UsageString())
			} else {
				fmt.Fprintf(ios.ErrOut, "\n%s", cmd.UsageString())
			}
		}
	}
	return code
}
