package disaggtest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// Fault names a scripted failure (see the package doc).
type Fault string

// The faults a request can ask for.
const (
	FaultNone Fault = ""
	// FaultCtx5xxOnce: the context server answers 503 the first time it sees the request's user.
	FaultCtx5xxOnce Fault = "ctx_5xx_once"
	// FaultCtx4xx: the context server refuses the request with 400 and a message.
	FaultCtx4xx Fault = "ctx_4xx"
	// FaultCtxNoParams: the context server answers without disaggregated_params.
	FaultCtxNoParams Fault = "ctx_no_params"
	// FaultCtxSlow: the context server takes 500ms to answer (its prefill holds the server).
	FaultCtxSlow Fault = "ctx_slow"
	// FaultCtxStall: the context server takes 3s to answer.
	FaultCtxStall Fault = "ctx_stall"
	// FaultCtxFinished: the context server finishes the request itself (finish_reason stop).
	FaultCtxFinished Fault = "ctx_finished"
	// FaultGenResetWrite: the generation server resets the connection while the request is still
	// being written, the first time it sees a disagg_request_id.
	FaultGenResetWrite Fault = "gen_reset_write"
	// FaultGenStatus: the generation server answers 503 with a JSON error body.
	FaultGenStatus Fault = "gen_status"
	// FaultGenBadRequest: the generation server answers 400 with a JSON error body.
	FaultGenBadRequest Fault = "gen_bad_request"
	// FaultGenCutBeforeFirst: 200 headers, then the connection closes before any chunk.
	FaultGenCutBeforeFirst Fault = "gen_cut_before_first"
	// FaultGenErrorEventFirst: a stream whose first event is an error object (the KV never came).
	FaultGenErrorEventFirst Fault = "gen_error_event_first"
	// FaultGenCutAfterFirst: one chunk, then the connection closes.
	FaultGenCutAfterFirst Fault = "gen_cut_after_first"
	// FaultGenStall: headers and nothing else until the request is cancelled (KV never arrives).
	FaultGenStall Fault = "gen_stall"
	// FaultGenSlow: chunks every 20ms, 200 of them, for tests that disconnect mid-stream.
	FaultGenSlow Fault = "gen_slow"
)

// FaultOf reads the fault a "user" field names.
func FaultOf(user string) Fault {
	_, rest, ok := strings.Cut(user, "fault:")
	if !ok {
		return FaultNone
	}
	name, _, _ := strings.Cut(rest, " ")
	return Fault(name)
}

// Stats counts what a scripted server saw.
type Stats struct {
	Requests  int
	Served    int
	Rejected  int // protocol errors the server answered 400 for
	Resets    int
	Cancelled int // requests whose context ended before the server finished them
	// Streamed counts generation requests that asked for a stream.
	Streamed int
	// IDs counts the disagg_request_ids the server answered 200 for.
	IDs map[int64]int
	// ResetIDs lists the ids it reset.
	ResetIDs []int64
	// LastProtocolError is the last protocol violation it refused.
	LastProtocolError string
}

// Server is one scripted context or generation server.
type Server struct {
	Addr string // host:port
	Role string // "context" or "generation"
	// Messages makes a generation server serve /v1/messages.
	Messages bool
	// TokensOut is how many tokens a generation answer has (default 4).
	TokensOut int
	// Responses makes a generation server serve /v1/responses.
	Responses bool
	// Unhealthy makes /health answer 503.
	Unhealthy atomic.Bool

	srv *http.Server
	ln  net.Listener

	mu      sync.Mutex
	stats   Stats
	ctxSeen map[string]int
}

// StartContext starts a scripted context server on a free loopback port; t.Cleanup stops it.
func StartContext(t testing.TB) *Server { return start(t, "context") }

// StartGeneration starts a scripted generation server on a free loopback port; t.Cleanup
// stops it. Its sockets have a 4 KiB receive buffer, so that a large request is still being
// written when FaultGenResetWrite resets it.
func StartGeneration(t testing.TB) *Server { return start(t, "generation") }

// StartGenerationAt starts a scripted generation server on addr (a server restarting on its
// old port); t.Cleanup stops it.
func StartGenerationAt(t testing.TB, addr string) *Server { return startAt(t, "generation", addr) }

func start(t testing.TB, role string) *Server { return startAt(t, role, "127.0.0.1:0") }

func startAt(t testing.TB, role, addr string) *Server {
	t.Helper()
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			if role == "generation" {
				serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
			}
		})
		if err != nil {
			return err
		}
		return serr
	}}
	ln, err := lc.Listen(context.Background(), "tcp", addr)
	if err != nil {
		t.Fatalf("scripted %s server: %v", role, err)
	}
	s := &Server{Addr: ln.Addr().String(), Role: role, ln: ln, TokensOut: 4,
		ctxSeen: map[string]int{}}
	s.stats.IDs = map[int64]int{}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"object":"list","data":[{"id":"scripted-model","object":"model","created":0,"owned_by":"kvctl"}]}`)
	})
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {
		if s.Unhealthy.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	if role == "context" {
		mux.HandleFunc("POST /v1/completions", s.context)
		mux.HandleFunc("POST /v1/chat/completions", s.context)
	} else {
		mux.HandleFunc("POST /v1/completions", s.generation)
		mux.HandleFunc("POST /v1/chat/completions", s.generation)
		mux.HandleFunc("POST /v1/messages", s.messages)
		mux.HandleFunc("POST /v1/responses", s.responses)
	}
	s.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = s.srv.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if s.srv.Shutdown(ctx) != nil {
			_ = s.srv.Close()
		}
	})
	return s
}

// Stats returns a copy of the server's counters.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.stats
	c.IDs = make(map[int64]int, len(s.stats.IDs))
	for k, v := range s.stats.IDs {
		c.IDs[k] = v
	}
	c.ResetIDs = append([]int64(nil), s.stats.ResetIDs...)
	return c
}

// DeadAddr returns a loopback host:port on which nothing listens: connecting is refused.
func DeadAddr(t testing.TB) string {
	t.Helper()
	var lc net.ListenConfig
	ln, err := lc.Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

type disaggParams struct {
	RequestType        string  `json:"request_type"`
	FirstGenTokens     []int64 `json:"first_gen_tokens,omitempty"`
	CtxRequestID       *int64  `json:"ctx_request_id,omitempty"`
	EncodedOpaqueState *string `json:"encoded_opaque_state,omitempty"`
	DraftTokens        []int64 `json:"draft_tokens"`
	DisaggRequestID    *int64  `json:"disagg_request_id,omitempty"`
	ConversationID     string  `json:"conversation_id,omitempty"`
}

type request struct {
	Model          string            `json:"model"`
	Prompt         json.RawMessage   `json:"prompt"`
	Messages       []json.RawMessage `json:"messages"`
	PromptTokenIDs []int64           `json:"prompt_token_ids"`
	MaxTokens      *int              `json:"max_tokens"`
	Stream         bool              `json:"stream"`
	StreamOptions  json.RawMessage   `json:"stream_options"`
	User           string            `json:"user"`
	Disagg         *disaggParams     `json:"disaggregated_params"`
}

func (s *Server) reject(w http.ResponseWriter, msg string) {
	s.mu.Lock()
	s.stats.Rejected++
	s.stats.LastProtocolError = msg
	s.mu.Unlock()
	writeJSONError(w, http.StatusBadRequest, "protocol error: "+msg)
}

func writeJSONError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"object": "error", "message": msg, "type": "BadRequestError", "param": nil, "code": status})
}

// tokenize turns a prompt into token ids: one per byte of a text prompt, or the ids given.
func tokenize(r *request) []int64 {
	var s string
	if json.Unmarshal(r.Prompt, &s) == nil {
		return textIDs(s)
	}
	var ids []int64
	if json.Unmarshal(r.Prompt, &ids) == nil {
		return ids
	}
	var all bytes.Buffer
	for _, m := range r.Messages {
		all.Write(m)
	}
	return textIDs(all.String())
}

func textIDs(s string) []int64 {
	n := min(len(s), 1<<16)
	out := make([]int64, n)
	for i := range n {
		out[i] = int64(s[i])
	}
	return out
}

func (s *Server) context(w http.ResponseWriter, r *http.Request) {
	var req request
	s.mu.Lock()
	s.stats.Requests++
	s.mu.Unlock()
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		s.reject(w, "body: "+err.Error())
		return
	}
	switch {
	case req.Disagg == nil:
		s.reject(w, "a context leg needs disaggregated_params")
		return
	case req.Disagg.RequestType != "context_only":
		s.reject(w, fmt.Sprintf("request_type %q, want context_only", req.Disagg.RequestType))
		return
	case req.Disagg.DisaggRequestID == nil || *req.Disagg.DisaggRequestID <= 0:
		s.reject(w, "a context leg needs a positive disagg_request_id")
		return
	case req.Stream:
		s.reject(w, "a context leg must not stream")
		return
	case len(req.StreamOptions) > 0 && string(req.StreamOptions) != "null":
		s.reject(w, "a context leg must not carry stream_options")
		return
	}
	fault := FaultOf(req.User)
	switch fault {
	case FaultCtx5xxOnce:
		s.mu.Lock()
		s.ctxSeen[req.User]++
		first := s.ctxSeen[req.User] == 1
		s.mu.Unlock()
		if first {
			writeJSONError(w, http.StatusServiceUnavailable, "scripted: context server overloaded")
			return
		}
	case FaultCtx4xx:
		writeJSONError(w, http.StatusBadRequest, "scripted: the prompt is longer than max_seq_len")
		return
	case FaultCtxSlow, FaultCtxStall:
		d := 500 * time.Millisecond
		if fault == FaultCtxStall {
			d = 3 * time.Second
		}
		select {
		case <-time.After(d):
		case <-r.Context().Done():
			s.cancelled()
			return
		}
	}
	id := *req.Disagg.DisaggRequestID
	state := fmt.Sprintf("scripted-ctx:%s:%d:%s", s.Addr, id, fault)
	dp := disaggParams{RequestType: "context_only", FirstGenTokens: []int64{7}, CtxRequestID: &id,
		EncodedOpaqueState: &state, DisaggRequestID: &id}
	finish := "length"
	if fault == FaultCtxFinished {
		finish = "stop"
	}
	choice := map[string]any{"index": 0, "finish_reason": finish, "disaggregated_params": dp}
	if fault == FaultCtxNoParams {
		delete(choice, "disaggregated_params")
	}
	obj := "text_completion"
	if strings.HasSuffix(r.URL.Path, "/chat/completions") {
		obj = "chat.completion"
		choice["message"] = map[string]any{"role": "assistant", "content": "A"}
	} else {
		choice["text"] = "A"
	}
	ids := tokenize(&req)
	resp := map[string]any{"id": fmt.Sprintf("cmpl-%d", id), "object": obj, "created": 0, "model": req.Model,
		"choices": []any{choice}, "prompt_token_ids": ids,
		"usage": map[string]int{"prompt_tokens": len(ids), "completion_tokens": 1, "total_tokens": len(ids) + 1}}
	s.mu.Lock()
	s.stats.Served++
	s.stats.IDs[id]++
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(resp)
}

// stateFault reads the fault the context server put into encoded_opaque_state, and checks the
// state names the id.
func stateFault(dp *disaggParams) (Fault, error) {
	if dp.EncodedOpaqueState == nil {
		return "", fmt.Errorf("no encoded_opaque_state")
	}
	parts := strings.Split(*dp.EncodedOpaqueState, ":")
	if len(parts) != 5 || parts[0] != "scripted-ctx" {
		return "", fmt.Errorf("encoded_opaque_state %q is not a scripted context server's", *dp.EncodedOpaqueState)
	}
	if id, err := strconv.ParseInt(parts[3], 10, 64); err != nil || dp.CtxRequestID == nil || id != *dp.CtxRequestID {
		return "", fmt.Errorf("encoded_opaque_state names id %s, ctx_request_id is %v", parts[3], dp.CtxRequestID)
	}
	return Fault(parts[4]), nil
}

func (s *Server) generation(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.stats.Requests++
	s.mu.Unlock()
	// Read the head of the body first: a reset must come while the rest is still in flight.
	head := make([]byte, 4096)
	n, _ := io.ReadFull(r.Body, head)
	head = head[:n]
	if bytes.Contains(head, []byte(":"+string(FaultGenResetWrite))) {
		if id, ok := headID(head); ok && s.firstReset(id) {
			s.reset(w)
			return
		}
	}
	var req request
	if err := json.NewDecoder(io.MultiReader(bytes.NewReader(head), r.Body)).Decode(&req); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) || r.Context().Err() != nil {
			s.cancelled() // the proxy gave up while the body was on its way
			return
		}
		s.reject(w, "body: "+err.Error())
		return
	}
	dp := req.Disagg
	switch {
	case dp == nil:
		s.reject(w, "a generation leg needs disaggregated_params")
		return
	case dp.RequestType != "generation_only":
		s.reject(w, fmt.Sprintf("request_type %q, want generation_only", dp.RequestType))
		return
	case dp.DisaggRequestID == nil || dp.CtxRequestID == nil || *dp.DisaggRequestID != *dp.CtxRequestID:
		s.reject(w, fmt.Sprintf("disagg_request_id %v is not the context leg's id %v", dp.DisaggRequestID, dp.CtxRequestID))
		return
	case len(dp.FirstGenTokens) == 0:
		s.reject(w, "no first_gen_tokens")
		return
	}
	fault, err := stateFault(dp)
	if err != nil {
		s.reject(w, err.Error())
		return
	}
	var ids []int64
	if strings.HasSuffix(r.URL.Path, "/chat/completions") {
		ids = req.PromptTokenIDs
	} else if json.Unmarshal(req.Prompt, &ids) != nil {
		ids = nil
	}
	if len(ids) == 0 {
		s.reject(w, "the prompt is not the context server's token ids")
		return
	}
	if req.Stream {
		s.mu.Lock()
		s.stats.Streamed++
		s.mu.Unlock()
	}
	s.answer(w, r, &req, fault, *dp.DisaggRequestID, strings.HasSuffix(r.URL.Path, "/chat/completions"))
}

func headID(head []byte) (int64, bool) {
	_, rest, ok := bytes.Cut(head, []byte(`"disagg_request_id":`))
	if !ok {
		return 0, false
	}
	end := bytes.IndexFunc(rest, func(r rune) bool { return r < '0' || r > '9' })
	if end <= 0 {
		return 0, false
	}
	id, err := strconv.ParseInt(string(rest[:end]), 10, 64)
	return id, err == nil
}

// resetIDs are the ids any generation server of this process has reset: a request is reset
// once, whichever server its retry reaches.
var resetIDs sync.Map

func (s *Server) firstReset(id int64) bool {
	if _, seen := resetIDs.LoadOrStore(id, true); seen {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stats.Resets++
	s.stats.ResetIDs = append(s.stats.ResetIDs, id)
	return true
}

// reset closes the connection with RST (linger 0) while the client is still writing.
func (s *Server) reset(w http.ResponseWriter) {
	hj, ok := w.(http.Hijacker)
	if !ok {
		return
	}
	conn, _, err := hj.Hijack()
	if err != nil {
		return
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = conn.Close()
}

func (s *Server) cancelled() {
	s.mu.Lock()
	s.stats.Cancelled++
	s.mu.Unlock()
}

func (s *Server) served(id int64) {
	s.mu.Lock()
	s.stats.Served++
	if id != 0 {
		s.stats.IDs[id]++
	}
	s.mu.Unlock()
}

func (s *Server) answer(w http.ResponseWriter, r *http.Request, req *request, fault Fault, id int64, chat bool) {
	switch fault {
	case FaultGenStatus:
		writeJSONError(w, http.StatusServiceUnavailable, "scripted: KV cache transfer failed for request "+strconv.FormatInt(id, 10))
		return
	case FaultGenBadRequest:
		writeJSONError(w, http.StatusBadRequest, "scripted: max_tokens exceeds the remaining sequence length")
		return
	}
	n := s.TokensOut
	if req.MaxTokens != nil && *req.MaxTokens > 0 {
		n = min(*req.MaxTokens, 4096)
	}
	if fault == FaultGenSlow {
		n = 200
	}
	if !req.Stream {
		if fault == FaultGenCutBeforeFirst || fault == FaultGenStall {
			s.cut(w, r, fault)
			return
		}
		text := strings.Repeat("tok ", n)
		choice := map[string]any{"index": 0, "finish_reason": "length"}
		obj := "text_completion"
		if chat {
			obj = "chat.completion"
			choice["message"] = map[string]any{"role": "assistant", "content": text}
		} else {
			choice["text"] = text
		}
		s.served(id)
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"id": fmt.Sprintf("cmpl-%d", id), "object": obj, "created": 0,
			"model": req.Model, "choices": []any{choice},
			"usage": map[string]int{"prompt_tokens": 1, "completion_tokens": n, "total_tokens": n + 1}})
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	_ = rc.Flush()
	switch fault {
	case FaultGenCutBeforeFirst, FaultGenStall:
		s.cut(w, r, fault)
		return
	case FaultGenErrorEventFirst:
		_, _ = fmt.Fprintf(w, "data: %s\n\n", `{"error":{"message":"scripted: KV cache transfer failed","type":"InternalServerError","code":500}}`)
		_ = rc.Flush()
		return
	}
	for i := range n {
		if i > 0 && fault == FaultGenSlow {
			select {
			case <-time.After(20 * time.Millisecond):
			case <-r.Context().Done():
				s.cancelled()
				return
			}
		}
		var chunk map[string]any
		var finish any
		if i == n-1 {
			finish = "length"
		}
		if chat {
			delta := map[string]any{"content": "tok "}
			if i == 0 {
				delta["role"] = "assistant"
			}
			chunk = map[string]any{"id": fmt.Sprintf("chatcmpl-%d", id), "object": "chat.completion.chunk", "created": 0,
				"model": req.Model, "choices": []any{map[string]any{"index": 0, "delta": delta, "finish_reason": finish}}}
		} else {
			chunk = map[string]any{"id": fmt.Sprintf("cmpl-%d", id), "object": "text_completion", "created": 0,
				"model": req.Model, "choices": []any{map[string]any{"index": 0, "text": "tok ", "finish_reason": finish}}}
		}
		raw, _ := json.Marshal(chunk)
		if _, err := fmt.Fprintf(w, "data: %s\n\n", raw); err != nil {
			s.cancelled()
			return
		}
		_ = rc.Flush()
		if fault == FaultGenCutAfterFirst {
			s.cut(w, r, FaultGenCutBeforeFirst)
			return
		}
	}
	if bytes.Contains(req.StreamOptions, []byte(`"include_usage":true`)) {
		obj := "text_completion"
		if chat {
			obj = "chat.completion.chunk"
		}
		raw, _ := json.Marshal(map[string]any{"id": fmt.Sprintf("cmpl-%d", id), "object": obj, "created": 0, "model": req.Model,
			"choices": []any{}, "usage": map[string]int{"prompt_tokens": 1, "completion_tokens": n, "total_tokens": n + 1}})
		_, _ = fmt.Fprintf(w, "data: %s\n\n", raw)
	}
	// Counted before the last event, so that a client that has its answer sees it counted.
	s.served(id)
	_, _ = io.WriteString(w, "data: [DONE]\n\n")
	_ = rc.Flush()
}

// cut ends the answer without a chunk: at once (closing the connection), or, for
// FaultGenStall, once the request is cancelled.
func (s *Server) cut(w http.ResponseWriter, r *http.Request, fault Fault) {
	if fault == FaultGenStall {
		select {
		case <-r.Context().Done():
			s.cancelled()
		case <-time.After(time.Minute):
		}
		return
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		panic(http.ErrAbortHandler)
	}
	if conn, buf, err := hj.Hijack(); err == nil {
		_ = buf.Flush()
		_ = conn.Close()
	}
}

// messages serves /v1/messages (Anthropic) when enabled.
func (s *Server) messages(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.stats.Requests++
	s.mu.Unlock()
	if !s.Messages {
		http.NotFound(w, r)
		return
	}
	var req request
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		s.reject(w, "body: "+err.Error())
		return
	}
	fault := FaultOf(req.User)
	if fault == FaultGenStatus {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, `{"type":"error","error":{"type":"overloaded_error","message":"scripted: overloaded"}}`)
		return
	}
	if !req.Stream {
		s.served(0)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"msg_1","type":"message","role":"assistant","model":"scripted-model","content":[{"type":"text","text":"tok tok"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":1,"output_tokens":2}}`)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	_ = rc.Flush()
	if fault == FaultGenCutBeforeFirst {
		s.cut(w, r, fault)
		return
	}
	for _, ev := range []string{
		`event: message_start` + "\n" + `data: {"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"scripted-model","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":1,"output_tokens":0}}}`,
		`event: content_block_start` + "\n" + `data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`,
		`event: content_block_delta` + "\n" + `data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"tok tok"}}`,
		`event: content_block_stop` + "\n" + `data: {"type":"content_block_stop","index":0}`,
		`event: message_delta` + "\n" + `data: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":2}}`,
		`event: message_stop` + "\n" + `data: {"type":"message_stop"}`,
	} {
		_, _ = io.WriteString(w, ev+"\n\n")
		_ = rc.Flush()
	}
	s.served(0)
}

// responses serves /v1/responses (OpenAI Responses) when enabled: a stream of response events,
// or, for FaultGenStatus, a 503 before any event.
func (s *Server) responses(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.stats.Requests++
	s.mu.Unlock()
	if !s.Responses {
		http.NotFound(w, r)
		return
	}
	var req struct {
		Stream bool   `json:"stream"`
		User   string `json:"user"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		s.reject(w, "body: "+err.Error())
		return
	}
	fault := FaultOf(req.User)
	if fault == FaultGenStatus {
		writeJSONError(w, http.StatusServiceUnavailable, "scripted: overloaded")
		return
	}
	const done = `{"id":"resp_1","object":"response","status":"completed","output":[{"type":"message","role":"assistant","content":[{"type":"output_text","text":"tok tok"}]}]}`
	if !req.Stream {
		s.served(0)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, done)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	_ = rc.Flush()
	if fault == FaultGenCutBeforeFirst || fault == FaultGenStall {
		s.cut(w, r, fault)
		return
	}
	for _, ev := range []string{
		"event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0}",
		"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"tok tok\",\"sequence_number\":1}",
		"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":" + done + ",\"sequence_number\":2}",
	} {
		_, _ = io.WriteString(w, ev+"\n\n")
		_ = rc.Flush()
	}
	s.served(0)
}

// Transport returns an HTTP transport for a proxy under test whose sockets have a 16 KiB send
// buffer, so that a request of a few hundred KiB is still being written when a scripted server
// resets it. refuse, when not nil, is asked before every request; when it says so, the request
// goes out on a fresh connection to a loopback port nothing listens on (deadAddr), and its dial
// is refused there.
func Transport(refuse func(req *http.Request) bool, deadAddr string) http.RoundTripper {
	d := &net.Dialer{Timeout: 5 * time.Second, Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUF, 16<<10)
		})
		if err != nil {
			return err
		}
		return serr
	}}
	live := &http.Transport{DialContext: d.DialContext, MaxIdleConnsPerHost: 256, DisableCompression: true}
	if refuse == nil {
		return live
	}
	dead := &http.Transport{DisableKeepAlives: true, DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return d.DialContext(ctx, network, deadAddr)
	}}
	return refusing{live: live, dead: dead, refuse: refuse}
}

type refusing struct {
	live, dead http.RoundTripper
	refuse     func(*http.Request) bool
}

func (r refusing) RoundTrip(req *http.Request) (*http.Response, error) {
	if r.refuse(req) {
		return r.dead.RoundTrip(req)
	}
	return r.live.RoundTrip(req)
}
