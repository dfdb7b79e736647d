package main

import (
	"context"
	"io"
	"net/http"
	"strings"
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
	// The admin API still answers on its own loopback address.
	if code, _, _ := httpGet(t, "http://"+p.admin+"/v1/stats"); code != 200 {
		t.Errorf("admin /v1/stats: %d", code)
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
