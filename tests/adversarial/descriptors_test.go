package adversarial

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvctl/kvctl/core/engineapi"
	"github.com/kvctl/kvctl/core/engineapi/enginepb"
	"github.com/kvctl/kvctl/core/hostmem"
)

// TestDescriptorSlotsPerUID: 70 short-lived processes of one engine-group user, each sending
// its per-process share of descriptors and never registering, take at most that uid's share of
// the daemon's unclaimed-descriptor slots, so an engine of another uid (the daemon's own) still
// registers and runs. (Per process, 70 × 16 would fill all 1,024 slots.)
func TestDescriptorSlotsPerUID(t *testing.T) {
	requireRoot(t)
	dir := socketDir(t)
	if err := os.Chown(dir, 0, nobodyUID); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o750|os.ModeSetgid); err != nil {
		t.Fatal(err)
	}
	p := startServe(t, serveOpts{dir: dir, args: []string{"--engine-group", fmt.Sprint(nobodyUID)}})
	fdPath := engineapi.FDSocketPath(p.socket)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	var (
		wg            sync.WaitGroup
		mu            sync.Mutex
		sent, refused int
		firstRefusal  string
	)
	sem := make(chan struct{}, 4)
	for range 70 {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			out, err := runAs(ctx, nobodyUID, "flood-fds", "ADDR="+fdPath, "COUNT=16").Output()
			var s, r int
			var first string
			if err == nil {
				_, err = fmt.Sscanf(strings.TrimSpace(string(out)), "sent=%d refused=%d first=%q", &s, &r, &first)
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				t.Errorf("flooder: %v: %q", err, out)
				return
			}
			sent += s
			refused += r
			if firstRefusal == "" && first != "" {
				firstRefusal = first
			}
		}()
	}
	wg.Wait()
	if sent > engineapi.DefaultMaxHeldFDsPerUID || !strings.Contains(firstRefusal, "uid 65534") {
		t.Errorf("one uid's processes left %d unclaimed descriptors (refused %d, first refusal %q), want at most the uid's share of %d", sent, refused, firstRefusal, engineapi.DefaultMaxHeldFDsPerUID)
	}
	// Within the TTL (30 s), the daemon's own user's engine still gets a slot and registers.
	runEngine(t, p.socket, "legit", 3)
	p.healthy(t)
}

// TestRefusedRegisterReleasesDescriptor: a Register that is refused frees the descriptor it
// named at once, so the token no longer names anything (before, it held a slot and stayed
// claimable for the whole TTL).
func TestRefusedRegisterReleasesDescriptor(t *testing.T) {
	p := startServe(t, serveOpts{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := engineapi.Dial(p.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	mem, err := hostmem.NewSharedMemory(64 * 8)
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	// Connect first, so the count below is the descriptor's alone.
	if _, err := c.Lookup(ctx, &enginepb.LookupRequest{Engine: "none", Request: &enginepb.Request{Id: "r"}}); status.Code(err) != codes.NotFound {
		t.Fatalf("lookup of no engine: %v", err)
	}
	_, fds0, _ := procStats(p.cmd.Process.Pid)
	tok, err := engineapi.SendFD(ctx, engineapi.FDSocketPath(p.socket), mem.FD)
	if err != nil {
		t.Fatal(err)
	}
	req := func(world int32) *enginepb.RegisterRequest {
		return &enginepb.RegisterRequest{Engine: "e", ModelKey: "m", Scheduler: true, Layout: smallLayout(8), WorldSize: world,
			Memory: &enginepb.RegisterRequest_SharedMemory{SharedMemory: &enginepb.SharedMemory{FdToken: tok, Size: 64 * 8}}}
	}
	if _, err := c.Register(ctx, req(-1)); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("a register with world_size -1: %v, want InvalidArgument", err)
	}
	_, err = c.Register(ctx, req(1))
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "unknown or expired descriptor token") {
		t.Errorf("the token of a refused register still named a descriptor: %v", err)
	}
	if _, fds1, _ := procStats(p.cmd.Process.Pid); fds1 > fds0 {
		t.Errorf("the daemon holds %d descriptors after the refused register, %d before", fds1, fds0)
	}
	p.alive(t)
}
