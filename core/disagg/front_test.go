package disagg_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvctl/kvctl/core/disagg"
	"github.com/kvctl/kvctl/core/disagg/disaggtest"
)

type healthAnswer struct {
	Status       string `json:"status"`
	ContextUp    int    `json:"context_up"`
	GenerationUp int    `json:"generation_up"`
	Draining     bool   `json:"draining"`
}

func getHealth(t *testing.T, url string) (int, healthAnswer) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var h healthAnswer
	if err := json.NewDecoder(resp.Body).Decode(&h); err != nil {
		t.Fatalf("%s: %v", url, err)
	}
	return resp.StatusCode, h
}

// /health and /readyz answer 200 only while a context server and a generation server answer
// their own /health; with every server behind it down, the front says so.
func TestHealthReflectsTheServers(t *testing.T) {
	live := newSetup(t, 1, 1, "")
	for _, ep := range []string{disagg.EndpointHealth, disagg.EndpointReadyz} {
		if code, h := getHealth(t, live.URL+ep); code != 200 || h.Status != "ok" || h.ContextUp != 1 || h.GenerationUp != 1 {
			t.Fatalf("%s with both servers up: %d %+v", ep, code, h)
		}
	}
	for _, tc := range []struct {
		name     string
		ctx, gen []string
		wantCtx  int
		wantGen  int
	}{
		{"every server down", []string{disaggtest.DeadAddr(t)}, []string{disaggtest.DeadAddr(t)}, 0, 0},
		{"no generation server", []string{live.Ctx[0].Addr}, []string{disaggtest.DeadAddr(t)}, 1, 0},
		{"no context server", []string{disaggtest.DeadAddr(t)}, []string{live.Gen[0].Addr}, 0, 1},
	} {
		url := startProxy(t, loadConfig(t, yamlFor(tc.ctx, tc.gen, "")), disagg.Options{})
		for _, ep := range []string{disagg.EndpointHealth, disagg.EndpointReadyz} {
			code, h := getHealth(t, url+ep)
			if code != http.StatusServiceUnavailable || h.Status != "unavailable" || h.ContextUp != tc.wantCtx || h.GenerationUp != tc.wantGen {
				t.Fatalf("%s, %s: %d %+v", tc.name, ep, code, h)
			}
		}
		if n := metric(t, url, `kvctl_disagg_backends_up{role="generation"}`); n != float64(tc.wantGen) {
			t.Fatalf("%s: backends_up{generation} %v", tc.name, n)
		}
	}
	// A server whose own /health fails counts as down.
	g := disaggtest.StartGeneration(t)
	g.Unhealthy.Store(true)
	url := startProxy(t, loadConfig(t, yamlFor([]string{live.Ctx[0].Addr}, []string{g.Addr}, "")), disagg.Options{})
	if code, h := getHealth(t, url+disagg.EndpointHealth); code != 503 || h.GenerationUp != 0 {
		t.Fatalf("an unhealthy generation server: %d %+v", code, h)
	}
}

// Shutting down drains: a request in flight when the front is told to stop runs to its end, and
// the front logs how many it waited for.
func TestShutdownDrainsRequestsInFlight(t *testing.T) {
	c := disaggtest.StartContext(t)
	g := disaggtest.StartGeneration(t)
	var logged syncBuffer
	opts := disagg.Options{Config: loadConfig(t, yamlFor([]string{c.Addr}, []string{g.Addr}, "")),
		Logger: slog.New(slog.NewTextHandler(&logged, nil)), RetryBackoff: time.Millisecond}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- disagg.Run(ctx, disagg.RunOptions{Options: opts, Addr: "127.0.0.1:0", DrainTimeout: 20 * time.Second,
			Ready: func(a string) { ready <- a }})
	}()
	url := "http://" + <-ready
	// A stream of 200 chunks 20ms apart is in flight when the front is stopped.
	type answer struct {
		status int
		body   []byte
		err    error
	}
	got := make(chan answer, 1)
	go func() {
		raw, _ := json.Marshal(completion(true, "fault:"+string(disaggtest.FaultGenSlow)))
		resp, err := http.Post(url+disagg.EndpointCompletions, "application/json", bytes.NewReader(raw))
		if err != nil {
			got <- answer{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		got <- answer{resp.StatusCode, b, err}
	}()
	eventually(t, "the stream to start", func() bool { return g.Stats().Streamed == 1 })
	cancel()
	a := <-got
	if a.err != nil || a.status != 200 || !strings.HasSuffix(strings.TrimSpace(string(a.body)), "data: [DONE]") {
		t.Fatalf("the request in flight: %v %d %.200s", a.err, a.status, a.body)
	}
	if err := <-done; err != nil {
		t.Fatalf("the front stopped with %v", err)
	}
	for _, want := range []string{"draining the disaggregated front", "requests_in_flight=1", "drained the disaggregated front", "requests_finished=1"} {
		if !strings.Contains(logged.String(), want) {
			t.Fatalf("the log lacks %q:\n%s", want, logged.String())
		}
	}
}

// A generation server that refuses connections for a moment (it is restarting) gets the
// re-send: the front backs off before re-sending instead of landing every try on the closed
// port at once.
func TestGenResendBacksOffForARestartingServer(t *testing.T) {
	c := disaggtest.StartContext(t)
	dead := disaggtest.DeadAddr(t)
	cfg := loadConfig(t, yamlFor([]string{c.Addr}, []string{dead}, "max_retries: 3\n"))
	url := startProxy(t, cfg, disagg.Options{RetryBackoff: 200 * time.Millisecond})
	restartedCh := make(chan *disaggtest.Server, 1)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		// The server comes back as soon as the front's first try was refused.
		for {
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
			resp, err := http.Get(url + "/metrics")
			if err != nil {
				continue
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if strings.Contains(string(b), `kvctl_disagg_retries_total{cause="connect",leg="generation"} 1`) {
				restartedCh <- disaggtest.StartGenerationAt(t, dead)
				return
			}
		}
	}()
	r := post(t, url+disagg.EndpointCompletions, completion(true, "r"))
	if r.Status != http.StatusOK {
		t.Fatalf("status %d: %s", r.Status, r.Body)
	}
	var restarted *disaggtest.Server
	select {
	case restarted = <-restartedCh:
	default:
	}
	if restarted == nil || restarted.Stats().Served != 1 {
		t.Fatal("the restarted server did not serve the re-sent leg")
	}
	if id := onlyID(t, restarted.Stats()); c.Stats().IDs[id] != 1 {
		t.Fatalf("the re-sent leg carried id %d, not the context leg's %v", id, c.Stats().IDs)
	}
}

// A context leg re-sent after a failure goes to another context server when there is one.
func TestContextResendGoesToAnotherServer(t *testing.T) {
	live := disaggtest.StartContext(t)
	g := disaggtest.StartGeneration(t)
	cfg := loadConfig(t, yamlFor([]string{disaggtest.DeadAddr(t), live.Addr}, []string{g.Addr}, ""))
	url := startProxy(t, cfg, disagg.Options{})
	for i := range 4 {
		if r := post(t, url+disagg.EndpointCompletions, completion(false, "r")); r.Status != http.StatusOK {
			t.Fatalf("request %d: status %d: %s", i, r.Status, r.Body)
		}
	}
	// Round robin hands every request the dead server first (its re-send advanced the turn to
	// the live one); every re-send then went to the live server, never to the dead one again.
	if n := metric(t, url, `kvctl_disagg_retries_total{cause="context_transport",leg="context"}`); n != 4 {
		t.Fatalf("context re-sends %v, want 4", n)
	}
	if n := live.Stats().Served; n != 4 {
		t.Fatalf("the live context server served %d, want 4", n)
	}
}

// A non-streamed request's generation leg is streamed upstream, so kv_transfer_timeout_ms holds
// for its first chunk: the client gets 504 within the timeout and the upstream request is
// cancelled. A leg that answers is put back together into the non-streamed answer.
func TestNonStreamedLegGetsTheFirstChunkTimeout(t *testing.T) {
	s := newSetup(t, 1, 1, "kv_transfer_timeout_ms: 300\nrequest_timeout_s: 600\n")
	r := post(t, s.URL+disagg.EndpointCompletions, completion(false, "fault:"+string(disaggtest.FaultGenStall)))
	if r.Status != http.StatusGatewayTimeout {
		t.Fatalf("status %d: %s", r.Status, r.Body)
	}
	if typ, m := errorMessage(t, r.Body); typ != "timeout_error" || !strings.Contains(m, "kv_transfer_timeout_ms") {
		t.Fatalf("envelope %s", r.Body)
	}
	eventually(t, "upstream cancellation", func() bool { return s.Gen[0].Stats().Cancelled == 1 })
	if n := metric(t, s.URL, `kvctl_disagg_timeouts_total{kind="kv_transfer",leg="generation"}`); n != 1 {
		t.Fatalf("kv_transfer timeouts %v", n)
	}
	// The timed-out request's reservation on its generation server is released with the error.
	if n := metric(t, s.URL, `kvctl_disagg_legs_in_flight{role="generation",server="`+s.Gen[0].Addr+`"}`); n != 0 {
		t.Fatalf("%v generation legs still held after the timeout", n)
	}

	for _, tc := range []struct {
		ep   string
		body map[string]any
	}{{disagg.EndpointCompletions, completion(false, "ok")}, {disagg.EndpointChat, chat(false, "ok")}} {
		r := post(t, s.URL+tc.ep, tc.body)
		if r.Status != http.StatusOK || !strings.HasPrefix(r.Header.Get("Content-Type"), "application/json") {
			t.Fatalf("%s: %d %s", tc.ep, r.Status, r.Body)
		}
		var v struct {
			Object  string `json:"object"`
			Choices []struct {
				Text    string `json:"text"`
				Message struct {
					Role    string `json:"role"`
					Content string `json:"content"`
				} `json:"message"`
				FinishReason string `json:"finish_reason"`
			} `json:"choices"`
			Usage struct {
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
		}
		if err := json.Unmarshal(r.Body, &v); err != nil || len(v.Choices) != 1 {
			t.Fatalf("%s: %v %s", tc.ep, err, r.Body)
		}
		text, obj := v.Choices[0].Text, "text_completion"
		if tc.ep == disagg.EndpointChat {
			text, obj = v.Choices[0].Message.Content, "chat.completion"
			if v.Choices[0].Message.Role != "assistant" {
				t.Fatalf("chat role %q", v.Choices[0].Message.Role)
			}
		}
		if v.Object != obj || text != "tok tok tok " || v.Choices[0].FinishReason != "length" || v.Usage.CompletionTokens != 3 {
			t.Fatalf("%s: rebuilt answer %s", tc.ep, r.Body)
		}
	}
	if st := s.Gen[0].Stats(); st.Streamed != 3 {
		t.Fatalf("the generation server was asked for %d streams, want 3", st.Streamed)
	}
	// A request whose answer a stream cannot carry (log probabilities) keeps a non-streamed leg.
	body := completion(false, "ok")
	body["logprobs"] = 2
	if r := post(t, s.URL+disagg.EndpointCompletions, body); r.Status != 200 || s.Gen[0].Stats().Streamed != 3 {
		t.Fatalf("logprobs: %d, streams %d", r.Status, s.Gen[0].Stats().Streamed)
	}
}

// /v1/responses passes through; a stream that fails before its first chunk keeps its 200 and
// carries an error event, while a non-streamed request fails with an HTTP error.
func TestResponsesStreamKeepsItsStatus(t *testing.T) {
	s := newSetup(t, 1, 1, "")
	s.Gen[0].Responses = true
	req := func(stream bool, user string) map[string]any {
		return map[string]any{"model": "scripted-model", "input": "hi", "stream": stream, "user": user}
	}
	r := post(t, s.URL+disagg.EndpointResponses, req(true, "ok"))
	if r.Status != 200 || !strings.Contains(string(r.Body), "event: response.completed") {
		t.Fatalf("stream: %d %s", r.Status, r.Body)
	}
	for _, f := range []disaggtest.Fault{disaggtest.FaultGenStatus, disaggtest.FaultGenCutBeforeFirst} {
		r = post(t, s.URL+disagg.EndpointResponses, req(true, "fault:"+string(f)))
		if r.Status != 200 || !strings.HasPrefix(string(r.Body), "event: error\ndata: ") {
			t.Fatalf("%s: %d %s", f, r.Status, r.Body)
		}
		var ev struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		}
		if err := json.Unmarshal([]byte(events(r.Body)[0]), &ev); err != nil || ev.Type != "error" || !strings.Contains(ev.Message, "generation server") {
			t.Fatalf("%s: error event %s", f, r.Body)
		}
	}
	r = post(t, s.URL+disagg.EndpointResponses, req(false, "fault:"+string(disaggtest.FaultGenStatus)))
	if _, m := errorMessage(t, r.Body); r.Status != 503 || !strings.Contains(m, "scripted: overloaded") {
		t.Fatalf("non-streamed: %d %s", r.Status, r.Body)
	}
	if r = post(t, s.URL+disagg.EndpointResponses, req(false, "ok")); r.Status != 200 || !strings.Contains(string(r.Body), `"status":"completed"`) {
		t.Fatalf("non-streamed: %d %s", r.Status, r.Body)
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
