package radix

import (
	"errors"
	"fmt"
	"testing"
)

func TestBackoffFullyCommittedPrompt(t *testing.T) {
	const T = 16
	for _, L := range []int{4 * T, 4*T + 5} {
		tr := mustTree(t, Config{TokensPerBlock: T})
		prompt := seq(1000, L)
		commit(t, tr, prompt)
		for _, backoff := range []int{0, 1, T, T + 1, L} {
			t.Run(fmt.Sprintf("L=%d/backoff=%d", L, backoff), func(t *testing.T) {
				m, err := tr.Match(queryOf(prompt, T), MatchOptions{Backoff: backoff, PartialReuse: true})
				if err != nil {
					t.Fatal(err)
				}
				if want := L - backoff; m.Tokens != want {
					t.Fatalf("Tokens = %d, want %d", m.Tokens, want)
				}
				if m.RawTokens != L || m.LookupTokens != L {
					t.Fatalf("RawTokens %d LookupTokens %d, want %d", m.RawTokens, m.LookupTokens, L)
				}
				if want := (L - backoff + T - 1) / T; len(m.Blocks) != want {
					t.Fatalf("%d blocks, want %d", len(m.Blocks), want)
				}
				if want := (L - backoff) / T; m.FirstNewBlock != want {
					t.Fatalf("FirstNewBlock = %d, want %d", m.FirstNewBlock, want)
				}
			})
		}
	}
}

func TestBackoffAlignmentGrid(t *testing.T) {
	const T = 8
	const L = 3 * T
	tr := mustTree(t, Config{TokensPerBlock: T})
	prompt := seq(7, L)
	commit(t, tr, prompt)
	q := queryOf(prompt, T)
	kinds := map[string]int{}
	for backoff := 0; backoff <= L+2; backoff++ {
		for _, align := range []int{0, 1, 2, 4, 8} {
			m, err := tr.Match(q, MatchOptions{Backoff: backoff, Alignment: align})
			if err != nil {
				t.Fatal(err)
			}
			end := max(L-backoff, 0)
			switch {
			case end == 0:
				kinds["root"]++
			case end%T == 0:
				kinds["boundary"]++
			default:
				kinds["mid"]++
			}
			a := max(align, 1)
			want := end / a * a
			if m.Tokens != want {
				t.Errorf("backoff %d alignment %d: Tokens = %d, want %d", backoff, align, m.Tokens, want)
			}
			if align > 1 && m.Tokens%align != 0 {
				t.Errorf("backoff %d alignment %d: %d not aligned", backoff, align, m.Tokens)
			}
			if m.FirstNewBlock != want/T || len(m.Blocks) != (want+T-1)/T {
				t.Errorf("backoff %d alignment %d: FirstNewBlock %d blocks %d", backoff, align, m.FirstNewBlock, len(m.Blocks))
			}
			if m.RawTokens != L {
				t.Errorf("RawTokens = %d, want %d", m.RawTokens, L)
			}
		}
	}
	for _, k := range []string{"root", "boundary", "mid"} {
		if kinds[k] == 0 {
			t.Errorf("no endpoint of kind %s exercised", k)
		}
	}
}

func TestAlignmentRefused(t *testing.T) {
	const T = 16
	tr := mustTree(t, Config{TokensPerBlock: T})
	for _, a := range []int{-1, 3, 5, 32, 17} {
		if _, err := tr.Match(Query{}, MatchOptions{Alignment: a}); !errors.Is(err, ErrAlignment) {
			t.Errorf("alignment %d: err = %v, want ErrAlignment", a, err)
		}
		if err := ValidateAlignment(a, T); !errors.Is(err, ErrAlignment) {
			t.Errorf("ValidateAlignment(%d): %v", a, err)
		}
	}
	for _, a := range []int{0, 1, 2, 4, 8, 16} {
		if _, err := tr.Match(Query{}, MatchOptions{Alignment: a}); err != nil {
			t.Errorf("alignment %d refused: %v", a, err)
		}
	}
	if err := ValidateAlignment(0, T); !errors.Is(err, ErrAlignment) {
		t.Errorf("ValidateAlignment(0) accepted")
	}
	if _, err := tr.Match(Query{}, MatchOptions{Backoff: -1}); !errors.Is(err, ErrBackoff) {
		t.Errorf("negative backoff: %v", err)
	}
}

func TestPartialMatch(t *testing.T) {
	const T = 8
	tr := mustTree(t, Config{TokensPerBlock: T, StoreTokens: true})
	base := seq(0, T)
	a := append(append([]int64{}, base...), 100, 101, 102, 103, 104, 105, 106, 107)
	b := append(append([]int64{}, base...), 100, 101, 200, 201, 202)
	commit(t, tr, a)
	commit(t, tr, b)
	query := append(append([]int64{}, base...), 100, 101, 102, 103, 999, 998)
	m, err := tr.Match(queryOf(query, T), MatchOptions{PartialReuse: true})
	if err != nil {
		t.Fatal(err)
	}
	if m.Tokens != T+4 || len(m.Blocks) != 2 {
		t.Fatalf("Tokens %d blocks %d, want %d and 2", m.Tokens, len(m.Blocks), T+4)
	}
	if got := tr.Tokens(m.Blocks[1]); len(got) != T || got[2] != 102 {
		t.Fatalf("partial match picked %v, want block a", got)
	}
	m, _ = tr.Match(queryOf(query, T), MatchOptions{PartialReuse: false})
	if m.Tokens != T {
		t.Fatalf("without partial reuse Tokens = %d, want %d", m.Tokens, T)
	}
	m, _ = tr.Match(Query{Keys: queryOf(query, T).Keys}, MatchOptions{PartialReuse: true})
	if m.Tokens != T {
		t.Fatalf("without query tokens Tokens = %d, want %d", m.Tokens, T)
	}
}

func TestPartialMatchNeedsStoredTokens(t *testing.T) {
	const T = 4
	tr := mustTree(t, Config{TokensPerBlock: T})
	commit(t, tr, seq(0, 2*T))
	m, _ := tr.Match(queryOf(seq(0, T+2), T), MatchOptions{PartialReuse: true})
	if m.Tokens != T {
		t.Fatalf("key-only full blocks matched partially: %d", m.Tokens)
	}
}

func TestPartialScanLimit(t *testing.T) {
	const T = 4
	for _, children := range []int{DefaultPartialScanLimit, DefaultPartialScanLimit + 1} {
		tr := mustTree(t, Config{TokensPerBlock: T, StoreTokens: true})
		for c := 0; c < children; c++ {
			commit(t, tr, []int64{int64(c), 1, 2, 3})
		}
		m, _ := tr.Match(queryOf([]int64{0, 1, 9}, T), MatchOptions{PartialReuse: true})
		want := 2
		if children > DefaultPartialScanLimit {
			want = 0
		}
		if m.Tokens != want {
			t.Errorf("%d children: Tokens = %d, want %d", children, m.Tokens, want)
		}
	}
}

// pruneTree commits n full blocks of T tokens and returns the tree, the prompt and the ids.
func pruneTree(t *testing.T, T, n int) (*Tree, []int64, []NodeID) {
	tr := mustTree(t, Config{TokensPerBlock: T})
	p := seq(50, n*T)
	return tr, p, commit(t, tr, p)
}

func TestPruneSSM(t *testing.T) {
	const T = 8
	tr, p, ids := pruneTree(t, T, 4)
	// Snapshots at 1·8+6 = 14 and 2·8+3 = 19.
	must(t, tr.SetCoverage(ids[1], Coverage{Attention: T, SSM: 6}))
	must(t, tr.SetCoverage(ids[2], Coverage{Attention: T, SSM: 3}))
	cases := []struct {
		backoff, align, want int
	}{
		{0, 1, 19},  // last snapshot before 32
		{13, 1, 19}, // 19 is exactly the endpoint
		{14, 1, 14}, // 18: back to 14
		{0, 2, 14},  // 19 is off the alignment: 18, then snapshot 14
		{0, 4, 0},   // 16, 14 → 12, no snapshot at or before 12
		{19, 1, 0},  // 13: before the first snapshot
	}
	for _, c := range cases {
		m, err := tr.Match(queryOf(p, T), MatchOptions{Backoff: c.backoff, Alignment: c.align, Prune: PruneRules{SSM: true}})
		if err != nil {
			t.Fatal(err)
		}
		if m.Tokens != c.want {
			t.Errorf("backoff %d align %d: Tokens = %d, want %d", c.backoff, c.align, m.Tokens, c.want)
		}
		if m.RawTokens != 4*T {
			t.Errorf("RawTokens = %d, want raw depth %d", m.RawTokens, 4*T)
		}
		if m.FirstNewBlock != c.want/T {
			t.Errorf("FirstNewBlock = %d for %d tokens", m.FirstNewBlock, c.want)
		}
	}
}

func TestPruneAttentionFull(t *testing.T) {
	const T = 8
	tr, p, ids := pruneTree(t, T, 4)
	must(t, tr.SetCoverage(ids[2], Coverage{Attention: 5}))
	m, _ := tr.Match(queryOf(p, T), MatchOptions{Prune: PruneRules{Attention: true}})
	if m.Tokens != 2*T+5 {
		t.Fatalf("short coverage: Tokens = %d, want %d", m.Tokens, 2*T+5)
	}
	m, _ = tr.Match(queryOf(p, T), MatchOptions{Alignment: 4, Prune: PruneRules{Attention: true}})
	if m.Tokens != 2*T+4 {
		t.Fatalf("short coverage aligned: Tokens = %d, want %d", m.Tokens, 2*T+4)
	}
	must(t, tr.SetCoverage(ids[1], Coverage{Attention: 0}))
	m, _ = tr.Match(queryOf(p, T), MatchOptions{Prune: PruneRules{Attention: true}})
	if m.Tokens != T {
		t.Fatalf("no coverage: Tokens = %d, want %d (before the block)", m.Tokens, T)
	}
	if len(m.Blocks) != 1 || m.FirstNewBlock != 1 {
		t.Fatalf("blocks %d first new %d", len(m.Blocks), m.FirstNewBlock)
	}
}

func TestPruneAttentionWindow(t *testing.T) {
	const T = 8
	tr, p, ids := pruneTree(t, T, 6)
	// Block 2 (tokens 16..24) lacks KV; with a 16-token window and an 8-token sink, a match
	// of 48 attends blocks 0 and 4..5 only.
	must(t, tr.SetCoverage(ids[2], Coverage{Attention: 0}))
	rules := PruneRules{Attention: true, Window: 16, SinkTokens: 8}
	m, _ := tr.Match(queryOf(p, T), MatchOptions{Prune: rules})
	if m.Tokens != 6*T {
		t.Fatalf("stale block pruned: Tokens = %d, want %d", m.Tokens, 6*T)
	}
	// A backoff of 20 ends at 28: the window [12, 28) reaches block 2, which cuts to 16.
	m, _ = tr.Match(queryOf(p, T), MatchOptions{Backoff: 20, Prune: rules})
	if m.Tokens != 2*T {
		t.Fatalf("window block pruned: Tokens = %d, want %d", m.Tokens, 2*T)
	}
	// A short sink block always counts.
	must(t, tr.SetCoverage(ids[2], Coverage{Attention: T}))
	must(t, tr.SetCoverage(ids[0], Coverage{Attention: 3}))
	m, _ = tr.Match(queryOf(p, T), MatchOptions{Prune: rules})
	if m.Tokens != 3 {
		t.Fatalf("sink block: Tokens = %d, want 3", m.Tokens)
	}
}

func TestPruneFixedPointBothRules(t *testing.T) {
	const T = 8
	tr, p, ids := pruneTree(t, T, 4)
	// Snapshots at 30 and 21; attention short in block 3 at 27. Attention cuts to 27, then the
	// last snapshot at or before 27 is 21.
	must(t, tr.SetCoverage(ids[3], Coverage{Attention: 3, SSM: 6}))
	must(t, tr.SetCoverage(ids[2], Coverage{Attention: T, SSM: 5}))
	m, _ := tr.Match(queryOf(p, T), MatchOptions{Prune: PruneRules{SSM: true, Attention: true}})
	if m.Tokens != 21 {
		t.Fatalf("Tokens = %d, want 21", m.Tokens)
	}
	if m.AttentionTokens != 27 {
		t.Fatalf("AttentionTokens = %d, want 27", m.AttentionTokens)
	}
	// With alignment 4: attention cuts to 27, SSM to 21, re-aligned to 20; no snapshot lies at
	// or before 20, so the match is empty. The attention-only pass stops at 27 → 24.
	m, _ = tr.Match(queryOf(p, T), MatchOptions{Alignment: 4, Prune: PruneRules{SSM: true, Attention: true}})
	if m.Tokens != 0 {
		t.Fatalf("aligned Tokens = %d, want 0", m.Tokens)
	}
	if m.AttentionTokens != 24 || m.RawTokens != 32 {
		t.Fatalf("AttentionTokens %d RawTokens %d, want 24 and 32", m.AttentionTokens, m.RawTokens)
	}
}

func TestQueryValidation(t *testing.T) {
	tr := mustTree(t, Config{TokensPerBlock: 4})
	q := queryOf(seq(0, 8), 4)
	q.Tokens = q.Tokens[:5]
	if _, err := tr.Match(q, MatchOptions{}); !errors.Is(err, ErrQuery) {
		t.Fatalf("err = %v, want ErrQuery", err)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
