package kvcache

import (
	"errors"
	"fmt"
	"testing"
)

func seq(start, n int) []int64 {
	out := make([]int64, n)
	for i := range out {
		out[i] = int64(start + i)
	}
	return out
}

func newManager(t *testing.T, cfg Config, decl *Declarations, opts Options) *Manager {
	t.Helper()
	m, err := New(cfg, decl, opts)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func pools(slots ...int) []PoolConfig {
	var out []PoolConfig
	for i, s := range slots {
		out = append(out, PoolConfig{Group: fmt.Sprintf("g%d", i), GPUSlots: s})
	}
	return out
}

// run allocates, computes and frees one request over prompt.
func run(t *testing.T, m *Manager, id RequestID, prompt []int64) AllocResult {
	t.Helper()
	res, err := m.Allocate(id, Prompt{Tokens: prompt}, len(prompt))
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Commit(id, prompt); err != nil {
		t.Fatal(err)
	}
	if err := m.Free(id); err != nil {
		t.Fatal(err)
	}
	return res
}

func TestManagerBackoffOnCommittedPrompt(t *testing.T) {
	const T = 8
	for _, L := range []int{4 * T, 4*T + 3} {
		for _, backoff := range []int{1, T, T + 1, L} {
			m := newManager(t, Config{TokensPerBlock: T, Pools: pools(64), ReuseMatchBackoff: backoff, EnablePartialReuse: true}, nil, Options{})
			prompt := seq(1, L)
			run(t, m, 1, prompt)
			mr, err := m.Match(Prompt{Tokens: prompt})
			if err != nil {
				t.Fatal(err)
			}
			if mr.Tokens != L-backoff || mr.RawTokens != L {
				t.Errorf("L %d backoff %d: Tokens %d raw %d, want %d and %d", L, backoff, mr.Tokens, mr.RawTokens, L-backoff, L)
			}
		}
	}
}

func TestManagerLeavesLastTokenToCompute(t *testing.T) {
	const T = 8
	m := newManager(t, Config{TokensPerBlock: T, Pools: pools(16), ReuseMatchAlignment: 4}, nil, Options{})
	prompt := seq(1, 2*T)
	run(t, m, 1, prompt)
	mr, _ := m.Match(Prompt{Tokens: prompt})
	if mr.Tokens != 2*T-4 {
		t.Fatalf("Tokens = %d, want %d (last token computed, then aligned)", mr.Tokens, 2*T-4)
	}
}

func TestManagerBlockAlignedReuse(t *testing.T) {
	const T = 8
	prompt := seq(1, 3*T+5)
	base := Config{TokensPerBlock: T, Pools: pools(32), ReuseMatchBackoff: 2}
	cases := []struct {
		name string
		decl *Declarations
		want int
	}{
		// Partial reuse is off, so the raw match is 3 whole blocks; the backoff ends it 2
		// tokens short of the boundary, and block alignment then gives up that block.
		{"no connector", nil, 3*T - 2},
		{"aligned", &Declarations{RequiresBlockAlignedReuse: ptr(true)}, 2 * T},
		{"drops", &Declarations{DropsReuseMatchBackoff: ptr(true)}, 3 * T},
	}
	longer := append(append([]int64{}, prompt...), seq(900, T)...)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := newManager(t, base, c.decl, Options{})
			run(t, m, 1, longer)
			mr, _ := m.Match(Prompt{Tokens: prompt})
			if mr.Tokens != c.want {
				t.Fatalf("Tokens = %d, want %d", mr.Tokens, c.want)
			}
		})
	}
	// With drops, a whole committed match is used whole (short of the last token).
	m := newManager(t, base, &Declarations{DropsReuseMatchBackoff: ptr(true)}, Options{})
	run(t, m, 1, longer)
	if mr, _ := m.Match(Prompt{Tokens: longer[:4*T]}); mr.Tokens != 4*T-1 {
		t.Fatalf("dropped backoff: Tokens = %d, want %d", mr.Tokens, 4*T-1)
	}
}

func TestDraftManagerAlignsWithTarget(t *testing.T) {
	const T = 8
	decl := &Declarations{RequiresBlockAlignedReuse: ptr(true), DropsReuseMatchBackoff: ptr(true)}
	target := newManager(t, Config{TokensPerBlock: T, Pools: pools(8), ReuseMatchBackoff: 2}, &Declarations{RequiresBlockAlignedReuse: ptr(true)}, Options{})
	if b, a := target.Reuse(); b != 2 || a != T {
		t.Fatalf("target reuse (%d, %d)", b, a)
	}
	draft := newManager(t, Config{TokensPerBlock: T, Pools: pools(8), ReuseMatchBackoff: 2, EnablePartialReuse: true}, decl, Options{Draft: true, Target: target})
	if b, a := draft.Reuse(); b != 2 || a != T {
		t.Fatalf("draft reuse (%d, %d), want its own backoff and the target's alignment", b, a)
	}
	plain := newManager(t, Config{TokensPerBlock: T, Pools: pools(8), ReuseMatchBackoff: 2, EnablePartialReuse: true}, decl, Options{Draft: true})
	if b, a := plain.Reuse(); b != 2 || a != 1 {
		t.Fatalf("unpaired draft reuse (%d, %d)", b, a)
	}
}

func TestAllocateReuseAndEviction(t *testing.T) {
	const T = 4
	m := newManager(t, Config{TokensPerBlock: T, Pools: pools(6, 8)}, nil, Options{})
	a := seq(1, 4*T)
	run(t, m, 1, a)
	if total, unref := m.CachedBlocks(); total != 4 || unref != 4 {
		t.Fatalf("cached %d unreferenced %d after one request", total, unref)
	}
	res, err := m.Allocate(2, Prompt{Tokens: a}, 4*T)
	if err != nil {
		t.Fatal(err)
	}
	if res.ReusedTokens != 4*T-1 {
		t.Fatalf("ReusedTokens = %d", res.ReusedTokens)
	}
	if free := m.FreePages(); free[0] != 1 || free[1] != 3 {
		t.Fatalf("free %v, want [1 3]: 3 shared blocks plus a private last block", free)
	}
	// A different prompt needs 3 pages: one is free and one cached block is unreferenced, so
	// it fails and gives back what it took (the evicted block's page stays free).
	if _, err := m.Allocate(3, Prompt{Tokens: seq(100, 3*T)}, 3*T); !errors.Is(err, ErrOutOfPages) {
		t.Fatalf("err = %v, want ErrOutOfPages", err)
	}
	if free := m.FreePages(); free[0] != 2 || free[1] != 4 {
		t.Fatalf("failed allocation leaked pages: %v, want [2 4]", free)
	}
	if _, unref := m.CachedBlocks(); unref != 0 {
		t.Fatalf("%d unreferenced blocks left", unref)
	}
	if _, err := m.Held(3); !errors.Is(err, ErrUnknownRequest) {
		t.Fatalf("failed request still known: %v", err)
	}
	must(t, m.Free(2))
	if _, err := m.Allocate(3, Prompt{Tokens: seq(100, 3*T)}, 3*T); err != nil {
		t.Fatalf("after free: %v", err)
	}
	if total, _ := m.CachedBlocks(); total > 3 {
		t.Fatalf("%d cached blocks, eviction should have made room", total)
	}
}

func TestDuplicateCommitDeduplicates(t *testing.T) {
	const T = 4
	m := newManager(t, Config{TokensPerBlock: T, Pools: pools(16)}, nil, Options{})
	p := seq(1, 2*T)
	_, err := m.Allocate(1, Prompt{Tokens: p}, 2*T)
	must(t, err)
	_, err = m.Allocate(2, Prompt{Tokens: p}, 2*T)
	must(t, err)
	must(t, m.Commit(1, p))
	must(t, m.Commit(2, p))
	if total, _ := m.CachedBlocks(); total != 2 {
		t.Fatalf("%d cached blocks, want 2", total)
	}
	must(t, m.Free(1))
	must(t, m.Free(2))
	if free := m.FreePages(); free[0] != 14 {
		t.Fatalf("free %v, want 14 (two cached blocks)", free)
	}
}

func TestPartialTailReuse(t *testing.T) {
	const T = 8
	m := newManager(t, Config{TokensPerBlock: T, Pools: pools(16), EnablePartialReuse: true}, nil, Options{})
	p := seq(1, T+5)
	run(t, m, 1, p)
	q := append(append([]int64{}, p...), 77, 78)
	mr, _ := m.Match(Prompt{Tokens: q})
	if mr.Tokens != T+5 {
		t.Fatalf("Tokens = %d, want %d from the partial tail", mr.Tokens, T+5)
	}
	res, err := m.Allocate(2, Prompt{Tokens: q}, len(q))
	must(t, err)
	if res.ReusedTokens != T+5 || res.Blocks != 2 {
		t.Fatalf("%+v", res)
	}
	must(t, m.Commit(2, q))
	must(t, m.Free(2))
	// The longer tail replaced the shorter one.
	if total, _ := m.CachedBlocks(); total != 2 {
		t.Fatalf("%d cached blocks, want 2", total)
	}
}

func TestHostTier(t *testing.T) {
	const T = 4
	m := newManager(t, Config{TokensPerBlock: T, Pools: pools(4), HostSlots: 8}, nil, Options{})
	a := seq(1, 4*T)
	run(t, m, 1, a)
	run(t, m, 2, seq(500, 4*T)) // evicts a's blocks to the host tier
	if m.HostBlocks() == 0 {
		t.Fatal("nothing reached the host tier")
	}
	mr, _ := m.Match(Prompt{Tokens: a})
	if mr.HostTokens == 0 || mr.Tokens != 4*T-1 {
		t.Fatalf("match %+v, want a host hit", mr)
	}
	res, err := m.Allocate(3, Prompt{Tokens: a}, 4*T)
	must(t, err)
	if res.OnboardedBlocks == 0 || res.ReusedTokens != 4*T-1 {
		t.Fatalf("%+v", res)
	}
	must(t, m.Free(3))
}

func TestReservations(t *testing.T) {
	const T = 4
	m := newManager(t, Config{TokensPerBlock: T, Pools: pools(10), MaxGenerationLead: 4, EnableCompletionReservation: true, Disaggregated: true}, nil, Options{})
	if !m.Reserving() {
		t.Fatal("reservation not in force")
	}
	// 8 prompt + 16 output + 4 lead = 28 tokens = 7 blocks.
	must(t, m.AdmitGeneration(1, 8, 16))
	if b, _ := m.Reservation(1); b != 7 {
		t.Fatalf("bound %d, want 7", b)
	}
	if err := m.AdmitGeneration(2, 8, 8); !errors.Is(err, ErrNoReservation) {
		t.Fatalf("over-commit admitted: %v", err)
	}
	must(t, m.AdmitContext(2, 12))
	// An unreserved request cannot take the reserved pages.
	if _, err := m.Allocate(9, Prompt{Tokens: seq(300, 4)}, 4); !errors.Is(err, ErrOutOfPages) {
		t.Fatalf("unreserved allocation: %v", err)
	}
	_, err := m.Allocate(1, Prompt{Tokens: seq(1, 8)}, 28)
	must(t, err)
	must(t, m.CheckReservations())
	must(t, m.Free(1))
	if _, ok := m.Reservation(1); ok {
		t.Fatal("Free kept the reservation")
	}
	_, err = m.Allocate(2, Prompt{Tokens: seq(50, 12)}, 12)
	must(t, err)
	must(t, m.Revert(2))
	if _, ok := m.Reservation(2); ok {
		t.Fatal("Revert kept the reservation")
	}
	must(t, m.AdmitContext(3, 8))
	m.Shutdown()
	if _, ok := m.Reservation(3); ok {
		t.Fatal("Shutdown kept the reservation")
	}
	if err := m.AdmitContext(4, 4); !errors.Is(err, ErrShutdown) {
		t.Fatalf("after shutdown: %v", err)
	}
}

func TestReservationWarnsWithHostTier(t *testing.T) {
	m := newManager(t, Config{TokensPerBlock: 4, Pools: pools(4), HostSlots: 4, EnableCompletionReservation: true, Disaggregated: true}, nil, Options{})
	if m.Reserving() || len(m.Warnings()) != 1 {
		t.Fatalf("reserving %v warnings %v", m.Reserving(), m.Warnings())
	}
}

func TestAdmissionOffers(t *testing.T) {
	const T = 4
	cfg := Config{TokensPerBlock: T, Pools: pools(6), AdmissionQuery: &AdmissionQueryConfig{MaxOfferDeferrals: 2, MaxUnchargedParks: 1}}
	m := newManager(t, cfg, &Declarations{SupportsAdmissionQuery: ptr(true)}, Options{})
	prompt := seq(1, 8*T)
	res, err := m.Allocate(1, Prompt{Tokens: prompt}, 2*T)
	must(t, err)
	if err := m.SetOffer(1, Offer{Epoch: res.Epoch + 1, Tokens: T}); !errors.Is(err, ErrStaleOffer) {
		t.Fatalf("wrong epoch: %v", err)
	}
	if err := m.SetOffer(1, Offer{Epoch: res.Epoch, Tokens: 3}); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("offer off a block: %v", err)
	}
	// A repeated answer for the same allocation replaces the earlier one.
	must(t, m.SetOffer(1, Offer{Epoch: res.Epoch, Tokens: 4 * T, Async: true}))
	must(t, m.SetOffer(1, Offer{Epoch: res.Epoch, Tokens: 2 * T}))
	cr, err := m.CoverAdmissionOffer(1, 2*T, false)
	must(t, err)
	if cr.Outcome != Covered || cr.Tokens != 2*T {
		t.Fatalf("%+v", cr)
	}
	if h, _ := m.Held(1); h != 4 {
		t.Fatalf("held %d blocks, want 4 (offer plus chunk)", h)
	}
	if o, ok := m.TakeOffer(1); !ok || o != (Offer{Epoch: res.Epoch, Tokens: 2 * T}) {
		t.Fatalf("TakeOffer = %+v, %v; want the second answer", o, ok)
	}
	if _, ok := m.TakeOffer(1); ok {
		t.Fatal("an offer was taken twice")
	}
	// A second request cannot cover 2 offered blocks plus a 2-block chunk in 2 free pages.
	for d := 1; d <= 2; d++ {
		res2, err := m.Allocate(2, Prompt{Tokens: seq(100, 8*T)}, T)
		must(t, err)
		must(t, m.SetOffer(2, Offer{Epoch: res2.Epoch, Tokens: 2 * T}))
		cr, err = m.CoverAdmissionOffer(2, 2*T, false)
		must(t, err)
		if cr.Outcome != Deferred || cr.Deferrals != d {
			t.Fatalf("pass %d: %+v, want deferred", d, cr)
		}
		if _, err := m.Held(2); !errors.Is(err, ErrUnknownRequest) {
			t.Fatal("deferred chunk kept its pages")
		}
		if err := m.SetOffer(2, Offer{Epoch: res2.Epoch, Tokens: T}); !errors.Is(err, ErrUnknownRequest) {
			t.Fatalf("offer on a released request: %v", err)
		}
	}
	res2, err := m.Allocate(2, Prompt{Tokens: seq(100, 8*T)}, T)
	must(t, err)
	must(t, m.SetOffer(2, Offer{Epoch: res2.Epoch, Tokens: 2 * T}))
	cr, err = m.CoverAdmissionOffer(2, 2*T, false)
	must(t, err)
	if cr.Outcome != Shrunk || cr.Tokens != T {
		t.Fatalf("after the deferrals: %+v, want shrunk to the one block its pages hold", cr)
	}
	if o, ok := m.TakeOffer(2); !ok || o.Tokens != T {
		t.Fatalf("stored offer %+v %v", o, ok)
	}
	if _, ok := m.TakeOffer(2); ok {
		t.Fatal("offer taken twice")
	}
	// A request that just preempted another is not deferred.
	must(t, m.Free(2))
	res3, err := m.Allocate(3, Prompt{Tokens: seq(200, 8*T)}, T)
	must(t, err)
	must(t, m.SetOffer(3, Offer{Epoch: res3.Epoch, Tokens: 2 * T}))
	if cr, _ = m.CoverAdmissionOffer(3, 2*T, true); cr.Outcome != Shrunk {
		t.Fatalf("just preempted: %+v", cr)
	}
	// A new allocation makes the old epoch stale.
	must(t, m.Revert(3))
	res4, err := m.Allocate(3, Prompt{Tokens: seq(200, 8*T)}, T)
	must(t, err)
	if res4.Epoch == res3.Epoch {
		t.Fatal("epoch did not move")
	}
	if err := m.SetOffer(3, Offer{Epoch: res3.Epoch, Tokens: T}); !errors.Is(err, ErrStaleOffer) {
		t.Fatalf("stale epoch: %v", err)
	}
}

func TestPassUnchargedParks(t *testing.T) {
	cfg := Config{TokensPerBlock: 4, Pools: pools(4), AdmissionQuery: &AdmissionQueryConfig{MaxUnchargedParks: 2}}
	m := newManager(t, cfg, &Declarations{SupportsAdmissionQuery: ptr(true)}, Options{})
	p := m.BeginPass(100, 5, false)
	for i := 0; i < 2; i++ {
		if c, ok := p.Admit(60, true); !ok || c != 0 {
			t.Fatalf("park %d: charged %d ok %v", i, c, ok)
		}
	}
	if c, ok := p.Admit(60, true); !ok || c != 60 {
		t.Fatalf("third park: charged %d ok %v, want a full charge", c, ok)
	}
	if _, ok := p.Admit(60, false); ok {
		t.Fatal("over budget admitted")
	}
	if tok, slots := p.Budget(); tok != 40 || slots != 2 {
		t.Fatalf("budget %d slots %d", tok, slots)
	}
	if _, ok := p.Admit(10, false); !ok {
		t.Fatal("small chunk refused")
	}
	if _, ok := p.Admit(10, false); !ok {
		t.Fatal("last slot refused")
	}
	if _, ok := p.Admit(0, true); ok {
		t.Fatal("admitted without a request slot")
	}
	if dp := m.BeginPass(100, 5, true); func() bool { c, _ := dp.Admit(10, true); return c == 0 }() {
		t.Fatal("uncharged park under attention DP")
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
