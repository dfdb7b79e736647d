package probe

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// Diagnosis codes: why a probe did not hit every block. They are a compatibility contract
// (they appear in `kvctl probe-pool -o json`): add, never rename.
const (
	// DiagFullHit: every block hit; nothing to explain.
	DiagFullHit = "full_hit"
	// DiagShortPrompt: the prompt is shorter than one block, so it has no block to hit.
	DiagShortPrompt = "prompt_shorter_than_block"
	// DiagMultimodalBypass: multimodal positions without a digest get no keys at all.
	DiagMultimodalBypass = "multimodal_without_digest"
	// DiagHoleAfterHit: the first blocks hit, then a hole; stored blocks behind it are recomputed.
	DiagHoleAfterHit = "hole_after_hit"
	// DiagPrefixThenMissing: the first blocks hit and the pool holds nothing of the rest.
	DiagPrefixThenMissing = "prefix_then_missing"
	// DiagFirstBlockMissing: the first block is missing but later blocks of the prompt are stored.
	DiagFirstBlockMissing = "first_block_missing"
	// DiagIncompleteBlocks: some keys of the prompt's blocks are stored, but no block is complete.
	DiagIncompleteBlocks = "incomplete_blocks"
	// DiagPoolEmpty: the pool holds no key at all.
	DiagPoolEmpty = "pool_empty"
	// DiagModelNotInPool: the pool holds no key of this model key.
	DiagModelNotInPool = "model_not_in_pool"
	// DiagOtherNamespace: pages of this model exist, under another namespace.
	DiagOtherNamespace = "other_namespace"
	// DiagOtherWorldSize: pages of this model exist, written by another world size (or with
	// attention DP on one side only).
	DiagOtherWorldSize = "other_world_size"
	// DiagOtherTokensPerBlock: pages of this model exist, with another tokens per block.
	DiagOtherTokensPerBlock = "other_tokens_per_block"
	// DiagOtherPageSize: pages of this model exist, with another page size in a layer group.
	DiagOtherPageSize = "other_page_size"
	// DiagOtherLayerGroup: pages of this model exist, but none of one of the probed layer groups.
	DiagOtherLayerGroup = "other_layer_group"
	// DiagOtherHashes: pages of this model with this layout exist, but none of this prompt's
	// block hashes: another salt, LoRA, multimodal digest, lookahead or key format, or other tokens.
	DiagOtherHashes = "other_hashes"
	// DiagListingUnavailable: the pool's key listing could not be read to say more.
	DiagListingUnavailable = "listing_unavailable"
	// DiagOtherHashAlgorithm: pages of this model and layout exist with digests of another
	// length: the engine hashes with another algorithm (vLLM's sha256 against xxhash).
	DiagOtherHashAlgorithm = "other_hash_algorithm"
)

// DefaultMaxScanKeys bounds how many keys of the pool's listing a diagnosis reads.
const DefaultMaxScanKeys = 200000

// Diagnosis is the likely reason a probe missed, as a stable code and a sentence; Flag names
// the flag and value that would match what the pool holds, when one would.
type Diagnosis struct {
	Code string `json:"code"`
	Text string `json:"text"`
	Flag string `json:"flag,omitempty"`
	// ScannedKeys is how many keys of the pool's listing were read; Truncated is set when the
	// listing held more than the scan reads.
	ScannedKeys int  `json:"scanned_keys,omitempty"`
	Truncated   bool `json:"truncated,omitempty"`
}

// PoolKey is a page key kvctl and TensorRT-LLM's mooncake_store write:
// "{namespace}/{model}/{shard}/lg{group}/t{T}b{bytes}/{hash}", shard "w{W}r{R}" or "replicated".
type PoolKey struct {
	Namespace, Model string
	World, Rank      int // 0, 0 for a replicated key
	Replicated       bool
	Group            int
	TokensPerBlock   int
	BytesPerPage     uint64
	Hash             string
}

// ParsePoolKey reads a page key; ok is false for anything else (the pool may hold other keys).
func ParsePoolKey(s string) (k PoolKey, ok bool) {
	parts := strings.Split(s, "/")
	n := len(parts)
	if n < 6 || parts[0] == "" {
		return k, false
	}
	k.Namespace, k.Model, k.Hash = parts[0], strings.Join(parts[1:n-4], "/"), parts[n-1]
	if k.Model == "" || len(k.Hash) != 32 || !isLowerHex(k.Hash) {
		return k, false
	}
	shard := parts[n-4]
	if shard == "replicated" {
		k.Replicated = true
	} else {
		w, r, found := strings.Cut(strings.TrimPrefix(shard, "w"), "r")
		if !found || !strings.HasPrefix(shard, "w") {
			return k, false
		}
		var err1, err2 error
		k.World, err1 = strconv.Atoi(w)
		k.Rank, err2 = strconv.Atoi(r)
		if err1 != nil || err2 != nil || k.World <= 0 || k.Rank < 0 || k.Rank >= k.World {
			return k, false
		}
	}
	g, ok := strings.CutPrefix(parts[n-3], "lg")
	if !ok {
		return k, false
	}
	var err error
	if k.Group, err = strconv.Atoi(g); err != nil || k.Group < 0 {
		return k, false
	}
	tb, ok := strings.CutPrefix(parts[n-2], "t")
	if !ok {
		return k, false
	}
	t, b, found := strings.Cut(tb, "b")
	if !found {
		return k, false
	}
	if k.TokensPerBlock, err = strconv.Atoi(t); err != nil || k.TokensPerBlock <= 0 {
		return k, false
	}
	if k.BytesPerPage, err = strconv.ParseUint(b, 10, 64); err != nil || k.BytesPerPage == 0 {
		return k, false
	}
	return k, true
}

func isLowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// MissInput is what a probe found, for DiagnoseMiss.
type MissInput struct {
	Tokens, TokensPerBlock int
	Blocks, HitBlocks      int
	Holes, MissingBlocks   int
	FirstHoleBlock         int // block index where the first hole starts (when Holes > 0)
	KeysPresent            int
	Bypassed               bool
	// Engine is the engine of a vLLM or SGLang format, whose keys are read by their own rules;
	// "" for TensorRT-LLM's.
	Engine string
	// Keys are every key the probe looked up, in block order, and Present says which the pool
	// holds (nil: none).
	Keys    []string
	Present []bool
}

// DiagnoseMiss says why a probe missed. Listing returns the pool's keys (the master's
// /get_all_keys); it is called only when the probe's own answer cannot tell, and at most
// maxScan of its keys are read (DefaultMaxScanKeys when 0).
func DiagnoseMiss(ctx context.Context, in MissInput, listing func(context.Context) ([]string, error), maxScan int) *Diagnosis {
	if maxScan <= 0 {
		maxScan = DefaultMaxScanKeys
	}
	switch {
	case in.Bypassed:
		return &Diagnosis{Code: DiagMultimodalBypass, Text: "the prompt has multimodal positions but no --mm-hash, so it gets no keys (TensorRT-LLM neither looks it up nor saves it)", Flag: "--mm-hash"}
	case in.Blocks == 0:
		return &Diagnosis{Code: DiagShortPrompt, Text: fmt.Sprintf("the prompt has %d tokens, fewer than one block of %d: only full blocks are stored and looked up", in.Tokens, in.TokensPerBlock)}
	case in.HitBlocks == in.Blocks:
		return &Diagnosis{Code: DiagFullHit, Text: fmt.Sprintf("all %d blocks hit", in.Blocks)}
	case in.HitBlocks > 0 && in.Holes > 0:
		return &Diagnosis{Code: DiagHoleAfterHit, Text: fmt.Sprintf("the first %d blocks hit, then a hole at block %d: the blocks stored behind it are recomputed because a prefix is served only up to its first gap (pages evicted or a save that failed)", in.HitBlocks, in.FirstHoleBlock)}
	case in.HitBlocks > 0:
		return &Diagnosis{Code: DiagPrefixThenMissing, Text: fmt.Sprintf("the first %d blocks hit and the pool holds nothing of the %d blocks after them: they were never saved or have been evicted", in.HitBlocks, in.MissingBlocks)}
	case in.Holes > 0:
		return &Diagnosis{Code: DiagFirstBlockMissing, Text: "the first block is missing while later blocks of the prompt are stored: the pool evicted or never received the start of the prefix, so nothing of it can hit"}
	}
	// Nothing hit and no block is stored: look at the keys the pool lacks (all of them, or
	// those a partly stored block lacks) against its listing.
	var missing []string
	for i, k := range in.Keys {
		if i >= len(in.Present) || !in.Present[i] {
			missing = append(missing, k)
		}
	}
	if in.Engine != "" {
		return diagnoseEngineMiss(ctx, in, missing, listing, maxScan)
	}
	ours := parseAll(missing)
	incomplete := func(d *Diagnosis) *Diagnosis {
		if in.KeysPresent == 0 {
			return d
		}
		switch d.Code {
		case DiagOtherNamespace, DiagOtherWorldSize, DiagOtherTokensPerBlock, DiagOtherPageSize, DiagOtherLayerGroup:
			d.Text = fmt.Sprintf("%d of the prompt's keys are stored but no block is complete: %s", in.KeysPresent, d.Text)
			return d
		}
		return &Diagnosis{Code: DiagIncompleteBlocks, ScannedKeys: d.ScannedKeys, Truncated: d.Truncated,
			Text: fmt.Sprintf("%d of the prompt's keys are stored but no block has all of its keys: a rank (or the replicated pages) did not save, or the probe's --world-size or --layer-group list differs from the engine's", in.KeysPresent)}
	}
	if len(ours) == 0 {
		return incomplete(&Diagnosis{Code: DiagOtherHashes, Text: "the pool holds none of this prompt's keys"})
	}
	keys, err := listing(ctx)
	if err != nil {
		return incomplete(&Diagnosis{Code: DiagListingUnavailable, Text: "the pool lacks this prompt's keys, and its key listing could not be read to say why: " + err.Error()})
	}
	d := &Diagnosis{}
	if len(keys) > maxScan {
		keys, d.Truncated = keys[:maxScan], true
	}
	d.ScannedKeys = len(keys)
	funnel(d, ours, parseAll(keys))
	d = incomplete(d)
	if d.Truncated {
		d.Text += fmt.Sprintf(" (from the first %d keys of the listing)", maxScan)
	}
	return d
}

func parseAll(keys []string) []PoolKey {
	out := make([]PoolKey, 0, len(keys))
	for _, s := range keys {
		if k, ok := ParsePoolKey(s); ok {
			out = append(out, k)
		}
	}
	return out
}

// funnel narrows the pool's keys down dimension by dimension, in the order a mismatch is most
// likely, and reports the first dimension where nothing of ours is left.
func funnel(d *Diagnosis, ours, pool []PoolKey) {
	me := ours[0]
	var world int
	for _, k := range ours {
		if !k.Replicated {
			world = k.World
			break
		}
	}
	if len(pool) == 0 {
		d.Code, d.Text = DiagPoolEmpty, "the pool holds no page keys at all: nothing has been saved yet, or the engines write to another pool"
		return
	}
	sameModel := filter(pool, func(k PoolKey) bool { return k.Model == me.Model })
	if len(sameModel) == 0 {
		d.Code = DiagModelNotInPool
		d.Text = fmt.Sprintf("the pool holds no pages of model key %q; it holds pages of %s", me.Model, top(pool, func(k PoolKey) string { return strconv.Quote(k.Model) }, 3))
		if m := mostCommon(pool, func(k PoolKey) string { return k.Model }); m != "" {
			d.Flag = "--model-key " + m
		}
		return
	}
	sameNS := filter(sameModel, func(k PoolKey) bool { return k.Namespace == me.Namespace })
	if len(sameNS) == 0 {
		ns := mostCommon(sameModel, func(k PoolKey) string { return k.Namespace })
		d.Code, d.Flag = DiagOtherNamespace, "--namespace "+ns
		d.Text = fmt.Sprintf("the pool holds pages of model %q under namespace %q, not %q", me.Model, ns, me.Namespace)
		return
	}
	if world > 0 {
		sameWorld := filter(sameNS, func(k PoolKey) bool { return k.Replicated || k.World == world })
		if len(filter(sameWorld, func(k PoolKey) bool { return !k.Replicated })) == 0 {
			sharded := filter(sameNS, func(k PoolKey) bool { return !k.Replicated })
			if len(sharded) > 0 {
				w := mostCommon(sharded, func(k PoolKey) string { return strconv.Itoa(k.World) })
				d.Code, d.Flag = DiagOtherWorldSize, "--world-size "+w
				d.Text = fmt.Sprintf("the pool holds pages of model %q written by a world size of %s, not %d (under attention DP the world in keys is 1)", me.Model, w, world)
				return
			}
		}
		sameNS = sameWorld
	}
	sameT := filter(sameNS, func(k PoolKey) bool { return k.TokensPerBlock == me.TokensPerBlock })
	if len(sameT) == 0 {
		t := mostCommon(sameNS, func(k PoolKey) string { return strconv.Itoa(k.TokensPerBlock) })
		d.Code, d.Flag = DiagOtherTokensPerBlock, "--tokens-per-block "+t
		d.Text = fmt.Sprintf("the pool holds pages of model %q with %s tokens per block, not %d", me.Model, t, me.TokensPerBlock)
		return
	}
	groups := map[int]uint64{}
	for _, k := range ours {
		if !k.Replicated {
			groups[k.Group] = k.BytesPerPage
		}
	}
	gs := make([]int, 0, len(groups))
	for g := range groups {
		gs = append(gs, g)
	}
	sort.Ints(gs)
	for _, g := range gs {
		inGroup := filter(sameT, func(k PoolKey) bool { return !k.Replicated && k.Group == g })
		if len(inGroup) == 0 {
			d.Code = DiagOtherLayerGroup
			d.Text = fmt.Sprintf("the pool holds pages of model %q but none of layer group %d; it holds layer groups %s", me.Model, g,
				top(filter(sameT, func(k PoolKey) bool { return !k.Replicated }), func(k PoolKey) string { return strconv.Itoa(k.Group) }, 4))
			return
		}
		if len(filter(inGroup, func(k PoolKey) bool { return k.BytesPerPage == groups[g] })) == 0 {
			b := mostCommon(inGroup, func(k PoolKey) string { return strconv.FormatUint(k.BytesPerPage, 10) })
			d.Code, d.Flag = DiagOtherPageSize, fmt.Sprintf("--layer-group %d:%s", g, b)
			d.Text = fmt.Sprintf("the pool holds pages of model %q in layer group %d of %s bytes, not %d", me.Model, g, b, groups[g])
			return
		}
	}
	d.Code = DiagOtherHashes
	d.Text = fmt.Sprintf("the pool holds %d pages of model %q with this layout but none of this prompt's block hashes: a different cache salt, LoRA, multimodal digest, prompt lookahead or key format (--format), or different tokens", len(sameT), me.Model)
}

func filter(ks []PoolKey, keep func(PoolKey) bool) []PoolKey {
	var out []PoolKey
	for _, k := range ks {
		if keep(k) {
			out = append(out, k)
		}
	}
	return out
}

func counts(ks []PoolKey, by func(PoolKey) string) ([]string, map[string]int) {
	n := map[string]int{}
	for _, k := range ks {
		n[by(k)]++
	}
	vals := make([]string, 0, len(n))
	for v := range n {
		vals = append(vals, v)
	}
	sort.Slice(vals, func(i, j int) bool {
		if n[vals[i]] != n[vals[j]] {
			return n[vals[i]] > n[vals[j]]
		}
		return vals[i] < vals[j]
	})
	return vals, n
}

func mostCommon(ks []PoolKey, by func(PoolKey) string) string {
	vals, _ := counts(ks, by)
	if len(vals) == 0 {
		return ""
	}
	return vals[0]
}

// top lists the most common values, with their page counts, at most n of them.
func top(ks []PoolKey, by func(PoolKey) string, n int) string {
	vals, c := counts(ks, by)
	var parts []string
	for i, v := range vals {
		if i == n {
			parts = append(parts, fmt.Sprintf("and %d more", len(vals)-n))
			break
		}
		parts = append(parts, fmt.Sprintf("%s (%d pages)", v, c[v]))
	}
	return strings.Join(parts, ", ")
}
