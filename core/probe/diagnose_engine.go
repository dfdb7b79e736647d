package probe

import (
	"context"
	"fmt"
	"strings"
)

// engineKey is a vLLM or SGLang pool key cut around its block hash: Model is what comes before
// the rank fields (vLLM: [cache_prefix@]model; SGLang: [tag_][model_]), Layout the rank and
// group fields, Hash the hex digest.
type engineKey struct {
	Model, Layout, Hash string
}

// parseEngineKey cuts s by engine's layout; ok is false for a key of another shape.
func parseEngineKey(engine, s string) (k engineKey, ok bool) {
	if engine == "vLLM" {
		i := strings.Index(s, "@tp_rank:")
		j := strings.LastIndexByte(s, '@')
		if i < 0 || j <= i {
			return k, false
		}
		k = engineKey{Model: s[:i], Layout: s[i:j], Hash: s[j+1:]}
		return k, len(k.Hash) >= 16 && isLowerHex(k.Hash)
	}
	// SGLang: the 64-hex page hash between '_'-separated parts.
	parts := strings.Split(s, "_")
	for i, p := range parts {
		if len(p) == 64 && isLowerHex(p) {
			model := strings.Join(parts[:i], "_")
			if i > 0 {
				model += "_"
			}
			return engineKey{Model: model, Layout: strings.Join(parts[i+1:], "_"), Hash: p}, true
		}
	}
	return k, false
}

// diagnoseEngineMiss is DiagnoseMiss for vLLM's and SGLang's keys: it narrows the pool's
// listing down by model, then digest length, then rank layout, and otherwise blames the hashes,
// naming the engine's inputs that change them.
func diagnoseEngineMiss(ctx context.Context, in MissInput, missing []string, listing func(context.Context) ([]string, error), maxScan int) *Diagnosis {
	var ours []engineKey
	for _, s := range missing {
		if k, ok := parseEngineKey(in.Engine, s); ok {
			ours = append(ours, k)
		}
	}
	hashes := "the engine hashes other tokens, or with another page size, extra_key or cache_salt, or bigram mode"
	if in.Engine == "vLLM" {
		hashes = "the engine ran with another PYTHONHASHSEED (or with none: its keys are then random per process and no probe can find them), another --prefix-caching-hash-algo, block size or hash block size, or the request had another LoRA, cache salt, multimodal input or tokens"
	}
	incomplete := func(d *Diagnosis) *Diagnosis {
		if in.KeysPresent > 0 {
			d.Text = fmt.Sprintf("%d of the prompt's keys are stored but no block has all of its keys: %s", in.KeysPresent, d.Text)
			if d.Code == DiagOtherHashes {
				d.Code, d.Text = DiagIncompleteBlocks, fmt.Sprintf("%d of the prompt's keys are stored but no block has all of its keys: a rank did not save, or the probe's ranks (--world-size, --num-kv-heads, --pp-size…) differ from the engine's", in.KeysPresent)
			}
		}
		return d
	}
	if len(ours) == 0 {
		return incomplete(&Diagnosis{Code: DiagOtherHashes, Text: "the pool holds none of this prompt's keys"})
	}
	all, err := listing(ctx)
	if err != nil {
		return incomplete(&Diagnosis{Code: DiagListingUnavailable, Text: "the pool lacks this prompt's keys, and its key listing could not be read to say why: " + err.Error()})
	}
	d := &Diagnosis{}
	if len(all) > maxScan {
		all, d.Truncated = all[:maxScan], true
	}
	d.ScannedKeys = len(all)
	var pool []engineKey
	for _, s := range all {
		if k, ok := parseEngineKey(in.Engine, s); ok {
			pool = append(pool, k)
		}
	}
	me := ours[0]
	modelFlag := "--model or --backend-tag"
	if in.Engine == "vLLM" {
		modelFlag = "--model or --cache-prefix"
	}
	switch same := filterEngine(pool, func(k engineKey) bool { return k.Model == me.Model }); {
	case len(all) == 0:
		d.Code, d.Text = DiagPoolEmpty, "the pool holds no key at all"
	case len(pool) == 0:
		d.Code, d.Text = DiagModelNotInPool, fmt.Sprintf("the pool holds no %s key", in.Engine)
	case len(same) == 0:
		d.Code, d.Text = DiagModelNotInPool, fmt.Sprintf("the pool holds %s keys, but none starting %q; it holds %s (check %s)", in.Engine, me.Model, topEngine(pool, func(k engineKey) string { return k.Model }), modelFlag)
	default:
		sameLen := filterEngine(same, func(k engineKey) bool { return len(k.Hash) == len(me.Hash) })
		sameLayout := filterEngine(sameLen, func(k engineKey) bool { return containsLayout(ours, k.Layout) })
		switch {
		case len(sameLen) == 0:
			d.Code, d.Flag = DiagOtherHashAlgorithm, "--format"
			d.Text = fmt.Sprintf("pages of %q exist with %d-character hashes, and this probe's have %d: the engine hashes with another algorithm (vLLM: sha256* gives 64, xxhash* 32)", me.Model, len(same[0].Hash), len(me.Hash))
		case len(sameLayout) == 0:
			d.Code = DiagOtherWorldSize
			d.Text = fmt.Sprintf("pages of %q exist, but under other ranks or groups: %s (check --world-size, --rank, --num-kv-heads, --mla, --pp-size and, for vLLM, --kv-group)", me.Model, topEngine(sameLen, func(k engineKey) string { return k.Layout }))
		default:
			d.Code = DiagOtherHashes
			d.Text = fmt.Sprintf("pages of %q with this probe's layout exist, but none of this prompt's hashes: %s", me.Model, hashes)
		}
	}
	d = incomplete(d)
	if d.Truncated {
		d.Text += fmt.Sprintf(" (from the first %d keys of the listing)", maxScan)
	}
	return d
}

func filterEngine(ks []engineKey, keep func(engineKey) bool) []engineKey {
	var out []engineKey
	for _, k := range ks {
		if keep(k) {
			out = append(out, k)
		}
	}
	return out
}

func containsLayout(ks []engineKey, layout string) bool {
	for _, k := range ks {
		if k.Layout == layout {
			return true
		}
	}
	return false
}

// topEngine names the three most common values of by, with their counts.
func topEngine(ks []engineKey, by func(engineKey) string) string {
	counts := map[string]int{}
	var order []string
	for _, k := range ks {
		v := by(k)
		if counts[v] == 0 {
			order = append(order, v)
		}
		counts[v]++
	}
	// Stable: by count, then first seen.
	for i := 1; i < len(order); i++ {
		for j := i; j > 0 && counts[order[j]] > counts[order[j-1]]; j-- {
			order[j], order[j-1] = order[j-1], order[j]
		}
	}
	var parts []string
	for i, v := range order {
		if i == 3 {
			parts = append(parts, fmt.Sprintf("and %d more", len(order)-3))
			break
		}
		parts = append(parts, fmt.Sprintf("%q (%d keys)", v, counts[v]))
	}
	return strings.Join(parts, ", ")
}
