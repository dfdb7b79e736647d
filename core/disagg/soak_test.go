package disagg_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvctl/kvctl/core/disagg"
	"github.com/kvctl/kvctl/core/disagg/disaggtest"
)

// soakKinds are the request kinds of the soak, one in twenty each; the rest are plain requests.
// Connection refusals are injected on top, on 5 % of the dials to generation servers.
var soakKinds = []struct {
	fault  disaggtest.Fault
	stream bool
	want   string // the outcome class the client must see
}{
	{disaggtest.FaultCtx5xxOnce, false, "ok"},
	{disaggtest.FaultGenResetWrite, true, "ok"},
	{disaggtest.FaultGenStatus, true, "503"},
	{disaggtest.FaultGenCutBeforeFirst, true, "502"},
	{disaggtest.FaultGenCutAfterFirst, true, "in_stream_error"},
	{disaggtest.FaultGenStall, true, "504"},
	{disaggtest.FaultGenSlow, true, "disconnect"},
	{disaggtest.FaultGenErrorEventFirst, true, "500"},
	{disaggtest.FaultCtx4xx, false, "400"},
}

// TestSoak sends KVCTL_DISAGG_SOAK requests (default 1000, at most 300 under the race detector;
// docs/disagg.md records a run of 10000) through the proxy with every fault injected at 5 %, and checks that every request got
// its answer within the client's timeout and that nothing is left in flight.
func TestSoak(t *testing.T) {
	n := 1000
	if s := os.Getenv("KVCTL_DISAGG_SOAK"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 {
			t.Fatalf("KVCTL_DISAGG_SOAK=%q", s)
		}
		n = v
	}
	kvTimeout, clientTimeout := "3000", 10*time.Second
	if raceDetector {
		n, kvTimeout, clientTimeout = min(n, 300), "10000", 60*time.Second
	}
	if testing.Short() {
		n = min(n, 200)
	}
	var ctxAddrs, genAddrs []string
	var gens []*disaggtest.Server
	for range 2 {
		ctxAddrs = append(ctxAddrs, disaggtest.StartContext(t).Addr)
		g := disaggtest.StartGeneration(t)
		gens = append(gens, g)
		genAddrs = append(genAddrs, g.Addr)
	}
	isGen := map[string]bool{genAddrs[0]: true, genAddrs[1]: true}
	var refused atomic.Int64
	var rmu sync.Mutex
	rng := rand.New(rand.NewPCG(1, 2))
	refusedBy := map[string]int{}
	tr := disaggtest.Transport(func(req *http.Request) bool {
		if !isGen[req.URL.Host] {
			return false
		}
		rmu.Lock()
		defer rmu.Unlock()
		r := rng.Float64() < 0.05
		if r {
			refused.Add(1)
			if req.GetBody != nil {
				if b, err := req.GetBody(); err == nil {
					raw, _ := io.ReadAll(io.LimitReader(b, 4096))
					if _, rest, ok := strings.Cut(string(raw), `"user":"`); ok {
						user, _, _ := strings.Cut(rest, " ")
						refusedBy[user]++
					}
				}
			}
		}
		return r
	}, disaggtest.DeadAddr(t))
	defer func() {
		rmu.Lock()
		defer rmu.Unlock()
		for u, n := range refusedBy {
			if n > 3 { // more than max_retries: the request ends with 502
				t.Logf("%s: %d refused dials", u, n)
			}
		}
	}()
	cfg := loadConfig(t, yamlFor(ctxAddrs, genAddrs, "max_retries: 3\nkv_transfer_timeout_ms: "+kvTimeout+"\n"))
	var logs lockedLog
	url := startProxy(t, cfg, disagg.Options{Transport: tr, Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	defer func() {
		if t.Failed() {
			t.Logf("proxy log (may have reached):\n%s", logs.grep("may have reached"))
		}
	}()

	bigPrompt := make([]int, 48<<10) // 96 KiB of JSON: more than the socket buffers of disaggtest.Transport
	for i := range bigPrompt {
		bigPrompt[i] = i % 11
	}
	client := &http.Client{Timeout: clientTimeout, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	type outcome struct {
		kind, got string
		dur       time.Duration
	}
	results := make([]outcome, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				k := i % 20
				kind, want, fault, stream := "plain", "ok", disaggtest.FaultNone, i%2 == 0
				if k < len(soakKinds) {
					kind, want, fault, stream = string(soakKinds[k].fault), soakKinds[k].want, soakKinds[k].fault, soakKinds[k].stream
				}
				body := map[string]any{"model": "m", "max_tokens": 3, "stream": stream, "user": fmt.Sprintf("req-%d fault:%s", i, fault)}
				path := disagg.EndpointCompletions
				switch {
				case fault == disaggtest.FaultGenResetWrite:
					body["prompt"] = bigPrompt
				case i%3 == 0:
					path = disagg.EndpointChat
					body["messages"] = []map[string]string{{"role": "user", "content": "turn " + strconv.Itoa(i)}}
				default:
					body["prompt"] = "prompt " + strconv.Itoa(i)
				}
				t0 := time.Now()
				got := soakOne(client, url+path, body, fault == disaggtest.FaultGenSlow)
				results[i] = outcome{kind + "→" + want, got, time.Since(t0)}
			}
		}()
	}
	wg.Wait()
	wall := time.Since(start)

	byKind := map[string]map[string]int{}
	unexpected := map[string]int{}
	var worst time.Duration
	hung := 0
	for _, r := range results {
		if byKind[r.kind] == nil {
			byKind[r.kind] = map[string]int{}
		}
		got, detail, _ := strings.Cut(r.got, " ")
		byKind[r.kind][got]++
		want := r.kind[strings.Index(r.kind, "→")+len("→"):]
		if got != want && !strings.HasPrefix(r.got, "client error") {
			unexpected[r.kind+" "+got+" "+detail]++
		}
		worst = max(worst, r.dur)
		if strings.HasPrefix(r.got, "client error") {
			hung++
		}
	}
	for k, m := range byKind {
		t.Logf("%-40s %v", k, m)
	}
	for k, c := range unexpected {
		t.Logf("unexpected ×%d: %s", c, k)
	}
	t.Logf("%d requests in %s (%.0f/s), slowest %s, %d dials refused", n, wall.Round(time.Millisecond), float64(n)/wall.Seconds(), worst.Round(time.Millisecond), refused.Load())
	if hung != 0 {
		t.Fatalf("%d requests were left without a response", hung)
	}
	for k, m := range byKind {
		want := k[strings.Index(k, "→")+len("→"):]
		total := 0
		for _, c := range m {
			total += c
		}
		// Two other outcomes are the contract working, not failing: 502 when every attempt's
		// dial was refused (max_retries ran out), and 504 when the loaded machine did not bring
		// a first token within kv_transfer_timeout_ms. Each is logged above and kept under 1 %.
		other := 0
		for got, c := range m {
			if got != want {
				other += c
			}
		}
		for u := range unexpected {
			if strings.HasPrefix(u, k+" ") && !strings.Contains(u, "connection refused") && !strings.Contains(u, "kv_transfer_timeout_ms") {
				t.Errorf("%s: unexpected outcome %s", k, u)
			}
		}
		if other*100 > total {
			t.Errorf("%s: %d of %d did not get %s: %v", k, other, total, want, m)
		}
	}
	for _, series := range []string{
		`kvctl_disagg_retries_total{cause="connect",leg="generation"}`,
		`kvctl_disagg_retries_total{cause="reset_while_writing",leg="generation"}`,
		`kvctl_disagg_retries_total{cause="context_status_5xx",leg="context"}`,
		`kvctl_disagg_timeouts_total{kind="kv_transfer",leg="generation"}`,
		`kvctl_disagg_first_chunk_failures_total{endpoint="/v1/completions"}`,
		`kvctl_disagg_first_chunk_failures_total{endpoint="/v1/chat/completions"}`,
		`kvctl_disagg_client_disconnects_total{endpoint="/v1/completions"}`,
		`kvctl_disagg_client_disconnects_total{endpoint="/v1/chat/completions"}`,
	} {
		t.Logf("%s %v", series, metric(t, url, series))
	}
	eventually(t, "every leg to end", func() bool {
		for _, a := range append(ctxAddrs, genAddrs...) {
			role := "generation"
			if !isGen[a] {
				role = "context"
			}
			if metric(t, url, `kvctl_disagg_legs_in_flight{role="`+role+`",server="`+a+`"}`) != 0 {
				return false
			}
		}
		return true
	})
	for _, g := range gens {
		if s := g.Stats(); s.Rejected != 0 {
			t.Errorf("generation server %s: %d protocol errors, last %q", g.Addr, s.Rejected, s.LastProtocolError)
		}
	}
}

// soakOne sends one request and classifies what the client saw: ok, an HTTP status,
// in_stream_error, disconnect (the client left after the first chunk, as planned), or
// "client error: ..." when no answer came.
func soakOne(c *http.Client, url string, body map[string]any, leave bool) string {
	raw, _ := json.Marshal(body)
	resp, err := c.Post(url, "application/json", bytes.NewReader(raw))
	if err != nil {
		return "client error: " + err.Error()
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return strconv.Itoa(resp.StatusCode) + " " + string(b)
	}
	if resp.Header.Get("Content-Type") != "text/event-stream" {
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			return "client error: " + err.Error()
		}
		return "ok"
	}
	br := bufio.NewReader(resp.Body)
	for {
		line, err := br.ReadString('\n')
		if err == io.EOF {
			return "client error: the stream ended without [DONE] or an error"
		}
		if err != nil {
			return "client error: " + err.Error()
		}
		if leave && strings.HasPrefix(line, "data: ") {
			return "disconnect"
		}
		if strings.HasPrefix(line, `data: {"error"`) {
			return "in_stream_error"
		}
		if strings.HasPrefix(line, "data: [DONE]") {
			return "ok"
		}
	}
}

type lockedLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedLog) grep(s string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, line := range strings.Split(l.b.String(), "\n") {
		if strings.Contains(line, s) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}
