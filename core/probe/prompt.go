package probe

import (
	"context"
	"errors"

	"github.com/kvctl/kvctl/core/keys"
	"github.com/kvctl/kvctl/mooncake/masterrpc"
)

// Block states in a Report.
const (
	StateHit     = "hit"     // part of the served prefix
	StateHole    = "hole"    // incomplete, with a complete block behind it
	StateStored  = "stored"  // complete, but behind a hole: recomputed
	StateMissing = "missing" // incomplete, and so is every block after it
)

// Queries a probe makes, as a Report names them.
const (
	QueryBatchQueryKeys = "batch_query_keys"
	QueryQueryKey       = "query_key"
	// QueryBatchExistKey is the query a probe over the master's RPC address makes.
	QueryBatchExistKey = "BatchExistKey"
)

// PromptKeys is a prompt as a probe asks about it: the key recipe, its length and the keys a
// lookup needs for each of its full blocks (keys.KeySetLookup). A prompt derived through a
// scheme without a 16-byte chain (vLLM's, SGLang's) has Scheme, Params and Result instead of
// Recipe and Derivation.
type PromptKeys struct {
	Recipe     keys.Recipe
	Tokens     int
	Derivation *keys.Derivation

	Scheme *keys.Scheme
	Params *keys.Params
	Result *keys.Result
}

// DeriveSchemeKeys derives the lookup keys of tokens through scheme s; each store chunk (a
// block that carries keys) is one block of the probe.
func DeriveSchemeKeys(s *keys.Scheme, p *keys.Params, tokens []int64) (*PromptKeys, error) {
	r, err := s.Derive(p, tokens, keys.KeySetLookup)
	if err != nil {
		return nil, err
	}
	return &PromptKeys{Tokens: len(tokens), Scheme: s, Params: p, Result: r}, nil
}

// probeBlock is one block a probe looks up.
type probeBlock struct {
	index, start, end int
	hash              string
	keys              []string
}

// blocks returns the blocks of p to look up, and the report's description of its keys.
func (p *PromptKeys) blocks(res *Report) []probeBlock {
	var out []probeBlock
	if p.Result == nil {
		rec, d := p.Recipe, p.Derivation
		res.Format, res.Namespace, res.ModelKey = string(rec.Format), rec.Namespace.Namespace, rec.Namespace.ModelKey
		res.TokensPerBlock, res.PromptLookahead = rec.TokensPerBlock, rec.PromptLookahead
		res.UncoveredTokens, res.Bypassed = d.UncoveredTokens, d.Bypassed
		for _, b := range d.Blocks {
			out = append(out, probeBlock{b.Index, b.Start, b.End, b.Hash.String(), b.Keys})
		}
		return out
	}
	r := p.Result
	res.Format, res.Engine, res.ModelKey = p.Scheme.Name, p.Scheme.Engine, keys.KeyModelName(p.Scheme, p.Params)
	res.Namespace = p.Params.CachePrefix
	if p.Scheme.Engine == keys.EngineSGLang {
		res.Namespace = p.Params.BackendTag
	}
	res.TokensPerBlock, res.UncoveredTokens = r.KeyTokensPerBlock, p.Tokens
	for _, b := range r.KeyedBlocks() {
		start, end := b.Start, b.End
		if b.ChunkEnd != 0 {
			start, end = b.ChunkStart, b.ChunkEnd
		}
		out = append(out, probeBlock{len(out), start, end, b.Hash.String(), b.Keys})
		res.UncoveredTokens = p.Tokens - end
	}
	return out
}

// DerivePromptKeys derives the lookup keys of p through rec.
func DerivePromptKeys(rec keys.Recipe, p keys.Prompt) (*PromptKeys, error) {
	d, err := rec.Derive(p, keys.KeySetLookup)
	if err != nil {
		return nil, err
	}
	return &PromptKeys{Recipe: rec, Tokens: len(p.Tokens), Derivation: d}, nil
}

// KeyPresence is one key a block needs and whether the pool holds it.
type KeyPresence struct {
	Key     string `json:"key"`
	Present bool   `json:"present"`
}

// BlockPresence is one full block of the prompt and what the pool holds of it.
type BlockPresence struct {
	Block       int           `json:"block"`
	Start       int           `json:"start"`
	End         int           `json:"end"`
	Hash        string        `json:"hash"`
	State       string        `json:"state"`
	Complete    bool          `json:"complete"`
	PresentKeys int           `json:"present_keys"`
	NeededKeys  int           `json:"needed_keys"`
	Keys        []KeyPresence `json:"keys"`
}

// HoleReport is a run of incomplete blocks with stored blocks behind it, in blocks and tokens.
type HoleReport struct {
	StartBlock             int   `json:"start_block"`
	Blocks                 int   `json:"blocks"`
	StartToken             int   `json:"start_token"`
	EndToken               int   `json:"end_token"`
	StoredBlocksBehind     int   `json:"stored_blocks_behind"`
	RecomputedStoredTokens int64 `json:"recomputed_stored_tokens"`
}

// Summary is a probe in a few numbers.
type Summary struct {
	Blocks                 int   `json:"blocks"`
	HitBlocks              int   `json:"hit_blocks"`
	HitTokens              int   `json:"hit_tokens"`
	Holes                  int   `json:"holes"`
	HoleBlocks             int   `json:"hole_blocks"`
	MissingBlocks          int   `json:"missing_blocks"`
	RecomputedStoredTokens int64 `json:"recomputed_stored_tokens"`
	KeysChecked            int   `json:"keys_checked"`
	KeysPresent            int   `json:"keys_present"`
}

// Report is what a pool holds of a prompt: block by block, its holes, a summary and, when it
// missed, the likely reason. It is the output of `kvctl probe-pool`; field names are a
// compatibility contract.
type Report struct {
	Pool   string `json:"pool"`
	Target string `json:"target"`
	Query  string `json:"query"`
	Format string `json:"format"`
	// Engine is the engine of a vLLM or SGLang format (absent for TensorRT-LLM's formats, whose
	// reports predate it).
	Engine          string          `json:"engine,omitempty"`
	Namespace       string          `json:"namespace"`
	ModelKey        string          `json:"model_key"`
	Tokens          int             `json:"tokens"`
	TokensPerBlock  int             `json:"tokens_per_block"`
	PromptLookahead int             `json:"prompt_lookahead"`
	UncoveredTokens int             `json:"uncovered_tokens"`
	Bypassed        bool            `json:"bypassed"`
	Blocks          []BlockPresence `json:"blocks"`
	Holes           []HoleReport    `json:"holes"`
	Summary         Summary         `json:"summary"`
	// Diagnosis is the likely reason for a miss, as a stable code and a sentence.
	Diagnosis *Diagnosis `json:"diagnosis,omitempty"`
}

// Admin looks every key of p up at an admin address and analyses the answer: with the
// read-only /batch_query_keys, or with /query_key key by key when renewLeases is set (which
// grants each present key a read lease). A failed request is a *PoolError.
func Admin(ctx context.Context, t *Target, p *PromptKeys, renewLeases bool) (*Report, error) {
	res, err := probeAdmin(ctx, t, p, renewLeases)
	if err != nil {
		return nil, &PoolError{Addr: t.Addr(), Timeout: t.Timeout, Err: err}
	}
	return res, nil
}

func probeAdmin(ctx context.Context, t *Target, p *PromptKeys, renewLeases bool) (*Report, error) {
	kind, err := t.Kind(ctx)
	if err != nil {
		return nil, err
	}
	query := QueryBatchQueryKeys
	if renewLeases {
		query = QueryQueryKey
	}
	res, err := analyzePrompt(ctx, t.Addr(), kind, query, p, func(ctx context.Context, keys []string) ([]bool, error) {
		return t.Exists(ctx, keys, renewLeases)
	})
	if err != nil {
		return nil, err
	}
	res.Diagnosis = diagnoseReport(ctx, t.Admin.AllKeys, res)
	return res, nil
}

// errNoListing is why a probe over a master's RPC address cannot read the pool's keys.
var errNoListing = errors.New("a master's RPC address lists no keys; probe its HTTP admin address (port 9003) to say more")

// RPC looks every key of p up with the master's BatchExistKey over its RPC address addr
// (host:port) and analyses the answer. A failed call is a *PoolError.
func RPC(ctx context.Context, c *masterrpc.Client, addr string, p *PromptKeys) (*Report, error) {
	pool := RPCScheme + addr
	res, err := analyzePrompt(ctx, pool, KindMasterRPC, QueryBatchExistKey, p, func(ctx context.Context, keys []string) ([]bool, error) {
		return RPCExists(ctx, c, keys)
	})
	if err != nil {
		return nil, &PoolError{Addr: pool, RPC: true, Err: err}
	}
	res.Diagnosis = diagnoseReport(ctx, func(context.Context) ([]string, error) { return nil, errNoListing }, res)
	return res, nil
}

// analyzePrompt asks exists about every key of p and reports blocks, holes and the summary.
func analyzePrompt(ctx context.Context, pool, kind, query string, p *PromptKeys, exists func(context.Context, []string) ([]bool, error)) (*Report, error) {
	res := &Report{
		Pool: pool, Target: kind, Query: query, Tokens: p.Tokens,
		Blocks: []BlockPresence{}, Holes: []HoleReport{},
	}
	blocks := p.blocks(res)
	var all []string
	for _, b := range blocks {
		all = append(all, b.keys...)
	}
	present, err := exists(ctx, all)
	if err != nil {
		return nil, err
	}
	complete := make([]bool, len(blocks))
	i := 0
	for bi, b := range blocks {
		blk := BlockPresence{Block: b.index, Start: b.start, End: b.end, Hash: b.hash, NeededKeys: len(b.keys), Keys: make([]KeyPresence, len(b.keys))}
		for ki, k := range b.keys {
			blk.Keys[ki] = KeyPresence{Key: k, Present: present[i]}
			if present[i] {
				blk.PresentKeys++
			}
			i++
		}
		blk.Complete = blk.PresentKeys == blk.NeededKeys
		complete[bi] = blk.Complete
		res.Blocks = append(res.Blocks, blk)
		res.Summary.KeysChecked += blk.NeededKeys
		res.Summary.KeysPresent += blk.PresentKeys
	}
	t := res.TokensPerBlock
	a := Analyze(complete, t)
	for bi := range res.Blocks {
		switch {
		case bi < a.Hit:
			res.Blocks[bi].State = StateHit
		case bi >= len(res.Blocks)-a.MissingTail:
			res.Blocks[bi].State = StateMissing
		case res.Blocks[bi].Complete:
			res.Blocks[bi].State = StateStored
		default:
			res.Blocks[bi].State = StateHole
		}
	}
	for _, h := range a.Holes {
		res.Holes = append(res.Holes, HoleReport{
			StartBlock: h.Start, Blocks: h.Blocks, StartToken: h.Start * t, EndToken: (h.Start + h.Blocks) * t,
			StoredBlocksBehind: h.StoredBlocks, RecomputedStoredTokens: h.RecomputedStoredTokens,
		})
	}
	res.Summary.Blocks = a.Blocks
	res.Summary.HitBlocks = a.Hit
	res.Summary.HitTokens = a.Hit * t
	res.Summary.Holes = len(a.Holes)
	res.Summary.HoleBlocks = int(a.Stats.HoleBlocks)
	res.Summary.MissingBlocks = a.MissingTail
	res.Summary.RecomputedStoredTokens = a.Stats.RecomputedStoredTokens
	return res, nil
}

// diagnoseReport explains what res missed, reading the pool's key listing (bounded) only when
// the probe's own answer cannot tell.
func diagnoseReport(ctx context.Context, listing func(context.Context) ([]string, error), res *Report) *Diagnosis {
	var ks []string
	in := MissInput{
		Tokens: res.Tokens, TokensPerBlock: res.TokensPerBlock,
		Blocks: res.Summary.Blocks, HitBlocks: res.Summary.HitBlocks,
		Holes: res.Summary.Holes, MissingBlocks: res.Summary.MissingBlocks,
		KeysPresent: res.Summary.KeysPresent, Bypassed: res.Bypassed, Engine: res.Engine,
	}
	for _, b := range res.Blocks {
		for _, k := range b.Keys {
			ks = append(ks, k.Key)
			in.Present = append(in.Present, k.Present)
		}
	}
	in.Keys = ks
	if len(res.Holes) > 0 {
		in.FirstHoleBlock = res.Holes[0].StartBlock
	}
	return DiagnoseMiss(ctx, in, listing, 0)
}
