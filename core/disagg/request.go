package disagg

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"
)

var (
	errKVTimeout      = errors.New("kv transfer timeout")
	errRequestTimeout = errors.New("request timeout")
	errClientGone     = errors.New("the client went away")
)

// body is a client request as a JSON object whose fields the proxy relays untouched.
type body map[string]json.RawMessage

func (b body) clone() body {
	c := make(body, len(b)+2)
	for k, v := range b {
		c[k] = v
	}
	return c
}

func (b body) bool(key string) bool {
	var v bool
	return json.Unmarshal(b[key], &v) == nil && v
}

func mustJSON(v any) json.RawMessage {
	raw, err := json.Marshal(v)
	if err != nil {
		panic(err) // only called on values that always marshal
	}
	return raw
}

// readRequest reads and checks a client's JSON object, bounded by max_request_bytes and
// body_read_timeout_s. The body's bytes count against max_inflight_bytes until release is
// called (always non-nil).
func (p *Proxy) readRequest(w http.ResponseWriter, r *http.Request) (b body, release func(), lerr *LegError) {
	release = func() {}
	// A body of unknown length may be as large as max_request_bytes: hold that much while it is
	// read, then only what it was.
	held := p.maxBody
	if r.ContentLength >= 0 && r.ContentLength < held {
		held = r.ContentLength
	}
	if err := p.adm.hold(held); err != nil {
		p.m.overloaded.WithLabelValues(RefusedBytes).Inc()
		return nil, release, &LegError{Status: http.StatusTooManyRequests, Message: err.Error(), Err: ErrBadRequest}
	}
	release = func() { p.adm.release(held) }
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Now().Add(p.bodyTimeout))
	raw, err := readBounded(http.MaxBytesReader(w, r.Body, p.maxBody), p.maxBody)
	// The deadline covers the body only: a stream's answer may take far longer, and the server
	// watches the connection for the client going away meanwhile.
	_ = rc.SetReadDeadline(time.Time{})
	if err != nil {
		var mbe *http.MaxBytesError
		var ne net.Error
		switch {
		case errors.As(err, &mbe) || errors.Is(err, errTooLarge):
			return nil, release, &LegError{Status: http.StatusRequestEntityTooLarge, Message: fmt.Sprintf("the request body is larger than %d bytes", p.maxBody), Err: ErrBadRequest}
		case errors.As(err, &ne) && ne.Timeout():
			p.m.overloaded.WithLabelValues(RefusedBodyTimeout).Inc()
			w.Header().Set("Connection", "close")
			return nil, release, &LegError{Status: http.StatusRequestTimeout, Message: fmt.Sprintf("the request body did not arrive within body_read_timeout_s (%s)", p.bodyTimeout), Err: ErrBadRequest}
		}
		return nil, release, &LegError{Status: http.StatusBadRequest, Message: "reading the request body: " + err.Error(), Err: ErrBadRequest}
	}
	if n := int64(len(raw)); n < held {
		p.adm.release(held - n)
		held = n
	}
	if err := json.Unmarshal(raw, &b); err != nil || b == nil {
		msg := "the request body is not a JSON object"
		if err != nil {
			msg += ": " + err.Error()
		}
		return nil, release, &LegError{Status: http.StatusBadRequest, Message: msg, Err: ErrBadRequest}
	}
	if s, ok := b["stream"]; ok && !bytes.Equal(s, []byte("null")) {
		var v bool
		if json.Unmarshal(s, &v) != nil {
			return nil, release, &LegError{Status: http.StatusBadRequest, Message: "stream: want true or false", Err: ErrBadRequest}
		}
	}
	return b, release, nil
}

// tokenIDs reads raw as a prompt of token ids, bounded by max_prompt_tokens: the array is
// counted without decoding first, so an over-long prompt is refused before anything is built
// for it. isIDs is false when raw is not an array of integers.
func tokenIDs(raw []byte, maxTokens int) (ids []int64, isIDs bool, lerr *LegError) {
	n, ok := scanTokenIDs(raw, maxTokens)
	if !ok || n == 0 {
		return nil, false, nil
	}
	if n > maxTokens {
		return nil, true, &LegError{Status: http.StatusBadRequest, Err: ErrBadRequest,
			Message: fmt.Sprintf("the prompt has more than %d token ids (max_prompt_tokens)", maxTokens)}
	}
	ids = make([]int64, 0, n)
	if json.Unmarshal(raw, &ids) != nil {
		return nil, false, nil
	}
	return ids, true, nil
}

// routeInfoOf reads what routing needs and checks the prompt the way trtllm-serve's
// disaggregated front does: one prompt per request, a string or a list of token ids.
func routeInfoOf(ep string, b body, h http.Header, maxTokens int) (*routeInfo, *LegError) {
	ri := &routeInfo{}
	bad := func(msg string) *LegError {
		return &LegError{Status: http.StatusBadRequest, Message: msg, Err: ErrBadRequest}
	}
	switch ep {
	case EndpointCompletions:
		raw, ok := b["prompt"]
		if !ok {
			return nil, bad("prompt is required")
		}
		ids, isIDs, lerr := tokenIDs(raw, maxTokens)
		if lerr != nil {
			return nil, lerr
		}
		var list []json.RawMessage
		switch {
		case isIDs:
			ri.tokenIDs, ri.promptTokens = ids, len(ids)
		case isJSONString(raw):
			ri.promptTokens = textTokens(len(raw))
		case len(raw) > 0 && raw[0] == '[' && json.Unmarshal(raw, &list) == nil && len(list) == 1:
			if isJSONString(list[0]) {
				b["prompt"] = list[0]
				ri.promptTokens = textTokens(len(list[0]))
			} else if ids, isIDs, lerr := tokenIDs(list[0], maxTokens); lerr != nil {
				return nil, lerr
			} else if isIDs {
				b["prompt"] = list[0]
				ri.tokenIDs, ri.promptTokens = ids, len(ids)
			} else {
				return nil, bad("prompt: want a string or a list of token ids")
			}
		default:
			return nil, bad("the disaggregated server only supports a single string prompt or a list of token ids per request")
		}
	case EndpointChat:
		var msgs []json.RawMessage
		if json.Unmarshal(b["messages"], &msgs) != nil || len(msgs) == 0 {
			return nil, bad("messages: want a non-empty list")
		}
		ri.promptTokens = textTokens(len(b["messages"]))
		ids, isIDs, lerr := tokenIDs(b["prompt_token_ids"], maxTokens)
		if lerr != nil {
			return nil, lerr
		}
		if isIDs {
			ri.tokenIDs, ri.promptTokens = ids, len(ids)
		}
	}
	ri.conversationID = conversationID(b, h)
	return ri, nil
}

// isJSONString reports whether raw is a valid JSON string, without copying it.
func isJSONString(raw []byte) bool {
	return len(raw) >= 2 && raw[0] == '"' && json.Valid(raw)
}

// textTokens estimates a text prompt's tokens at four bytes each.
func textTokens(n int) int { return max(n/4, 1) }

func conversationID(b body, h http.Header) string {
	var v struct {
		ConversationID string `json:"conversation_id"`
	}
	for _, k := range []string{"conversation_params", "disaggregated_params"} {
		if json.Unmarshal(b[k], &v) == nil && v.ConversationID != "" {
			return v.ConversationID
		}
	}
	for _, k := range []string{"X-Conversation-Id", "X-Correlation-Id"} {
		if s := h.Get(k); s != "" && len(s) <= 256 {
			return s
		}
	}
	return ""
}

// serveDisagg runs one completion or chat request as a context leg and a generation leg.
func (p *Proxy) serveDisagg(w http.ResponseWriter, r *http.Request, ep string) {
	leave, ok := p.admit(w, r, ep, false)
	if !ok {
		p.m.requests.WithLabelValues(ep, "false").Inc()
		return
	}
	defer leave()
	b, release, lerr := p.readRequest(w, r)
	defer release()
	if lerr != nil {
		p.m.requests.WithLabelValues(ep, "false").Inc()
		p.fail(w, r, ep, false, lerr)
		return
	}
	stream := b.bool("stream")
	p.m.requests.WithLabelValues(ep, strconv.FormatBool(stream)).Inc()
	ri, lerr := routeInfoOf(ep, b, r.Header, p.maxTokens)
	if lerr != nil {
		p.fail(w, r, ep, false, lerr)
		return
	}
	ctx := r.Context()
	id := p.ids.next()
	ri.id = strconv.FormatInt(id, 10)
	ctxResp, id, lerr := p.contextLeg(ctx, ep, b, id, ri)
	if lerr != nil {
		p.fail(w, r, ep, false, lerr)
		return
	}
	if !needGen(ctxResp) {
		p.finishedInContext(w, ep, stream, ctxResp)
		return
	}
	gen, lerr := genRequest(ep, b, ctxResp, id)
	if lerr != nil {
		p.fail(w, r, ep, false, lerr)
		return
	}
	// A non-streamed leg is asked for a stream too, so that its first chunk can be held to
	// kv_transfer_timeout_ms like a streamed one; the chunks are put back together into the
	// answer the client asked for.
	aggregate := !stream && aggregatable(b)
	if aggregate {
		gen["stream"] = json.RawMessage("true")
		gen["stream_options"] = json.RawMessage(`{"include_usage":true}`)
	}
	p.relayLeg(w, r, leg{ep: ep, path: ep, role: RoleGeneration, body: mustJSON(gen), stream: stream || aggregate,
		aggregate: aggregate, ri: ri, firstChunk: p.kvTimeout, firstChunkKind: TimeoutKVTransfer})
}

// contextLeg sends the context leg, re-sending it under a fresh disagg_request_id after a
// transport error or a 5xx answer, up to max_retries times.
func (p *Proxy) contextLeg(ctx context.Context, ep string, b body, id int64, ri *routeInfo) (map[string]json.RawMessage, int64, *LegError) {
	var exclude *upstream
	for attempt := 0; ; attempt++ {
		cb := b.clone()
		dp := map[string]any{"request_type": "context_only", "disagg_request_id": id}
		var client struct {
			ConversationID string `json:"conversation_id"`
		}
		if json.Unmarshal(b["disaggregated_params"], &client) == nil && client.ConversationID != "" {
			dp["conversation_id"] = client.ConversationID
		}
		cb["disaggregated_params"] = mustJSON(dp)
		cb["stream"] = json.RawMessage("false")
		delete(cb, "stream_options")
		// A capped router waits for a free server no longer than a leg may take.
		pctx, pcancel := context.WithTimeout(ctx, p.reqTimeout)
		res, err := p.ctxPick.pick(pctx, ri, exclude)
		pcancel()
		if err != nil {
			if ctx.Err() != nil {
				return nil, id, &LegError{Role: RoleContext, Status: 499, Message: "the client went away", Err: errClientGone}
			}
			return nil, id, &LegError{Role: RoleContext, Status: http.StatusServiceUnavailable, Message: err.Error(), Err: ErrUpstream}
		}
		up := res.up
		out, status, cause, lerr := p.contextOnce(ctx, up, ep, mustJSON(cb))
		res.done()
		if lerr == nil {
			return out, id, nil
		}
		if ctx.Err() != nil {
			return nil, id, &LegError{Role: RoleContext, Server: up.addr, Status: 499, Message: "the client went away", Err: errClientGone}
		}
		retry := cause != "" || status >= 500
		if !retry || attempt >= p.maxRetries {
			return nil, id, lerr
		}
		if cause == "" {
			cause = CauseContextStatus
		}
		p.m.retries.WithLabelValues(RoleContext, cause).Inc()
		p.log.Warn("context leg failed; re-sending", "server", up.addr, "attempt", attempt+1, "err", lerr.Error())
		exclude = up
		id = p.ids.next()
		select {
		case <-time.After(p.backoffFor(attempt)):
		case <-ctx.Done():
			return nil, id, &LegError{Role: RoleContext, Status: 499, Message: "the client went away", Err: errClientGone}
		}
	}
}

// contextOnce sends one context leg. cause is set when a transport error is to be retried.
func (p *Proxy) contextOnce(ctx context.Context, up *upstream, ep string, payload []byte) (map[string]json.RawMessage, int, string, *LegError) {
	lctx, cancel := context.WithTimeoutCause(ctx, p.reqTimeout, errRequestTimeout)
	defer cancel()
	g := p.m.inFlight.WithLabelValues(RoleContext, up.addr)
	g.Inc()
	defer g.Dec()
	start := time.Now()
	resp, _, err := p.send(lctx, up, ep, payload)
	if err != nil {
		if errors.Is(context.Cause(lctx), errRequestTimeout) {
			p.m.timeouts.WithLabelValues(RoleContext, TimeoutRequest).Inc()
			return nil, 0, "", &LegError{Role: RoleContext, Server: up.addr, Status: http.StatusGatewayTimeout,
				Message: fmt.Sprintf("no answer within request_timeout_s (%s)", p.reqTimeout), Err: ErrTimeout}
		}
		return nil, 0, CauseContextTransport, &LegError{Role: RoleContext, Server: up.addr, Status: http.StatusBadGateway, Message: err.Error(), Err: ErrUpstream}
	}
	defer resp.Body.Close()
	p.m.legSeconds.WithLabelValues(RoleContext).Observe(time.Since(start).Seconds())
	if resp.StatusCode >= 400 {
		raw, _ := readBounded(resp.Body, maxErrorBody)
		return nil, resp.StatusCode, "", &LegError{Role: RoleContext, Server: up.addr, Status: resp.StatusCode, Message: workerMessage(raw), Err: ErrUpstream}
	}
	raw, err := readBounded(resp.Body, maxContextResponse)
	if err != nil {
		cause := ""
		if !errors.Is(err, context.Canceled) {
			cause = CauseContextTransport
		}
		if errors.Is(context.Cause(lctx), errRequestTimeout) {
			p.m.timeouts.WithLabelValues(RoleContext, TimeoutRequest).Inc()
			return nil, 0, "", &LegError{Role: RoleContext, Server: up.addr, Status: http.StatusGatewayTimeout,
				Message: fmt.Sprintf("no answer within request_timeout_s (%s)", p.reqTimeout), Err: ErrTimeout}
		}
		return nil, 0, cause, &LegError{Role: RoleContext, Server: up.addr, Status: http.StatusBadGateway, Message: "reading the answer: " + err.Error(), Err: ErrUpstream}
	}
	out, err := checkContextResponse(raw)
	if err != nil {
		return nil, http.StatusBadGateway, "", &LegError{Role: RoleContext, Server: up.addr, Status: http.StatusBadGateway, Message: err.Error(), Err: ErrUpstream}
	}
	return out, resp.StatusCode, "", nil
}

// checkContextResponse checks that a context leg's answer carries what the generation leg needs.
func checkContextResponse(raw []byte) (map[string]json.RawMessage, error) {
	var out map[string]json.RawMessage
	if err := json.Unmarshal(raw, &out); err != nil || out == nil {
		return nil, errors.New("the context answer is not a JSON object")
	}
	var choices []map[string]json.RawMessage
	if err := json.Unmarshal(out["choices"], &choices); err != nil || len(choices) == 0 {
		return nil, errors.New("the context answer has no choices")
	}
	if !needGen(out) {
		return out, nil
	}
	var dp map[string]json.RawMessage
	if err := json.Unmarshal(choices[0]["disaggregated_params"], &dp); err != nil || dp == nil {
		return nil, errors.New("the context answer carries no disaggregated_params; is it a trtllm-serve context server?")
	}
	return out, nil
}

// needGen reports whether the context leg left work for a generation server: it stopped for
// length or is not finished, as trtllm-serve's front decides.
func needGen(ctxResp map[string]json.RawMessage) bool {
	var choices []struct {
		FinishReason *string `json:"finish_reason"`
	}
	if json.Unmarshal(ctxResp["choices"], &choices) != nil || len(choices) == 0 || choices[0].FinishReason == nil {
		return false
	}
	fr := *choices[0].FinishReason
	return fr == "length" || fr == "not_finished"
}

// finishedInContext answers a request the context server already finished.
func (p *Proxy) finishedInContext(w http.ResponseWriter, ep string, stream bool, ctxResp map[string]json.RawMessage) {
	p.m.responses.WithLabelValues(ep).Inc()
	if stream {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte("data: [DONE]\n\n"))
		return
	}
	var choices []map[string]json.RawMessage
	if json.Unmarshal(ctxResp["choices"], &choices) == nil && len(choices) > 0 {
		delete(choices[0], "disaggregated_params")
		ctxResp["choices"] = mustJSON(choices)
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(mustJSON(ctxResp))
}

// genRequest builds the generation leg: the client's request with the context server's
// disaggregated_params, request_type generation_only, the same disagg_request_id, and the
// prompt's token ids.
func genRequest(ep string, b body, ctxResp map[string]json.RawMessage, id int64) (body, *LegError) {
	var choices []map[string]json.RawMessage
	_ = json.Unmarshal(ctxResp["choices"], &choices)
	var dp map[string]json.RawMessage
	if len(choices) == 0 || json.Unmarshal(choices[0]["disaggregated_params"], &dp) != nil || dp == nil {
		return nil, &LegError{Role: RoleContext, Status: http.StatusBadGateway, Message: "the context answer carries no disaggregated_params", Err: ErrUpstream}
	}
	dp["request_type"] = json.RawMessage(`"generation_only"`)
	dp["disagg_request_id"] = mustJSON(id)
	g := b.clone()
	g["disaggregated_params"] = mustJSON(dp)
	if ids, ok := ctxResp["prompt_token_ids"]; ok && !bytes.Equal(ids, []byte("null")) {
		if ep == EndpointCompletions {
			g["prompt"] = ids
		} else {
			g["prompt_token_ids"] = ids
		}
	}
	return g, nil
}

// send posts payload to up. When the request cannot have reached the server, retryCause names
// why (CauseConnect or CauseResetWhileWriting); otherwise it is "".
func (p *Proxy) send(ctx context.Context, up *upstream, path string, payload []byte) (resp *http.Response, retryCause string, err error) {
	// The transport may send the request again on another connection when nothing of it was
	// written; each attempt starts with GotConn and a fresh body, so the flags below describe
	// the last attempt.
	var gotConn, wrote atomic.Bool
	var body atomic.Pointer[trackedBody]
	body.Store(&trackedBody{r: bytes.NewReader(payload)})
	trace := &httptrace.ClientTrace{
		GotConn: func(httptrace.GotConnInfo) {
			gotConn.Store(true)
			wrote.Store(false)
		},
		WroteRequest: func(i httptrace.WroteRequestInfo) {
			if i.Err == nil {
				wrote.Store(true)
			}
		},
	}
	req, err := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, trace), http.MethodPost, "http://"+up.addr+path, body.Load())
	if err != nil {
		return nil, "", err
	}
	req.ContentLength = int64(len(payload))
	req.GetBody = func() (io.ReadCloser, error) {
		b := &trackedBody{r: bytes.NewReader(payload)}
		body.Store(b)
		return io.NopCloser(b), nil
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err = p.hc.Do(req)
	if err == nil {
		return resp, "", nil
	}
	if ctx.Err() != nil {
		return nil, "", err
	}
	var op *net.OpError
	switch {
	case !gotConn.Load() && (errors.As(err, &op) && op.Op == "dial" || errors.Is(err, syscall.ECONNREFUSED)):
		return nil, CauseConnect, err
	// The transport closes a connection whose read side saw the reset, and its writer then
	// reports net.ErrClosed: the request was still not fully written. The trace's WroteRequest
	// comes before the transport's last flush, so a body the transport never read to its end
	// is the other sign that the request was cut short.
	case gotConn.Load() && (!wrote.Load() || !body.Load().done.Load()) && (errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.Is(err, net.ErrClosed)):
		return nil, CauseResetWhileWriting, err
	}
	p.log.Debug("leg failed where it may have reached the server", "server", up.addr, "connected", gotConn.Load(),
		"written", wrote.Load(), "body_read", body.Load().done.Load(), "err", err)
	return nil, "", err
}

// fail answers a request that failed before any of its response went out.
func (p *Proxy) fail(w http.ResponseWriter, r *http.Request, ep string, anthropic bool, e *LegError) {
	// A body that timed out cancels the request's context too, but its client is still there
	// to read the 408.
	if errors.Is(e.Err, errClientGone) || r.Context().Err() != nil && e.Status != http.StatusRequestTimeout {
		p.m.disconnects.WithLabelValues(ep).Inc()
		return
	}
	p.m.errors.WithLabelValues(ep, strconv.Itoa(e.Status)).Inc()
	if !errors.Is(e.Err, ErrBadRequest) {
		p.log.Warn("request failed", "endpoint", ep, "status", e.Status, "err", e.Error())
	}
	writeError(w, anthropic, e.Status, e.Error())
}

// trackedBody is a request body that records whether the transport read it to its end.
type trackedBody struct {
	r    *bytes.Reader
	done atomic.Bool
}

func (b *trackedBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if errors.Is(err, io.EOF) {
		b.done.Store(true)
	}
	return n, err
}
