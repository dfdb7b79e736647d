// Package version implements `kvctl version`.
package version

import (
	"context"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"

	"github.com/kvctl/kvctl/commands/cmdutil"
)

// Options are the inputs of `kvctl version`.
type Options struct {
	IO      *cmdutil.IOStreams
	Version string
	Commit  string
	Format  string
}

// Info is the result of `kvctl version`.
type Info struct {
	Version   string `json:"version"`
	Commit    string `json:"commit"`
	GoVersion string `json:"go_version"`
	Platform  string `json:"platform"`
}

// NewCmdVersion returns `kvctl version`. runF replaces the run function in tests.
func NewCmdVersion(f *cmdutil.Factory, runF func(*Options) error) *cobra.Command {
	opts := &Options{IO: f.IOStreams}
	return &cobra.Command{
		Use:   "version",
		Short: "Print kvctl's version, commit and Go version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts.Version, opts.Commit = f.Version, f.Commit
			opts.Format = cmdutil.OutputFormat(cmd)
			if runF != nil {
				return runF(opts)
			}
			return runVersion(cmd.Context(), opts)
		},
	}
}

// runVersion prints the version information.
func runVersion(_ context.Context, opts *Options) error {
	info := Get(opts.Version, opts.Commit)
	return cmdutil.Print(opts.IO, opts.Format, info, func() cmdutil.Table {
		return cmdutil.Table{
			Header: []string{"FIELD", "VALUE"},
			Rows: [][]string{
				{"version", info.Version},
				{"commit", info.Commit},
				{"go", info.GoVersion},
				{"platform", info.Platform},
			},
		}
	})
}

// Get fills the version information, taking what the linker did not set from the build info.
func Get(version, commit string) Info {
	info := Info{Version: version, Commit: commit, GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if info.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			info.Version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && info.Commit == "" {
				info.Commit = s.Value
			}
		}
	}
	if info.Version == "" {
		info.Version = "dev"
	}
	if info.Commit == "" {
		info.Commit = "unknown"
	}
	return info
}
