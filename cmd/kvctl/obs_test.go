package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvctl/kvctl/core/enginesim"
)

// bannerValue waits for the banner line that starts with label and returns the rest.
func bannerValue(t *testing.T, p *serveProc, label string) string {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		for _, line := range strings.Split(p.stderr.String(), "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), label); ok {
				return strings.TrimSpace(v)
			}
		}
	}
	t.Fatalf("no %q line in the banner:\n%s", label, p.stderr)
	return ""
}

func httpGet(t *testing.T, url string) (int, string, http.Header) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b), resp.Header
}

// TestServeMetricsListener runs the real binary with --metrics-addr on all interfaces: that
// listener serves /metrics, /healthz and /readyz and refuses every admin path, while the admin
// API stays on loopback.
func TestServeMetricsListener(t *testing.T) {
	socket := shortSocket(t)
	p := startServe(t, socket, "--metrics-addr", "0.0.0.0:0")
	m := bannerValue(t, p, "metrics  ")
	addr, ok := strings.CutSuffix(strings.TrimPrefix(m, "http://"), "/metrics")
	if !ok || !strings.HasPrefix(addr, "[::]:") && !strings.HasPrefix(addr, "0.0.0.0:") {
		t.Fatalf("banner metrics line %q: want http://0.0.0.0:PORT/metrics", m)
	}
	base := "http://127.0.0.1:" + addr[strings.LastIndexByte(addr, ':')+1:]

	ctx := context.Background()
	e, err := enginesim.Start(ctx, enginesim.Config{Socket: socket, ModelKey: "m", Name: "e", TokensPerBlock: 16, Slots: 512})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close(ctx)
	if _, err := e.Run(ctx, simPrompts(4, 10, 16, "r"), 4); err != nil {
		t.Fatal(err)
	}

	code, body, _ := httpGet(t, base+"/metrics")
	if code != 200 || !strings.Contains(body, "kvctl_ready 1\n") || !strings.Contains(body, `kvctl_rank_prefix_lookups_total{model_key="m",rank="0"}`) {
		t.Errorf("/metrics on the metrics listener: %d, lacks kvctl_ready 1 or the engine's series", code)
	}
	if code, body, _ := httpGet(t, base+"/healthz"); code != 200 || body != "ok\n" {
		t.Errorf("/healthz: %d %q", code, body)
	}
	if code, body, _ := httpGet(t, base+"/readyz"); code != 200 || body != "ready\n" {
		t.Errorf("/readyz: %d %q", code, body)
	}
	for _, path := range []string{"/", "/v1/stats", "/get_all_keys", "/query_key?key=x", "/batch_query_keys?keys=a", "/get_all_segments", "/metrics/summary"} {
		code, body, _ := httpGet(t, base+path)
		if code != http.StatusNotFound {
			t.Errorf("metrics listener %s: %d, want 404", path, code)
		}
		if strings.Contains(body, "kvctl-embedded") || strings.Contains(body, "@") {
			t.Errorf("metrics listener %s leaks pool contents: %q", path, body)
		}
	}
	// The admin API still answers on its own loopback address, with the version the banner
	// printed.
	code, body, _ = httpGet(t, "http://"+p.admin+"/v1/stats")
	var st struct {
		Version string `json:"version"`
	}
	if err := json.Unmarshal([]byte(body), &st); code != 200 || err != nil || st.Version != "dev" || !strings.Contains(p.stderr.String(), "kvctl serve dev\n") {
		t.Errorf("admin /v1/stats: %d, version %q (%v); banner:\n%s", code, st.Version, err, p.stderr)
	}
	if code, body, _ := httpGet(t, base+"/metrics"); code != 200 || !strings.Contains(body, `kvctl_build_info{goversion="`) || !strings.Contains(body, `version="dev"`) {
		t.Errorf("kvctl_build_info lacks version dev")
	}
}

// TestServeQuietMemory starts the real binary with a small chosen pool and with the automatic
// size: neither fits badly on this machine, so neither start may warn about memory.
func TestServeQuietMemory(t *testing.T) {
	for _, size := range []string{"128MiB", "auto"} {
		p := startServe(t, shortSocket(t), "--pool-size", size)
		bannerValue(t, p, "ready")
		if s := p.stderr.String(); strings.Contains(s, "memory budget") || strings.Contains(s, "KiB") || strings.Contains(s, "larger than the memory") {
			t.Errorf("--pool-size %s warned about memory:\n%s", size, s)
		}
	}
}

// startServeJSON runs `kvctl serve --log-format json` and returns once its ready record is out.
func startServeJSON(t *testing.T, socket string, args ...string) *serveProc {
	t.Helper()
	all := append([]string{"serve", "--socket", socket, "--admin-addr", "127.0.0.1:0", "--pool-size", "128MiB", "--log-level", "debug", "--log-format", "json"}, args...)
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
			var rec struct {
				Msg   string `json:"msg"`
				Admin string `json:"admin"`
			}
			if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "kvctl serve ready" {
				ready <- strings.TrimPrefix(rec.Admin, "http://")
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

// TestServeJSONLogs runs the real binary with --log-format json through a start, an engine's
// work and a drain: every stderr line is one JSON record, the banner included; durations are
// Go duration strings; connector lines carry their figures as attributes.
func TestServeJSONLogs(t *testing.T) {
	socket := shortSocket(t)
	p := startServeJSON(t, socket, "--stats-interval", "1ms")
	ctx := context.Background()
	e, err := enginesim.Start(ctx, enginesim.Config{Socket: socket, ModelKey: "m", Name: "e", TokensPerBlock: 16, Slots: 512})
	if err != nil {
		t.Fatal(err)
	}
	reqs := simPrompts(7, 12, 16, "r")
	for pass := range 2 {
		if _, err := e.Run(ctx, renamedPrompts(reqs, fmt.Sprint(pass)), 4); err != nil {
			t.Fatal(err)
		}
	}
	_ = e.Close(ctx)
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	if exited, err := p.wait(40 * time.Second); !exited || err != nil {
		t.Fatalf("exit after SIGTERM: %v (exited %v)\n%s", err, exited, p.stderr)
	}

	msgs := map[string]map[string]any{}
	lines := strings.Split(strings.TrimRight(p.stderr.String(), "\n"), "\n")
	for i, line := range lines {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("stderr line %d is not JSON: %q", i+1, line)
		}
		for _, k := range []string{"time", "level", "msg"} {
			if _, ok := rec[k]; !ok {
				t.Errorf("line %d lacks %q: %s", i+1, k, line)
			}
		}
		msgs[rec["msg"].(string)] = rec
	}
	banner := msgs["kvctl serve ready"]
	if banner == nil || banner["socket"] != socket || banner["pool_bytes"] != float64(128<<20) {
		t.Errorf("no banner record with the socket and pool size: %v", banner)
	}
	if d := msgs["draining"]; d == nil || d["deadline"] != "30s" {
		t.Errorf("draining record %v: want deadline \"30s\"", d)
	}
	if m := msgs["mooncake-store matched blocks"]; m == nil || m["blocks"] == nil || m["request"] == nil {
		t.Errorf("no structured match record: %v", m)
	}
	if m := msgs["mooncake-store staging"]; m == nil || m["slots"] == nil {
		t.Errorf("no structured staging record: %v", m)
	}
	if msgs["prefix-hole stats"] == nil || msgs["load stats"] == nil {
		t.Errorf("no stats records with --stats-interval 1ms")
	}
	for _, rec := range msgs {
		for k, v := range rec {
			if f, ok := v.(float64); ok && (strings.HasSuffix(k, "deadline") || strings.HasSuffix(k, "timeout") || strings.HasSuffix(k, "ttl") || strings.HasSuffix(k, "interval")) && f > 1e6 {
				t.Errorf("%s: %s = %v looks like nanoseconds", rec["msg"], k, f)
			}
		}
	}
}

// TestJSONErrors checks that a refused start with --log-format json still writes only JSON.
func TestJSONErrors(t *testing.T) {
	cmd := exec.Command("kvctl", "serve", "--log-format", "json", "--socket", shortSocket(t), "--pool-size", "3MiB", "--admin-addr", "")
	cmd.Env = append(os.Environ(), "XDG_CONFIG_HOME="+t.TempDir())
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	// A pool size below the minimum given as a flag is a usage error (README's exit codes).
	if !errors.As(err, &ee) || ee.ExitCode() != 2 {
		t.Fatalf("exit %v, want 2\n%s", err, out)
	}
	for _, line := range strings.Split(strings.TrimRight(string(out), "\n"), "\n") {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) != nil || rec["level"] != "ERROR" || !strings.Contains(rec["msg"].(string), "pool-size") {
			t.Errorf("not a JSON error record naming pool-size: %q", line)
		}
	}
}

// TestWatchInterrupt stops `kvctl stats --watch` with SIGINT: exit 130 and no "context
// canceled" on stderr.
func TestWatchInterrupt(t *testing.T) {
	p := startServe(t, shortSocket(t))
	cmd := exec.Command("kvctl", "stats", "--watch", "1s", "--pool", p.admin)
	cmd.Env = append(os.Environ(), "XDG_CONFIG_HOME="+t.TempDir())
	var stdout, stderr lockedBuilder
	cmd.Stdout, cmd.Stderr = writerOf(&stdout), writerOf(&stderr)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(stdout.String(), "kvctl-serve"); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no watch report in 10s:\n%s\n%s", stdout.String(), stderr.String())
		}
	}
	_ = cmd.Process.Signal(os.Interrupt)
	err := cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 130 {
		t.Errorf("exit %v, want 130", err)
	}
	if strings.Contains(stderr.String(), "context canceled") {
		t.Errorf("stderr after Ctrl-C: %q", stderr.String())
	}
}

type builderWriter struct{ b *lockedBuilder }

func (w builderWriter) Write(p []byte) (int, error) { w.b.WriteString(string(p)); return len(p), nil }

func writerOf(b *lockedBuilder) io.Writer { return builderWriter{b} }
