// Package hash implements `kvctl hash`: the block hashes and pool keys an engine (TensorRT-LLM,
// vLLM, SGLang) derives for a prompt.
package hash

import (
	"bufio"
	"context"
	"fmt"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/kvctl/kvctl/commands/cmdutil"
	"github.com/kvctl/kvctl/core/keys"
)

// Key sets --key-set selects.
const (
	KeySetSave   = keys.KeySetSave
	KeySetLookup = keys.KeySetLookup
)

// Options are the inputs of `kvctl hash`.
type Options struct {
	IO *cmdutil.IOStreams
	// KeyFlags are the key inputs, shared with kvctl probe-pool.
	cmdutil.KeyFlags

	KeysOnly     bool
	OutputFormat string
}

// NewCmdHash returns `kvctl hash`. runF replaces the run function in tests.
func NewCmdHash(f *cmdutil.Factory, runF func(*Options) error) *cobra.Command {
	opts := &Options{IO: f.IOStreams}
	cmd := &cobra.Command{
		Use:   "hash [TOKEN...]",
		Short: "Print the block hashes and pool keys an engine derives for a prompt",
		Long: `Print the block hashes and Mooncake pool keys of a prompt, byte-identical to those
TensorRT-LLM's mooncake-store connector, vLLM's MooncakeStoreConnector or SGLang's HiCache
mooncake backend uses (--format).

Tokens come from the arguments (separated by spaces or commas) or from --tokens-file: a JSON
array of integers, or integers separated by whitespace or commas; "-" reads standard input.
Token ids are signed 64-bit integers.

Only full blocks get a hash; the tail after the last full block is reported as uncovered.
TensorRT-LLM keys need --model-key and at least one --layer-group. By default each block lists the keys this
rank writes (--key-set save); --key-set lookup lists every key a lookup needs for the block to
count as a hit: every peer shard of every layer group, plus the replicated keys.

vLLM (--format vllm…): --python-hash-seed is required, the PYTHONHASHSEED the engine ran with;
without it vLLM seeds its hashes with os.urandom, so its keys are random per process and
cannot be derived (exit 2). --tokens-per-block is its --block-size (default 16); keys need
--model (the basename is in the key), and --world-size/--rank are the TP size and rank, with
--num-kv-heads, --mla, --pp-*, --pcp-*, --dcp-*, --kv-group and --cache-prefix. The request's
--lora-name, --cache-salt, --mm-feature and --prompt-embeds-digest enter the hashes, as bare
values (--vllm-extra-keys untagged, the default) or, for vLLM 0.33, tagged with their kind and
the adapter's --lora-path (--vllm-extra-keys tagged). vLLM 0.33 with PYTHONHASHSEED unset seeds
SHA-256 hashes from the fixed string "vllm-none-hash" (--python-hash-seed vllm-none-hash). With
--hash-block-size below the block size, each store chunk is keyed by its last hash block.

SGLang (--format sglang…): --tokens-per-block is its --page-size (default 1); --extra-key and
--cache-salt seed the chain (sglang), --bigram for EAGLE, --prior-hash continues a parent's
chain; keys carry --backend-tag, --model (the served model name) and the TP (and PP) rank.
Token ids must fit in unsigned 32 bits (exit 3 otherwise).

--from-config with a vLLM or SGLang format reads vLLM's --kv-transfer-config JSON
(cache_prefix) or SGLang's --hicache-storage-backend-extra-config JSON (extra_backend_tag,
tp_lcm_size), from a file or given inline.

Formats:
` + cmdutil.FormatHelp(),
		Example: `  # hashes of two 4-token blocks
  kvctl hash --tokens-per-block 4 0 1 2 3 4 5 6 7

  # the keys a rank writes, one per line, for a prompt in a file
  kvctl hash --tokens-file prompt.json --model-key llama-3-8b \
      --world-size 4 --rank 2 --layer-group 0:65536 --keys-only

  # what a lookup must find, as JSON
  kvctl hash --tokens-file - --model-key m --layer-group 0:131072 --key-set lookup -o json < prompt.txt

  # the keys vLLM's Mooncake connector writes at TP rank 3 of 8
  kvctl hash --format vllm --python-hash-seed 0 --model meta-llama/Llama-3.1-8B-Instruct \
      --world-size 8 --rank 3 --num-kv-heads 8 --tokens-file prompt.json

  # SGLang HiCache pages of 64 tokens
  kvctl hash --format sglang --tokens-per-block 64 --model meta-llama/Llama-3.1-8B-Instruct \
      --tokens-file prompt.json`,
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.OutputFormat = cmdutil.OutputFormat(cmd)
			if err := opts.Bind(cmd, args); err != nil {
				return err
			}
			if opts.KeySet != KeySetSave && opts.KeySet != KeySetLookup {
				return cmdutil.FlagErrorf("invalid --key-set %q: want save or lookup", opts.KeySet)
			}
			if runF != nil {
				return runF(opts)
			}
			return runHash(cmd.Context(), opts)
		},
	}
	cmdutil.AddKeyFlags(cmd, &opts.KeyFlags)
	fl := cmd.Flags()
	fl.StringVar((*string)(&opts.KeySet), "key-set", string(KeySetSave), "keys per block: save (what this rank writes) or lookup (what a hit needs)")
	fl.BoolVar(&opts.KeysOnly, "keys-only", false, "print only the keys, one per line")
	_ = cmd.RegisterFlagCompletionFunc("key-set", cobra.FixedCompletions([]string{string(KeySetSave), string(KeySetLookup)}, cobra.ShellCompDirectiveNoFileComp))
	return cmd
}

// Block is one full block of the prompt.
type Block struct {
	Block int    `json:"block"`
	Start int    `json:"start"`
	End   int    `json:"end"`
	Hash  string `json:"hash"`
	// ChunkStart and ChunkEnd are the tokens of the store chunk the block's hash keys, when
	// they differ from the block's (vLLM with --hash-block-size below the block size).
	ChunkStart *int     `json:"chunk_start,omitempty"`
	ChunkEnd   *int     `json:"chunk_end,omitempty"`
	GroupKey   string   `json:"group_key,omitempty"`
	Keys       []string `json:"keys,omitempty"`
}

// Result is the output of `kvctl hash`.
type Result struct {
	Format string `json:"format"`
	// Engine is the engine whose keys the format reproduces (vLLM, SGLang; absent for
	// TensorRT-LLM's formats, whose output predates it).
	Engine          string `json:"engine,omitempty"`
	Tokens          int    `json:"tokens"`
	TokensPerBlock  int    `json:"tokens_per_block"`
	PromptLookahead int    `json:"prompt_lookahead"`
	// HashBlockSize is vLLM's hash block size when it differs from the block size.
	HashBlockSize int `json:"hash_block_size,omitempty"`
	// Model is the model name vLLM's or SGLang's keys carry.
	Model           string  `json:"model,omitempty"`
	Seed            string  `json:"seed"`
	Bypassed        bool    `json:"bypassed"`
	Namespace       string  `json:"namespace,omitempty"`
	ModelKey        string  `json:"model_key,omitempty"`
	Shard           string  `json:"shard,omitempty"`
	KeySet          string  `json:"key_set,omitempty"`
	UncoveredTokens int     `json:"uncovered_tokens"`
	Blocks          []Block `json:"blocks"`
}

// runHash hashes the prompt and prints the result.
func runHash(_ context.Context, opts *Options) error {
	tokens, err := opts.LoadPrompt(opts.IO)
	if err != nil {
		return err
	}
	res, err := compute(opts, tokens)
	if err != nil {
		return err
	}
	if opts.KeysOnly {
		w := bufio.NewWriterSize(opts.IO.Out, 64<<10)
		for _, b := range res.Blocks {
			for _, k := range b.Keys {
				w.WriteString(k)
				w.WriteByte('\n')
			}
		}
		return w.Flush()
	}
	return cmdutil.Print(opts.IO, opts.OutputFormat, res, func() cmdutil.Table { return rows(res) })
}

// compute derives the hashes and keys of tokens as opts describe, through the key recipe
// (keys.Recipe) the connector and kvctl serve use. Bad key inputs are usage errors.
func compute(opts *Options, tokens []int64) (*Result, error) {
	s, err := opts.Scheme()
	if err != nil {
		return nil, err
	}
	if s.Chain == nil {
		return computeScheme(opts, s, tokens)
	}
	if _, err = opts.Params(s); err != nil {
		return nil, err
	}
	rec, scope, err := opts.Recipe()
	if err != nil {
		return nil, err
	}
	set := keys.KeySetNone
	if opts.ModelKey != "" || len(rec.Groups) > 0 || opts.KeysOnly {
		set = KeySetSave
		if opts.KeySet == KeySetLookup {
			set = KeySetLookup
		}
		if err = cmdutil.CheckKeys(rec); err != nil {
			return nil, err
		}
	}
	d, err := rec.Derive(keys.Prompt{Tokens: tokens, Scope: scope, HasMultimodal: opts.HasMultimodal}, set)
	if err != nil {
		return nil, err
	}
	res := &Result{
		Format: string(rec.Format), Tokens: len(tokens), TokensPerBlock: opts.TokensPerBlock,
		PromptLookahead: opts.PromptLookahead, Seed: d.Seed.String(), Bypassed: d.Bypassed,
		UncoveredTokens: d.UncoveredTokens, Blocks: make([]Block, len(d.Blocks)),
	}
	if set != keys.KeySetNone {
		ns := rec.Namespace
		res.Namespace, res.ModelKey, res.Shard, res.KeySet = ns.Namespace, ns.ModelKey, ns.Shard(), string(opts.KeySet)
	}
	for i, b := range d.Blocks {
		res.Blocks[i] = Block{Block: b.Index, Start: b.Start, End: b.End, Hash: b.Hash.String(), GroupKey: b.GroupKey, Keys: b.Keys}
	}
	return res, nil
}

// computeScheme derives the hashes and keys of tokens through a scheme without a 16-byte chain
// (vLLM's, SGLang's). Keys are listed when the scheme has what it needs for them (--model where
// it takes one) or --keys-only asks for them.
func computeScheme(opts *Options, s *keys.Scheme, tokens []int64) (*Result, error) {
	p, err := opts.Params(s)
	if err != nil {
		return nil, err
	}
	set := keys.KeySetNone
	if opts.KeysOnly || !s.Takes(keys.InputModel) || opts.Model != "" {
		set = opts.KeySet
	}
	r, err := s.Derive(p, tokens, set)
	if err != nil {
		return nil, cmdutil.SchemeError(err)
	}
	res := &Result{
		Format: s.Name, Engine: s.Engine, Tokens: len(tokens), TokensPerBlock: p.TokensPerBlock,
		Seed: r.Seed.String(), UncoveredTokens: r.UncoveredTokens, Blocks: make([]Block, len(r.Blocks)),
		KeySet: string(set),
	}
	if p.HashBlockSize != 0 && p.HashBlockSize != p.TokensPerBlock {
		res.HashBlockSize = p.HashBlockSize
	}
	if set != keys.KeySetNone {
		res.Model = keys.KeyModelName(s, p)
	}
	for i, b := range r.Blocks {
		res.Blocks[i] = Block{Block: b.Index, Start: b.Start, End: b.End, Hash: b.Hash.String(), Keys: b.Keys}
		if b.ChunkEnd != 0 {
			cs, ce := b.ChunkStart, b.ChunkEnd
			res.Blocks[i].ChunkStart, res.Blocks[i].ChunkEnd = &cs, &ce
		}
	}
	return res, nil
}

func rows(res *Result) cmdutil.Table {
	t := cmdutil.Table{Header: []string{"BLOCK", "TOKENS", "HASH"}}
	withKeys := res.ModelKey != "" || res.KeySet != ""
	if withKeys {
		t.Header = append(t.Header, "KEY")
	}
	for _, b := range res.Blocks {
		base := []string{strconv.Itoa(b.Block), fmt.Sprintf("%d-%d", b.Start, b.End), b.Hash}
		if !withKeys {
			t.Rows = append(t.Rows, base)
			continue
		}
		for _, k := range b.Keys {
			t.Rows = append(t.Rows, append(append([]string(nil), base...), k))
		}
		if len(b.Keys) == 0 {
			// A vLLM hash block inside a store chunk: the chunk is keyed by its last block.
			t.Rows = append(t.Rows, append(base, "-"))
		}
	}
	if res.UncoveredTokens > 0 {
		// The tail after the last full block gets no hash; say so rather than leave it out.
		end := 0
		if n := len(res.Blocks); n > 0 {
			end = res.Blocks[n-1].End
		}
		row := []string{"-", fmt.Sprintf("%d-%d", end, end+res.UncoveredTokens), fmt.Sprintf("(uncovered: %d tokens, no hash)", res.UncoveredTokens)}
		if withKeys {
			row = append(row, "-")
		}
		t.Rows = append(t.Rows, row)
	}
	return t
}
