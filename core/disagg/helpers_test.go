package disagg_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"runtime/pprof"
	"strings"
	"testing"
	"time"

	"github.com/kvctl/kvctl/core/config"
	"github.com/kvctl/kvctl/core/disagg"
	"github.com/kvctl/kvctl/core/disagg/disaggtest"
)

// setup is a proxy in front of scripted servers.
type setup struct {
	URL  string
	Ctx  []*disaggtest.Server
	Gen  []*disaggtest.Server
	Conf *config.DisaggConfig
}

// yamlFor writes a disagg_config.yaml for the servers, plus extra lines.
func yamlFor(ctx, gen []string, extra string) string {
	var b strings.Builder
	b.WriteString("hostname: 127.0.0.1\nport: 8000\nbackend: pytorch\n")
	fmt.Fprintf(&b, "context_servers:\n  num_instances: %d\n  urls:\n", len(ctx))
	for _, u := range ctx {
		fmt.Fprintf(&b, "    - %q\n", u)
	}
	fmt.Fprintf(&b, "generation_servers:\n  num_instances: %d\n  urls:\n", len(gen))
	for _, u := range gen {
		fmt.Fprintf(&b, "    - %q\n", u)
	}
	b.WriteString(extra)
	return b.String()
}

func loadConfig(t testing.TB, text string) *config.DisaggConfig {
	t.Helper()
	f, diags := config.Load("disagg_config.yaml", []byte(text), config.LoadOptions{})
	if diags.HasErrors() || f == nil || f.Disagg == nil {
		t.Fatalf("config does not load: %v\n%s", diags, text)
	}
	return f.Disagg
}

// startProxy runs disagg.Run on a free loopback port; t.Cleanup stops it.
func startProxy(t testing.TB, cfg *config.DisaggConfig, opts disagg.Options) string {
	t.Helper()
	opts.Config = cfg
	if opts.RetryBackoff == 0 {
		opts.RetryBackoff = time.Millisecond
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- disagg.Run(ctx, disagg.RunOptions{Options: opts, Addr: "127.0.0.1:0", DrainTimeout: 5 * time.Second,
			Ready: func(a string) { ready <- a }})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			var b strings.Builder
			_ = pprof.Lookup("goroutine").WriteTo(&b, 1)
			t.Errorf("proxy stopped with %v\n%s", err, b.String())
		}
	})
	select {
	case a := <-ready:
		return "http://" + a
	case err := <-done:
		t.Fatalf("proxy did not start: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("proxy did not start in 10s")
	}
	return ""
}

// newSetup starts nCtx context and nGen generation servers and a proxy in front of them.
func newSetup(t testing.TB, nCtx, nGen int, extra string) *setup {
	t.Helper()
	s := &setup{}
	var cu, gu []string
	for range nCtx {
		c := disaggtest.StartContext(t)
		s.Ctx = append(s.Ctx, c)
		cu = append(cu, c.Addr)
	}
	for range nGen {
		g := disaggtest.StartGeneration(t)
		s.Gen = append(s.Gen, g)
		gu = append(gu, g.Addr)
	}
	s.Conf = loadConfig(t, yamlFor(cu, gu, extra))
	s.URL = startProxy(t, s.Conf, disagg.Options{})
	return s
}

type result struct {
	Status int
	Header http.Header
	Body   []byte
}

func post(t testing.TB, url string, v any) result {
	t.Helper()
	raw, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post(url, "application/json", bytes.NewReader(raw))
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("POST %s: reading: %v", url, err)
	}
	return result{resp.StatusCode, resp.Header, b}
}

// events splits an event-stream body into data payloads.
func events(body []byte) []string {
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(nil, 16<<20)
	for sc.Scan() {
		if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			out = append(out, d)
		}
	}
	return out
}

// errorMessage reads an OpenAI or Anthropic error envelope.
func errorMessage(t testing.TB, body []byte) (typ, msg string) {
	t.Helper()
	var v struct {
		Type  string `json:"type"`
		Error struct {
			Message string `json:"message"`
			Type    string `json:"type"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &v); err != nil || v.Error.Message == "" {
		t.Fatalf("not an error envelope: %s", body)
	}
	return v.Error.Type, v.Error.Message
}

// metric reads one sample of the proxy's /metrics: name with its labels as written there.
func metric(t testing.TB, base, series string) float64 {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, series+" "); ok {
			var v float64
			if _, err := fmt.Sscan(rest, &v); err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return v
		}
	}
	return 0
}

// eventually waits up to 5s for cond.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s did not happen within 5s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func onlyID(t testing.TB, s disaggtest.Stats) int64 {
	t.Helper()
	if len(s.IDs) != 1 {
		t.Fatalf("want one disagg_request_id served, got %v", s.IDs)
	}
	for id, n := range s.IDs {
		if n != 1 {
			t.Fatalf("id %d served %d times", id, n)
		}
		return id
	}
	return 0
}
