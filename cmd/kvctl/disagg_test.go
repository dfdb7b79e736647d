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
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvctl/kvctl/core/disagg/disaggtest"
	"github.com/kvctl/kvctl/mooncake/mooncaketest"
)

// startDisaggServe runs `kvctl serve --disagg-config` in front of one scripted context and one
// scripted generation server and returns the front's base URL.
func startDisaggServe(t *testing.T, extra string) (string, *disaggtest.Server, *disaggtest.Server) {
	t.Helper()
	c := disaggtest.StartContext(t)
	g := disaggtest.StartGeneration(t)
	f := startFront(t, []string{c.Addr}, []string{g.Addr}, extra)
	return f.URL, c, g
}

// frontProc is one `kvctl serve --disagg-config` process.
type frontProc struct {
	URL  string
	cmd  *exec.Cmd
	log  *lockedBuilder // what it wrote to stderr
	done chan struct{}  // closed when it has exited and its stderr is read
	err  error          // its exit, once done is closed
}

// startFront runs `kvctl serve --disagg-config` in front of the context and generation
// servers at ctxs and gens, with extra config lines and flags, and waits for its listen line;
// t.Cleanup stops it. The front's port is picked free and written into the config before
// kvctl binds it, so another process can take it in between: a start that fails to bind is
// tried again on another port.
func startFront(t *testing.T, ctxs, gens []string, extra string, flags ...string) *frontProc {
	t.Helper()
	for attempt := 1; ; attempt++ {
		f, err := startFrontOnce(t, ctxs, gens, extra, flags)
		if err == nil {
			return f
		}
		if attempt == 3 || !strings.Contains(f.log.String(), "address already in use") {
			t.Fatalf("%v\n%s", err, f.log.String())
		}
	}
}

func startFrontOnce(t *testing.T, ctxs, gens []string, extra string, flags []string) (*frontProc, error) {
	t.Helper()
	port := mooncaketest.FreePort(t)
	var b strings.Builder
	b.WriteString("hostname: 127.0.0.1\nport: " + strconv.Itoa(port) + "\nbackend: pytorch\n")
	for _, role := range []struct {
		key   string
		addrs []string
	}{{"context_servers", ctxs}, {"generation_servers", gens}} {
		fmt.Fprintf(&b, "%s:\n  num_instances: %d\n  urls:\n", role.key, len(role.addrs))
		for _, a := range role.addrs {
			fmt.Fprintf(&b, "    - %q\n", a)
		}
	}
	b.WriteString(extra)
	cfg := filepath.Join(t.TempDir(), "disagg_config.yaml")
	if err := os.WriteFile(cfg, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("kvctl", append([]string{"serve", "--disagg-config", cfg}, flags...)...)
	cmd.Env = append(os.Environ(), "XDG_CONFIG_HOME="+t.TempDir())
	pr, pw := io.Pipe()
	cmd.Stderr = pw
	f := &frontProc{cmd: cmd, log: &lockedBuilder{}, done: make(chan struct{})}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ready := make(chan string, 1)
	scanned := make(chan struct{})
	go func() {
		defer close(scanned)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			f.log.WriteString(sc.Text() + "\n")
			if a, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "listen   "); ok {
				ready <- a
			}
		}
	}()
	go func() {
		f.err = cmd.Wait()
		_ = pw.Close()
		<-scanned // everything kvctl wrote before it exited
		close(f.done)
	}()
	select {
	case u := <-ready:
		f.URL = u
		t.Cleanup(func() { f.stop(os.Interrupt, 10*time.Second) })
		return f, nil
	case <-f.done:
		return f, fmt.Errorf("kvctl serve --disagg-config exited: %w", f.err)
	case <-time.After(20 * time.Second):
		f.stop(os.Interrupt, 10*time.Second)
		return f, errors.New("kvctl serve --disagg-config was not ready in 20s")
	}
}

// stop signals the front and waits up to wait for it to exit (then kills it); it returns the
// exit.
func (f *frontProc) stop(sig os.Signal, wait time.Duration) error {
	_ = f.cmd.Process.Signal(sig)
	select {
	case <-f.done:
	case <-time.After(wait):
		_ = f.cmd.Process.Kill()
		<-f.done
	}
	return f.err
}

const openAIScript = `
import json, sys
import openai

c = openai.OpenAI(base_url=sys.argv[1] + "/v1", api_key="unused", max_retries=0, timeout=30)
msgs = [{"role": "user", "content": "hi"}]
out = {}
r = c.completions.create(model="scripted-model", prompt="NVIDIA is a great company because", max_tokens=3)
out["completion"] = r.choices[0].text
s = c.completions.create(model="scripted-model", prompt="NVIDIA is", max_tokens=3, stream=True)
out["completion_stream"] = [ch.choices[0].text for ch in s]
r = c.chat.completions.create(model="scripted-model", messages=msgs, max_tokens=3)
out["chat"] = r.choices[0].message.content
s = c.chat.completions.create(model="scripted-model", messages=msgs, max_tokens=3, stream=True)
out["chat_stream"] = [ch.choices[0].delta.content for ch in s]
try:
    s = c.chat.completions.create(model="scripted-model", messages=msgs, stream=True, user="fault:gen_status")
    for _ in s:
        pass
    out["status_error"] = None
except openai.APIStatusError as e:
    out["status_error"] = {"status": e.status_code, "message": str(e.message)}
got = []
try:
    s = c.completions.create(model="scripted-model", prompt="p", stream=True, user="fault:gen_cut_after_first")
    for ch in s:
        got.append(ch.choices[0].text)
    out["in_stream"] = {"chunks": got, "error": None}
except openai.APIError as e:
    out["in_stream"] = {"chunks": got, "error": str(e.message)}
try:
    s = c.completions.create(model="scripted-model", prompt="p", stream=True, user="fault:gen_stall")
    for _ in s:
        pass
    out["timeout"] = None
except openai.APIStatusError as e:
    out["timeout"] = {"status": e.status_code, "message": str(e.message)}
out["models"] = [m.id for m in c.models.list().data]
print(json.dumps(out))
`

// The real openai Python package, streaming and not, through `kvctl serve --disagg-config`.
func TestDisaggServeWithOpenAIClient(t *testing.T) {
	// The environment of `make pyenv` holds the pinned openai package beside Mooncake's; without
	// it the test skips, or fails under CI=true.
	py := filepath.Join(mooncaketest.PyEnv(t), "bin", "python3")
	url, c, g := startDisaggServe(t, "kv_transfer_timeout_ms: 500\n")
	script := filepath.Join(t.TempDir(), "client.py")
	if err := os.WriteFile(script, []byte(openAIScript), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, py, script, url).CombinedOutput()
	if err != nil {
		t.Fatalf("openai client: %v\n%s", err, out)
	}
	var got struct {
		Completion       string   `json:"completion"`
		CompletionStream []string `json:"completion_stream"`
		Chat             string   `json:"chat"`
		ChatStream       []string `json:"chat_stream"`
		StatusError      *struct {
			Status  int    `json:"status"`
			Message string `json:"message"`
		} `json:"status_error"`
		InStream struct {
			Chunks []string `json:"chunks"`
			Error  *string  `json:"error"`
		} `json:"in_stream"`
		Timeout *struct {
			Status  int    `json:"status"`
			Message string `json:"message"`
		} `json:"timeout"`
		Models []string `json:"models"`
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &got); err != nil {
		t.Fatalf("client output: %v\n%s", err, out)
	}
	if got.Completion != "tok tok tok " || got.Chat != "tok tok tok " {
		t.Errorf("non-streamed: %q %q", got.Completion, got.Chat)
	}
	if strings.Join(got.CompletionStream, "") != "tok tok tok " || len(got.ChatStream) != 3 {
		t.Errorf("streamed: %q %q", got.CompletionStream, got.ChatStream)
	}
	if got.StatusError == nil || got.StatusError.Status != 503 || !strings.Contains(got.StatusError.Message, "KV cache transfer failed") {
		t.Errorf("a streaming 503 reached the client as %+v", got.StatusError)
	}
	if len(got.InStream.Chunks) != 1 || got.InStream.Error == nil || !strings.Contains(*got.InStream.Error, "stream failed") {
		t.Errorf("an error after the first chunk reached the client as %+v", got.InStream)
	}
	if got.Timeout == nil || got.Timeout.Status != 504 || !strings.Contains(got.Timeout.Message, "kv_transfer_timeout_ms") {
		t.Errorf("a stalled transfer reached the client as %+v", got.Timeout)
	}
	if len(got.Models) != 1 || got.Models[0] != "scripted-model" {
		t.Errorf("models %q", got.Models)
	}
	if cs, gs := c.Stats(), g.Stats(); cs.Rejected != 0 || gs.Rejected != 0 {
		t.Errorf("protocol violations: %q %q", cs.LastProtocolError, gs.LastProtocolError)
	}
}

// TestREADMEDisaggWithNoServers checks the README's sentence on a front with no servers behind
// it against the real binary: /health answers 503 with the status and counts the README quotes,
// and a completion answers 502 naming the context server.
func TestREADMEDisaggWithNoServers(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Join(strings.Fields(string(readme)), " ")
	i := strings.Index(text, "With no servers behind it, `curl 127.0.0.1:8000/health` answers")
	if i < 0 {
		t.Fatal("the README no longer says what /health answers with no servers behind the front")
	}
	claim := text[i : i+strings.Index(text[i:], "reach.")]
	f := startFront(t, []string{disaggtest.DeadAddr(t)}, []string{disaggtest.DeadAddr(t)}, "")
	url := f.URL
	resp, err := http.Get(url + "/health")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(claim, "answers "+strconv.Itoa(resp.StatusCode)) {
		t.Errorf("/health answered %d; the README says: %s", resp.StatusCode, claim)
	}
	for _, f := range []string{`"status":"unavailable"`, `"context_up":0`, `"generation_up":0`} {
		if !strings.Contains(string(body), f) || !strings.Contains(claim, f) {
			t.Errorf("%s: /health answered %s; the README says: %s", f, body, claim)
		}
	}
	resp, err = http.Post(url+"/v1/completions", "application/json", strings.NewReader(`{"model":"m","prompt":"hi","max_tokens":2}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 502 || !strings.Contains(string(body), "context server") || !strings.Contains(claim, "completion answers 502") {
		t.Errorf("a completion answered %d %s; the README says: %s", resp.StatusCode, body, claim)
	}
}
