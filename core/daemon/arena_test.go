package daemon_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvctl/kvctl/core/connector"
	"github.com/kvctl/kvctl/core/daemon"
	"github.com/kvctl/kvctl/core/daemon/daemontest"
	"github.com/kvctl/kvctl/core/engineapi"
	"github.com/kvctl/kvctl/core/engineapi/enginepb"
	"github.com/kvctl/kvctl/core/enginesim"
	"github.com/kvctl/kvctl/pool/embedded"
)

// arenaMappings counts this process's shared mappings of prompt arenas with permissions perms:
// "r--s" are the daemon's (it maps arenas read-only), "rw-s" the engines' own.
func arenaMappings(t *testing.T, perms string) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Skip(err)
	}
	n := 0
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 6 && f[1] == perms && strings.Contains(line, "memfd:kvctl-prompt-arena") {
			n++
		}
	}
	return n
}

// arenaFDs counts this process's open descriptors of prompt arenas.
func arenaFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip(err)
	}
	n := 0
	for _, e := range ents {
		if l, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); err == nil && strings.Contains(l, "memfd:kvctl-prompt-arena") {
			n++
		}
	}
	return n
}

// waitFor polls cond for up to 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// arenaEngine starts an enginesim engine that sends its own prompts packed, so that the test
// alone decides what its prompt arena holds, and saves prompts into the pool.
func arenaEngine(t *testing.T, socket, name string, reqs []enginesim.Request) *enginesim.Engine {
	t.Helper()
	ctx := context.Background()
	e, err := enginesim.Start(ctx, enginesim.Config{Socket: socket, ModelKey: "m", Name: name, TokensPerBlock: 16, Slots: 128, NoPromptArena: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close(context.Background()) })
	if len(reqs) > 0 {
		if _, err := e.Run(ctx, reqs, 0); err != nil {
			t.Fatal(err)
		}
	}
	return e
}

// newArena makes a prompt arena released when the test ends.
func newArena(t *testing.T, size int64) *engineapi.PromptArena {
	t.Helper()
	a, err := engineapi.NewPromptArena(size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	return a
}

// putTokens writes toks at byte offset off of a in the tokens_packed encoding (any alignment).
func putTokens(a *engineapi.PromptArena, off uint64, toks []int64) {
	engineapi.PackTokens(a.Bytes()[off:off], toks)
}

// TestPromptArenaLookup runs lookups over a real daemon's socket with the prompt in a prompt
// arena: for the same prompt they answer as the packed field does, warm and cold, at aligned and
// unaligned offsets, through Lookup and AdmissionQuery, with num_computed_tokens checked against
// the arena prompt's length; a range outside the arena, over the token limit, or sent with
// another token field is refused with InvalidArgument naming the problem; the engine cannot
// shrink the sealed arena; and the daemon keeps serving afterwards.
func TestPromptArenaLookup(t *testing.T) {
	r := start(t, 64<<20)
	ctx := context.Background()
	const T = 16
	reqs := prompts(21, 3, T, "fill")
	e := arenaEngine(t, r.Info.Socket, "pa", reqs)
	c := e.Client(0)
	a := newArena(t, 1<<20)
	if err := c.RegisterPromptArena(ctx, "pa/rank0", a); err != nil {
		t.Fatal(err)
	}
	call := func(admission bool, id string, computed int32, req *enginepb.Request) (int, error) {
		req.Id, req.ContextOnly = id, true
		lr := &enginepb.LookupRequest{Engine: "pa/rank0", Request: req, NumComputedTokens: computed}
		var resp *enginepb.LookupResponse
		var err error
		if admission {
			resp, err = c.AdmissionQuery(ctx, lr)
		} else {
			resp, err = c.Lookup(ctx, lr)
		}
		_, _ = c.RequestReset(ctx, &enginepb.RequestRef{Engine: "pa/rank0", RequestId: id})
		return int(resp.GetMatchedTokens()), err
	}
	cold := prompts(99, 1, T, "cold")[0].Tokens
	for i, tc := range []struct {
		toks []int64
		off  uint64
		want int
	}{
		{reqs[0].Tokens, 0, (len(reqs[0].Tokens) - 1) / T * T},
		{reqs[2].Tokens, 5, (len(reqs[2].Tokens) - 1) / T * T},
		{reqs[1].Tokens, 4096 + 3, (len(reqs[1].Tokens) - 1) / T * T},
		{cold, 64 << 10, 0},
	} {
		putTokens(a, tc.off, tc.toks)
		rng := &enginepb.ArenaRange{Offset: tc.off, Count: uint64(len(tc.toks))}
		for _, admission := range []bool{false, true} {
			got, err := call(admission, "arena", 0, &enginepb.Request{TokensArena: rng})
			if err != nil {
				t.Fatal(err)
			}
			packed, err := call(admission, "packed", 0, &enginepb.Request{TokensPacked: engineapi.PackTokens(nil, tc.toks)})
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want || packed != tc.want {
				t.Errorf("prompt %d at offset %d (admission %v): arena matched %d, packed %d; want %d", i, tc.off, admission, got, packed, tc.want)
			}
		}
	}

	toks := reqs[0].Tokens
	putTokens(a, 0, toks)
	whole := &enginepb.ArenaRange{Offset: 0, Count: uint64(len(toks))}
	if got, err := call(false, "part", T, &enginepb.Request{TokensArena: whole}); err != nil || got != (len(toks)-1)/T*T-T {
		t.Errorf("arena lookup from token %d: matched %d, %v; want %d", T, got, err, (len(toks)-1)/T*T-T)
	}
	if _, err := call(false, "past", int32(len(toks)+1), &enginepb.Request{TokensArena: whole}); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "past the prompt") {
		t.Errorf("num_computed_tokens past the arena prompt: %v", err)
	}

	size := a.Size()
	for _, tc := range []struct {
		name string
		req  *enginepb.Request
		msg  string
	}{
		{"offset past the end", &enginepb.Request{TokensArena: &enginepb.ArenaRange{Offset: size + 1}}, "offset 1048577 is past the end of the 1048576-byte arena"},
		{"range past the end", &enginepb.Request{TokensArena: &enginepb.ArenaRange{Offset: size - 8, Count: 2}}, "of 2 tokens at offset 1048568 ends past the end of the 1048576-byte arena"},
		{"more tokens than the arena holds", &enginepb.Request{TokensArena: &enginepb.ArenaRange{Offset: 0, Count: size/8 + 1}}, "ends past the end"},
		{"count over the request limit", &enginepb.Request{TokensArena: &enginepb.ArenaRange{Count: 4 << 20}}, "tokens_arena count 4194304 is above the limit of 2097152"},
		{"count that overflows", &enginepb.Request{TokensArena: &enginepb.ArenaRange{Offset: 8, Count: 1 << 61}}, "is above the limit"},
		{"arena and packed", &enginepb.Request{TokensArena: whole, TokensPacked: engineapi.PackTokens(nil, toks)}, "tokens_arena and tokens or tokens_packed are all set"},
		{"arena and repeated", &enginepb.Request{TokensArena: whole, Tokens: toks}, "are all set"},
	} {
		_, err := call(false, "bad", 0, tc.req)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: %v, want InvalidArgument naming %q", tc.name, err, tc.msg)
		}
	}

	// The seal holds: the engine cannot shrink the arena under the daemon's mapping.
	if err := unix.Ftruncate(a.FD(), 0); err == nil {
		t.Error("the engine truncated its sealed arena")
	}
	if got, err := call(false, "after", 0, &enginepb.Request{TokensArena: whole}); err != nil || got != (len(toks)-1)/T*T {
		t.Errorf("lookup after the refusals: %d, %v", got, err)
	}
	warmRun(ctx, t, e, reqs, "-again", "second run")
}

// TestPromptArenaBelongsToItsEngine checks who may register and use an arena: a lookup of an
// engine with no arena of its own is refused with FailedPrecondition even while another engine
// has one; another connection cannot register an arena for an engine it did not register; an
// unknown engine, an unknown descriptor token and a rank without the scheduler are refused.
func TestPromptArenaBelongsToItsEngine(t *testing.T) {
	r := start(t, 64<<20)
	ctx := context.Background()
	reqs := prompts(5, 2, 16, "own")
	ea := arenaEngine(t, r.Info.Socket, "first", reqs)
	eb := arenaEngine(t, r.Info.Socket, "second", nil)
	a := newArena(t, 64<<10)
	if err := ea.Client(0).RegisterPromptArena(ctx, "first/rank0", a); err != nil {
		t.Fatal(err)
	}
	putTokens(a, 0, reqs[0].Tokens)
	rng := &enginepb.ArenaRange{Count: uint64(len(reqs[0].Tokens))}
	_, err := eb.Client(0).Lookup(ctx, &enginepb.LookupRequest{Engine: "second/rank0", Request: &enginepb.Request{Id: "x", TokensArena: rng}})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), `engine "second/rank0" has no prompt arena`) {
		t.Errorf("lookup naming an arena range of an engine without an arena: %v", err)
	}
	_, err = eb.Client(0).Lookup(ctx, &enginepb.LookupRequest{Engine: "first/rank0", Request: &enginepb.Request{Id: "x", TokensArena: rng}})
	if status.Code(err) != codes.PermissionDenied {
		t.Errorf("lookup of the first engine's arena over the second's connection: %v", err)
	}
	b := newArena(t, 64<<10)
	for _, tc := range []struct {
		name   string
		c      *engineapi.Client
		engine string
		code   codes.Code
		msg    string
	}{
		{"another connection's engine", eb.Client(0), "first/rank0", codes.PermissionDenied, "registered over another connection"},
		{"unknown engine", eb.Client(0), "nobody", codes.NotFound, `engine "nobody" is not registered`},
	} {
		err := tc.c.RegisterPromptArena(ctx, tc.engine, b)
		if status.Code(err) != tc.code || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: %v, want %v naming %q", tc.name, err, tc.code, tc.msg)
		}
	}
	_, err = ea.Client(0).EngineClient.RegisterPromptArena(ctx, &enginepb.PromptArenaRequest{Engine: "first/rank0", FdToken: strings.Repeat("ab", 16), Size: 4096})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "unknown or expired descriptor token") {
		t.Errorf("unknown descriptor token: %v", err)
	}
	// The first engine's arena still serves it after all that.
	resp, err := ea.Client(0).Lookup(ctx, &enginepb.LookupRequest{Engine: "first/rank0", Request: &enginepb.Request{Id: "y", TokensArena: rng, ContextOnly: true}})
	if want := (len(reqs[0].Tokens) - 1) / 16 * 16; err != nil || int(resp.GetMatchedTokens()) != want {
		t.Errorf("first engine's arena lookup: %d, %v; want %d", resp.GetMatchedTokens(), err, want)
	}

	tp, err := enginesim.Start(ctx, enginesim.Config{Socket: r.Info.Socket, ModelKey: "m", Name: "tp", World: 2, Slots: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer tp.Close(ctx)
	err = tp.Client(1).RegisterPromptArena(ctx, "tp/rank1", b)
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "without the scheduler adapter") {
		t.Errorf("arena for a rank without the scheduler: %v", err)
	}
}

// TestPromptArenaRefusesMemory starts a daemon whose arena limit is 1 MiB and offers it arenas
// it must refuse, each with InvalidArgument naming the problem: a regular file, memfds that are
// not sealed against shrinking, one smaller than the size registered, one over the limit, size
// 0. The daemon keeps none of their descriptors. An engine whose arena is refused (RemoteRank's
// default 8 MiB is over the limit) falls back to packed prompts and runs correctly.
func TestPromptArenaRefusesMemory(t *testing.T) {
	popts := embedded.DefaultOptions()
	popts.Segments = []embedded.SegmentSpec{{Name: "test", Capacity: 64 << 20}}
	r := daemontest.Start(t, daemon.Config{Pool: popts, Defaults: connector.Options{StagingBufferBytes: 8 << 20},
		Limits: daemon.Limits{MaxPromptArenaBytes: 1 << 20}})
	ctx := context.Background()
	e := arenaEngine(t, r.Info.Socket, "ref", nil)
	c := e.Client(0)
	memfd := func(flags int, size int64, seals int) int {
		fd, err := unix.MemfdCreate("kvctl-prompt-arena", unix.MFD_CLOEXEC|flags)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = unix.Close(fd) })
		if err := unix.Ftruncate(fd, size); err != nil {
			t.Fatal(err)
		}
		if seals != 0 {
			if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals); err != nil {
				t.Fatal(err)
			}
		}
		return fd
	}
	plain, err := os.CreateTemp(t.TempDir(), "arena")
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if err := plain.Truncate(64 << 10); err != nil {
		t.Fatal(err)
	}
	sealed := unix.MFD_ALLOW_SEALING

	for _, tc := range []struct {
		name string
		fd   int
		size uint64
		msg  string
	}{
		{"regular file", int(plain.Fd()), 64 << 10, "cannot carry seals"},
		{"memfd without sealing", memfd(0, 64<<10, 0), 64 << 10, "not sealed against shrinking"},
		{"memfd not sealed", memfd(sealed, 64<<10, 0), 64 << 10, "not sealed against shrinking"},
		{"memfd sealed against growing only", memfd(sealed, 64<<10, unix.F_SEAL_GROW), 64 << 10, "not sealed against shrinking"},
		{"smaller than registered", memfd(sealed, 64<<10, unix.F_SEAL_SHRINK), 128 << 10, "the memfd has 65536 bytes, fewer than the 131072 registered"},
		{"over the limit", memfd(sealed, 2<<20, unix.F_SEAL_SHRINK), 2 << 20, "size 2097152 is above the limit of 1048576 bytes"},
		{"size 0", memfd(sealed, 64<<10, unix.F_SEAL_SHRINK), 0, "size is 0"},
	} {
		tok, err := engineapi.SendFD(ctx, engineapi.FDSocketPath(r.Info.Socket), tc.fd)
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.EngineClient.RegisterPromptArena(ctx, &enginepb.PromptArenaRequest{Engine: "ref/rank0", FdToken: tok, Size: tc.size})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: %v, want InvalidArgument naming %q", tc.name, err, tc.msg)
		}
	}
	if n := arenaMappings(t, "r--s"); n != 0 {
		t.Errorf("%d refused arenas are mapped by the daemon", n)
	}
	// Every descriptor sent was claimed and closed: the only arena descriptors left are the
	// test's own six memfds.
	if n := arenaFDs(t); n != 6 {
		t.Errorf("%d prompt-arena descriptors open, want the test's own 6", n)
	}

	def, err := enginesim.Start(ctx, enginesim.Config{Socket: r.Info.Socket, ModelKey: "m2", Name: "fallback", Slots: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer def.Close(ctx)
	reqs := prompts(8, 4, 16, "fb")
	if _, err := def.Run(ctx, reqs, 0); err != nil {
		t.Fatal(err)
	}
	warmRun(ctx, t, def, reqs, "-warm", "warm run over packed prompts")
	if a, err := def.Remote(0).PromptArena(ctx); a != nil || status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "above the limit") {
		t.Errorf("arena over the daemon's limit: %v, %v; want the refusal", a, err)
	}
	if viaArena, packed := def.Remote(0).PromptCounts(); viaArena != 0 || packed == 0 {
		t.Errorf("prompts through the arena %d, packed %d; want all packed", viaArena, packed)
	}
}

// TestPromptArenaReleased checks that the daemon holds an arena's memory exactly as long as the
// engine: it keeps no descriptor (the read-only mapping alone), a second registration replaces
// the first mapping, Unregister unmaps it, and so does the end of the connection of an engine
// that never unregistered. RemoteRank's own arena goes with its connection on both sides.
func TestPromptArenaReleased(t *testing.T) {
	r := start(t, 64<<20)
	ctx := context.Background()
	reqs := prompts(3, 2, 16, "rel")
	maps0 := arenaMappings(t, "r--s")
	e := arenaEngine(t, r.Info.Socket, "rel", reqs)
	a1, a2 := newArena(t, 64<<10), newArena(t, 128<<10)
	fds0 := arenaFDs(t)
	if err := e.Client(0).RegisterPromptArena(ctx, "rel/rank0", a1); err != nil {
		t.Fatal(err)
	}
	if got := arenaMappings(t, "r--s"); got != maps0+1 {
		t.Errorf("after registering: %d daemon mappings, want %d", got, maps0+1)
	}
	if got := arenaFDs(t); got != fds0 {
		t.Errorf("after registering: %d arena descriptors, want %d (the daemon keeps none)", got, fds0)
	}
	if err := e.Client(0).RegisterPromptArena(ctx, "rel/rank0", a2); err != nil {
		t.Fatal(err)
	}
	if got := arenaMappings(t, "r--s"); got != maps0+1 {
		t.Errorf("after replacing: %d daemon mappings, want %d", got, maps0+1)
	}
	// The replacement is the one read.
	putTokens(a2, 100<<10, reqs[1].Tokens)
	resp, err := e.Client(0).Lookup(ctx, &enginepb.LookupRequest{Engine: "rel/rank0", Request: &enginepb.Request{Id: "z", ContextOnly: true,
		TokensArena: &enginepb.ArenaRange{Offset: 100 << 10, Count: uint64(len(reqs[1].Tokens))}}})
	if want := (len(reqs[1].Tokens) - 1) / 16 * 16; err != nil || int(resp.GetMatchedTokens()) != want {
		t.Errorf("lookup in the replacement arena: %d, %v; want %d", resp.GetMatchedTokens(), err, want)
	}
	if _, err := e.Client(0).Unregister(ctx, &enginepb.EngineRef{Engine: "rel/rank0"}); err != nil {
		t.Fatal(err)
	}
	if got := arenaMappings(t, "r--s"); got != maps0 {
		t.Errorf("after Unregister: %d daemon mappings, want %d", got, maps0)
	}

	gone := arenaEngine(t, r.Info.Socket, "gone", nil)
	a3 := newArena(t, 64<<10)
	if err := gone.Client(0).RegisterPromptArena(ctx, "gone/rank0", a3); err != nil {
		t.Fatal(err)
	}
	if got := arenaMappings(t, "r--s"); got != maps0+1 {
		t.Errorf("second engine registered: %d daemon mappings, want %d", got, maps0+1)
	}
	gone.Abandon()
	waitFor(t, "the closed connection's arena to be unmapped", func() bool { return arenaMappings(t, "r--s") == maps0 })

	// RemoteRank's arena, made on its first lookup, on both sides of the socket.
	own0 := arenaMappings(t, "rw-s")
	def, err := enginesim.Start(ctx, enginesim.Config{Socket: r.Info.Socket, ModelKey: "m", Name: "def", Slots: 64})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := def.Run(ctx, reqs, 0); err != nil {
		t.Fatal(err)
	}
	if got, own := arenaMappings(t, "r--s"), arenaMappings(t, "rw-s"); got != maps0+1 || own != own0+1 {
		t.Errorf("RemoteRank's arena: daemon %d, engine %d mappings; want %d, %d", got, own, maps0+1, own0+1)
	}
	if err := def.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if got, own := arenaMappings(t, "r--s"), arenaMappings(t, "rw-s"); got != maps0 || own != own0 {
		t.Errorf("after the engine closed: daemon %d, engine %d mappings; want %d, %d", got, own, maps0, own0)
	}
}

// TestPromptArenaRewrittenDuringLookups has the engine rewrite its arena while lookups read it:
// every lookup still answers, for the prompt either as it was or with block 32 changed (never
// anything else), and the daemon neither crashes nor stops serving; once the writer stops, the
// lookup matches fully.
func TestPromptArenaRewrittenDuringLookups(t *testing.T) {
	r := start(t, 64<<20)
	ctx := context.Background()
	const T = 16
	prompt := randTokens(77, 64*T+5)
	e := arenaEngine(t, r.Info.Socket, "rw", []enginesim.Request{{ID: "fill", Tokens: prompt}})
	c := e.Client(0)
	a := newArena(t, 64<<10)
	if err := c.RegisterPromptArena(ctx, "rw/rank0", a); err != nil {
		t.Fatal(err)
	}
	putTokens(a, 0, prompt)
	want := (len(prompt) - 1) / T * T
	rng := &enginepb.ArenaRange{Count: uint64(len(prompt))}
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		mem := a.Bytes()
		for i := 0; !stop.Load(); i++ {
			// Change a token of block 32, and a moment later put it back, so that lookups
			// see the prompt whole, changed, and changing while they copy it.
			at := (32*T + i%T) * 8
			mem[at] ^= 0x5a
			time.Sleep(100 * time.Microsecond)
			mem[at] ^= 0x5a
			time.Sleep(100 * time.Microsecond)
		}
	}()
	partial := 0
	for i := range 200 {
		resp, err := c.Lookup(ctx, &enginepb.LookupRequest{Engine: "rw/rank0", Request: &enginepb.Request{Id: "rw", TokensArena: rng, ContextOnly: true}})
		if err != nil {
			stop.Store(true)
			wg.Wait()
			t.Fatalf("lookup %d while the arena changes: %v", i, err)
		}
		if m := int(resp.GetMatchedTokens()); m != want && m != 32*T {
			t.Errorf("lookup %d matched %d tokens; want %d (the prompt) or %d (block 32 changed)", i, m, want, 32*T)
		} else if m < want {
			partial++
		}
		_, _ = c.RequestReset(ctx, &enginepb.RequestRef{Engine: "rw/rank0", RequestId: "rw"})
	}
	stop.Store(true)
	wg.Wait()
	t.Logf("%d of 200 lookups saw a rewritten prompt", partial)
	putTokens(a, 0, prompt)
	resp, err := c.Lookup(ctx, &enginepb.LookupRequest{Engine: "rw/rank0", Request: &enginepb.Request{Id: "rw2", TokensArena: rng, ContextOnly: true}})
	if err != nil || int(resp.GetMatchedTokens()) != want {
		t.Errorf("lookup after the writer stopped: %d, %v; want %d", resp.GetMatchedTokens(), err, want)
	}
}

// TestRemoteRankPromptArena runs the same prompts through two enginesim engines, one with
// RemoteRank's prompt arena (the default) and one without, on one daemon: their warm runs agree
// and match every saved block, the first sent its prompts through the arena and freed every
// range. A lookup cut short by its
// context keeps its range reserved; concurrent lookups each get their own range and answer; a
// prompt larger than the arena goes packed.
func TestRemoteRankPromptArena(t *testing.T) {
	r := start(t, 128<<20)
	ctx := context.Background()
	run := func(name string, noArena bool) (*enginesim.Engine, []enginesim.Result) {
		e, err := enginesim.Start(ctx, enginesim.Config{Socket: r.Info.Socket, ModelKey: name, Name: name, Slots: 64, NoPromptArena: noArena})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.Close(context.Background()) })
		reqs := prompts(42, 6, 16, "rr")
		var out []enginesim.Result
		for _, rs := range [][]enginesim.Request{reqs, renamed(reqs, "-warm")} {
			res, err := e.Run(ctx, rs, 2)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, res)
		}
		return e, out
	}
	ea, withArena := run("arena", false)
	_, packed := run("packed", true)
	// The cold runs' hits depend on which saves finished before a later request looked up (the
	// requests run two at a time); the warm runs find every prompt saved, all of it.
	warmWant := 0
	for _, p := range prompts(42, 6, 16, "rr") {
		warmWant += (len(p.Tokens) - 1) / 16 * 16
	}
	w, p := withArena[1], packed[1]
	// Passes and the passes' times are left out: they depend on timing.
	w.Passes, p.Passes = 0, 0
	w.Admit, w.Load, w.Rest, p.Admit, p.Load, p.Rest = 0, 0, 0, 0, 0, 0
	if w != p || w.MatchedTokens != warmWant {
		t.Errorf("warm run: with the arena %+v, packed %+v; want %d tokens matched", w, p, warmWant)
	}
	rk := ea.Remote(0)
	a, err := rk.PromptArena(ctx)
	if err != nil || a == nil {
		t.Fatalf("RemoteRank's arena: %v", err)
	}
	if viaArena, viaPacked := rk.PromptCounts(); viaArena == 0 || viaPacked != 0 {
		t.Errorf("prompts through the arena %d, packed %d; want all through the arena", viaArena, viaPacked)
	}
	if a.HeldBytes() != 0 {
		t.Errorf("%d arena bytes still held after the runs", a.HeldBytes())
	}

	prompt := prompts(42, 1, 16, "rr")[0]
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, _, err := rk.Lookup(cancelled, connector.Request{ID: "c", Tokens: prompt.Tokens, ContextOnly: true}, 0); status.Code(err) != codes.Canceled {
		t.Fatalf("lookup with a cancelled context: %v", err)
	}
	if a.HeldBytes() == 0 {
		t.Error("a cancelled lookup's range was freed while the daemon may still read it")
	}
	n, _, err := rk.Lookup(ctx, connector.Request{ID: "d", Tokens: prompt.Tokens, ContextOnly: true}, 0)
	if want := (len(prompt.Tokens) - 1) / 16 * 16; err != nil || n != want {
		t.Errorf("lookup after a cancelled one: %d, %v; want %d", n, err, want)
	}
	_ = rk.RequestReset(ctx, "d")

	// Concurrent lookups share the arena: each gets its own range and its own answer.
	held := a.HeldBytes()
	saved := prompts(42, 6, 16, "rr")
	var wg sync.WaitGroup
	errs := make(chan error, 8*20)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 20 {
				p := saved[(g+i)%len(saved)]
				id := fmt.Sprintf("conc-%d-%d", g, i)
				n, _, err := rk.Lookup(ctx, connector.Request{ID: id, Tokens: p.Tokens, ContextOnly: true}, 0)
				if want := (len(p.Tokens) - 1) / 16 * 16; err != nil || n != want {
					errs <- fmt.Errorf("%s: matched %d, want %d: %w", id, n, want, err)
				}
				_ = rk.RequestReset(ctx, id)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if a.HeldBytes() != held {
		t.Errorf("after concurrent lookups %d arena bytes held, want %d", a.HeldBytes(), held)
	}

	// A second RemoteRank for the same engine with a one-page arena: it replaces the daemon's
	// arena for the rank; a prompt larger than a page goes packed, a small one through it.
	small := engineapi.NewRemoteRankWith(ea.Client(0), &enginepb.RegisterResponse{Engine: "arena/rank0"}, connector.RoleBoth,
		engineapi.RemoteRankOptions{PromptArenaBytes: 4096})
	big := randTokens(5, 1000)
	big = append(prompt.Tokens[:len(prompt.Tokens):len(prompt.Tokens)], big...)
	for _, toks := range [][]int64{big, prompt.Tokens} {
		n, _, err := small.Lookup(ctx, connector.Request{ID: "s", Tokens: toks, ContextOnly: true}, 0)
		if want := (len(prompt.Tokens) - 1) / 16 * 16; err != nil || n != want {
			t.Errorf("lookup of %d tokens over a 4 KiB arena: %d, %v; want %d", len(toks), n, err, want)
		}
		_ = small.RequestReset(ctx, "s")
	}
	if viaArena, viaPacked := small.PromptCounts(); viaArena != 1 || viaPacked != 1 {
		t.Errorf("4 KiB arena: %d through it, %d packed; want 1 and 1", viaArena, viaPacked)
	}
}

// TestPromptArenaUnregisterDuringLookups unregisters an engine while lookups through its arena
// run on four goroutines: each lookup either answers in full or is refused with NotFound or
// FailedPrecondition (the engine or its arena already gone), the daemon unmaps the arena once
// the copies in flight are done, and it keeps serving other engines.
func TestPromptArenaUnregisterDuringLookups(t *testing.T) {
	r := start(t, 64<<20)
	ctx := context.Background()
	reqs := prompts(13, 1, 16, "ur")
	maps0 := arenaMappings(t, "r--s")
	e := arenaEngine(t, r.Info.Socket, "ur", reqs)
	c := e.Client(0)
	a := newArena(t, 64<<10)
	if err := c.RegisterPromptArena(ctx, "ur/rank0", a); err != nil {
		t.Fatal(err)
	}
	putTokens(a, 0, reqs[0].Tokens)
	want := (len(reqs[0].Tokens) - 1) / 16 * 16
	rng := &enginepb.ArenaRange{Count: uint64(len(reqs[0].Tokens))}
	var wg sync.WaitGroup
	var answered, refused atomic.Int64
	errs := make(chan error, 4)
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				id := fmt.Sprintf("ur-%d-%d", g, i)
				resp, err := c.Lookup(ctx, &enginepb.LookupRequest{Engine: "ur/rank0", Request: &enginepb.Request{Id: id, TokensArena: rng, ContextOnly: true}})
				switch code := status.Code(err); {
				case err == nil && int(resp.GetMatchedTokens()) == want:
					answered.Add(1)
					_, _ = c.RequestReset(ctx, &enginepb.RequestRef{Engine: "ur/rank0", RequestId: id})
				case code == codes.NotFound || code == codes.FailedPrecondition:
					refused.Add(1)
					return
				default:
					errs <- fmt.Errorf("lookup %s matched %d: %w", id, resp.GetMatchedTokens(), err)
					return
				}
			}
		}()
	}
	waitFor(t, "lookups to run", func() bool { return answered.Load() >= 20 })
	if _, err := c.Unregister(ctx, &enginepb.EngineRef{Engine: "ur/rank0"}); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if refused.Load() != 4 {
		t.Errorf("%d goroutines saw the engine go, want 4", refused.Load())
	}
	if got := arenaMappings(t, "r--s"); got != maps0 {
		t.Errorf("after Unregister: %d daemon mappings, want %d", got, maps0)
	}
	other := arenaEngine(t, r.Info.Socket, "ur2", nil)
	res, err := other.Run(ctx, renamed(reqs, "-other"), 0)
	if err != nil || res.Requests != 1 {
		t.Errorf("another engine after the race: %+v, %v", res, err)
	}
}

// TestPromptArenaDefaultLimit pins the default arena limit, 64 MiB: an arena of exactly 64 MiB
// is mapped, one page more is refused naming the limit. Neither is touched, so neither costs
// memory.
func TestPromptArenaDefaultLimit(t *testing.T) {
	if got := daemon.DefaultLimits().MaxPromptArenaBytes; got != 64<<20 {
		t.Fatalf("default prompt arena limit %d, want %d", got, 64<<20)
	}
	r := start(t, 16<<20)
	ctx := context.Background()
	e := arenaEngine(t, r.Info.Socket, "lim", nil)
	if err := e.Client(0).RegisterPromptArena(ctx, "lim/rank0", newArena(t, 64<<20)); err != nil {
		t.Errorf("a 64 MiB arena: %v", err)
	}
	err := e.Client(0).RegisterPromptArena(ctx, "lim/rank0", newArena(t, 64<<20+1))
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "above the limit of 67108864 bytes") {
		t.Errorf("an arena one page over 64 MiB: %v", err)
	}
}
