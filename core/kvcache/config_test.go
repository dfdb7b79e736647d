package kvcache

import (
	"errors"
	"strings"
	"testing"
)

func ptr(b bool) *bool { return &b }

func TestEffectiveReuse(t *testing.T) {
	const T = 32
	aligned := &Declarations{RequiresBlockAlignedReuse: ptr(true)}
	drops := &Declarations{DropsReuseMatchBackoff: ptr(true)}
	both := &Declarations{RequiresBlockAlignedReuse: ptr(true), DropsReuseMatchBackoff: ptr(true)}
	falses := &Declarations{RequiresBlockAlignedReuse: ptr(false), DropsReuseMatchBackoff: ptr(false)}
	capacity := &Declarations{CapacityOnly: true, RequiresBlockAlignedReuse: ptr(true), DropsReuseMatchBackoff: ptr(true)}
	cases := []struct {
		name         string
		backoff      int
		partial      bool
		decl         *Declarations
		draft        bool
		wantB, wantA int
	}{
		{"no connector", 3, false, nil, false, 3, 1},
		{"aligned", 3, false, aligned, false, 3, T},
		{"aligned but partial reuse on", 3, true, aligned, false, 3, 1},
		{"aligned without backoff", 0, false, aligned, false, 0, 1},
		{"explicit false", 3, false, falses, false, 3, 1},
		{"capacity-only ignored", 3, false, capacity, false, 3, 1},
		{"drops", 3, false, drops, false, 0, 1},
		{"both: backoff dropped, nothing to align", 3, false, both, false, 0, 1},
		{"draft never drops", 3, false, drops, true, 3, 1},
		{"draft aligns", 3, false, both, true, 3, T},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := Config{TokensPerBlock: T, ReuseMatchBackoff: c.backoff, EnablePartialReuse: c.partial}
			b, a := EffectiveReuse(cfg, c.decl, c.draft)
			if b != c.wantB || a != c.wantA {
				t.Fatalf("EffectiveReuse = (%d, %d), want (%d, %d)", b, a, c.wantB, c.wantA)
			}
		})
	}
}

func TestPromptLookaheadKeepsDraftLookahead(t *testing.T) {
	cfg := Config{TokensPerBlock: 16, ReuseMatchBackoff: 3, DraftPromptLookahead: 3}
	drops := &Declarations{DropsReuseMatchBackoff: ptr(true)}
	if b, _ := EffectiveReuse(cfg, drops, false); b != 0 {
		t.Fatalf("backoff %d not dropped", b)
	}
	if got := PromptLookahead(cfg, drops, false); got != 3 {
		t.Fatalf("PromptLookahead = %d, want the raw draft lookahead 3", got)
	}
	cfg.DraftPromptLookahead = 0
	if got := PromptLookahead(cfg, nil, false); got != 3 {
		t.Fatalf("PromptLookahead = %d, want the backoff 3", got)
	}
}

func TestDeclarationRules(t *testing.T) {
	var none *Declarations
	if none.BlockAlignedReuse() || none.DropsBackoff() || none.CompletionReservation() || none.AdmissionQuery() {
		t.Fatal("a missing connector declared something")
	}
	d := &Declarations{RequiresCompletionReservation: ptr(true), SupportsAdmissionQuery: ptr(true)}
	if !d.CompletionReservation() || !d.AdmissionQuery() {
		t.Fatal("explicit true not honoured")
	}
	d.CapacityOnly = true
	if d.CompletionReservation() || d.AdmissionQuery() {
		t.Fatal("capacity-only declarations honoured")
	}
	cfg := Config{TokensPerBlock: 4, AdmissionQuery: &AdmissionQueryConfig{}}
	q := &Declarations{SupportsAdmissionQuery: ptr(true)}
	if !AdmissionQueryApplies(cfg, q, false) || AdmissionQueryApplies(cfg, q, true) || AdmissionQueryApplies(Config{}, q, false) {
		t.Fatal("admission query rule wrong")
	}
	// Seed commit 7: admission_query is ignored for a connector without the capability (none,
	// undeclared, declared false) and for a capacity-only one.
	for _, d := range []*Declarations{nil, {}, {SupportsAdmissionQuery: ptr(false)}, {SupportsAdmissionQuery: ptr(true), CapacityOnly: true}} {
		if AdmissionQueryApplies(cfg, d, false) {
			t.Fatalf("admission queries applied for a connector declaring %+v", d)
		}
	}
	// Seed commit 6: beyond either opt-in, only a disaggregated target manager with no tier
	// below GPU, beam width 1, one pipeline stage and full attention reserves.
	for _, c := range []struct {
		name string
		cfg  Config
		warn string
	}{
		{"aggregated", Config{EnableCompletionReservation: true}, "only to a disaggregated server"},
		{"host tier", Config{EnableCompletionReservation: true, Disaggregated: true, HostSlots: 4}, "host tier"},
		{"beam search", Config{EnableCompletionReservation: true, Disaggregated: true, BeamWidth: 2}, "beam width 1"},
		{"pipeline", Config{EnableCompletionReservation: true, Disaggregated: true, PipelineStages: 2}, "single pipeline stage"},
		{"windowed", Config{EnableCompletionReservation: true, Disaggregated: true, WindowedLayers: true}, "full attention"},
	} {
		if ok, warn := ReservationApplies(c.cfg, nil, false); ok || !strings.Contains(warn, c.warn) {
			t.Errorf("%s: reservation applies %v, warning %q; want it ignored with a warning naming %q", c.name, ok, warn, c.warn)
		}
	}
	if ok, warn := ReservationApplies(Config{Disaggregated: true}, nil, false); ok || warn != "" {
		t.Fatalf("no opt-in: applies %v, warning %q", ok, warn)
	}
	if ok, _ := ReservationApplies(Config{EnableCompletionReservation: true, Disaggregated: true}, nil, true); ok {
		t.Fatal("a draft manager reserves")
	}
	if ok, _ := ReservationApplies(Config{Disaggregated: true, BeamWidth: 1, PipelineStages: 1}, &Declarations{RequiresCompletionReservation: ptr(true)}, false); !ok {
		t.Fatal("declared reservation not applied")
	}
}

func TestConfigValidateReportsEverything(t *testing.T) {
	cfg := Config{
		TokensPerBlock: 16, ReuseMatchAlignment: 3, ReuseMatchBackoff: -1, HostSlots: -2,
		Pools:          []PoolConfig{{Group: "a", GPUSlots: 0}, {Group: "a", GPUSlots: 4}},
		AdmissionQuery: &AdmissionQueryConfig{MaxOfferDeferrals: -1, MaxUnchargedParks: -1},
	}
	err := cfg.Validate()
	if !errors.Is(err, ErrConfig) {
		t.Fatalf("err = %v", err)
	}
	for _, key := range []string{"reuse_match_alignment", "reuse_match_backoff", "host_slots", "pools[0].gpu_slots", "pools[1].group", "admission_query.max_offer_deferrals", "admission_query.max_uncharged_parks"} {
		if !strings.Contains(err.Error(), key) {
			t.Errorf("error does not name %s: %v", key, err)
		}
	}
	// Both admission limits are counts: 0 is allowed.
	zero := Config{TokensPerBlock: 16, Pools: []PoolConfig{{Group: "g", GPUSlots: 1}}, AdmissionQuery: &AdmissionQueryConfig{}}
	if err := zero.Validate(); err != nil {
		t.Errorf("admission limits of 0 refused: %v", err)
	}
	for _, a := range []int{0, 1, 2, 4, 8, 16} {
		ok := Config{TokensPerBlock: 16, ReuseMatchAlignment: a, Pools: []PoolConfig{{Group: "g", GPUSlots: 1}}}
		if err := ok.Validate(); err != nil {
			t.Errorf("alignment %d refused: %v", a, err)
		}
	}
	for _, a := range []int{-1, 3, 32} {
		bad := Config{TokensPerBlock: 16, ReuseMatchAlignment: a, Pools: []PoolConfig{{Group: "g", GPUSlots: 1}}}
		if err := bad.Validate(); err == nil {
			t.Errorf("alignment %d accepted", a)
		}
	}
}
