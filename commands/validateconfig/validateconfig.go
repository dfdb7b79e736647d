// Package validateconfig implements `kvctl validate-config`: CI-grade checks of connector and
// pool config files with the loader `kvctl serve` uses.
package validateconfig

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kvctl/kvctl/commands/cmdutil"
	"github.com/kvctl/kvctl/core/boundedio"
	"github.com/kvctl/kvctl/core/config"
)

// Options are the inputs of `kvctl validate-config`.
type Options struct {
	IO          *cmdutil.IOStreams
	Getenv      func(string) string
	Files       []string
	Kind        string
	Strict      bool
	Render      bool
	NodeBudget  bool
	RanksOnNode int
	// For names the consumer a file is checked for: "" (the file's own rules) or "serve".
	For          string
	OutputFormat string
	// ReadFile is replaced in tests.
	ReadFile func(string) ([]byte, error)
	// Seams come from the Factory: MemAvailable reads the memory the node budget checks
	// (nil: the system's, as config.SystemMemAvailable reads it).
	cmdutil.Seams
}

// NewCmdValidateConfig returns `kvctl validate-config`. runF replaces the run function in tests.
func NewCmdValidateConfig(f *cmdutil.Factory, runF func(*Options) error) *cobra.Command {
	opts := &Options{IO: f.IOStreams, Seams: f.Seams}
	kinds := make([]string, 0, 4)
	for _, k := range config.Kinds() {
		kinds = append(kinds, string(k))
	}
	cmd := &cobra.Command{
		Use:   "validate-config FILE...",
		Short: "Check connector and pool config files",
		Long: `Check TensorRT-LLM connector YAML, Mooncake client configs (mooncake.json), pool
manifests (pool.json), kvctl serve configs and TensorRT-LLM's disagg_config.yaml (the file
kvctl serve --disagg-config runs), reporting every problem at once with file:line:column, the
key path, a severity and a hint.

Each file's kind is detected from its keys (then its name); --kind forces one for every file.
"-" reads standard input. The checks are the ones kvctl serve runs before it starts: a file this
command accepts starts serve, and one it refuses is refused by serve with the same words.

A YAML whose kv_connector_config names kvctl's own connector (connector_module
kvctl_engine.trtllm) is checked for the socket and settings it reaches kvctl serve with
(server_url, else KVCTL_SOCKET and KVCTL_MODEL_KEY) and for what TensorRT-LLM would refuse
next to it; see docs/trtllm.md.

Warnings do not fail the check unless --strict is given. --render prints the mooncake.json a
server would write for a TensorRT-LLM YAML, byte for byte. --node-budget adds the node memory
check (segments and staging against available memory less 32 GiB).

A file valid for its own kind may still be refused by the program it is given to: --for serve
checks a mooncake.json as kvctl serve --pool-backend mooncake --mooncake-config reads it (kvctl
speaks protocol tcp and needs an HTTP metadata server), and says so in the result.`,
		Example: `  kvctl validate-config llm_api.yaml
  kvctl validate-config --strict -o json llm_api.yaml pool.json mooncake.json
  kvctl validate-config --render llm_api.yaml pool.json > mooncake.json
  cat mooncake.json | kvctl validate-config --kind mooncake-json -

  # is this mooncake.json one kvctl serve --mooncake-config can join a cluster with?
  kvctl validate-config --for serve mooncake.json`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) == 0 {
				return cmdutil.FlagErrorf("validate-config needs at least one FILE (- for stdin)")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.Files = args
			opts.OutputFormat = cmdutil.OutputFormat(cmd)
			opts.Getenv = f.Getenv
			if opts.Kind != "" {
				if _, err := config.ParseKind(opts.Kind); err != nil {
					return cmdutil.FlagErrorf("--kind: %v", err)
				}
			}
			stdin := 0
			for _, a := range args {
				if a == "-" {
					stdin++
				}
			}
			if stdin > 1 {
				return cmdutil.FlagErrorf("standard input (-) can be read only once")
			}
			if opts.For != "" && opts.For != ForServe {
				return cmdutil.FlagErrorf("invalid --for %q: want serve", opts.For)
			}
			if err := cmdutil.CheckCount("ranks-on-node", opts.RanksOnNode, 1, 1<<16); err != nil {
				return err
			}
			if runF != nil {
				return runF(opts)
			}
			return runValidateConfig(cmd.Context(), opts)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&opts.Kind, "kind", "", "force the kind of every file: "+strings.Join(kinds, ", "))
	fl.BoolVar(&opts.Strict, "strict", false, "fail on warnings too")
	fl.BoolVar(&opts.Render, "render", false, "print the client config (mooncake.json) a server would write")
	fl.BoolVar(&opts.NodeBudget, "node-budget", false, "also check the node memory budget")
	fl.StringVar(&opts.For, "for", "", "also check each file for the consumer it is given to: serve (a mooncake.json as kvctl serve --mooncake-config reads it)")
	fl.IntVar(&opts.RanksOnNode, "ranks-on-node", 1, "ranks sharing this node, for --node-budget")
	_ = cmd.RegisterFlagCompletionFunc("kind", cobra.FixedCompletions(kinds, cobra.ShellCompDirectiveNoFileComp))
	return cmd
}

// FileResult is the outcome for one file.
type FileResult struct {
	File        string              `json:"file"`
	Kind        string              `json:"kind"`
	Valid       bool                `json:"valid"`
	Errors      int                 `json:"errors"`
	Warnings    int                 `json:"warnings"`
	Diagnostics []config.Diagnostic `json:"diagnostics"`
}

// Result is the output of `kvctl validate-config`.
type Result struct {
	Valid    bool         `json:"valid"`
	Strict   bool         `json:"strict"`
	Errors   int          `json:"errors"`
	Warnings int          `json:"warnings"`
	Files    []FileResult `json:"files"`
}

type loaded struct {
	file  *config.File
	diags config.Diagnostics
}

// runValidateConfig checks every file and prints the result. It returns a validation error
// (exit 3) when any file is invalid. ctx interrupts a read (SIGINT/SIGTERM).
func runValidateConfig(ctx context.Context, opts *Options) error {
	if ctx == nil {
		ctx = context.Background()
	}
	readFile := opts.ReadFile
	if readFile == nil {
		// Through a hard limit whatever stat says: /dev/zero, a FIFO or a file that grows must
		// not be read without end.
		readFile = func(name string) ([]byte, error) {
			data, err := boundedio.ReadFile(ctx, name, maxFileBytes)
			if errors.Is(err, boundedio.ErrTooLarge) {
				return nil, cmdutil.ValidationErrorf("%s: larger than %d bytes; not a config file", name, maxFileBytes)
			}
			return data, err
		}
	}
	lopts := config.LoadOptions{
		Kind:         config.Kind(opts.Kind),
		NodeBudget:   opts.NodeBudget,
		RanksOnNode:  opts.RanksOnNode,
		MemAvailable: opts.MemAvailable,
		Env:          opts.Getenv,
		ReadFile:     readFile,
	}
	if lopts.MemAvailable == nil {
		lopts.MemAvailable = config.SystemMemAvailable
	}

	res := Result{Valid: true, Strict: opts.Strict}
	var files []loaded
	for _, name := range opts.Files {
		data, display, err := read(opts, readFile, name)
		if err != nil {
			return err
		}
		f, diags := config.Load(display, data, lopts)
		diags = append(diags, serveDiagnostics(f, diags, readFile)...)
		if opts.For == ForServe {
			fd, err := forServe(f, display, data)
			if err != nil {
				return err
			}
			diags = append(diags, fd...)
		}
		files = append(files, loaded{f, diags})
		fr := FileResult{File: display, Diagnostics: []config.Diagnostic(diags)}
		if fr.Diagnostics == nil {
			fr.Diagnostics = []config.Diagnostic{}
		}
		if f != nil {
			fr.Kind = string(f.Kind)
		}
		fr.Errors, fr.Warnings = len(diags.Errors()), len(diags.Warnings())
		fr.Valid = fr.Errors == 0 && (!opts.Strict || fr.Warnings == 0)
		res.Errors += fr.Errors
		res.Warnings += fr.Warnings
		res.Valid = res.Valid && fr.Valid
		res.Files = append(res.Files, fr)
	}

	if opts.Render {
		return render(opts, files, res)
	}
	if err := printResult(opts, res); err != nil {
		return err
	}
	if !res.Valid {
		return cmdutil.SilentExit(cmdutil.ExitValidation)
	}
	return nil
}

func read(opts *Options, readFile func(string) ([]byte, error), name string) ([]byte, string, error) {
	if name == "-" {
		data, err := io.ReadAll(io.LimitReader(opts.IO.In, maxFileBytes+1))
		if err != nil {
			return nil, "", fmt.Errorf("read standard input: %w", err)
		}
		if len(data) > maxFileBytes {
			return nil, "", cmdutil.ValidationErrorf("standard input: larger than %d bytes; not a config file", maxFileBytes)
		}
		return data, "<stdin>", nil
	}
	if fi, err := os.Stat(name); err == nil && fi.Size() > maxFileBytes {
		return nil, "", cmdutil.ValidationErrorf("%s: %d bytes is larger than %d; not a config file", name, fi.Size(), maxFileBytes)
	}
	data, err := readFile(name)
	if err != nil {
		return nil, "", err
	}
	return data, name, nil
}

// maxFileBytes bounds what is read as one config file.
const maxFileBytes = 16 << 20

func printResult(opts *Options, res Result) error {
	if opts.OutputFormat == cmdutil.FormatJSON || opts.OutputFormat == cmdutil.FormatYAML {
		return cmdutil.Print(opts.IO, opts.OutputFormat, res, nil)
	}
	w := opts.IO.Out
	for _, fr := range res.Files {
		for _, d := range fr.Diagnostics {
			fmt.Fprintln(w, d.String())
		}
	}
	for _, fr := range res.Files {
		state := "valid"
		if !fr.Valid {
			state = "INVALID"
		}
		kind := " (" + fr.Kind + ")"
		if fr.Kind == "" {
			kind = "" // the file did not parse far enough to tell its kind
		}
		fmt.Fprintf(w, "%s: %s%s: %s, %s\n", fr.File, state, kind, plural(fr.Errors, "error"), plural(fr.Warnings, "warning"))
	}
	return nil
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return strconv.Itoa(n) + " " + what + "s"
}

// render prints the client config a server would write for the (single) TensorRT-LLM YAML among
// the files, using a pool manifest given alongside it or the one its pool field names.
func render(opts *Options, files []loaded, res Result) error {
	var yaml *config.File
	var manifest *config.PoolManifest
	for _, l := range files {
		if l.file == nil {
			continue
		}
		switch l.file.Kind {
		case config.KindTRTLLM:
			if yaml != nil {
				return cmdutil.FlagErrorf("--render takes one TensorRT-LLM YAML, got %s and %s", yaml.Name, l.file.Name)
			}
			yaml = l.file
		case config.KindManifest:
			manifest = l.file.Manifest
		}
	}
	if !res.Valid {
		// Say why nothing is rendered, on stderr, so stdout stays a clean config or nothing.
		for _, fr := range res.Files {
			for _, d := range fr.Diagnostics {
				fmt.Fprintln(opts.IO.ErrOut, d.String())
			}
		}
		return cmdutil.ValidationErrorf("not rendering: the config is invalid (%s, %s)", plural(res.Errors, "error"), plural(res.Warnings, "warning"))
	}
	if yaml == nil || yaml.Store() == nil {
		return cmdutil.FlagErrorf("--render needs a TensorRT-LLM YAML with a kv_connector_config.mooncake_store block")
	}
	block := yaml.Store()
	if manifest == nil {
		path, _, err := config.ParsePoolRef(block.Pool)
		if err != nil {
			return cmdutil.ValidationErrorf("%s: %v", yaml.Name, err)
		}
		if path != "" {
			if !filepath.IsAbs(path) && yaml.Name != "<stdin>" {
				path = filepath.Join(filepath.Dir(yaml.Name), path)
			}
			data, err := boundedio.ReadFile(context.Background(), path, boundedio.MaxConfigBytes)
			if err != nil {
				return fmt.Errorf("pool manifest named by %s: %w", yaml.Name, err)
			}
			mf, diags := config.Load(path, data, config.LoadOptions{Kind: config.KindManifest})
			if diags.HasErrors() {
				for _, d := range diags {
					fmt.Fprintln(opts.IO.ErrOut, d.String())
				}
				return cmdutil.ValidationErrorf("pool manifest %s is invalid", path)
			}
			manifest = mf.Manifest
		}
	}
	_, out, err := config.RenderClientConfig(block, manifest, func() string { return config.DetectRDMADevices("/sys/class/infiniband") })
	if err != nil {
		if errors.Is(err, config.ErrRender) {
			return cmdutil.ValidationErrorf("%v", err)
		}
		return err
	}
	if _, err := opts.IO.Out.Write(out); err != nil {
		return err
	}
	if opts.IO.IsStdoutTTY() {
		fmt.Fprintln(opts.IO.Out)
	}
	return nil
}
