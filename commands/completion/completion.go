// Package completion implements `kvctl completion`.
package completion

import (
	"context"

	"github.com/spf13/cobra"

	"github.com/kvctl/kvctl/commands/cmdutil"
)

// Options are the inputs of `kvctl completion`.
type Options struct {
	IO *cmdutil.IOStreams
	// Shell is bash, zsh, fish or powershell; Root is the command tree to complete.
	Shell string
	Root  *cobra.Command
}

// NewCmdCompletion returns `kvctl completion bash|zsh|fish|powershell`.
func NewCmdCompletion(f *cmdutil.Factory) *cobra.Command {
	opts := &Options{IO: f.IOStreams}
	return &cobra.Command{
		Use:   "completion bash|zsh|fish|powershell",
		Short: "Print a shell completion script",
		Long: `Print a completion script for your shell.

  bash:       source <(kvctl completion bash)
  zsh:        kvctl completion zsh > "${fpath[1]}/_kvctl"
  fish:       kvctl completion fish > ~/.config/fish/completions/kvctl.fish
  powershell: kvctl completion powershell | Out-String | Invoke-Expression`,
		ValidArgs: []string{"bash", "zsh", "fish", "powershell"},
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return cmdutil.FlagErrorf("completion needs exactly one shell: bash, zsh, fish or powershell")
			}
			return cobra.OnlyValidArgs(cmd, args)
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.Shell, opts.Root = args[0], cmd.Root()
			return runCompletion(cmd.Context(), opts)
		},
	}
}

// runCompletion writes the completion script of opts.Shell for the tree under opts.Root.
func runCompletion(_ context.Context, opts *Options) error {
	out := opts.IO.Out
	switch opts.Shell {
	case "bash":
		return opts.Root.GenBashCompletionV2(out, true)
	case "zsh":
		return opts.Root.GenZshCompletion(out)
	case "fish":
		return opts.Root.GenFishCompletion(out, true)
	default:
		return opts.Root.GenPowerShellCompletionWithDesc(out)
	}
}
