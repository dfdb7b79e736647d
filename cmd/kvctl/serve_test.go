package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvctl/kvctl/core/enginesim"
	"github.com/kvctl/kvctl/core/statsapi"
)

// serveProc is a real `kvctl serve` process.
type serveProc struct {
	cmd    *exec.Cmd
	socket string
	admin  string
	stderr *lockedBuilder
	// done is closed when the process has exited; err is its exit error then.
	done chan struct{}
	err  error
}

// wait waits up to d for the process to exit and returns its exit error when it did.
func (p *serveProc) wait(d time.Duration) (exited bool, err error) {
	select {
	case <-p.done:
		return true, p.err
	case <-time.After(d):
		return false, nil
	}
}

func startServe(t *testing.T, socket string, args ...string) *serveProc {
	t.Helper()
	all := append([]string{"serve", "--socket", socket, "--admin-addr", "127.0.0.1:0", "--pool-size", "128MiB", "--log-level", "debug"}, args...)
	cmd := exec.Command("kvctl", all...)
	cmd.Env = append(os.Environ(), "XDG_CONFIG_HOME="+t.TempDir())
	pr, pw := io.Pipe()
	cmd.Stderr = pw
	p := &serveProc{cmd: cmd, socket: socket, stderr: &lockedBuilder{}, done: make(chan struct{})}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			line := sc.Text()
			p.stderr.WriteString(line + "\n")
			if addr, ok := strings.CutPrefix(strings.TrimSpace(line), "admin    http://"); ok {
				ready <- addr
			}
		}
	}()
	go func() { p.err = cmd.Wait(); _ = pw.Close(); close(p.done) }()
	select {
	case p.admin = <-ready:
	case <-p.done:
		t.Fatalf("kvctl serve exited before it was ready: %v\n%s", p.err, p.stderr)
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatalf("kvctl serve was not ready in 20s:\n%s", p.stderr)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.done
	})
	return p
}

func shortSocket(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "kv")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return filepath.Join(dir, "kvctl.sock")
}

func simPrompts(seed uint64, n, T int, prefix string) []enginesim.Request {
	rng := rand.New(rand.NewPCG(seed, 11))
	out := make([]enginesim.Request, n)
	for i := range out {
		toks := make([]int64, (6+rng.IntN(6))*T+rng.IntN(T))
		for j := range toks {
			toks[j] = rng.Int64N(150000)
		}
		out[i] = enginesim.Request{ID: fmt.Sprintf("%s-%d", prefix, i), Tokens: toks}
	}
	return out
}

// TestServeDrainsOnSIGTERM runs an engine against the real binary, then stops it with SIGTERM:
// the daemon must flush, say so and exit 0; its socket is private to its user while it runs.
func TestServeDrainsOnSIGTERM(t *testing.T) {
	socket := shortSocket(t)
	p := startServe(t, socket)
	fi, err := os.Stat(socket)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode: %v %v, want 0600", fi.Mode(), err)
	}
	ctx := context.Background()
	e, err := enginesim.Start(ctx, enginesim.Config{Socket: socket, ModelKey: "m", Name: "e", TokensPerBlock: 16, Slots: 1024})
	if err != nil {
		t.Fatal(err)
	}
	reqs := simPrompts(1, 40, 16, "r")
	if _, err := e.Run(ctx, reqs, 8); err != nil {
		t.Fatal(err)
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	exited, err := p.wait(40 * time.Second)
	if !exited {
		t.Fatal("no exit after SIGTERM")
	}
	if err != nil {
		t.Fatalf("exit after SIGTERM: %v\n%s", err, p.stderr)
	}
	if !strings.Contains(p.stderr.String(), "stopped cleanly") {
		t.Errorf("no clean stop in the log:\n%s", p.stderr)
	}
	if _, err := os.Stat(socket); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket left behind after a clean stop: %v", err)
	}
	_ = e.Close(ctx)
}

// TestServeKilledDuringSaves kills the daemon with SIGKILL while saves are in flight, restarts it
// on the same socket (the stale socket is replaced) and runs the same prompts again: every page
// the new daemon serves must be exactly what was computed, and nothing partial may be served.
func TestServeKilledDuringSaves(t *testing.T) {
	socket := shortSocket(t)
	p := startServe(t, socket)
	ctx, cancel := context.WithCancel(context.Background())
	e, err := enginesim.Start(ctx, enginesim.Config{Socket: socket, ModelKey: "m", Name: "e", TokensPerBlock: 16, Slots: 4096, PageBytes: []int{32 << 10}})
	if err != nil {
		t.Fatal(err)
	}
	reqs := simPrompts(2, 200, 16, "r")
	runErr := make(chan error, 1)
	go func() { _, err := e.Run(ctx, reqs, 32); runErr <- err }()
	// Kill as soon as the first pages reach the pool, with most of the run still to go.
	for deadline := time.Now().Add(30 * time.Second); ; {
		var st statsapi.StatsJSON
		if resp, err := http.Get("http://" + p.admin + "/v1/stats"); err == nil {
			_ = json.NewDecoder(resp.Body).Decode(&st)
			resp.Body.Close()
		}
		if st.Pool.Puts > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no page reached the pool in 30s")
		}
		time.Sleep(2 * time.Millisecond)
	}
	_ = p.cmd.Process.Kill()
	p.wait(time.Minute)
	if err := <-runErr; err == nil {
		t.Fatal("the engine finished before the daemon was killed; the test did not kill it during saves")
	}
	cancel()
	_ = e.Close(context.Background())

	p2 := startServe(t, socket)
	ctx2 := context.Background()
	e2, err := enginesim.Start(ctx2, enginesim.Config{Socket: socket, ModelKey: "m", Name: "e2", TokensPerBlock: 16, Slots: 4096, PageBytes: []int{32 << 10}})
	if err != nil {
		t.Fatalf("%v\n%s", err, p2.stderr)
	}
	defer e2.Close(ctx2)
	for pass := range 2 {
		res, err := e2.Run(ctx2, renamedPrompts(reqs[:60], fmt.Sprint(pass)), 16)
		if err != nil {
			t.Fatalf("pass %d after restart: %v", pass, err)
		}
		if pass == 1 && res.LoadedBlocks == 0 {
			t.Errorf("second pass after restart loaded nothing: %+v", res)
		}
	}
}

func renamedPrompts(reqs []enginesim.Request, suffix string) []enginesim.Request {
	out := make([]enginesim.Request, len(reqs))
	for i, q := range reqs {
		out[i] = enginesim.Request{ID: q.ID + "-" + suffix, Tokens: q.Tokens}
	}
	return out
}

// lockedBuilder is a strings.Builder safe for the reader goroutine and the test together.
type lockedBuilder struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuilder) WriteString(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.b.WriteString(s)
}

func (l *lockedBuilder) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
