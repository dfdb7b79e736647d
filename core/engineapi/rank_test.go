package engineapi_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvctl/kvctl/core/connector"
	"github.com/kvctl/kvctl/core/daemon"
	"github.com/kvctl/kvctl/core/daemon/daemontest"
	"github.com/kvctl/kvctl/core/engineapi"
	"github.com/kvctl/kvctl/core/engineapi/enginepb"
	"github.com/kvctl/kvctl/core/hostmem"
	"github.com/kvctl/kvctl/core/keys"
	"github.com/kvctl/kvctl/core/kvmem"
	"github.com/kvctl/kvctl/core/simkv"
	"github.com/kvctl/kvctl/pool"
	"github.com/kvctl/kvctl/pool/embedded"
)

const rankT = 8 // tokens per block in the rank tests

// rankLayout has two layer groups, the second with a replicated region.
func rankLayout(slots int) (kvmem.Layout, int64) {
	s := uint64(slots)
	l := kvmem.Layout{TokensPerBlock: rankT, Groups: []kvmem.GroupLayout{
		{ID: 0, Slots: slots, Regions: []kvmem.Region{{Offset: 0, Stride: 48, Size: 48}}},
		{ID: 1, Slots: slots, Regions: []kvmem.Region{{Offset: 48 * s, Stride: 32, Size: 24}}, ReplicatedRegions: []kvmem.Region{{Offset: 80 * s, Stride: 16, Size: 16}}},
	}}
	return l, int64(96 * s)
}

func rankPool() embedded.Options {
	po := embedded.DefaultOptions()
	po.Segments = []embedded.SegmentSpec{{Name: "rank-test", Capacity: 16 << 20}}
	return po
}

var rankNamespace = keys.Namespace{ModelKey: "rank-model", WorldSize: 1}

// rankSide is one implementation under test: the rank, the engine's own view of its memory,
// and the pool behind it.
type rankSide struct {
	rank connector.Rank
	view kvmem.Mover
	pool *embedded.Embedded
}

func localSide(t *testing.T, layout kvmem.Layout, size int64) rankSide {
	t.Helper()
	pl, err := embedded.NewEmbedded(rankPool())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pl.Close() })
	opts := connector.Options{Role: connector.RoleBoth, Namespace: rankNamespace, Format: keys.FormatTRTLLM, TokensPerBlock: rankT,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	s, err := connector.NewScheduler(opts, pl)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.RegisterLayout(layout); err != nil {
		t.Fatal(err)
	}
	mem := sharedMemory(t, size)
	mv, err := hostmem.NewMover(mem.FD, size, layout)
	if err != nil {
		t.Fatal(err)
	}
	w, err := connector.NewWorker(opts, pl, mv)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close(context.Background()); _ = mv.Close() })
	if err := w.RegisterLayout(layout); err != nil {
		t.Fatal(err)
	}
	return rankSide{rank: connector.NewLocalRank("local", s, w), view: hostView(t, mem, size, layout), pool: pl}
}

func remoteSide(t *testing.T, layout kvmem.Layout, size int64) rankSide {
	t.Helper()
	r := daemontest.Start(t, daemon.Config{Pool: rankPool()})
	c, err := engineapi.Dial(r.Info.Socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	mem := sharedMemory(t, size)
	resp, err := c.RegisterSharedMemory(context.Background(), &enginepb.RegisterRequest{
		Engine: "remote", ModelKey: rankNamespace.ModelKey, WorldSize: 1, Role: string(connector.RoleBoth),
		Format: string(keys.FormatTRTLLM), Scheduler: true, Layout: engineapi.LayoutToPB(layout),
	}, mem.FD, uint64(size))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = c.Unregister(context.Background(), &enginepb.EngineRef{Engine: "remote"}) })
	return rankSide{rank: engineapi.NewRemoteRank(c, resp, connector.RoleBoth), view: hostView(t, mem, size, layout), pool: r.Daemon.Pool()}
}

func sharedMemory(t *testing.T, size int64) *hostmem.SharedMemory {
	t.Helper()
	mem, err := hostmem.NewSharedMemory(size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mem.Close() })
	return mem
}

func hostView(t *testing.T, mem *hostmem.SharedMemory, size int64, layout kvmem.Layout) kvmem.Mover {
	t.Helper()
	mv, err := hostmem.NewMover(mem.FD, size, layout)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mv.Close() })
	return mv
}

func rankPrompt(seed int64, shared, n int) []int64 {
	out := make([]int64, n)
	for i := range out {
		if i < shared {
			out[i] = int64(7000 + i)
		} else {
			out[i] = seed*100000 + int64(i)
		}
	}
	return out
}

// transcript is what one side did: every non-empty pass's metadata, each request's outcome,
// the driver's counts and the pool's keys at the end.
type transcript struct {
	passes   []string
	requests []string
	stats    string
	keys     []string
	loaded   int
}

// drive runs the same request sequence on one side: a cold phase (two prompts sharing three
// blocks, two blocks a pass), then a warm phase whose first pass loses one page from the pool
// between the lookup and the load, so one request restarts.
func drive(t *testing.T, side rankSide, layout kvmem.Layout) transcript {
	t.Helper()
	ctx := context.Background()
	var tr transcript
	mem := &simkv.Memory{Layout: layout, Ranks: []simkv.Pages{side.view}}
	base := map[string]int{}
	lost := false
	var drv *connector.Driver
	hooks := connector.DriverHooks{
		// Fixed slots per request, so the page ids do not depend on when saves finish.
		Allocate: func(ctx context.Context, r *connector.DrivenRequest, m int, _ bool) (int, error) {
			blocks := (len(r.Tokens) + rankT - 1) / rankT
			r.Pages = make([][]int, len(layout.Groups))
			for g := range r.Pages {
				for b := range blocks {
					r.Pages[g] = append(r.Pages[g], base[r.ID]+b)
				}
			}
			return m, mem.Poison(ctx, r.Pages, blocks)
		},
		Built: func(ctx context.Context, meta connector.Metadata) error {
			if line := flatten(meta); line != "" {
				tr.passes = append(tr.passes, fmt.Sprintf("pass %d: %s", drv.Pass(), line))
			}
			for _, l := range meta.Loads {
				if l.RequestID != "c" || lost {
					continue
				}
				// Lose block 3 of c's restore in every group.
				lost = true
				h, _ := l.Pages[3*len(layout.Groups)].Hash.Hash()
				for g, gl := range layout.Groups {
					k := rankNamespace.PageKey(g, rankT, gl.BytesPerPage(), h)
					if code := side.pool.Remove(ctx, k, true); code != pool.OK {
						return fmt.Errorf("remove %s: %v", k, code)
					}
				}
			}
			return nil
		},
		Restored: func(ctx context.Context, r *connector.DrivenRequest, first, end int) error {
			tr.loaded += end - first
			return mem.Check(ctx, r.ID, r.Tokens, r.Pages, first, end)
		},
		Computed: func(ctx context.Context, r *connector.DrivenRequest, first, end int) error {
			return mem.Write(ctx, r.Tokens, r.Pages, first, end)
		},
		Restarted: func(ctx context.Context, r *connector.DrivenRequest) error {
			return mem.CheckNoWrongByte(ctx, r.ID, r.Tokens, r.Pages, len(r.Pages[0]))
		},
	}
	var err error
	drv, err = connector.NewDriver([]connector.Rank{side.rank}, connector.DriverOptions{TokensPerBlock: rankT, Chunk: 2 * rankT, Hooks: hooks})
	if err != nil {
		t.Fatal(err)
	}
	wait := func(context.Context) error { time.Sleep(50 * time.Microsecond); return nil }
	phase := func(prompts map[string][]int64, order ...string) {
		var reqs []*connector.DrivenRequest
		for i, id := range order {
			base[id] = 8 * i
			reqs = append(reqs, drv.Add(connector.Request{ID: id, Tokens: prompts[id], ContextOnly: true}))
		}
		for limit := 0; drv.Busy(); limit++ {
			if limit > 1000 {
				t.Fatal("the driver made no progress")
			}
			if err := drv.Step(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if err := drv.Drain(ctx, wait); err != nil {
			t.Fatal(err)
		}
		for _, r := range reqs {
			tr.requests = append(tr.requests, fmt.Sprintf("%s: phase %d computed %d matched %d loaded pages %d save pages %d restarts %d async saving %t",
				r.ID, r.Phase, r.Computed, r.Matched, r.LoadedPages, r.SavePages, r.Restarts, r.AsyncSaving))
		}
	}
	a := rankPrompt(1, 0, 5*rankT+3)
	phase(map[string][]int64{"a": a, "b": rankPrompt(2, 3*rankT, 6*rankT+1)}, "a", "b")
	phase(map[string][]int64{"c": a, "d": rankPrompt(3, 2*rankT, 4*rankT+5)}, "c", "d")
	st := drv.Stats()
	tr.stats = fmt.Sprintf("matched %d parked %d restarts %d", st.MatchedTokens, st.Parked, st.Restarts)
	if tr.keys, err = side.pool.Keys(ctx); err != nil {
		t.Fatal(err)
	}
	slices.Sort(tr.keys)
	return tr
}

// flatten spells a pass's metadata one transfer a field, nil and empty alike.
func flatten(m connector.Metadata) string {
	var out string
	for _, set := range []struct {
		name string
		ts   []connector.RequestTransfers
	}{{"load", m.Loads}, {"save", m.Saves}, {"async", m.AsyncLoads}} {
		for _, t := range set.ts {
			out += fmt.Sprintf("[%s %s", set.name, t.RequestID)
			for _, p := range t.Pages {
				out += fmt.Sprintf(" %x/g%d/p%d", p.Hash.Bytes()[:4], p.Group, p.Page)
			}
			out += "]"
		}
	}
	return out
}

// TestLocalAndRemoteRanksAgree drives the same request sequence through connector.Driver over a
// LocalRank (a Scheduler and a Worker in process) and over a RemoteRank (a real daemon on a
// unix socket, through the engine API): the passes' metadata, every request's outcome, the
// restored bytes and the pool's keys are the same.
func TestLocalAndRemoteRanksAgree(t *testing.T) {
	layout, size := rankLayout(32)
	local, remote := localSide(t, layout, size), remoteSide(t, layout, size)
	if l, r := local.rank.Declarations(), remote.rank.Declarations(); l != r {
		t.Fatalf("declarations: local %+v, remote %+v", l, r)
	}
	lt, rt := drive(t, local, layout), drive(t, remote, layout)
	if lt.loaded == 0 || !slices.ContainsFunc(lt.requests, func(s string) bool {
		return strings.HasPrefix(s, "c:") && strings.HasSuffix(s, "restarts 1 async saving true")
	}) {
		t.Fatalf("the sequence restored no block or did not restart c: %d blocks restored, requests %q", lt.loaded, lt.requests)
	}
	for _, cmp := range []struct {
		what          string
		local, remote []string
	}{
		{"passes", lt.passes, rt.passes},
		{"requests", lt.requests, rt.requests},
		{"stats", []string{lt.stats, fmt.Sprint(lt.loaded)}, []string{rt.stats, fmt.Sprint(rt.loaded)}},
		{"pool keys", lt.keys, rt.keys},
	} {
		if !slices.Equal(cmp.local, cmp.remote) {
			t.Errorf("%s differ:\nlocal  %q\nremote %q", cmp.what, cmp.local, cmp.remote)
		}
	}
}
