package adversarial

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvctl/kvctl/core/disagg/disaggtest"
)

// The disaggregated front (`kvctl serve --disagg-config`) under clients that try to make it
// hold memory and connections: prompts that amplify, more requests and bytes than it should
// hold, bodies sent slowly, and one peer opening connections without end.

type disaggFront struct {
	url    string
	pid    int
	stderr *lockedLog
	ctx    *disaggtest.Server
	gen    *disaggtest.Server
}

type lockedLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedLog) add(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.b.WriteString(s)
}

func (l *lockedLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startFront runs the front in front of scripted servers with extra config lines; nofile, when
// positive, is the front's descriptor limit.
func startFront(t *testing.T, extra string, nofile int) *disaggFront {
	t.Helper()
	c := disaggtest.StartContext(t)
	g := disaggtest.StartGeneration(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	cfg := filepath.Join(t.TempDir(), "disagg_config.yaml")
	text := fmt.Sprintf("hostname: 127.0.0.1\nport: %d\ncontext_servers:\n  num_instances: 1\n  urls:\n    - %q\n"+
		"generation_servers:\n  num_instances: 1\n  urls:\n    - %q\n%s", port, c.Addr, g.Addr, extra)
	if err := os.WriteFile(cfg, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	script := `exec "$0" serve --disagg-config "$1"`
	if nofile > 0 {
		script = "ulimit -n " + strconv.Itoa(nofile) + " && " + script
	}
	cmd := exec.Command("sh", "-c", script, kvctl, cfg)
	cmd.Env = append(os.Environ(), "XDG_CONFIG_HOME="+t.TempDir())
	pr, pw := io.Pipe()
	cmd.Stderr = pw
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); _ = pw.Close(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	f := &disaggFront{pid: cmd.Process.Pid, stderr: &lockedLog{}, ctx: c, gen: g}
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			f.stderr.add(sc.Text() + "\n")
			if a, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "listen   "); ok {
				ready <- a
			}
		}
	}()
	select {
	case a := <-ready:
		f.url = a
	case <-done:
		t.Fatalf("the front exited:\n%s", f.stderr.String())
	case <-time.After(20 * time.Second):
		t.Fatalf("the front was not ready in 20s:\n%s", f.stderr.String())
	}
	return f
}

func completionBody(user string) []byte {
	b, _ := json.Marshal(map[string]any{"model": "m", "prompt": "hello there", "max_tokens": 3, "user": user})
	return b
}

func postFront(client *http.Client, url string, body []byte) (int, string, error) {
	resp, err := client.Post(url+"/v1/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, string(b), nil
}

func peakRSSKiB(t *testing.T, pid int) int64 {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return n
		}
	}
	t.Fatal("no VmHWM")
	return 0
}

// A 30 MiB body of 15.7 M token ids, under max_request_bytes, is refused for its token count
// (max_prompt_tokens) without the front building anything for its ids: its peak memory grows by
// a small multiple of the body, not the 380 MB that decoding the ids cost.
func TestDisaggPromptAmplification(t *testing.T) {
	f := startFront(t, "", 0)
	var body bytes.Buffer
	body.WriteString(`{"model":"m","max_tokens":1,"prompt":[`)
	const n = 15_700_000
	for i := range n {
		if i > 0 {
			body.WriteByte(',')
		}
		body.WriteByte('1')
	}
	body.WriteString(`]}`)
	// The front sends the first requests of its life through the same paths; settle them first.
	if code, b, err := postFront(http.DefaultClient, f.url, completionBody("warm")); err != nil || code != 200 {
		t.Fatalf("warm-up: %d %v %s", code, err, b)
	}
	before := peakRSSKiB(t, f.pid)
	code, b, err := postFront(http.DefaultClient, f.url, body.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if code != http.StatusBadRequest || !strings.Contains(b, "max_prompt_tokens") {
		t.Fatalf("a %d-token prompt: %d %s", n, code, b)
	}
	grew := peakRSSKiB(t, f.pid) - before
	t.Logf("peak RSS grew by %d MiB for a %d MiB body", grew>>10, body.Len()>>20)
	if limit := int64(5 * body.Len() >> 10); grew > limit {
		t.Fatalf("the front's peak memory grew by %d KiB for a %d KiB body (more than %d KiB)", grew, body.Len()>>10, limit)
	}
	if f.ctx.Stats().Requests != 1 {
		t.Fatal("the refused prompt reached the context server")
	}
}

// Past max_inflight_requests a request is answered 429 at once, and past max_inflight_bytes
// too, instead of being held.
func TestDisaggInflightBounds(t *testing.T) {
	f := startFront(t, "max_inflight_requests: 3\nmax_inflight_bytes: 1048576\n", 0)
	var wg sync.WaitGroup
	codes := make(chan int, 3)
	for i := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, _, _ := postFront(http.DefaultClient, f.url, completionBody(fmt.Sprintf("fault:ctx_stall %d", i)))
			codes <- code
		}()
	}
	for deadline := time.Now().Add(10 * time.Second); f.ctx.Stats().Requests < 3; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the held requests never reached the context server")
		}
	}
	code, b, err := postFront(http.DefaultClient, f.url, completionBody("one more"))
	if err != nil || code != http.StatusTooManyRequests || !strings.Contains(b, "max_inflight_requests") {
		t.Fatalf("a request past max_inflight_requests: %d %v %s", code, err, b)
	}
	wg.Wait()
	close(codes)
	for c := range codes {
		if c != 200 {
			t.Fatalf("a held request ended with %d", c)
		}
	}

	// Two bodies of 600 KiB announced and sent slowly hold more than 1 MiB: whichever the front
	// admits second is refused before it is read. Which one that is depends on which headers
	// the front reads first, so both connections are watched and the first answer counts.
	open := func() (net.Conn, *bufio.Reader) {
		c, err := net.Dial("tcp", strings.TrimPrefix(f.url, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{", 600<<10)
		return c, bufio.NewReader(c)
	}
	type answer struct {
		code int
		body string
		err  error
	}
	answers := make(chan answer, 2)
	for range 2 {
		c, r := open()
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		go func() {
			resp, err := http.ReadResponse(r, nil)
			if err != nil {
				answers <- answer{err: err}
				return
			}
			msg, _ := io.ReadAll(resp.Body)
			answers <- answer{code: resp.StatusCode, body: string(msg)}
		}()
	}
	a := <-answers
	if a.err != nil {
		t.Fatalf("neither slow body got an answer: %v", a.err)
	}
	if a.code != http.StatusTooManyRequests || !strings.Contains(a.body, "max_inflight_bytes") {
		t.Fatalf("a body past max_inflight_bytes: %d %s", a.code, a.body)
	}
}

// A client that sends its body slowly is cut off after body_read_timeout_s with 408.
func TestDisaggSlowBody(t *testing.T) {
	f := startFront(t, "body_read_timeout_s: 1\n", 0)
	c, err := net.Dial("tcp", strings.TrimPrefix(f.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"prompt\":")
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer to a body that stopped: %v", err)
	}
	msg, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusRequestTimeout || !strings.Contains(string(msg), "body_read_timeout_s") {
		t.Fatalf("a body that stopped: %d %s", resp.StatusCode, msg)
	}
}

// One peer opening connections without end gets only its share of them: the front keeps
// serving another peer, and its descriptors stay bounded, even under a descriptor limit the
// flood alone would exhaust.
func TestDisaggConnectionShare(t *testing.T) {
	raiseOwnLimit()
	f := startFront(t, "max_connections: 128\nmax_connections_per_peer: 32\n", 256)
	attacker := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}, Timeout: 2 * time.Second}
	addr := strings.TrimPrefix(f.url, "http://")
	var conns []net.Conn
	t.Cleanup(func() {
		for _, c := range conns {
			_ = c.Close()
		}
	})
	for range 600 {
		c, err := attacker.Dial("tcp", addr)
		if err != nil {
			continue
		}
		// Headers that never end.
		_, _ = io.WriteString(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
		conns = append(conns, c)
	}
	// The legitimate client, on its own connections.
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
	for i := range 5 {
		code, b, err := postFront(client, f.url, completionBody("legit"))
		if err != nil || code != 200 {
			t.Fatalf("request %d from another peer during the flood: %d %v %s", i, code, err, b)
		}
	}
	_, fds, err := procStats(f.pid)
	if err != nil {
		t.Fatal(err)
	}
	if fds > 128+40 {
		t.Fatalf("the front holds %d descriptors during the flood", fds)
	}
	resp, err := client.Get(f.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	m, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(m), `kvctl_disagg_refused_total{reason="peer_share"}`) ||
		strings.Contains(string(m), `kvctl_disagg_refused_total{reason="peer_share"} 0`) {
		t.Fatalf("no connection refused for the peer's share:\n%s", m)
	}
}
