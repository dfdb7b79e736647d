// Package completion implements `kvctl completion`.
package completion

import (
	"github.com/spf13/cobra"

	"github.com/kvctl/kvctl/commands/cmdutil"
)

// NewCmdCompletion returns `kvctl completion bash|zsh|fish|powershell`.
func NewCmdCompletion(f *cmdutil.Factory) *cobra.Command {
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
			root := cmd.Root()
			out := f.IOStreams.Out
			switch args[0] {
			case "bash":
				return root.GenBashCompletionV2(out, true)
			case "zsh":
				return root.GenZshCompletion(out)
			case "fish":
				return root.GenFishCompletion(out, true)
			default:
				return root.GenPowerShellCompletionWithDesc(out)
			}
		},
	}
}
