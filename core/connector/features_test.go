package connector

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvctl/kvctl/core/keys"
	"github.com/kvctl/kvctl/core/stats"
	"github.com/kvctl/kvctl/pool"
	"github.com/kvctl/kvctl/pool/embedded"
	"github.com/prometheus/client_golang/prometheus"
)

func TestAsyncLoads(t *testing.T) { poolKinds(t, testAsyncLoads) }

func testAsyncLoads(t *testing.T, newPool func() testPool) {
	for _, workers := range []int{1, 4} {
		t.Run(fmt.Sprintf("workers=%d", workers), func(t *testing.T) {
			pl := newPool()
			opts := baseOptions()
			const n = 24
			prompts := make([][]int64, n)
			cold := newEngine(t, pl, opts, 1, 2048)
			for i := range prompts {
				prompts[i] = prompt(int64(i%6), 20, 37+i) // six families sharing a 5-block prefix
				cold.add(fmt.Sprintf("r%02d", i), prompts[i])
			}
			cold.mustRun()

			ao := opts
			ao.AsyncLoad, ao.AsyncLoadWorkers = true, workers
			ao.TransferBatchSize = 5 // several pool calls per request
			ao.StatsInterval = time.Hour
			warm := newEngine(t, pl, ao, 1, 2048)
			for i := range prompts {
				warm.add(fmt.Sprintf("r%02d", i), prompts[i])
			}
			warm.mustRun()
			for i, p := range prompts {
				r := warm.byID[fmt.Sprintf("r%02d", i)]
				if want := (len(p) - 1) / testT; r.loaded != want {
					t.Fatalf("%s loaded %d blocks, want %d", r.id, r.loaded, want)
				}
			}
			if len(warm.ranks[0].w.async) != 0 {
				t.Fatalf("async table not drained: %d left", len(warm.ranks[0].w.async))
			}
			tot := warm.ranks[0].w.stats.LoadTotals()
			if tot.AsyncLoads != n || tot.FailedPages != 0 {
				t.Fatalf("load stats %+v", tot)
			}
		})
	}
}

func TestAsyncLoadFailureIsHandedBack(t *testing.T) { poolKinds(t, testAsyncLoadFailureIsHandedBack) }

func testAsyncLoadFailureIsHandedBack(t *testing.T, newPool func() testPool) {
	pl := newPool()
	opts := baseOptions()
	ta, tb := prompt(11, 0, 29), prompt(12, 0, 29)
	cold := newEngine(t, pl, opts, 1, 128)
	cold.add("a", ta)
	cold.add("b", tb)
	cold.mustRun()

	c, _ := keys.NewChain(keys.ChainConfig{TokensPerBlock: testT})
	ha, _ := c.Extend(ta)
	evicted := opts.Namespace.ReplicatedPageKey(1, testT, 12, ha[2])
	ao := opts
	ao.AsyncLoad, ao.AsyncLoadWorkers = true, 2
	warm := newEngine(t, pl, ao, 1, 128)
	warm.beforeLoad = func(e *engine, meta Metadata) {
		if e.pass == 0 {
			if len(meta.AsyncLoads) != 2 {
				t.Fatalf("pass 0 carries %d async transfers, want 2", len(meta.AsyncLoads))
			}
			pl.evict(evicted)
		}
	}
	warm.add("a", ta)
	warm.add("b", tb)
	warm.mustRun()
	a, b := warm.byID["a"], warm.byID["b"]
	if a.Restarts != 1 || b.Restarts != 0 || b.loaded != 7 || a.loaded != 2 {
		t.Fatalf("a restarts=%d loaded=%d, b restarts=%d loaded=%d", a.Restarts, a.loaded, b.Restarts, b.loaded)
	}
	if !pl.has(evicted) {
		t.Fatal("the restarted request did not save its recomputed block")
	}
}

func TestSavesReemittedWhenSaveStepSkipped(t *testing.T) {
	poolKinds(t, testSavesReemittedWhenSaveStepSkipped)
}

func testSavesReemittedWhenSaveStepSkipped(t *testing.T, newPool func() testPool) {
	pl := newPool()
	e := newEngine(t, pl, baseOptions(), 1, 64)
	e.chunk = 8 // two blocks per pass
	e.skipSave = func(pass int) bool { return pass == 1 }
	r := e.add("r", prompt(13, 0, 25))
	hashOf := func(b int) keys.PageHash {
		c, _ := keys.NewChain(keys.ChainConfig{TokensPerBlock: testT})
		hs, _ := c.Extend(r.tokens)
		return keys.PageHashOf(hs[b])
	}
	blocksIn := func(meta Metadata) map[keys.PageHash]bool {
		out := map[keys.PageHash]bool{}
		for _, s := range meta.Saves {
			for _, p := range s.Pages {
				out[p.Hash] = true
			}
		}
		return out
	}
	e.mustRun()
	// Pass 1 emitted blocks 2 and 3 but never reached the save step; pass 2 emits them again
	// together with its own.
	if m := blocksIn(e.metas[1]); !m[hashOf(2)] || !m[hashOf(3)] {
		t.Fatalf("pass 1 saves %v", m)
	}
	if m := blocksIn(e.metas[2]); !m[hashOf(2)] || !m[hashOf(3)] || !m[hashOf(4)] || !m[hashOf(5)] {
		t.Fatalf("pass 2 did not re-emit the unconfirmed saves: %d blocks", len(m))
	}
	if m := blocksIn(e.metas[3]); m[hashOf(2)] || m[hashOf(4)] {
		t.Fatal("confirmed saves were emitted again")
	}
	if got := len(pl.keys()); got != 6*3 {
		t.Fatalf("pool holds %d keys, want %d", got, 18)
	}
}

func TestResetDropsUnconfirmedSaves(t *testing.T) {
	opts := baseOptions()
	s, _ := NewScheduler(opts, newMemPool())
	_ = s.RegisterLayout(testLayout(16))
	tokens := prompt(14, 0, 13)
	if _, _, err := s.Lookup(context.Background(), Request{ID: "r", Tokens: tokens}, 0); err != nil {
		t.Fatal(err)
	}
	pages := [][]int{{0, 1, 2, 3}, {0, 1, 2, 3}}
	meta, err := s.BuildMeta(SchedulerOutput{NewRequests: []RequestData{{ID: "r", NewBlockIDsByGroup: pages, NumScheduledTokens: 13}}})
	if err != nil || len(meta.Saves) != 1 || len(meta.Saves[0].Pages) != 3*2 {
		t.Fatalf("meta %+v, %v", meta, err)
	}
	s.RequestReset("r", false)
	if _, ok := s.unconfirmed["r"]; ok {
		t.Fatal("reset kept the unconfirmed save")
	}
	// A stale report about the reset request confirms nothing for its replay.
	if _, _, err := s.Lookup(context.Background(), Request{ID: "r", Tokens: tokens}, 0); err != nil {
		t.Fatal(err)
	}
	meta, _ = s.BuildMeta(SchedulerOutput{SubmittedSaves: []string{"r"}, NewRequests: []RequestData{{ID: "r", NewBlockIDsByGroup: pages, NumScheduledTokens: 13}}})
	if len(meta.Saves) != 1 || len(meta.Saves[0].Pages) != 6 {
		t.Fatalf("replay saves %+v", meta.Saves)
	}
}

func TestAttentionDPOwnersShareKeys(t *testing.T) { poolKinds(t, testAttentionDPOwnersShareKeys) }

func testAttentionDPOwnersShareKeys(t *testing.T, newPool func() testPool) {
	pl := newPool()
	owner := func(rank int) Options {
		o := baseOptions()
		o.Namespace = keys.Namespace{ModelKey: "test-model", WorldSize: 2, Rank: rank, AttentionDP: true}
		return o
	}
	tokens := prompt(15, 0, 33)
	e0 := newEngine(t, pl, owner(0), 1, 64)
	e0.add("r", tokens)
	e0.mustRun()
	for _, k := range pl.keys() {
		if !strings.Contains(k, "/w1r0/") && !strings.Contains(k, "/replicated/") {
			t.Fatalf("owner key %s is not shared", k)
		}
	}
	e1 := newEngine(t, pl, owner(1), 1, 64)
	e1.add("r2", tokens)
	e1.mustRun()
	if got := e1.byID["r2"].loaded; got != 8 {
		t.Fatalf("owner 1 loaded %d blocks of owner 0's prefix, want 8", got)
	}
	// An owner restarts a request that lost a page rather than failing.
	if !e1.ranks[0].w.recover {
		t.Fatal("an attention-DP owner does not recover failed loads")
	}
}

func TestSpeculativePrefillLookaheadKeys(t *testing.T) {
	poolKinds(t, testSpeculativePrefillLookaheadKeys)
}

func testSpeculativePrefillLookaheadKeys(t *testing.T, newPool func() testPool) {
	pl := newPool()
	opts := baseOptions()
	opts.SpeculativePrefill, opts.PromptLookahead = true, 3
	s, err := NewScheduler(opts, pl)
	if err != nil {
		t.Fatal(err)
	}
	_ = s.RegisterLayout(testLayout(16))
	if _, _, err := s.Lookup(context.Background(), Request{ID: "g", Tokens: prompt(1, 0, 9)}, 0); !errors.Is(err, ErrNotContextOnly) {
		t.Fatalf("a generation request was accepted: %v", err)
	}
	if m, _, err := s.Lookup(context.Background(), Request{ID: "d", Tokens: prompt(1, 0, 9), Dummy: true}, 0); err != nil || m != 0 {
		t.Fatalf("a dummy request was refused or offered: %d, %v", m, err)
	}

	tokens := prompt(16, 0, 30) // (30-3)/4 = 6 blocks get a hash; block 6 needs tokens up to 31
	cold := newEngine(t, pl, opts, 1, 64)
	cold.add("r", tokens)
	cold.mustRun()
	want := saveKeysOf(t, opts, cold.layout, tokens)
	if len(want) != 6*3 {
		t.Fatalf("%d lookahead keys", len(want))
	}
	got := pl.keys()
	if len(got) != len(want) {
		t.Fatalf("pool holds %d keys, want %d", len(got), len(want))
	}
	for _, k := range want {
		if !pl.has(k) {
			t.Fatalf("missing lookahead key %s", k)
		}
	}
	// Lookahead keys differ from keys without a lookahead.
	plain := baseOptions()
	for _, k := range saveKeysOf(t, plain, cold.layout, tokens) {
		if pl.has(k) {
			t.Fatalf("a lookahead server wrote a plain key %s", k)
		}
	}
	warm := newEngine(t, pl, opts, 1, 64)
	warm.add("r", tokens)
	warm.mustRun()
	if got := warm.byID["r"].loaded; got != 6 {
		t.Fatalf("warm lookahead run loaded %d blocks, want 6", got)
	}
}

func TestGroupedSoftPinnedPuts(t *testing.T) { poolKinds(t, testGroupedSoftPinnedPuts) }

func testGroupedSoftPinnedPuts(t *testing.T, newPool func() testPool) {
	pl := newPool()
	opts := baseOptions()
	opts.GroupBlocks, opts.SoftPinTTL = true, 90*time.Second
	tokens := prompt(17, 0, 17)
	e := newEngine(t, pl, opts, 1, 32)
	e.add("r", tokens)
	e.mustRun()
	c, _ := keys.NewChain(keys.ChainConfig{TokensPerBlock: testT})
	hs, _ := c.Extend(tokens)
	g, _ := newGeometry(e.layout, opts.withDefaults())
	switch p := pl.(type) {
	case *memPool:
		for _, h := range hs {
			for _, k := range opts.Namespace.SaveKeys(testT, g.groups, h) {
				if got := p.group[k]; got != opts.Namespace.GroupKey(h) {
					t.Fatalf("%s is in group %q, want %q", k, got, opts.Namespace.GroupKey(h))
				}
				if p.pinTTL[k] != 90*time.Second {
					t.Fatalf("%s soft pin %v", k, p.pinTTL[k])
				}
			}
		}
	case *embPool:
		checkEmbeddedGroups(t, p, opts, g, hs)
	default:
		t.Fatalf("unknown pool %T", pl)
	}

	// A TTL above the pool's ceiling is refused on every put: logged, not fatal.
	var logs bytes.Buffer
	bad := baseOptions()
	bad.SoftPinTTL = 48 * time.Hour
	bad.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	e2 := newEngine(t, newPool(), bad, 1, 32)
	e2.add("r", tokens)
	e2.mustRun()
	if len(e2.pool.keys()) != 0 || strings.Count(logs.String(), "max_kv_soft_pin_ttl") != 1 || !strings.Contains(logs.String(), "failed to save") {
		t.Fatalf("refused puts: keys=%d logs=%s", len(e2.pool.keys()), logs.String())
	}
}

func TestHoleStatsFromTheLookup(t *testing.T) { poolKinds(t, testHoleStatsFromTheLookup) }

// checkEmbeddedGroups checks, on the embedded pool's own state, that every page of a block
// joined the block's eviction group and carries the 90 s soft pin: all objects are grouped and
// pinned, the pins lapse between 89 s and 91 s, and a get of one page of a block refreshes the
// lease of that block's other pages and of no other block's.
func checkEmbeddedGroups(t *testing.T, p *embPool, opts Options, g *geometry, hs []keys.Hash) {
	t.Helper()
	want := int64(len(hs) * 3)
	if st := p.stats(t); st.Objects != want || st.Detail[embedded.DetailGrouped] != want || st.Detail[embedded.DetailSoftPinned] != want {
		t.Fatalf("embedded pool: %d objects, %d grouped, %d soft-pinned; want %d of each", st.Objects, st.Detail[embedded.DetailGrouped], st.Detail[embedded.DetailSoftPinned], want)
	}
	p.clock.Advance(89 * time.Second)
	if st := p.stats(t); st.Detail[embedded.DetailSoftPinned] != want {
		t.Fatalf("after 89 s, %d of %d objects are soft-pinned", st.Detail[embedded.DetailSoftPinned], want)
	}
	p.clock.Advance(2 * time.Second)
	if st := p.stats(t); st.Detail[embedded.DetailSoftPinned] != 0 {
		t.Fatalf("after 91 s, %d objects are still soft-pinned", st.Detail[embedded.DetailSoftPinned])
	}
	// Every lease has lapsed by now; a get of one page of block 1 renews its whole group.
	hit := opts.Namespace.SaveKeys(testT, g.groups, hs[1])
	if _, ok := p.get(hit[0]); !ok {
		t.Fatalf("%s is not in the pool", hit[0])
	}
	now, ttl := p.clock.Now(), p.Options().LeaseTTL
	for b, h := range hs {
		for _, k := range opts.Namespace.SaveKeys(testT, g.groups, h) {
			d, ok := p.LeaseDeadline(k)
			switch {
			case !ok:
				t.Fatalf("%s is not in the pool", k)
			case b == 1 && !d.Equal(now.Add(ttl)):
				t.Fatalf("%s, in the hit block's group, has its lease until %v, want %v", k, d, now.Add(ttl))
			case b != 1 && d.After(now):
				t.Fatalf("%s, outside the hit block's group, had its lease renewed to %v", k, d)
			}
		}
	}
}

func testHoleStatsFromTheLookup(t *testing.T, newPool func() testPool) {
	pl := newPool()
	opts := baseOptions()
	tokens := prompt(18, 0, 41) // 10 candidate blocks
	cold := newEngine(t, pl, opts, 1, 64)
	cold.add("r", tokens)
	cold.mustRun()
	c, _ := keys.NewChain(keys.ChainConfig{TokensPerBlock: testT})
	hs, _ := c.Extend(tokens)
	// Pattern "##.##...#." : evict one page of blocks 2, 5, 6, 7 and 9.
	for _, b := range []int{2, 5, 6, 7, 9} {
		pl.evict(opts.Namespace.PageKey(b%2, testT, []uint64{48, 20}[b%2], hs[b]))
	}
	reg := prometheus.NewRegistry()
	var logs bytes.Buffer
	rep, err := stats.NewReporter(stats.ReporterOptions{Interval: time.Nanosecond, Registerer: reg, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	so := opts
	so.Stats = rep
	s, _ := NewScheduler(so, pl)
	_ = s.RegisterLayout(testLayout(64))
	calls := pl.existCalls()
	m, _, err := s.Lookup(context.Background(), Request{ID: "r", Tokens: tokens}, 0)
	if err != nil || m != 2*testT {
		t.Fatalf("lookup = %d, %v", m, err)
	}
	if pl.existCalls() != calls+1 {
		t.Fatalf("lookup made %d existence calls, want 1", pl.existCalls()-calls)
	}
	// Second lookup from a 3-block local match: candidates 3..9 = "##...#." .
	if _, _, err := s.Lookup(context.Background(), Request{ID: "r2", Tokens: tokens}, 3*testT); err != nil {
		t.Fatal(err)
	}
	want := stats.HoleStats{
		Lookups: 2, LookedUpBlocks: 10 + 7, HitBlocks: 2 + 2,
		Holes: 2 + 1, HoleBlocks: 4 + 3, RecomputedStoredTokens: (2+1)*testT + 1*testT,
	}
	if got := rep.HoleTotals(); got != want {
		t.Fatalf("hole stats %+v, want %+v", got, want)
	}
	if !strings.Contains(logs.String(), `msg="prefix-hole stats"`) {
		t.Fatalf("no stats line: %s", logs.String())
	}
}

func TestDummyBypassAndRoles(t *testing.T) { poolKinds(t, testDummyBypassAndRoles) }

func testDummyBypassAndRoles(t *testing.T, newPool func() testPool) {
	pl := newPool()
	cold := newEngine(t, pl, baseOptions(), 1, 32)
	tokens := prompt(19, 0, 17)
	cold.add("r", tokens)
	cold.mustRun()

	s, _ := NewScheduler(baseOptions(), pl)
	_ = s.RegisterLayout(testLayout(32))
	ctx := context.Background()
	if m, _, _ := s.Lookup(ctx, Request{ID: "d", Tokens: tokens, Dummy: true}, 0); m != 0 || s.reqs["d"] != nil {
		t.Fatal("a dummy request reached the adapter")
	}
	if m, _, _ := s.Lookup(ctx, Request{ID: "mm", Tokens: tokens, HasMultimodal: true}, 0); m != 0 || s.reqs["mm"] != nil {
		t.Fatal("an unhashed multimodal request was looked up")
	}
	digest := keys.MultimodalDigest([8]int32{1, 2, 3, 4, 5, 6, 7, 8})
	if _, _, _ = s.Lookup(ctx, Request{ID: "mm2", Tokens: tokens, HasMultimodal: true, Scope: keys.Scope{Multimodal: [][32]byte{digest}}}, 0); s.reqs["mm2"] == nil {
		t.Fatal("a hashed multimodal request was bypassed")
	}
	if m, _, _ := s.Lookup(ctx, Request{ID: "x", Tokens: tokens}, 2); m != 0 {
		t.Fatal("a local match inside a block got an offer")
	}
	if m, _, _ := s.Lookup(ctx, Request{ID: "x", Tokens: tokens}, 8); m != 8 {
		t.Fatalf("lookup past a 2-block local match = %d, want 8", m)
	}
	if s.RequestFinished("never", false) {
		t.Fatal("an unknown request reported saves")
	}

	for _, role := range []Role{RoleProducer, RoleCapacity} {
		o := baseOptions()
		o.Role = role
		ps, _ := NewScheduler(o, pl)
		_ = ps.RegisterLayout(testLayout(32))
		if m, _, _ := ps.Lookup(ctx, Request{ID: "r", Tokens: tokens}, 0); m != 0 {
			t.Fatalf("a %s role offered %d tokens", role, m)
		}
		meta, _ := ps.BuildMeta(SchedulerOutput{NewRequests: []RequestData{{ID: "r", NewBlockIDsByGroup: [][]int{{0, 1, 2, 3, 4}, {0, 1, 2, 3, 4}}, NumScheduledTokens: 17}}})
		if role == RoleProducer && len(meta.Saves) != 1 || role == RoleCapacity && len(meta.Saves) != 0 {
			t.Fatalf("%s role saves %+v", role, meta.Saves)
		}
	}
}

func TestAdmissionQueryIsReplaced(t *testing.T) { poolKinds(t, testAdmissionQueryIsReplaced) }

func testAdmissionQueryIsReplaced(t *testing.T, newPool func() testPool) {
	pl := newPool()
	cold := newEngine(t, pl, baseOptions(), 1, 32)
	tokens := prompt(20, 0, 25)
	cold.add("r", tokens)
	cold.mustRun()
	s, _ := NewScheduler(baseOptions(), pl)
	_ = s.RegisterLayout(testLayout(32))
	ctx := context.Background()
	if m, _, _ := s.AdmissionQuery(ctx, Request{ID: "r", Tokens: tokens}, 0); m != 24 {
		t.Fatalf("admission query = %d", m)
	}
	if m, _, _ := s.AdmissionQuery(ctx, Request{ID: "r", Tokens: tokens}, 8); m != 16 {
		t.Fatalf("repeated admission query = %d", m)
	}
	if st := s.reqs["r"]; st.offerFirst != 2 || st.offerBlocks != 4 {
		t.Fatalf("offer (%d, %d) after a repeated query", st.offerFirst, st.offerBlocks)
	}
	if !s.Declarations().SupportsAdmissionQuery {
		t.Fatal("admission query not declared")
	}
}

func TestDeclarations(t *testing.T) {
	for _, tt := range []struct {
		role    Role
		backoff ReuseBackoff
		aligned bool
		drops   bool
	}{
		{RoleBoth, ReuseBackoffOff, true, true},
		{RoleConsumer, ReuseBackoffAlign, true, false},
		{RoleProducer, ReuseBackoffOff, false, false},
		{RoleCapacity, ReuseBackoffOff, false, false},
	} {
		o := baseOptions()
		o.Role, o.LocalReuseBackoff = tt.role, tt.backoff
		s, err := NewScheduler(o, newMemPool())
		if err != nil {
			t.Fatal(err)
		}
		d := ReadDeclarations(s.Declarations().Map(), tt.role)
		// Both halves declare the same (seed commit 12: supports_attention_dp on the scheduler
		// and the worker); the worker's are what Register answers and LocalRank reads.
		w, err := NewWorker(o, newMemPool(), newHostMover(testLayout(16)))
		if err != nil {
			t.Fatal(err)
		}
		if wd := w.Declarations(); wd != s.Declarations() {
			t.Errorf("%s/%s: the worker declares %+v, the scheduler %+v", tt.role, tt.backoff, wd, s.Declarations())
		}
		if rd := NewLocalRank("r", s, w).Declarations(); rd != d {
			t.Errorf("%s/%s: the rank reads %+v, want %+v", tt.role, tt.backoff, rd, d)
		}
		_ = w.Close(context.Background())
		if d.RequiresBlockAlignedReuse != tt.aligned || d.DropsReuseMatchBackoff != tt.drops {
			t.Errorf("%s/%s: aligned=%t drops=%t", tt.role, tt.backoff, d.RequiresBlockAlignedReuse, d.DropsReuseMatchBackoff)
		}
		if !d.SupportsAttentionDP {
			t.Errorf("%s: attention DP not supported", tt.role)
		}
		if tt.role == RoleCapacity && (d.ReportsFailedLoads || d.RequiresCompletionReservation || d.SupportsAdmissionQuery || d.SupportsSpeculativePrefill) {
			t.Errorf("a capacity role's declarations were not ignored: %+v", d)
		}
		if tt.role != RoleCapacity && (!d.ReportsFailedLoads || !d.RequiresCompletionReservation || !d.SupportsAdmissionQuery || !d.SupportsSpeculativePrefill) {
			t.Errorf("%s: %+v", tt.role, d)
		}
	}
	// Only an explicit true counts.
	raw := map[string]any{DeclReportsFailedLoads: "true", DeclSupportsAdmissionQuery: 1, DeclRequiresCompletionReservation: true}
	d := ReadDeclarations(raw, RoleBoth)
	if d.ReportsFailedLoads || d.SupportsAdmissionQuery || !d.RequiresCompletionReservation {
		t.Fatalf("truthy values counted: %+v", d)
	}
}

func TestOptionsValidateReportsEverything(t *testing.T) {
	err := Options{Role: "leader", TokensPerBlock: 0, TransferBatchSize: -1, LocalReuseBackoff: "sometimes", AsyncLoadWorkers: -2}.Validate()
	if err == nil {
		t.Fatal("invalid options accepted")
	}
	for _, want := range []string{"role", "transfer_batch_size", "local_reuse_backoff", "async_load_workers"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %s: %v", want, err)
		}
	}
	o := baseOptions()
	o.Namespace.ModelKey = ""
	if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "model key") {
		t.Fatalf("missing model key: %v", err)
	}
	if err := baseOptions().Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestSaveErrorIsKept(t *testing.T) {
	pl := newMemPool()
	l := testLayout(16)
	m := newHostMover(l)
	m.gatherFn = func() error { return errors.New("device lost") }
	w, err := NewWorker(baseOptions(), pl, m)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.RegisterLayout(l); err != nil {
		t.Fatal(err)
	}
	w.BindMeta(Metadata{Saves: []RequestTransfers{{RequestID: "r", Pages: []PageTransfer{{Group: 0, Page: 1}}}}})
	if err := w.WaitForSave(context.Background()); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for w.Err() == nil && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	for i := range 2 {
		if _, _, err := w.GetFinished(nil, nil); err == nil || !strings.Contains(err.Error(), "device lost") {
			t.Fatalf("call %d: %v", i, err)
		}
		if err := w.StartLoad(context.Background()); err == nil {
			t.Fatal("StartLoad after a save error succeeded")
		}
	}
	if err := w.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
}

type blockingFence struct{ release chan struct{} }

func (f blockingFence) Wait(ctx context.Context) error {
	select {
	case <-f.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func TestCloseJoinsAgainstOneDeadline(t *testing.T) {
	l := testLayout(16)
	fence := blockingFence{release: make(chan struct{})}
	o := baseOptions()
	o.Fence = func() Fence { return fence }
	var mu sync.Mutex
	var stagings []*hostStaging
	m := &trackingMover{hostMover: newHostMover(l), made: &stagings, mu: &mu}
	w, err := NewWorker(o, newMemPool(), m)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.RegisterLayout(l); err != nil {
		t.Fatal(err)
	}
	w.BindMeta(Metadata{Saves: []RequestTransfers{{RequestID: "r", Pages: []PageTransfer{{Group: 0, Page: 1}}}}})
	if err := w.WaitForSave(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := w.Close(ctx); err == nil || !strings.Contains(err.Error(), "staging is kept") {
		t.Fatalf("close past the deadline: %v", err)
	}
	mu.Lock()
	for _, s := range stagings {
		if s.closed {
			t.Error("staging released while a goroutine may still use it")
		}
	}
	mu.Unlock()
	if err := w.StartLoad(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("StartLoad after close: %v", err)
	}

	// A clean close releases every staging buffer.
	w2, _ := NewWorker(baseOptions(), newMemPool(), m)
	_ = w2.RegisterLayout(l)
	mu.Lock()
	stagings = nil
	mu.Unlock()
	w3, _ := NewWorker(func() Options { o := baseOptions(); o.AsyncLoad, o.AsyncLoadWorkers = true, 3; return o }(), newMemPool(), m)
	if err := w3.RegisterLayout(l); err != nil {
		t.Fatal(err)
	}
	if err := w3.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	_ = w2.Close(context.Background())
	mu.Lock()
	defer mu.Unlock()
	if len(stagings) != 3+1 { // three async load shares and one save staging
		t.Fatalf("%d stagings made", len(stagings))
	}
	for _, s := range stagings {
		if !s.closed {
			t.Fatal("staging not released by a clean close")
		}
	}
}

// Seed commit 17: shutdown unregisters every staging pool and keeps any pool whose
// unregistration failed. A save staging whose release fails is kept by the worker with the
// mover that made it (neither is closed), the close error says so, and the other staging is
// still released.
func TestStagingWhoseUnregistrationFailsIsKept(t *testing.T) {
	l := testLayout(16)
	var mu sync.Mutex
	var stagings []*hostStaging
	m := &trackingMover{hostMover: newHostMover(l), made: &stagings, mu: &mu}
	o := baseOptions()
	o.AsyncLoad, o.AsyncLoadWorkers = true, 2
	w, err := NewWorker(o, newMemPool(), m)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.RegisterLayout(l); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	if len(stagings) != 2+1 {
		mu.Unlock()
		t.Fatalf("%d stagings made, want two async load shares and one save staging", len(stagings))
	}
	for _, s := range stagings {
		if s == w.saveStage.(*hostStaging) {
			s.failClose = errors.New("cuMemHostUnregister: CUDA_ERROR_INVALID_VALUE")
		}
	}
	mu.Unlock()
	saveMover := w.saveMover.(*trackingMover)
	err = w.Close(context.Background())
	if err == nil || !strings.Contains(err.Error(), "CUDA_ERROR_INVALID_VALUE") || !strings.Contains(err.Error(), "the staging is kept") {
		t.Fatalf("close = %v, want the failed unregistration named and the staging kept", err)
	}
	if len(w.keptStaging) != 1 || w.keptStaging[0] != w.saveStage {
		t.Fatalf("kept %d stagings, want the save staging", len(w.keptStaging))
	}
	if saveMover.closed {
		t.Fatal("the mover of a kept staging was closed")
	}
	for i, am := range w.asyncMovers {
		if !am.(*trackingMover).closed {
			t.Fatalf("async mover %d of a released staging was not closed", i)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	released := 0
	for _, s := range stagings {
		if s.closed {
			released++
		}
	}
	if released != 2 {
		t.Fatalf("%d stagings released, want the two async shares", released)
	}
}

// trackingMover records the staging it makes, through its clones too.
type trackingMover struct {
	*hostMover
	mu   *sync.Mutex
	made *[]*hostStaging
}

func (m *trackingMover) NewStaging(slots, slotBytes int) (gpuStaging, error) {
	s, err := m.hostMover.NewStaging(slots, slotBytes)
	if err == nil {
		m.mu.Lock()
		*m.made = append(*m.made, s.(*hostStaging))
		m.mu.Unlock()
	}
	return s, err
}

func (m *trackingMover) Clone() (gpuMover, error) {
	c, _ := m.hostMover.Clone()
	return &trackingMover{hostMover: c.(*hostMover), mu: m.mu, made: m.made}, nil
}

var _ = pool.OK

// TestLookupTokensOwned: a lookup that hands its tokens over (TokensOwned) leaves them with the
// scheduler uncopied, and the tokens a later BuildMeta appends never land in the caller's array;
// without the flag the scheduler keeps its own copy, so the caller may reuse its slice.
func TestLookupTokensOwned(t *testing.T) {
	for _, owned := range []bool{true, false} {
		s, _ := NewScheduler(baseOptions(), newMemPool())
		_ = s.RegisterLayout(testLayout(16))
		buf := make([]int64, 13, 64)
		copy(buf, prompt(14, 0, 13))
		want := slices.Clone(buf)
		if _, _, err := s.Lookup(context.Background(), Request{ID: "r", Tokens: buf, TokensOwned: owned}, 0); err != nil {
			t.Fatal(err)
		}
		kept := s.reqs["r"].tokens
		if shared := &kept[0] == &buf[0]; shared != owned {
			t.Fatalf("owned %v: the scheduler shares the caller's array: %v", owned, shared)
		}
		pages := [][]int{{0, 1, 2, 3}, {0, 1, 2, 3}}
		if _, err := s.BuildMeta(SchedulerOutput{CachedRequests: []RequestData{{ID: "r", NewTokens: []int64{7, 8, 9}, NewBlockIDsByGroup: pages, NumScheduledTokens: 3}}}); err != nil {
			t.Fatal(err)
		}
		if got := buf[:16]; !slices.Equal(got[:13], want) || got[13] != 0 || got[14] != 0 || got[15] != 0 {
			t.Fatalf("owned %v: the caller's array changed: %v", owned, got)
		}
		if !owned {
			buf[0] = -1 // the caller reuses its slice
		}
		if got := s.reqs["r"].tokens; len(got) != 16 || got[0] != want[0] || !slices.Equal(got[13:], []int64{7, 8, 9}) {
			t.Fatalf("owned %v: the scheduler holds %v", owned, got)
		}
	}
}
