// Command kvctl is the operator's tool for KV-cache offloading to a shared pool. See the README
// and `kvctl --help`.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/kvctl/kvctl/commands/cmdutil"
	"github.com/kvctl/kvctl/commands/root"
	versioncmd "github.com/kvctl/kvctl/commands/version"
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
	return runWith(args, cmdutil.System(), os.Getenv)
}

// runWith runs kvctl with args on ios and returns the exit code: the one place an error
// becomes an exit code and is printed.
func runWith(args []string, ios *cmdutil.IOStreams, getenv func(string) string) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	// One version everywhere: the banner, /v1/stats, kvctl_build_info and kvctl version.
	info := versioncmd.Get(version, commit)
	f := &cmdutil.Factory{IOStreams: ios, Version: info.Version, Commit: info.Commit, Seams: cmdutil.Seams{Now: time.Now}, Getenv: getenv}
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
	if ctx.Err() != nil && errors.Is(err, context.Canceled) {
		// Interrupted (Ctrl-C on --watch): the exit code says so; "context canceled" says nothing.
		return cmdutil.ExitInterrupted
	}
	if !cmdutil.IsSilent(err) && f.LogFormat == "json" {
		// With JSON logs every line on stderr is JSON, the final error included.
		f.Logger().Error(err.Error(), "exit_code", code)
		return code
	}
	if !cmdutil.IsSilent(err) {
		fmt.Fprintf(ios.ErrOut, "kvctl: %v\n", err)
		if code == cmdutil.ExitUsage {
			// One line on where to get help, so that the error stays on screen.
			path := "kvctl"
			if c, _, ferr := cmd.Find(args); ferr == nil && c != nil {
				path = c.CommandPath()
			}
			fmt.Fprintf(ios.ErrOut, "Run '%s --help' for usage.\n", path)
		}
	}
	return code
}
