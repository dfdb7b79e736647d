package adversarial

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvctl/kvctl/core/engineapi"
	"github.com/kvctl/kvctl/core/enginesim"
)

func prompts(seed uint64, n, T int, prefix string) []enginesim.Request {
	rng := rand.New(rand.NewPCG(seed, 7))
	out := make([]enginesim.Request, n)
	for i := range out {
		toks := make([]int64, (3+rng.IntN(4))*T+rng.IntN(T))
		for j := range toks {
			toks[j] = rng.Int64N(150000)
		}
		out[i] = enginesim.Request{ID: fmt.Sprintf("%s-%d", prefix, i), Tokens: toks}
	}
	return out
}

// runEngine registers a simulated engine, runs the prompts twice (cold, then warm from the pool)
// and checks every loaded page byte for byte (enginesim fails on a wrong byte).
func runEngine(t *testing.T, socket, name string, seed uint64) enginesim.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e, err := enginesim.Start(ctx, enginesim.Config{Socket: socket, ModelKey: "m", Name: name, Slots: 512})
	if err != nil {
		t.Fatalf("engine %s: %v", name, err)
	}
	defer e.Close(context.Background())
	reqs := prompts(seed, 12, 16, name)
	if _, err := e.Run(ctx, reqs, 4); err != nil {
		t.Fatalf("engine %s cold pass: %v", name, err)
	}
	warm := make([]enginesim.Request, len(reqs))
	for i, r := range reqs {
		warm[i] = enginesim.Request{ID: r.ID + "-warm", Tokens: r.Tokens}
	}
	res, err := e.Run(ctx, warm, 4)
	if err != nil {
		t.Fatalf("engine %s warm pass: %v", name, err)
	}
	if res.LoadedBlocks == 0 {
		t.Errorf("engine %s loaded nothing on the warm pass: %+v", name, res)
	}
	return res
}

// holdConns opens up to n connections to addr and keeps them until the test ends.
func holdConns(t *testing.T, network, addr string, n int) (opened int, closeAll func()) {
	t.Helper()
	var conns []net.Conn
	for range n {
		c, err := net.DialTimeout(network, addr, 2*time.Second)
		if err != nil {
			continue
		}
		conns = append(conns, c)
	}
	var once sync.Once
	closeAll = func() {
		once.Do(func() {
			for _, c := range conns {
				_ = c.Close()
			}
		})
	}
	t.Cleanup(closeAll)
	return len(conns), closeAll
}

// TestConnectionFloods: idle connections well past the cap on each of the three listeners (the
// admin port, the engine socket, the descriptor channel) neither stop the daemon nor stop an
// engine from registering and running on the others; the admin server cuts idle connections
// off by itself; the file table returns to where it was.
func TestConnectionFloods(t *testing.T) {
	raiseOwnLimit()
	p := startServe(t, serveOpts{args: []string{"--max-conns", "64"}})
	_, fds0, err := procStats(p.cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}

	// Admin flood (any local user can reach the loopback port).
	n, closeAdmin := holdConns(t, "tcp", p.admin, 600)
	if n == 0 {
		t.Fatal("no admin connection opened")
	}
	// While it holds, engines still register and run over the engine socket and side channel.
	runEngine(t, p.socket, "during-admin-flood", 1)
	p.alive(t)

	// Engine socket and side channel floods (same user).
	m, closeEngine := holdConns(t, "unix", p.socket, 600)
	k, closeFD := holdConns(t, "unix", engineapi.FDSocketPath(p.socket), 600)
	t.Logf("held %d admin, %d engine-socket, %d descriptor-channel connections", n, m, k)
	p.alive(t)
	_, fdsFlood, _ := procStats(p.cmd.Process.Pid)
	if limit := fds0 + 3*64 + 64; fdsFlood > limit {
		t.Errorf("daemon holds %d descriptors during the flood, above %d (baseline %d + the three caps)", fdsFlood, limit, fds0)
	}
	closeEngine()
	closeFD()

	// The admin server closes idle connections on its own (read-header timeout).
	closed := make(chan struct{})
	go func() {
		c, err := net.Dial("tcp", p.admin)
		if err == nil {
			_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
			_, _ = io.Copy(io.Discard, c)
			_ = c.Close()
		}
		close(closed)
	}()
	closeAdmin()
	select {
	case <-closed:
	case <-time.After(35 * time.Second):
		t.Error("an idle admin connection was not closed by the daemon")
	}
	p.healthy(t)
	runEngine(t, p.socket, "after-floods", 2)

	// Back to the baseline once the floods are gone (give the server a moment to reap).
	var fds1 int
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if _, fds1, _ = procStats(p.cmd.Process.Pid); fds1 <= fds0+8 {
			break
		}
	}
	if fds1 > fds0+8 {
		t.Errorf("descriptors after the floods: %d, baseline %d", fds1, fds0)
	}
	if s := p.stderr.String(); !strings.Contains(s, "listener at its cap") {
		t.Errorf("no refusal at the cap was logged:\n%s", tail(s, 30))
	}
}
