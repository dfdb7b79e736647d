// Package probepool implements `kvctl probe-pool`: which blocks of a prompt a live pool holds,
// where its prefix stops, and which holes make it recompute tokens it stores.
package probepool

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"charm.land/lipgloss/v2"
	"github.com/spf13/cobra"

	"github.com/kvctl/kvctl/commands/cmdutil"
	"github.com/kvctl/kvctl/core/keys"
	"github.com/kvctl/kvctl/core/probe"
	"github.com/kvctl/kvctl/mooncake"
)

// Options are the inputs of `kvctl probe-pool`.
type Options struct {
	IO *cmdutil.IOStreams
	// Keys holds the key inputs shared with kvctl hash.
	Keys *cmdutil.KeyFlags

	Pool         string
	RenewLeases  bool
	Watch        int // seconds between probes; 0 probes once
	ExpectHit    int
	HasExpectHit bool
	Timeout      time.Duration
	OutputFormat string

	// DumpKey, Out and Metadata serve --dump-key: fetch one object through the data path.
	DumpKey  string
	Out      string
	Metadata string

	// Seams come from the Factory: Now stamps watch headers, Sleep waits between two watch
	// reports.
	cmdutil.Seams
	// Iterations stops a watch after that many reports (0: until the context is done).
	Iterations int
}

// NewCmdProbePool returns `kvctl probe-pool`. runF replaces the run function in tests.
func NewCmdProbePool(f *cmdutil.Factory, runF func(*Options) error) *cobra.Command {
	opts := &Options{IO: f.IOStreams, Seams: f.Seams, Keys: &cmdutil.KeyFlags{KeySet: keys.KeySetLookup}}
	cmd := &cobra.Command{
		Use:   "probe-pool --pool URL [TOKEN...]",
		Short: "Show which blocks of a prompt a live pool holds, and where its prefix stops",
		Long: `Ask a live pool which keys of a prompt it holds, block by block, and show the prefix a
lookup would serve, the holes behind it and the stored tokens those holes make an engine
recompute.

The prompt and its keys are given as for kvctl hash: tokens as arguments or --tokens-file, the
scope flags, --model-key and every --layer-group (and --replicated) page size, or --from-config
with a TensorRT-LLM YAML, mooncake.json or pool.json plus the layer-group page sizes.

--format vllm… probes the keys of vLLM's MooncakeStoreConnector: give --python-hash-seed (the
engine's PYTHONHASHSEED; without it vLLM's keys are random per process and cannot be derived),
--model, the engine's block size as --tokens-per-block and its TP layout (--world-size,
--num-kv-heads, …); a chunk counts as present only if the key of every TP, PP and context-parallel
rank namespace exists. --format sglang… probes SGLang HiCache pages: every TP rank's K and V
objects (one object for --mla). --from-config reads vLLM's --kv-transfer-config JSON or SGLang's
storage-backend extra config JSON.

For TensorRT-LLM a block counts as present only if every key a lookup needs exists: the sharded
key of every peer shard of every layer group, plus the replicated keys.

--pool is one of:
  - a Mooncake master's HTTP admin address (port 9003 by default) or a kvctl serve admin
    address, as http://host:port or host:port; the two are told apart by /v1/stats. Keys are
    looked up with the read-only /batch_query_keys, which grants no lease and moves no
    counter. --renew-leases asks /query_key key by key instead, which grants each present
    key a read lease as an engine's lookup does.
  - a Mooncake master's RPC address (--rpc_port, 50051 by default), as rpc://host:port, or
    host:port when that port does not answer HTTP. Keys are looked up with the master's
    BatchExistKey, as an engine's connector does, which grants each present key a read lease.

--dump-key KEY --out FILE fetches one stored object through the data path, as an engine would
load it, and writes its bytes unchanged to FILE ("-" for standard output). It needs the
master's RPC address in --pool and its HTTP metadata server (--metadata, by default port 8080
on the master's host), and exits 3 when the pool does not hold KEY.

The hit is the run of leading complete blocks. A hole is a run of incomplete blocks after it
with a complete block behind it; the complete blocks behind a hole are stored but recomputed,
since a prefix is served only up to its first gap. Incomplete blocks reaching the end of the
prompt are reported as missing, not as a hole.

--watch N probes again every N seconds until interrupted: on a terminal the report is redrawn in
place, otherwise one report follows another; a pool that does not answer is reported on
standard error and asked again at the next interval. --expect-hit N exits 3 when fewer than N blocks hit,
for smoke tests.`,
		Example: `  # which of a prompt's blocks a master holds
  kvctl probe-pool --pool 10.0.0.5:9003 --tokens-file prompt.json \
      --model-key llama-3-8b --world-size 4 --layer-group 0:65536

  # the key layout from the engine's YAML, as JSON
  kvctl probe-pool --pool http://127.0.0.1:9480 --from-config llm_api.yaml \
      --layer-group 0:131072 --tokens-file prompt.json -o json

  # the same, asking the master over its RPC port
  kvctl probe-pool --pool rpc://10.0.0.5:50051 --tokens-file prompt.json \
      --model-key llama-3-8b --world-size 4 --layer-group 0:65536

  # save one stored page for inspection
  kvctl probe-pool --pool rpc://10.0.0.5:50051 --dump-key 'trtllm/llama/0/abcd' --out page.bin

  # which blocks a vLLM pool holds
  kvctl probe-pool --pool rpc://10.0.0.5:50051 --format vllm --python-hash-seed 0 \
      --model meta-llama/Llama-3.1-8B-Instruct --tokens-file prompt.json

  # the same for SGLang HiCache pages of 64 tokens at TP 2
  kvctl probe-pool --pool rpc://10.0.0.5:50051 --format sglang --tokens-per-block 64 \
      --model meta-llama/Llama-3.1-8B-Instruct --world-size 2 --tokens-file prompt.json

  # CI smoke test: at least 3 blocks must hit
  kvctl probe-pool --pool 127.0.0.1:9480 --model-key m --layer-group 0:4096 \
      --tokens-per-block 4 --expect-hit 3 0 1 2 3 4 5 6 7 8 9 10 11`,
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.OutputFormat = cmdutil.OutputFormat(cmd)
			opts.HasExpectHit = cmd.Flags().Changed("expect-hit")
			if opts.DumpKey != "" || cmd.Flags().Changed("dump-key") {
				if err := checkDumpFlags(opts, args); err != nil {
					return err
				}
				if runF != nil {
					return runF(opts)
				}
				return runDump(cmd.Context(), opts)
			}
			if opts.Out != "" {
				return cmdutil.FlagErrorf("--out names the file --dump-key writes; give --dump-key KEY")
			}
			if err := opts.Keys.Bind(cmd, args); err != nil {
				return err
			}
			if opts.Pool == "" {
				return cmdutil.FlagErrorf("--pool is required: a Mooncake master or kvctl serve admin address, host:port")
			}
			if opts.Watch < 0 {
				return cmdutil.FlagErrorf("--watch %ds: want an interval of at least 1s", opts.Watch)
			}
			if opts.HasExpectHit && opts.ExpectHit < 0 {
				return cmdutil.FlagErrorf("--expect-hit %d: must not be negative", opts.ExpectHit)
			}
			if opts.HasExpectHit && opts.Watch > 0 {
				return cmdutil.FlagErrorf("--expect-hit checks one probe; it cannot be combined with --watch")
			}
			if opts.Timeout <= 0 {
				return cmdutil.FlagErrorf("--timeout %v: must be positive", opts.Timeout)
			}
			if runF != nil {
				return runF(opts)
			}
			return runProbePool(cmd.Context(), opts)
		},
	}
	cmdutil.AddKeyFlags(cmd, opts.Keys)
	fl := cmd.Flags()
	fl.StringVar(&opts.Pool, "pool", "", "the pool: a Mooncake master's admin address (`URL` http://host:9003), its RPC address (rpc://host:50051) or a kvctl serve admin address")
	fl.BoolVar(&opts.RenewLeases, "renew-leases", false, "look keys up with /query_key, which grants each present key a read lease, instead of the read-only /batch_query_keys")
	cmdutil.SecondsVar(fl, &opts.Watch, "watch", 0, "probe again at this interval (5s, 1m, or a number of seconds) until interrupted")
	fl.IntVar(&opts.ExpectHit, "expect-hit", 0, "exit 3 when fewer than `N` blocks hit")
	cmdutil.DurationVar(fl, &opts.Timeout, "timeout", probe.DefaultTimeout, "bound on each request to the pool")
	addDumpFlags(cmd, opts)
	return cmd
}

// runProbePool probes the pool once, or every --watch seconds until ctx is done.
func runProbePool(ctx context.Context, opts *Options) error {
	s, err := opts.Keys.Scheme()
	if err != nil {
		return err
	}
	if s.Chain != nil {
		if opts.Keys.ModelKey == "" && len(opts.Keys.FromConfig) == 0 {
			return cmdutil.FlagErrorf("--model-key (or --from-config) is required: the pool's keys name the model")
		}
		if len(opts.Keys.LayerGroups) == 0 {
			return cmdutil.FlagErrorf("at least one --layer-group g:bytes_per_page is required: the pool's keys name each layer group's page size")
		}
	}
	opts.Keys.KeySet = keys.KeySetLookup
	prompt, err := derivePrompt(opts, s)
	if err != nil {
		return err
	}
	if addr, ok := probe.ExplicitRPC(opts.Pool); ok {
		return runRPC(ctx, opts, addr, prompt)
	}
	target, err := probe.NewTarget(opts.Pool, opts.Timeout)
	if err != nil {
		return cmdutil.FlagErrorf("--pool: %v", err)
	}
	if _, err := target.Kind(ctx); errors.Is(err, mooncake.ErrUnreachable) && probe.LooksLikeRPC(opts.Pool, err) {
		// Not HTTP: perhaps the master's RPC port.
		if c, rerr := probe.DialMaster(ctx, opts.Pool, opts.Timeout); rerr == nil {
			_ = c.Close()
			return runRPC(ctx, opts, opts.Pool, prompt)
		}
	}
	return report(ctx, opts, target.Addr(), func(ctx context.Context) (*probe.Report, error) {
		return probe.Admin(ctx, target, prompt, opts.RenewLeases)
	})
}

// derivePrompt reads the prompt and derives the keys a lookup needs, through the key recipe.
func derivePrompt(opts *Options, s *keys.Scheme) (*probe.PromptKeys, error) {
	tokens, err := opts.Keys.LoadPrompt(opts.IO)
	if err != nil {
		return nil, err
	}
	if s.Chain == nil {
		return deriveSchemePrompt(opts, s, tokens)
	}
	rec, scope, err := opts.Keys.Recipe()
	if err != nil {
		return nil, err
	}
	if err := cmdutil.CheckKeys(rec); err != nil {
		return nil, err
	}
	return probe.DerivePromptKeys(rec, keys.Prompt{Tokens: tokens, Scope: scope, HasMultimodal: opts.Keys.HasMultimodal})
}

// deriveSchemePrompt derives a prompt's lookup keys by vLLM's or SGLang's rules, through their
// scheme.
func deriveSchemePrompt(opts *Options, s *keys.Scheme, tokens []int64) (*probe.PromptKeys, error) {
	if s.Takes(keys.InputModel) && opts.Keys.Model == "" {
		return nil, cmdutil.FlagErrorf("--model is required: %s's pool keys name the model", s.Engine)
	}
	p, err := opts.Keys.Params(s)
	if err != nil {
		return nil, err
	}
	pk, err := probe.DeriveSchemeKeys(s, p, tokens)
	if err != nil {
		return nil, cmdutil.SchemeError(err)
	}
	return pk, nil
}

// report probes pool once, checking --expect-hit, or every --watch seconds.
func report(ctx context.Context, opts *Options, pool string, probeOnce func(context.Context) (*probe.Report, error)) error {
	if opts.Watch > 0 {
		w := cmdutil.Watch{IO: opts.IO, Every: opts.Watch, Format: opts.OutputFormat, Target: pool, Iterations: opts.Iterations, Seams: opts.Seams}
		return w.Run(ctx, func(ctx context.Context) (func() error, error) {
			res, err := probeOnce(ctx)
			if err != nil {
				return nil, cmdutil.PoolError(err)
			}
			return func() error { return write(opts, res) }, nil
		})
	}
	res, err := probeOnce(ctx)
	if err != nil {
		return cmdutil.PoolError(err)
	}
	if err := write(opts, res); err != nil {
		return err
	}
	if opts.HasExpectHit && res.Summary.HitBlocks < opts.ExpectHit {
		return cmdutil.ValidationErrorf("expected at least %s to hit, got %d of %d from %s", plural(opts.ExpectHit, "block", "blocks"), res.Summary.HitBlocks, res.Summary.Blocks, pool)
	}
	return nil
}

func write(opts *Options, res *probe.Report) error {
	if opts.OutputFormat != cmdutil.FormatTable && opts.OutputFormat != "" {
		return cmdutil.Print(opts.IO, opts.OutputFormat, res, nil)
	}
	if err := cmdutil.WriteTable(opts.IO, rows(res, opts.IO.ColorEnabled())); err != nil {
		return err
	}
	return writeFooter(opts.IO.Out, res, opts.IO.ColorEnabled())
}

var stateColor = map[string]string{probe.StateHit: "10", probe.StateHole: "9", probe.StateStored: "11", probe.StateMissing: "8"}

func paint(on bool, color, s string) string {
	if !on {
		return s
	}
	return lipgloss.NewStyle().Foreground(lipgloss.Color(color)).Render(s)
}

func rows(res *probe.Report, color bool) cmdutil.Table {
	t := cmdutil.Table{Header: []string{"BLOCK", "TOKENS", "HASH", "STATE", "KEYS", "MISSING"}}
	prefix := res.Namespace + "/" + res.ModelKey + "/"
	for _, b := range res.Blocks {
		var missing []string
		for _, k := range b.Keys {
			if !k.Present {
				s := strings.TrimSuffix(strings.TrimPrefix(k.Key, prefix), "/"+b.Hash)
				if res.Engine != "" {
					// vLLM's and SGLang's keys: the key with its hash cut out names the rank.
					s = strings.Replace(k.Key, b.Hash, "…", 1)
				}
				missing = append(missing, s)
			}
		}
		m := strings.Join(missing, ",")
		if m == "" {
			m = "-"
		}
		t.Rows = append(t.Rows, []string{
			strconv.Itoa(b.Block), fmt.Sprintf("%d-%d", b.Start, b.End), b.Hash,
			paint(color, stateColor[b.State], b.State), fmt.Sprintf("%d/%d", b.PresentKeys, b.NeededKeys), m,
		})
	}
	return t
}

func plural(n int, one, many string) string {
	if n == 1 {
		return fmt.Sprintf("%d %s", n, one)
	}
	return fmt.Sprintf("%d %s", n, many)
}

func writeFooter(w io.Writer, res *probe.Report, color bool) error {
	var b strings.Builder
	b.WriteByte('\n')
	for _, h := range res.Holes {
		where := fmt.Sprintf("block %d", h.StartBlock)
		if h.Blocks > 1 {
			where = fmt.Sprintf("blocks %d-%d", h.StartBlock, h.StartBlock+h.Blocks-1)
		}
		fmt.Fprintf(&b, "hole at %s (tokens %d-%d): %s stored behind it, %d tokens recomputed\n",
			where, h.StartToken, h.EndToken, plural(h.StoredBlocksBehind, "block", "blocks"), h.RecomputedStoredTokens)
	}
	s := res.Summary
	line := fmt.Sprintf("%s: %d of %s hit (%d tokens), %s (%s), %d stored tokens recomputed, %s missing at the end, %d of %d keys present",
		res.Pool, s.HitBlocks, plural(s.Blocks, "block", "blocks"), s.HitTokens,
		plural(s.Holes, "hole", "holes"), plural(s.HoleBlocks, "block", "blocks"), s.RecomputedStoredTokens,
		plural(s.MissingBlocks, "block", "blocks"), s.KeysPresent, s.KeysChecked)
	if res.Bypassed {
		line = fmt.Sprintf("%s: the prompt has multimodal positions without --mm-hash, so it has no keys to probe", res.Pool)
	}
	c := "10"
	if s.Holes > 0 {
		c = "9"
	} else if s.HitBlocks < s.Blocks {
		c = "11"
	}
	b.WriteString(paint(color, c, line))
	b.WriteByte('\n')
	writeDiagnosis(&b, res)
	_, err := io.WriteString(w, b.String())
	return err
}
