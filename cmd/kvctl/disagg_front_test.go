package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvctl/kvctl/commands/cmdutil"
	"github.com/kvctl/kvctl/core/disagg/disaggtest"
)

// The disaggregated front's timeouts, re-sends, health and shutdown (issue 36), each through a
// real `kvctl serve --disagg-config` process in front of scripted trtllm-serve servers on
// loopback sockets.

type frontAnswer struct {
	Status int
	Header http.Header
	Body   []byte
}

func frontPost(t *testing.T, url string, v any) frontAnswer {
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
	return frontAnswer{resp.StatusCode, resp.Header, b}
}

// frontCompletion is a /v1/completions body; user names a scripted fault ("fault:<name>").
func frontCompletion(stream bool, user string) map[string]any {
	return map[string]any{"model": "scripted-model", "prompt": "NVIDIA is a great company because",
		"max_tokens": 3, "stream": stream, "user": user}
}

// frontMetric reads one sample of the front's /metrics (0 when absent).
func frontMetric(t *testing.T, base, series string) float64 {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			var v float64
			if _, err := fmt.Sscan(rest, &v); err != nil {
				t.Fatalf("%s: %v", sc.Text(), err)
			}
			return v
		}
	}
	return 0
}

// within waits up to d for cond, polling.
func within(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s did not happen within %s", what, d)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

type frontHealth struct {
	Status       string `json:"status"`
	ContextUp    int    `json:"context_up"`
	GenerationUp int    `json:"generation_up"`
	Draining     bool   `json:"draining"`
}

func getFrontHealth(t *testing.T, url string) (int, frontHealth) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var h frontHealth
	if err := json.NewDecoder(resp.Body).Decode(&h); err != nil {
		t.Fatalf("%s: %v", url, err)
	}
	return resp.StatusCode, h
}

// /health and /readyz of the front answer 200 only while a context server and a generation
// server answer their own /health, and say how many do; a generation server that turns
// unhealthy turns both to 503; a front whose servers are all gone answers 503.
func TestDisaggFrontHealthReflectsItsServers(t *testing.T) {
	c := disaggtest.StartContext(t)
	g := disaggtest.StartGeneration(t)
	f := startFront(t, []string{c.Addr}, []string{g.Addr}, "")
	for _, ep := range []string{"/health", "/readyz"} {
		if code, h := getFrontHealth(t, f.URL+ep); code != 200 || h.Status != "ok" || h.ContextUp != 1 || h.GenerationUp != 1 || h.Draining {
			t.Fatalf("%s with both servers up: %d %+v", ep, code, h)
		}
	}
	g.Unhealthy.Store(true)
	// The probe's answer is shared for a second; within a few the front sees the change.
	within(t, 5*time.Second, "/health turning 503", func() bool {
		code, h := getFrontHealth(t, f.URL+"/health")
		return code == http.StatusServiceUnavailable && h.Status == "unavailable" && h.GenerationUp == 0 && h.ContextUp == 1
	})
	if code, h := getFrontHealth(t, f.URL+"/readyz"); code != http.StatusServiceUnavailable || h.GenerationUp != 0 {
		t.Fatalf("/readyz with the generation server unhealthy: %d %+v", code, h)
	}
	if n := frontMetric(t, f.URL, `kvctl_disagg_backends_up{role="generation"}`); n != 0 {
		t.Fatalf("backends_up{generation} %v with the generation server unhealthy", n)
	}
	g.Unhealthy.Store(false)
	within(t, 5*time.Second, "/readyz turning 200 again", func() bool {
		code, _ := getFrontHealth(t, f.URL+"/readyz")
		return code == http.StatusOK
	})

	dead := startFront(t, []string{disaggtest.DeadAddr(t)}, []string{disaggtest.DeadAddr(t)}, "")
	for _, ep := range []string{"/health", "/readyz"} {
		if code, h := getFrontHealth(t, dead.URL+ep); code != http.StatusServiceUnavailable || h.ContextUp != 0 || h.GenerationUp != 0 {
			t.Fatalf("%s with every server down: %d %+v", ep, code, h)
		}
	}
}

// SIGTERM drains: a stream in flight when the front is told to stop runs to its end, the front
// logs how many requests it waited for and exits 0. With a drain timeout shorter than the
// stream, the front logs the request it cut and exits non-zero.
func TestDisaggFrontDrainsOnSIGTERM(t *testing.T) {
	c := disaggtest.StartContext(t)
	g := disaggtest.StartGeneration(t)

	type answer struct {
		status int
		body   []byte
		err    error
	}
	// slowStream sends a stream of 200 chunks 20ms apart (4s) and returns its answer.
	slowStream := func(url string) <-chan answer {
		got := make(chan answer, 1)
		go func() {
			raw, _ := json.Marshal(frontCompletion(true, "fault:"+string(disaggtest.FaultGenSlow)))
			resp, err := http.Post(url+"/v1/completions", "application/json", bytes.NewReader(raw))
			if err != nil {
				got <- answer{err: err}
				return
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			got <- answer{resp.StatusCode, b, err}
		}()
		return got
	}

	f := startFront(t, []string{c.Addr}, []string{g.Addr}, "", "--drain-timeout", "30s")
	got := slowStream(f.URL)
	within(t, 5*time.Second, "the stream to start", func() bool { return g.Stats().Streamed == 1 })
	if err := f.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	a := <-got
	if a.err != nil || a.status != 200 || !strings.HasSuffix(strings.TrimSpace(string(a.body)), "data: [DONE]") {
		t.Fatalf("the request in flight at SIGTERM: %v %d %.300s", a.err, a.status, a.body)
	}
	if n := strings.Count(string(a.body), "data: {"); n != 200 {
		t.Fatalf("the drained stream carried %d chunks, want all 200", n)
	}
	select {
	case <-f.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the front did not exit after draining")
	}
	if f.err != nil {
		t.Fatalf("the drained front exited with %v\n%s", f.err, f.log.String())
	}
	for _, want := range []string{"draining the disaggregated front", "requests_in_flight=1", "drained the disaggregated front", "requests_finished=1"} {
		if !strings.Contains(f.log.String(), want) {
			t.Fatalf("the log lacks %q:\n%s", want, f.log.String())
		}
	}
	if st := g.Stats(); st.Cancelled != 0 {
		t.Fatalf("the generation server saw %d requests cancelled while the front drained", st.Cancelled)
	}

	// A drain timeout shorter than the stream: the front cuts it, says so and fails.
	short := startFront(t, []string{c.Addr}, []string{g.Addr}, "", "--drain-timeout", "300ms")
	got = slowStream(short.URL)
	within(t, 5*time.Second, "the second stream to start", func() bool { return g.Stats().Streamed == 2 })
	if err := short.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	a = <-got
	if a.err == nil && strings.HasSuffix(strings.TrimSpace(string(a.body)), "data: [DONE]") {
		t.Fatalf("a stream longer than the drain timeout ran to its end: %d chunks", strings.Count(string(a.body), "data: {"))
	}
	select {
	case <-short.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the front did not exit after its drain timeout")
	}
	var ee *exec.ExitError
	if !errors.As(short.err, &ee) || ee.ExitCode() != cmdutil.ExitInterrupted {
		t.Fatalf("a front that cut a request exited with %v, want exit %d\n%s", short.err, cmdutil.ExitInterrupted, short.log.String())
	}
	for _, want := range []string{"drain timed out; closed the remaining connections", "requests_cut=1", "1 of 1 requests still in flight after 300ms"} {
		if !strings.Contains(short.log.String(), want) {
			t.Fatalf("the log lacks %q:\n%s", want, short.log.String())
		}
	}
	within(t, 5*time.Second, "the cut stream cancelled upstream", func() bool { return g.Stats().Cancelled == 1 })
}

// A generation server that refuses connections for a moment gets the re-send: the front backs
// off (with jitter, 50-100ms before the first re-send, doubling) instead of landing every try
// on the closed port at once, so a server that comes back after the first refusal serves the
// leg, under the context leg's disagg_request_id. With the port closed for good, every try is
// refused after waits that add up to at least the backoff's lower bounds, and the client gets
// 502.
func TestDisaggFrontResendBacksOff(t *testing.T) {
	c := disaggtest.StartContext(t)
	dead := disaggtest.DeadAddr(t)
	f := startFront(t, []string{c.Addr}, []string{dead}, "max_retries: 3\n")
	const refused = `kvctl_disagg_retries_total{cause="connect",leg="generation"}`
	restarted := make(chan *disaggtest.Server, 1)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
			resp, err := http.Get(f.URL + "/metrics")
			if err != nil {
				continue
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if strings.Contains(string(b), refused+" 1") {
				restarted <- disaggtest.StartGenerationAt(t, dead)
				return
			}
		}
	}()
	r := frontPost(t, f.URL+"/v1/completions", frontCompletion(false, "r"))
	if r.Status != http.StatusOK {
		t.Fatalf("status %d: %s\n%s", r.Status, r.Body, f.log.String())
	}
	var g *disaggtest.Server
	select {
	case g = <-restarted:
	default:
		t.Fatal("the request was answered before the generation server came back")
	}
	st := g.Stats()
	if st.Served != 1 || len(st.IDs) != 1 {
		t.Fatalf("the restarted server served %d legs (ids %v), want the re-sent one", st.Served, st.IDs)
	}
	for id := range st.IDs {
		if c.Stats().IDs[id] != 1 {
			t.Fatalf("the re-sent leg carried id %d, not the context leg's %v", id, c.Stats().IDs)
		}
	}
	if !strings.Contains(f.log.String(), "leg did not reach its server; re-sending it unchanged") {
		t.Fatalf("the re-send was not logged:\n%s", f.log.String())
	}

	// Closed for good: 1 try and 3 re-sends, after waits of at least 50+100+200ms.
	gone := startFront(t, []string{c.Addr}, []string{disaggtest.DeadAddr(t)}, "max_retries: 3\n")
	start := time.Now()
	r = frontPost(t, gone.URL+"/v1/completions", frontCompletion(false, "r"))
	took := time.Since(start)
	if r.Status != http.StatusBadGateway {
		t.Fatalf("every try refused: status %d: %s", r.Status, r.Body)
	}
	if n := frontMetric(t, gone.URL, refused); n != 3 {
		t.Fatalf("%v re-sends, want 3", n)
	}
	if took < 350*time.Millisecond {
		t.Fatalf("4 refused tries took %s: the re-sends did not back off", took)
	}
}

// Every generation leg gets the first-token timeout: a non-streamed request's leg is streamed
// upstream, so a generation server that never sends its first chunk (the KV never arrives)
// costs the client kv_transfer_timeout_ms, not request_timeout_s: it gets 504 with a
// timeout_error, and the generation server sees the request cancelled. A leg that answers is
// put back together into the non-streamed answer.
func TestDisaggFrontNonStreamedLegGetsTheFirstTokenTimeout(t *testing.T) {
	c := disaggtest.StartContext(t)
	g := disaggtest.StartGeneration(t)
	f := startFront(t, []string{c.Addr}, []string{g.Addr}, "kv_transfer_timeout_ms: 300\nrequest_timeout_s: 600\n")
	start := time.Now()
	r := frontPost(t, f.URL+"/v1/completions", frontCompletion(false, "fault:"+string(disaggtest.FaultGenStall)))
	took := time.Since(start)
	if r.Status != http.StatusGatewayTimeout {
		t.Fatalf("status %d: %s", r.Status, r.Body)
	}
	var e struct {
		Error struct {
			Message string `json:"message"`
			Type    string `json:"type"`
		} `json:"error"`
	}
	if err := json.Unmarshal(r.Body, &e); err != nil || e.Error.Type != "timeout_error" || !strings.Contains(e.Error.Message, "kv_transfer_timeout_ms") {
		t.Fatalf("error response %s", r.Body)
	}
	// Far below request_timeout_s (600s): the first-token timeout answered.
	if took > time.Minute {
		t.Fatalf("the timeout took %s", took)
	}
	within(t, 5*time.Second, "upstream cancellation", func() bool { return g.Stats().Cancelled == 1 })
	if st := g.Stats(); st.Streamed != 1 || st.Requests != 1 {
		t.Fatalf("the generation server saw %d requests, %d streamed; want the one leg, streamed", st.Requests, st.Streamed)
	}

	r = frontPost(t, f.URL+"/v1/completions", frontCompletion(false, "ok"))
	var v struct {
		Object  string `json:"object"`
		Choices []struct {
			Text         string `json:"text"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(r.Body, &v); err != nil || r.Status != 200 || v.Object != "text_completion" || len(v.Choices) != 1 ||
		v.Choices[0].Text != "tok tok tok " || v.Choices[0].FinishReason != "length" {
		t.Fatalf("the rebuilt answer: %d %s", r.Status, r.Body)
	}
	if st := g.Stats(); st.Streamed != 2 {
		t.Fatalf("the answered leg was not streamed upstream: %d streams", st.Streamed)
	}
}

// A context leg re-sent after a failure goes to another context server when there is one.
func TestDisaggFrontContextResendGoesToAnotherServer(t *testing.T) {
	live := disaggtest.StartContext(t)
	g := disaggtest.StartGeneration(t)
	f := startFront(t, []string{disaggtest.DeadAddr(t), live.Addr}, []string{g.Addr}, "")
	for i := range 4 {
		if r := frontPost(t, f.URL+"/v1/completions", frontCompletion(false, "r")); r.Status != http.StatusOK {
			t.Fatalf("request %d: status %d: %s", i, r.Status, r.Body)
		}
	}
	// Every request is answered by the live server; those that tried the dead one first were
	// re-sent to the live one.
	if n := live.Stats().Served; n != 4 {
		t.Fatalf("the live context server served %d, want 4", n)
	}
	if n := frontMetric(t, f.URL, `kvctl_disagg_retries_total{cause="context_transport",leg="context"}`); n < 1 {
		t.Fatalf("no context re-send counted (%v)", n)
	}
}

// /v1/responses through the front: a stream that fails before its first chunk keeps its 200
// and carries an error event; the same request not streamed is an HTTP error.
func TestDisaggFrontResponsesStreamError(t *testing.T) {
	c := disaggtest.StartContext(t)
	g := disaggtest.StartGeneration(t)
	g.Responses = true
	f := startFront(t, []string{c.Addr}, []string{g.Addr}, "")
	req := func(stream bool, user string) map[string]any {
		return map[string]any{"model": "scripted-model", "input": "hi", "stream": stream, "user": user}
	}
	if r := frontPost(t, f.URL+"/v1/responses", req(true, "ok")); r.Status != 200 || !strings.Contains(string(r.Body), "event: response.completed") {
		t.Fatalf("stream: %d %s", r.Status, r.Body)
	}
	r := frontPost(t, f.URL+"/v1/responses", req(true, "fault:"+string(disaggtest.FaultGenStatus)))
	if r.Status != 200 || !strings.HasPrefix(r.Header.Get("Content-Type"), "text/event-stream") || !strings.HasPrefix(string(r.Body), "event: error\ndata: ") {
		t.Fatalf("a failed stream: %d %q %s", r.Status, r.Header.Get("Content-Type"), r.Body)
	}
	var ev struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	}
	data, _, _ := strings.Cut(strings.TrimPrefix(string(r.Body), "event: error\ndata: "), "\n")
	if err := json.Unmarshal([]byte(data), &ev); err != nil || ev.Type != "error" || !strings.Contains(ev.Message, "generation server") {
		t.Fatalf("the error event: %s", r.Body)
	}
	if r := frontPost(t, f.URL+"/v1/responses", req(false, "fault:"+string(disaggtest.FaultGenStatus))); r.Status != http.StatusServiceUnavailable {
		t.Fatalf("not streamed: %d %s", r.Status, r.Body)
	}
}

// Seed commit 19 through the front: a request the user cancelled is left to the cancel path.
// A client that goes away while its generation leg waits for its first chunk cancels the
// upstream request and is counted as a disconnect, never as a timeout; a later request whose KV
// never arrives is the only timeout, answered 504 with its upstream request cancelled too.
func TestDisaggFrontUserCancelIsLeftToTheCancelPath(t *testing.T) {
	c := disaggtest.StartContext(t)
	g := disaggtest.StartGeneration(t)
	f := startFront(t, []string{c.Addr}, []string{g.Addr}, "kv_transfer_timeout_ms: 300\nrequest_timeout_s: 600\n")
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, f.URL+"/v1/completions",
		strings.NewReader(`{"prompt":"p","max_tokens":3,"stream":true,"user":"fault:`+string(disaggtest.FaultGenStall)+`"}`))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		done <- err
	}()
	within(t, 5*time.Second, "the generation leg", func() bool { return g.Stats().Requests == 1 })
	cancel()
	if err := <-done; err == nil {
		t.Fatal("the cancelled client got an answer")
	}
	within(t, 5*time.Second, "upstream cancellation", func() bool { return g.Stats().Cancelled == 1 })
	const disconnects = `kvctl_disagg_client_disconnects_total{endpoint="/v1/completions"}`
	within(t, 5*time.Second, "the disconnect", func() bool { return frontMetric(t, f.URL, disconnects) == 1 })

	r := frontPost(t, f.URL+"/v1/completions", frontCompletion(true, "fault:"+string(disaggtest.FaultGenStall)))
	if r.Status != http.StatusGatewayTimeout {
		t.Fatalf("status %d: %s", r.Status, r.Body)
	}
	within(t, 5*time.Second, "the timed-out leg cancelled upstream", func() bool { return g.Stats().Cancelled == 2 })
	if n := frontMetric(t, f.URL, `kvctl_disagg_timeouts_total{kind="kv_transfer",leg="generation"}`); n != 1 {
		t.Fatalf("kv_transfer timeouts %v, want only the second request's", n)
	}
	if n := frontMetric(t, f.URL, disconnects); n != 1 {
		t.Fatalf("disconnects %v, want 1", n)
	}
}
