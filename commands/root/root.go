// Package root builds kvctl's command tree.
package root

import (
	"errors"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kvctl/kvctl/commands/cmdutil"
	"github.com/kvctl/kvctl/commands/completion"
	"github.com/kvctl/kvctl/commands/hash"
	"github.com/kvctl/kvctl/commands/probepool"
	"github.com/kvctl/kvctl/commands/replay"
	"github.com/kvctl/kvctl/commands/serve"
	"github.com/kvctl/kvctl/commands/stats"
	"github.com/kvctl/kvctl/commands/validateconfig"
	"github.com/kvctl/kvctl/commands/version"
)

// NewCmdRoot returns the kvctl command with every subcommand attached. It does no I/O.
func NewCmdRoot(f *cmdutil.Factory) *cobra.Command {
	var (
		configPath string
		noColor    bool
	)
	cmd := &cobra.Command{
		Use:   "kvctl <command> [flags]",
		Short: "Operate KV-cache offloading to a shared Mooncake pool",
		Long: `kvctl runs and inspects KV-cache offloading for large-model inference. kvctl serve is the
connector daemon engines call for prefix hits and KV page loads and saves; the other commands
derive the exact block hashes and pool keys TensorRT-LLM uses, check connector and pool
configs, probe and watch Mooncake pools and kvctl's own, and replay request traces through
the same core.

Flags can also be set in the environment (KVCTL_<FLAG>, dashes as underscores) or in a
YAML config file whose keys are the flag names; a flag on the command line wins, then the
environment, then the file, then the default.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			v, err := cmdutil.LoadConfig(cmd, configPath, f.Getenv)
			if err != nil {
				return err
			}
			f.Config = v
			if err := cmdutil.ValidateFormat(cmdutil.OutputFormat(cmd)); err != nil {
				return err
			}
			if _, err := cmdutil.ParseLogLevel(f.LogLevel); err != nil {
				return &cmdutil.FlagError{Err: err}
			}
			if err := cmdutil.ValidateLogFormat(f.LogFormat); err != nil {
				return &cmdutil.FlagError{Err: err}
			}
			if noColor {
				f.IOStreams.SetColorEnabled(false)
			}
			return nil
		},
	}
	// kvctl --version prints what kvctl version prints first.
	cmd.Version = version.Get(f.Version, f.Commit).Version
	cmd.SetVersionTemplate("kvctl {{.Version}}\n")
	cmd.SetIn(f.IOStreams.In)
	cmd.SetOut(f.IOStreams.Out)
	cmd.SetErr(f.IOStreams.ErrOut)
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error {
		return &cmdutil.FlagError{Err: err}
	})

	pf := cmd.PersistentFlags()
	pf.StringVar(&configPath, "config", "", "config file (default $XDG_CONFIG_HOME/kvctl/config.yaml; env KVCTL_CONFIG)")
	pf.StringP("output", "o", cmdutil.FormatTable, "output format: table, json or yaml")
	pf.StringVar(&f.LogLevel, "log-level", "info", "log level: debug, info, warn or error")
	pf.StringVar(&f.LogFormat, "log-format", "text", "log format: text or json")
	pf.BoolVar(&noColor, "no-color", false, "disable colour (also NO_COLOR=1 or CLICOLOR=0)")
	_ = cmd.RegisterFlagCompletionFunc("output", cobra.FixedCompletions(cmdutil.Formats, cobra.ShellCompDirectiveNoFileComp))
	_ = cmd.RegisterFlagCompletionFunc("log-level", cobra.FixedCompletions(cmdutil.LogLevels, cobra.ShellCompDirectiveNoFileComp))
	_ = cmd.RegisterFlagCompletionFunc("log-format", cobra.FixedCompletions(cmdutil.LogFormats, cobra.ShellCompDirectiveNoFileComp))

	cmd.AddCommand(
		hash.NewCmdHash(f, nil),
		probepool.NewCmdProbePool(f, nil),
		replay.NewCmdReplay(f, nil),
		serve.NewCmdServe(f, nil),
		stats.NewCmdStats(f, nil),
		validateconfig.NewCmdValidateConfig(f, nil),
		version.NewCmdVersion(f, nil),
		completion.NewCmdCompletion(f),
	)
	appendExitCodes(cmd)
	return cmd
}

// appendExitCodes ends every command's help with the exit-code table, so that it is in each
// man page too.
func appendExitCodes(cmd *cobra.Command) {
	for _, c := range cmd.Commands() {
		appendExitCodes(c)
	}
	if !strings.Contains(cmd.Long, cmdutil.ExitCodesHelp) {
		if cmd.Long == "" {
			cmd.Long = cmd.Short + "."
		}
		cmd.Long += "\n\n" + cmdutil.ExitCodesHelp
	}
}

// Execute runs the tree with args and returns the error a command failed with, if any. Unknown
// commands and bad flags come back as usage errors.
func Execute(cmd *cobra.Command, args []string) error {
	cmd.SetArgs(args)
	_, err := cmd.ExecuteC()
	if err != nil && isUsageMessage(err) {
		return &cmdutil.FlagError{Err: err}
	}
	return err
}

// isUsageMessage recognises the errors cobra itself returns for unknown commands and wrong
// argument counts, which carry no type.
func isUsageMessage(err error) bool {
	var fe *cmdutil.FlagError
	var ee *cmdutil.ExitError
	if errors.As(err, &fe) || errors.As(err, &ee) {
		return false
	}
	msg := err.Error()
	for _, p := range []string{"unknown command", "accepts ", "requires at least", "requires at most", "requires exactly", "invalid argument"} {
		if strings.Contains(msg, p) {
			return true
		}
	}
	return false
}
