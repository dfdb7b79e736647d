package disagg_test

import (
	"bufio"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvctl/kvctl/core/disagg"
	"github.com/kvctl/kvctl/core/disagg/disaggtest"
)

func completion(stream bool, user string) map[string]any {
	return map[string]any{"model": "scripted-model", "prompt": "NVIDIA is a great company because", "max_tokens": 3,
		"stream": stream, "user": user}
}

func chat(stream bool, user string) map[string]any {
	return map[string]any{"model": "scripted-model", "messages": []map[string]string{{"role": "user", "content": "hi"}},
		"max_tokens": 3, "stream": stream, "user": user}
}

// Both legs run, with the protocol the scripted servers check, for every endpoint and mode.
func TestLegsCarryTheProtocol(t *testing.T) {
	s := newSetup(t, 1, 1, "")
	for _, tc := range []struct {
		name   string
		path   string
		body   map[string]any
		stream bool
	}{
		{"completion", disagg.EndpointCompletions, completion(false, "a"), false},
		{"completion stream", disagg.EndpointCompletions, completion(true, "b"), true},
		{"chat", disagg.EndpointChat, chat(false, "c"), false},
		{"chat stream", disagg.EndpointChat, chat(true, "d"), true},
		{"token-id prompt", disagg.EndpointCompletions, map[string]any{"prompt": []int{1, 2, 3}, "max_tokens": 2}, false},
		{"one-element prompt list", disagg.EndpointCompletions, map[string]any{"prompt": []string{"x"}, "max_tokens": 2}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := post(t, s.URL+tc.path, tc.body)
			if r.Status != http.StatusOK {
				t.Fatalf("status %d: %s", r.Status, r.Body)
			}
			if tc.stream {
				if ct := r.Header.Get("Content-Type"); ct != "text/event-stream" {
					t.Fatalf("content type %q", ct)
				}
				ev := events(r.Body)
				if len(ev) != 4 || ev[3] != "[DONE]" {
					t.Fatalf("want 3 chunks and [DONE], got %q", ev)
				}
				if !strings.Contains(ev[0], "tok ") {
					t.Fatalf("first chunk %s", ev[0])
				}
			} else if !strings.Contains(string(r.Body), "tok tok") {
				t.Fatalf("body %s", r.Body)
			}
		})
	}
	c, g := s.Ctx[0].Stats(), s.Gen[0].Stats()
	if c.Rejected != 0 || g.Rejected != 0 {
		t.Fatalf("protocol violations: ctx %q gen %q", c.LastProtocolError, g.LastProtocolError)
	}
	for id := range g.IDs {
		if c.IDs[id] != 1 {
			t.Fatalf("generation served id %d that no context leg used (%v)", id, c.IDs)
		}
	}
	if len(g.IDs) != 6 {
		t.Fatalf("generation served %d ids, want 6", len(g.IDs))
	}
}

// A refused connection is retried with the same disagg_request_id on another server.
func TestGenRetryOnRefusedKeepsID(t *testing.T) {
	c := disaggtest.StartContext(t)
	g := disaggtest.StartGeneration(t)
	dead := disaggtest.DeadAddr(t)
	cfg := loadConfig(t, yamlFor([]string{c.Addr}, []string{dead, g.Addr}, ""))
	url := startProxy(t, cfg, disagg.Options{})
	for i := range 2 { // round robin: each request meets the dead server first, then the live one
		r := post(t, url+disagg.EndpointCompletions, completion(i == 0, "r"))
		if r.Status != http.StatusOK {
			t.Fatalf("request %d: status %d: %s", i, r.Status, r.Body)
		}
	}
	if n := metric(t, url, `kvctl_disagg_retries_total{cause="connect",leg="generation"}`); n != 2 {
		t.Fatalf("connect retries %v, want 2", n)
	}
	gs, cs := g.Stats(), c.Stats()
	for id := range gs.IDs {
		if cs.IDs[id] != 1 {
			t.Fatalf("retried leg carried id %d, not the context leg's (%v)", id, cs.IDs)
		}
	}
	if len(gs.IDs) != 2 {
		t.Fatalf("ids served: %v", gs.IDs)
	}
}

// A reset while the request is being written is retried with the same id.
func TestGenRetryOnResetWhileWritingKeepsID(t *testing.T) {
	c := disaggtest.StartContext(t)
	g := disaggtest.StartGeneration(t)
	cfg := loadConfig(t, yamlFor([]string{c.Addr}, []string{g.Addr}, ""))
	s := &setup{Ctx: []*disaggtest.Server{c}, Gen: []*disaggtest.Server{g},
		URL: startProxy(t, cfg, disagg.Options{Transport: disaggtest.Transport(nil, "")})}
	ids := make([]int, 1<<18) // 256Ki token ids: 512 KiB of JSON, far more than the socket buffers
	for i := range ids {
		ids[i] = i % 7
	}
	r := post(t, s.URL+disagg.EndpointCompletions, map[string]any{"prompt": ids, "max_tokens": 2, "user": "fault:" + string(disaggtest.FaultGenResetWrite)})
	if r.Status != http.StatusOK {
		t.Fatalf("status %d: %s", r.Status, r.Body)
	}
	gs := s.Gen[0].Stats()
	if gs.Resets != 1 {
		t.Fatalf("resets %d, want 1", gs.Resets)
	}
	if id := onlyID(t, gs); id != gs.ResetIDs[0] || s.Ctx[0].Stats().IDs[id] != 1 {
		t.Fatalf("served id %d, reset id %d, context ids %v", id, gs.ResetIDs[0], s.Ctx[0].Stats().IDs)
	}
	if n := metric(t, s.URL, `kvctl_disagg_retries_total{cause="reset_while_writing",leg="generation"}`); n != 1 {
		t.Fatalf("reset retries %v, want 1", n)
	}
}

// Any failure once the request was written fails the request, unretried.
func TestGenNoRetryOnceWritten(t *testing.T) {
	s := newSetup(t, 1, 2, "")
	for _, stream := range []bool{false, true} {
		r := post(t, s.URL+disagg.EndpointCompletions, completion(stream, "fault:"+string(disaggtest.FaultGenCutBeforeFirst)))
		if r.Status != http.StatusBadGateway {
			t.Fatalf("stream=%v: status %d, want 502: %s", stream, r.Status, r.Body)
		}
		if _, msg := errorMessage(t, r.Body); !strings.Contains(msg, "generation server") {
			t.Fatalf("message %q does not name the generation server", msg)
		}
	}
	if n := s.Gen[0].Stats().Requests + s.Gen[1].Stats().Requests; n != 2 {
		t.Fatalf("generation servers saw %d requests, want 2 (no retry)", n)
	}
	if n := metric(t, s.URL, `kvctl_disagg_retries_total{cause="connect",leg="generation"}`); n != 0 {
		t.Fatalf("retried: %v", n)
	}
}

// A streaming leg answered with a 4xx/5xx JSON body fails with the worker's status and message.
func TestStreamingErrorStatusIsTheWorkers(t *testing.T) {
	s := newSetup(t, 1, 1, "")
	for _, tc := range []struct {
		fault  disaggtest.Fault
		status int
		msg    string
	}{
		{disaggtest.FaultGenStatus, 503, "KV cache transfer failed"},
		{disaggtest.FaultGenBadRequest, 400, "max_tokens exceeds"},
	} {
		for _, path := range []string{disagg.EndpointCompletions, disagg.EndpointChat} {
			body := completion(true, "fault:"+string(tc.fault))
			if path == disagg.EndpointChat {
				body = chat(true, "fault:"+string(tc.fault))
			}
			r := post(t, s.URL+path, body)
			if r.Status != tc.status {
				t.Fatalf("%s %s: status %d, want %d: %s", path, tc.fault, r.Status, tc.status, r.Body)
			}
			if _, msg := errorMessage(t, r.Body); !strings.Contains(msg, tc.msg) {
				t.Fatalf("message %q lacks the worker's %q", msg, tc.msg)
			}
		}
	}
}

// A stream that fails before its first chunk is an HTTP error, counted, and not a response.
func TestFailureBeforeFirstChunkIsHTTPError(t *testing.T) {
	s := newSetup(t, 1, 1, "")
	r := post(t, s.URL+disagg.EndpointChat, chat(true, "fault:"+string(disaggtest.FaultGenErrorEventFirst)))
	if r.Status != 500 {
		t.Fatalf("status %d, want the worker's 500: %s", r.Status, r.Body)
	}
	if _, msg := errorMessage(t, r.Body); !strings.Contains(msg, "KV cache transfer failed") {
		t.Fatalf("message %q", msg)
	}
	r = post(t, s.URL+disagg.EndpointCompletions, completion(true, "fault:"+string(disaggtest.FaultGenCutBeforeFirst)))
	if r.Status != http.StatusBadGateway || r.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("status %d %q: %s", r.Status, r.Header.Get("Content-Type"), r.Body)
	}
	if n := metric(t, s.URL, `kvctl_disagg_first_chunk_failures_total{endpoint="/v1/chat/completions"}`); n != 1 {
		t.Fatalf("first-chunk failures (chat) %v", n)
	}
	if n := metric(t, s.URL, `kvctl_disagg_responses_total{endpoint="/v1/completions"}`); n != 0 {
		t.Fatalf("a failed stream was counted as a response")
	}
	post(t, s.URL+disagg.EndpointCompletions, completion(true, "ok"))
	if n := metric(t, s.URL, `kvctl_disagg_responses_total{endpoint="/v1/completions"}`); n != 1 {
		t.Fatalf("responses %v, want 1", n)
	}
}

// After the first chunk, an error is reported in the stream.
func TestFailureAfterFirstChunkIsInStream(t *testing.T) {
	s := newSetup(t, 1, 1, "")
	r := post(t, s.URL+disagg.EndpointCompletions, completion(true, "fault:"+string(disaggtest.FaultGenCutAfterFirst)))
	if r.Status != http.StatusOK {
		t.Fatalf("status %d", r.Status)
	}
	ev := events(r.Body)
	if len(ev) != 2 || !strings.Contains(ev[0], "tok ") {
		t.Fatalf("events %q", ev)
	}
	var e struct {
		Error struct {
			Message string `json:"message"`
			Code    int    `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(ev[1]), &e); err != nil || !strings.Contains(e.Error.Message, "stream failed") || e.Error.Code != 502 {
		t.Fatalf("in-stream error %q (%v)", ev[1], err)
	}
	if n := metric(t, s.URL, `kvctl_disagg_errors_total{endpoint="/v1/completions",status="in_stream"}`); n != 1 {
		t.Fatalf("in-stream errors %v", n)
	}
}

// /v1/messages passes through, with the Anthropic envelope on errors.
func TestMessagesPassthroughAndEnvelope(t *testing.T) {
	s := newSetup(t, 1, 1, "")
	msg := func(stream bool, user string) map[string]any {
		return map[string]any{"model": "scripted-model", "max_tokens": 8, "stream": stream, "user": user,
			"messages": []map[string]string{{"role": "user", "content": "hi"}}}
	}
	r := post(t, s.URL+disagg.EndpointMessages, msg(false, "x"))
	if r.Status != http.StatusNotFound {
		t.Fatalf("a server without /v1/messages: status %d", r.Status)
	}
	if typ, m := errorMessage(t, r.Body); typ != "not_found_error" || !strings.Contains(m, "do not serve /v1/messages") {
		t.Fatalf("envelope %s", r.Body)
	}
	s.Gen[0].Messages = true
	r = post(t, s.URL+disagg.EndpointMessages, msg(true, "x"))
	if r.Status != http.StatusOK || !strings.Contains(string(r.Body), "event: message_start") {
		t.Fatalf("status %d: %s", r.Status, r.Body)
	}
	r = post(t, s.URL+disagg.EndpointMessages, msg(true, "fault:"+string(disaggtest.FaultGenCutBeforeFirst)))
	var env struct {
		Type  string `json:"type"`
		Error struct {
			Type string `json:"type"`
		} `json:"error"`
	}
	if r.Status != http.StatusBadGateway || json.Unmarshal(r.Body, &env) != nil || env.Type != "error" || env.Error.Type != "api_error" {
		t.Fatalf("status %d: %s", r.Status, r.Body)
	}
	r = post(t, s.URL+disagg.EndpointMessages, msg(true, "fault:"+string(disaggtest.FaultGenStatus)))
	if typ, m := errorMessage(t, r.Body); r.Status != 503 || typ != "overloaded_error" || !strings.Contains(m, "scripted: overloaded") {
		t.Fatalf("status %d: %s", r.Status, r.Body)
	}
}

// A client that disconnects cancels the upstream stream and releases its reservation.
func TestClientDisconnectCancelsUpstream(t *testing.T) {
	s := newSetup(t, 1, 1, "")
	req, _ := http.NewRequest(http.MethodPost, s.URL+disagg.EndpointCompletions,
		strings.NewReader(`{"prompt":"p","stream":true,"user":"fault:gen_slow"}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("first line %q: %v", line, err)
	}
	gauge := `kvctl_disagg_legs_in_flight{role="generation",server="` + s.Gen[0].Addr + `"}`
	if n := metric(t, s.URL, gauge); n != 1 {
		t.Fatalf("legs in flight %v, want 1", n)
	}
	resp.Body.Close() // the client goes away mid-stream
	eventually(t, "upstream cancellation", func() bool { return s.Gen[0].Stats().Cancelled == 1 })
	eventually(t, "release", func() bool {
		return metric(t, s.URL, gauge) == 0 && metric(t, s.URL, `kvctl_disagg_client_disconnects_total{endpoint="/v1/completions"}`) == 1
	})
}

// No first token within kv_transfer_timeout_ms: the upstream is cancelled, the client gets 504.
func TestKVTransferTimeout(t *testing.T) {
	s := newSetup(t, 1, 1, "kv_transfer_timeout_ms: 300\n")
	start := time.Now()
	r := post(t, s.URL+disagg.EndpointChat, chat(true, "fault:"+string(disaggtest.FaultGenStall)))
	if r.Status != http.StatusGatewayTimeout {
		t.Fatalf("status %d: %s", r.Status, r.Body)
	}
	if typ, m := errorMessage(t, r.Body); typ != "timeout_error" || !strings.Contains(m, "kv_transfer_timeout_ms") {
		t.Fatalf("envelope %s", r.Body)
	}
	if time.Since(start) > 10*time.Second {
		t.Fatalf("the timeout did not fire")
	}
	eventually(t, "upstream cancellation", func() bool { return s.Gen[0].Stats().Cancelled == 1 })
	if n := metric(t, s.URL, `kvctl_disagg_timeouts_total{kind="kv_transfer",leg="generation"}`); n != 1 {
		t.Fatalf("timeouts %v", n)
	}
}

// The timeout comes from the generation servers' cache_transceiver_config too.
func TestKVTransferTimeoutFromCacheTransceiverConfig(t *testing.T) {
	c := disaggtest.StartContext(t)
	g := disaggtest.StartGeneration(t)
	text := yamlFor([]string{c.Addr}, []string{g.Addr}, "") +
		"  cache_transceiver_config:\n    backend: UCX\n    kv_transfer_timeout_ms: 250\n"
	cfg := loadConfig(t, text)
	if cfg.KVTransferTimeoutMs != 250 || cfg.KVTransferTimeoutFrom != "generation_servers.cache_transceiver_config.kv_transfer_timeout_ms" {
		t.Fatalf("timeout %d from %q", cfg.KVTransferTimeoutMs, cfg.KVTransferTimeoutFrom)
	}
	url := startProxy(t, cfg, disagg.Options{})
	r := post(t, url+disagg.EndpointCompletions, completion(true, "fault:"+string(disaggtest.FaultGenStall)))
	if r.Status != http.StatusGatewayTimeout {
		t.Fatalf("status %d", r.Status)
	}
}

// Context legs keep their retry: a 5xx is re-sent under a fresh id; a 4xx is not re-sent.
func TestContextLegRetry(t *testing.T) {
	s := newSetup(t, 1, 1, "")
	r := post(t, s.URL+disagg.EndpointCompletions, completion(false, "fault:"+string(disaggtest.FaultCtx5xxOnce)))
	if r.Status != http.StatusOK {
		t.Fatalf("status %d: %s", r.Status, r.Body)
	}
	if n := metric(t, s.URL, `kvctl_disagg_retries_total{cause="context_status_5xx",leg="context"}`); n != 1 {
		t.Fatalf("context retries %v", n)
	}
	r = post(t, s.URL+disagg.EndpointCompletions, completion(false, "fault:"+string(disaggtest.FaultCtx4xx)))
	if r.Status != http.StatusBadRequest {
		t.Fatalf("status %d", r.Status)
	}
	if _, m := errorMessage(t, r.Body); !strings.Contains(m, "longer than max_seq_len") || !strings.Contains(m, "context server") {
		t.Fatalf("message %q", m)
	}
	if n := s.Ctx[0].Stats().Requests; n != 3 {
		t.Fatalf("context requests %d, want 3", n)
	}
	r = post(t, s.URL+disagg.EndpointCompletions, completion(false, "fault:"+string(disaggtest.FaultCtxNoParams)))
	if _, m := errorMessage(t, r.Body); r.Status != http.StatusBadGateway || !strings.Contains(m, "disaggregated_params") {
		t.Fatalf("status %d: %s", r.Status, r.Body)
	}
	r = post(t, s.URL+disagg.EndpointCompletions, completion(false, "fault:"+string(disaggtest.FaultCtxFinished)))
	if r.Status != http.StatusOK || strings.Contains(string(r.Body), "disaggregated_params") {
		t.Fatalf("a request the context server finished: %d %s", r.Status, r.Body)
	}
}

// Bad input gets a clear 4xx naming the problem.
func TestBadInput(t *testing.T) {
	s := newSetup(t, 1, 1, "max_request_bytes: 4096\n")
	for _, tc := range []struct {
		path, body string
		status     int
		want       string
	}{
		{disagg.EndpointCompletions, `not json`, 400, "not a JSON object"},
		{disagg.EndpointCompletions, `[1,2]`, 400, "not a JSON object"},
		{disagg.EndpointCompletions, `{"model":"m"}`, 400, "prompt is required"},
		{disagg.EndpointCompletions, `{"prompt":["a","b"]}`, 400, "single string prompt"},
		{disagg.EndpointCompletions, `{"prompt":"a","stream":"yes"}`, 400, "stream"},
		{disagg.EndpointChat, `{"messages":[]}`, 400, "messages"},
		{disagg.EndpointCompletions, `{"prompt":"` + strings.Repeat("x", 5000) + `"}`, 413, "larger than 4096"},
	} {
		resp, err := http.Post(s.URL+tc.path, "application/json", strings.NewReader(tc.body))
		if err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		_, _ = bufio.NewReader(resp.Body).WriteTo(&b)
		resp.Body.Close()
		if resp.StatusCode != tc.status || !strings.Contains(b.String(), tc.want) {
			t.Errorf("%s %.40s: status %d %s, want %d with %q", tc.path, tc.body, resp.StatusCode, b.String(), tc.status, tc.want)
		}
	}
	if n := s.Ctx[0].Stats().Requests; n != 0 {
		t.Fatalf("bad input reached a context server %d times", n)
	}
}

func TestModelsAndHealth(t *testing.T) {
	s := newSetup(t, 1, 1, "")
	for _, p := range []string{disagg.EndpointModels, disagg.EndpointHealth} {
		resp, err := http.Get(s.URL + p)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("%s: %v %v", p, err, resp)
		}
		resp.Body.Close()
	}
}
