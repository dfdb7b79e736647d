package radix

import (
	"testing"

	"github.com/kvctl/kvctl/core/keys"
	"pgregory.net/rapid"
)

const propT = 4

// genPrompt draws a prompt over a tiny alphabet so that prompts share prefixes often.
func genPrompt(t *rapid.T, label string) []int64 {
	return rapid.SliceOfN(rapid.Int64Range(0, 2), 1, 5*propT).Draw(t, label)
}

// expectedRaw is the content-divergence depth computed by brute force over the prompts
// inserted: the most leading full blocks any prompt shares with q, plus the longest common
// prefix of the next block with the same block of a prompt that shares them.
func expectedRaw(prompts [][]int64, q []int64, T int) int {
	best := 0
	shared := func(p []int64) int {
		k := 0
		for (k+1)*T <= len(q) && (k+1)*T <= len(p) {
			for i := k * T; i < (k+1)*T; i++ {
				if p[i] != q[i] {
					return k
				}
			}
			k++
		}
		return k
	}
	kmax := 0
	for _, p := range prompts {
		kmax = max(kmax, shared(p))
	}
	for _, p := range prompts {
		if shared(p) != kmax {
			continue
		}
		l := 0
		for i := kmax * T; i < len(p) && i < len(q) && i < (kmax+1)*T && p[i] == q[i]; i++ {
			l++
		}
		best = max(best, l)
	}
	return kmax*T + best
}

func TestPropertyMatch(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		tr, err := New(Config{TokensPerBlock: propT, StoreTokens: true})
		if err != nil {
			rt.Fatal(err)
		}
		prompts := rapid.SliceOfN(rapid.Custom(func(t *rapid.T) []int64 { return genPrompt(t, "p") }), 1, 8).Draw(rt, "prompts")
		for _, p := range prompts {
			if _, err := tr.InsertChain(nil, Root, blocksOf(p, propT)); err != nil {
				rt.Fatal(err)
			}
		}
		if err := tr.Check(); err != nil {
			rt.Fatal(err)
		}
		q := genPrompt(rt, "query")
		align := rapid.SampledFrom([]int{1, 2, 4}).Draw(rt, "alignment")
		raw := expectedRaw(prompts, q, propT)
		prev := -1
		for backoff := 0; backoff <= len(q)+1; backoff++ {
			m, err := tr.Match(queryOf(q, propT), MatchOptions{Backoff: backoff, Alignment: align, PartialReuse: true})
			if err != nil {
				rt.Fatal(err)
			}
			if m.RawTokens != raw {
				rt.Fatalf("RawTokens = %d, brute force says %d", m.RawTokens, raw)
			}
			if m.Tokens > raw || m.Tokens > len(q) {
				rt.Fatalf("match %d exceeds the inserted prefix %d", m.Tokens, raw)
			}
			if m.Tokens%align != 0 {
				rt.Fatalf("match %d not a multiple of %d", m.Tokens, align)
			}
			if prev >= 0 && m.Tokens > prev {
				rt.Fatalf("backoff %d grew the match from %d to %d", backoff, prev, m.Tokens)
			}
			if m.Tokens != Trim(raw, backoff, align) {
				rt.Fatalf("backoff %d: Tokens %d, want %d", backoff, m.Tokens, Trim(raw, backoff, align))
			}
			prev = m.Tokens
		}
	})
}

func TestPropertyPrune(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		tr, _ := New(Config{TokensPerBlock: propT})
		n := rapid.IntRange(1, 6).Draw(rt, "blocks")
		p := seq(0, n*propT)
		ids, _ := tr.InsertChain(nil, Root, blocksOf(p, propT))
		for i, id := range ids {
			c := Coverage{
				Attention: rapid.IntRange(0, propT).Draw(rt, "attn"),
				SSM:       rapid.IntRange(0, propT).Draw(rt, "ssm"),
			}
			if err := tr.SetCoverage(id, c); err != nil {
				rt.Fatalf("block %d: %v", i, err)
			}
		}
		rules := PruneRules{
			SSM:        rapid.Bool().Draw(rt, "ssm rule"),
			Attention:  rapid.Bool().Draw(rt, "attention rule"),
			Window:     rapid.IntRange(0, 3*propT).Draw(rt, "window"),
			SinkTokens: rapid.IntRange(0, propT).Draw(rt, "sink"),
		}
		align := rapid.SampledFrom([]int{1, 2, 4}).Draw(rt, "alignment")
		backoff := rapid.IntRange(0, len(p)).Draw(rt, "backoff")
		m, err := tr.Match(queryOf(p, propT), MatchOptions{Backoff: backoff, Alignment: align, Prune: rules})
		if err != nil {
			rt.Fatal(err)
		}
		if m.Tokens > Trim(len(p), backoff, align) || m.Tokens%align != 0 {
			rt.Fatalf("pruned match %d longer than %d or unaligned", m.Tokens, Trim(len(p), backoff, align))
		}
		// The result satisfies every rule it was pruned by.
		e := m.Tokens
		if rules.SSM && e > 0 {
			ok := false
			for i := range ids {
				info, _ := tr.Info(ids[i])
				if info.Coverage.SSM > 0 && i*propT+info.Coverage.SSM == e {
					ok = true
				}
			}
			if !ok {
				rt.Fatalf("SSM rule: endpoint %d is no snapshot", e)
			}
		}
		if rules.Attention {
			for i := 0; i*propT < e; i++ {
				s, end := i*propT, min((i+1)*propT, e)
				if rules.Window > 0 && s >= rules.SinkTokens && end <= e-rules.Window {
					continue
				}
				info, _ := tr.Info(ids[i])
				if info.Coverage.Attention < end-s {
					rt.Fatalf("attention rule: block %d covers %d of %d", i, info.Coverage.Attention, end-s)
				}
			}
		}
	})
}

func TestPropertyOps(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		tr, _ := New(Config{TokensPerBlock: propT, StoreTokens: rapid.Bool().Draw(rt, "store")})
		var held []NodeID
		steps := rapid.IntRange(1, 60).Draw(rt, "steps")
		for s := 0; s < steps; s++ {
			switch rapid.IntRange(0, 5).Draw(rt, "op") {
			case 0:
				p := genPrompt(rt, "insert")
				if _, err := tr.InsertChain(nil, Root, blocksOf(p, propT)); err != nil {
					rt.Fatal(err)
				}
			case 1:
				p := genPrompt(rt, "claim")
				m, err := tr.Match(queryOf(p, propT), MatchOptions{PartialReuse: true, Backoff: rapid.IntRange(0, 5).Draw(rt, "backoff")})
				if err != nil {
					rt.Fatal(err)
				}
				if err := tr.Acquire(m.Blocks...); err != nil {
					rt.Fatal(err)
				}
				held = append(held, m.Blocks...)
			case 2:
				if len(held) > 0 {
					i := rapid.IntRange(0, len(held)-1).Draw(rt, "release")
					if err := tr.Release(held[i]); err != nil {
						rt.Fatal(err)
					}
					held = append(held[:i], held[i+1:]...)
				}
			case 3:
				var evicted []NodeID
				tr.Evict(rapid.IntRange(1, 5).Draw(rt, "evict"), func(id NodeID) { evicted = append(evicted, id) })
				for _, e := range evicted {
					for _, h := range held {
						if h == e {
							rt.Fatalf("evicted referenced node %d", e)
						}
					}
				}
			case 4:
				p := genPrompt(rt, "touch")
				m, _ := tr.Match(queryOf(p, propT), MatchOptions{})
				tr.Touch(m.Blocks...)
			case 5:
				if len(held) > 0 {
					// A held node cannot be removed.
					if err := tr.Remove(held[0]); err == nil {
						rt.Fatalf("removed held node %d", held[0])
					}
				}
			}
			if err := tr.Check(); err != nil {
				rt.Fatalf("step %d: %v", s, err)
			}
			for _, h := range held {
				if info, err := tr.Info(h); err != nil || info.Refs < 1 {
					rt.Fatalf("held node %d: %+v %v", h, info, err)
				}
			}
		}
		for _, h := range held {
			if err := tr.Release(h); err != nil {
				rt.Fatal(err)
			}
		}
		tr.Evict(1<<30, nil)
		if tr.Len() != 0 {
			rt.Fatalf("%d blocks left after releasing and evicting all", tr.Len())
		}
		if err := tr.Check(); err != nil {
			rt.Fatal(err)
		}
	})
}

func TestPropertyPoolIndex(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		p := NewPoolIndex(0)
		present := map[keys.Hash]bool{}
		prefixes := map[keys.Hash][]keys.Hash{}
		genChain := func(label string) []keys.Hash {
			ids := rapid.SliceOfN(rapid.IntRange(0, 2), 1, 6).Draw(rt, label)
			c := chainOf(ids...)
			for i, k := range c {
				prefixes[k] = c[:i]
			}
			return c
		}
		for s := rapid.IntRange(1, 40).Draw(rt, "steps"); s > 0; s-- {
			if rapid.Bool().Draw(rt, "insert") {
				c := genChain("chain")
				if _, err := p.Insert(c); err != nil {
					rt.Fatal(err)
				}
				for _, k := range c {
					present[k] = true
				}
			} else {
				c := genChain("victim")
				k := c[rapid.IntRange(0, len(c)-1).Draw(rt, "at")]
				if got := p.Remove(k); got != present[k] {
					rt.Fatalf("Remove = %v, model says %v", got, present[k])
				}
				delete(present, k)
			}
			if p.Len() != len(present) {
				rt.Fatalf("Len = %d, model %d", p.Len(), len(present))
			}
			if err := p.t.Check(); err != nil {
				rt.Fatal(err)
			}
			exists := map[keys.Hash]bool{}
			for k := range present {
				exists[k] = true
				for _, a := range prefixes[k] {
					exists[a] = true
				}
			}
			if p.Nodes() != len(exists) {
				rt.Fatalf("Nodes = %d, model %d (orphan holes?)", p.Nodes(), len(exists))
			}
			c := genChain("probe")
			var want ProbeResult
			gap := -1
			for i, k := range c {
				if !exists[k] {
					break
				}
				if !present[k] {
					if gap < 0 {
						gap = i
					}
					continue
				}
				if gap >= 0 {
					want.Holes = append(want.Holes, Hole{Start: gap, Len: i - gap})
					gap = -1
				}
				if len(want.Holes) == 0 {
					want.Hit++
				} else {
					want.BehindHoles++
				}
			}
			got := p.Probe(c)
			if got.Hit != want.Hit || got.BehindHoles != want.BehindHoles || len(got.Holes) != len(want.Holes) {
				rt.Fatalf("Probe = %+v, model %+v", got, want)
			}
		}
	})
}
