package adversarial

import (
	"context"
	"encoding/hex"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvctl/kvctl/core/engineapi"
	"github.com/kvctl/kvctl/core/engineapi/enginepb"
	"github.com/kvctl/kvctl/core/enginesim"
	"github.com/kvctl/kvctl/core/hostmem"
)

// smallLayout is a one-group layout of slots pages of 64 bytes.
func smallLayout(slots int) *enginepb.Layout {
	return &enginepb.Layout{TokensPerBlock: 16, Groups: []*enginepb.LayerGroup{{Slots: int32(slots), Regions: []*enginepb.Region{{Size: 64, Stride: 64}}}}}
}

// registerShm registers an engine over c with sealed shared memory of slots × 64 bytes.
func registerShm(t *testing.T, ctx context.Context, c *engineapi.Client, name, model, ns string, slots int) *hostmem.SharedMemory {
	t.Helper()
	mem, err := hostmem.NewSharedMemory(int64(slots * 64))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mem.Close() })
	_, err = c.RegisterSharedMemory(ctx, &enginepb.RegisterRequest{Engine: name, ModelKey: model, Namespace: ns, Scheduler: true, Layout: smallLayout(slots)}, mem.FD, uint64(slots*64))
	if err != nil {
		t.Fatalf("register %s: %v", name, err)
	}
	return mem
}

// TestCallsFromAnotherConnection: a process on the socket (same user) that names another
// engine's registration in any call is refused with PermissionDenied, and the victim keeps
// working with its pages intact.
func TestCallsFromAnotherConnection(t *testing.T) {
	p := startServe(t, serveOpts{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	victim, err := enginesim.Start(ctx, enginesim.Config{Socket: p.socket, ModelKey: "m", Name: "victim", Slots: 256})
	if err != nil {
		t.Fatal(err)
	}
	defer victim.Close(context.Background())
	reqs := prompts(3, 8, 16, "v")
	if _, err := victim.Run(ctx, reqs, 4); err != nil {
		t.Fatal(err)
	}

	atk, err := engineapi.Dial(p.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer atk.Close()
	name := "victim/rank0"
	page := &enginepb.PageTransfer{Hash: make([]byte, 16)}
	calls := map[string]func() error{
		"BindMeta": func() error {
			_, err := atk.BindMeta(ctx, &enginepb.BindMetaRequest{Engine: name, Metadata: &enginepb.Metadata{Saves: []*enginepb.RequestTransfers{{RequestId: "x", Pages: []*enginepb.PageTransfer{page}}}}})
			return err
		},
		"StartLoad":   func() error { _, err := atk.StartLoad(ctx, &enginepb.EngineRef{Engine: name}); return err },
		"WaitForSave": func() error { _, err := atk.WaitForSave(ctx, &enginepb.EngineRef{Engine: name}); return err },
		"Lookup": func() error {
			_, err := atk.Lookup(ctx, &enginepb.LookupRequest{Engine: name, Request: &enginepb.Request{Id: "x", Tokens: reqs[0].Tokens}})
			return err
		},
		"BuildMeta":       func() error { _, err := atk.BuildMeta(ctx, &enginepb.BuildMetaRequest{Engine: name}); return err },
		"GetFinished":     func() error { _, err := atk.GetFinished(ctx, &enginepb.GetFinishedRequest{Engine: name}); return err },
		"TakeFailedLoads": func() error { _, err := atk.TakeFailedLoads(ctx, &enginepb.EngineRef{Engine: name}); return err },
		"DropBoundSaves": func() error {
			_, err := atk.DropBoundSaves(ctx, &enginepb.DropRequest{Engine: name, RequestIds: []string{"v-1"}})
			return err
		},
		"RequestFinished": func() error {
			_, err := atk.RequestFinished(ctx, &enginepb.RequestRef{Engine: name, RequestId: "v-1"})
			return err
		},
		"Unregister": func() error { _, err := atk.Unregister(ctx, &enginepb.EngineRef{Engine: name}); return err },
	}
	for call, fn := range calls {
		if err := fn(); status.Code(err) != codes.PermissionDenied {
			t.Errorf("%s naming another connection's engine: %v, want PermissionDenied", call, err)
		}
	}
	// The victim is still registered and serves its own pages back intact.
	warm := make([]enginesim.Request, len(reqs))
	for i, r := range reqs {
		warm[i] = enginesim.Request{ID: r.ID + "-again", Tokens: r.Tokens}
	}
	res, err := victim.Run(ctx, warm, 4)
	if err != nil {
		t.Fatalf("the victim after the attack: %v", err)
	}
	if res.LoadedBlocks == 0 {
		t.Errorf("the victim loaded nothing after the attack: %+v", res)
	}
	p.alive(t)
}

// TestLoadByRawHash: a malicious engine (same model, its own registration) lists the pool's keys
// on the admin API and asks its worker to load one of the victim's blocks by hash (and to save
// over one). The daemon refuses: no BuildMeta of its deployment offered that block.
func TestLoadByRawHash(t *testing.T) {
	p := startServe(t, serveOpts{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	victim, err := enginesim.Start(ctx, enginesim.Config{Socket: p.socket, ModelKey: "m", Name: "victim", Slots: 256, PageBytes: []int{64}})
	if err != nil {
		t.Fatal(err)
	}
	defer victim.Close(context.Background())
	if _, err := victim.Run(ctx, prompts(4, 6, 16, "v"), 4); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + p.admin + "/get_all_keys")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var hash []byte
	for _, k := range strings.Split(string(body), "\n") {
		k = strings.Trim(strings.TrimSpace(k), `",[]`)
		if i := strings.LastIndexByte(k, '/'); i > 0 && strings.HasPrefix(k, "trtllm/m/") {
			if h, err := hex.DecodeString(k[i+1:]); err == nil && len(h) == 16 {
				hash = h
				break
			}
		}
	}
	if hash == nil {
		t.Fatalf("no victim key in /get_all_keys:\n%.2000s", body)
	}

	atk, err := engineapi.Dial(p.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer atk.Close()
	mem := registerShm(t, ctx, atk, "thief", "m", "", 8)
	for _, kind := range []string{"loads", "async loads", "saves"} {
		tr := []*enginepb.RequestTransfers{{RequestId: "steal", Pages: []*enginepb.PageTransfer{{Hash: hash, Group: 0, Page: 0}}}}
		m := &enginepb.Metadata{}
		switch kind {
		case "loads":
			m.Loads = tr
		case "async loads":
			m.AsyncLoads = tr
		case "saves":
			m.Saves = tr
		}
		_, err := atk.BindMeta(ctx, &enginepb.BindMetaRequest{Engine: "thief", Metadata: m})
		if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "not offered") {
			t.Errorf("bind metadata with %s of a hash never offered: %v, want PermissionDenied", kind, err)
		}
	}
	// A worker-only rank (no scheduler of its own) binds only what schedulers of its deployment
	// (same namespace, model, world size and uid) offered: under another model, nothing.
	wmem, err := hostmem.NewSharedMemory(8 * 64)
	if err != nil {
		t.Fatal(err)
	}
	defer wmem.Close()
	if _, err := atk.RegisterSharedMemory(ctx, &enginepb.RegisterRequest{Engine: "thief-worker", ModelKey: "other", Layout: smallLayout(8)}, wmem.FD, 8*64); err != nil {
		t.Fatal(err)
	}
	_, err = atk.BindMeta(ctx, &enginepb.BindMetaRequest{Engine: "thief-worker", Metadata: &enginepb.Metadata{Loads: []*enginepb.RequestTransfers{{RequestId: "steal", Pages: []*enginepb.PageTransfer{{Hash: hash}}}}}})
	if status.Code(err) != codes.PermissionDenied {
		t.Errorf("a worker-only rank of another deployment binding the victim's block: %v, want PermissionDenied", err)
	}
	if _, err := atk.StartLoad(ctx, &enginepb.EngineRef{Engine: "thief"}); err != nil {
		t.Errorf("start load: %v", err)
	}
	for i, b := range mem.Data {
		if b != 0 {
			t.Fatalf("the thief's memory was written at byte %d", i)
		}
	}
	p.alive(t)
}

// TestNamespaceModelSlash: namespace "ns/x" with model "m" and namespace "ns" with model "x/m"
// would write identical keys ({namespace}/{model_key}/...), serving one model's KV to the other.
// Keys stay byte for byte TensorRT-LLM's, so serve refuses a namespace holding '/' at Register;
// model keys with '/' are fine, and engines with the same strings still share.
func TestNamespaceModelSlash(t *testing.T) {
	p := startServe(t, serveOpts{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	reqs := prompts(5, 6, 16, "a")
	if a, err := enginesim.Start(ctx, enginesim.Config{Socket: p.socket, Namespace: "ns/x", ModelKey: "m", Name: "a", Slots: 256}); err == nil {
		_ = a.Close(context.Background())
		t.Fatal("namespace ns/x was accepted: its keys can collide with namespace ns and a model key starting x/")
	} else if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "namespace") {
		t.Fatalf("namespace ns/x refused with %v, want InvalidArgument naming the namespace", err)
	}
	b, err := enginesim.Start(ctx, enginesim.Config{Socket: p.socket, Namespace: "ns", ModelKey: "x/m", Name: "b", Slots: 256})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close(context.Background())
	if _, err := b.Run(ctx, reqs, 4); err != nil {
		t.Fatal(err)
	}
	// The same strings do share: a second engine with b's namespace and model hits.
	c, err := enginesim.Start(ctx, enginesim.Config{Socket: p.socket, Namespace: "ns", ModelKey: "x/m", Name: "c", Slots: 256})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	renamed := make([]enginesim.Request, len(reqs))
	for i, r := range reqs {
		renamed[i] = enginesim.Request{ID: "c-" + r.ID, Tokens: r.Tokens}
	}
	if res, err := c.Run(ctx, renamed, 4); err != nil || res.LoadedBlocks == 0 {
		t.Errorf("the same namespace and model must share: %+v %v", res, err)
	}
	// Another model key under the same namespace shares nothing.
	d, err := enginesim.Start(ctx, enginesim.Config{Socket: p.socket, Namespace: "ns", ModelKey: "x", Name: "d", Slots: 256})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close(context.Background())
	for i, r := range reqs {
		renamed[i] = enginesim.Request{ID: "d-" + r.ID, Tokens: r.Tokens}
	}
	if res, err := d.Run(ctx, renamed, 4); err != nil || res.MatchedTokens != 0 || res.LoadedBlocks != 0 {
		t.Errorf("model x was served model x/m's KV: %+v %v", res, err)
	}
}

// TestShrinkableMemory: memory that could be truncated under the daemon's mapping is refused at
// Register (the attack was: register, ftruncate to 0, ask for a save: SIGBUS killed the
// daemon). Sealed memory cannot be truncated at all.
func TestShrinkableMemory(t *testing.T) {
	p := startServe(t, serveOpts{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := engineapi.Dial(p.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const size = 8 * 64
	unsealed, err := unix.MemfdCreate("unsealed", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(unsealed)
	if err := unix.Ftruncate(unsealed, size); err != nil {
		t.Fatal(err)
	}
	sealable, err := unix.MemfdCreate("sealable", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(sealable)
	if err := unix.Ftruncate(sealable, size); err != nil {
		t.Fatal(err)
	}
	short, err := hostmem.NewSharedMemory(size / 2)
	if err != nil {
		t.Fatal(err)
	}
	defer short.Close()
	for _, tc := range []struct {
		name string
		fd   int
		want string
	}{
		{"memfd without seals", unsealed, "F_SEAL_SHRINK"},
		{"sealable memfd left unsealed", sealable, "F_SEAL_SHRINK"},
		{"sealed memfd smaller than registered", short.FD, "fewer than"},
		{"a pipe", int(mustPipe(t)), "seals"},
	} {
		_, err := c.RegisterSharedMemory(ctx, &enginepb.RegisterRequest{Engine: "e-" + tc.name, ModelKey: "m", Layout: smallLayout(8)}, tc.fd, size)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want InvalidArgument naming %q", tc.name, err, tc.want)
		}
	}
	// Sealed memory registers, and truncating it afterwards fails in the engine, not the daemon.
	mem := registerShm(t, ctx, c, "sealed", "m", "", 8)
	if err := unix.Ftruncate(mem.FD, 0); err == nil {
		t.Fatal("a sealed memfd was truncated")
	}
	p.alive(t)
}

func mustPipe(t *testing.T) uintptr {
	t.Helper()
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fds[0]); unix.Close(fds[1]) })
	return uintptr(fds[0])
}
