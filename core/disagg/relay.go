package disagg

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"mime"
	"net/http"
	"strconv"
	"time"
)

// leg is a request relayed to one server and its answer relayed to the client: a generation
// leg, or a /v1/messages passthrough.
type leg struct {
	ep, path       string
	role           string
	body           []byte
	stream         bool
	aggregate      bool // the client asked for no stream: the leg's stream is rebuilt into one answer
	anthropic      bool
	responses      bool // /v1/responses: a stream keeps its 200 and fails with an error event
	ri             *routeInfo
	firstChunk     time.Duration // how long a stream may take to its first chunk
	firstChunkKind string        // the timeout kind counted when it passes
}

// relayLeg sends l, re-sending it (same body, so the same disagg_request_id) only when it cannot
// have reached the server, and relays the answer. A stream's first chunk is read before any
// header goes to the client.
//
// A re-send waits first, backing off with jitter (backoffFor), so that a server that is
// restarting or dropped its listen backlog for a moment gets the next try; a wait that would
// end past the leg's request_timeout_s deadline is not taken and the last failure is the
// answer.
func (p *Proxy) relayLeg(w http.ResponseWriter, r *http.Request, l leg) {
	ctx := r.Context()
	pick := p.genPick
	deadline := time.Now().Add(p.reqTimeout)
	var exclude *upstream
	for attempt := 0; ; attempt++ {
		res, err := pick.pick(ctx, l.ri, exclude)
		if err != nil {
			p.fail(w, r, l.ep, l.anthropic, &LegError{Role: l.role, Status: http.StatusServiceUnavailable, Message: err.Error(), Err: ErrUpstream})
			return
		}
		wait := p.backoffFor(attempt)
		mayRetry := attempt < p.maxRetries && time.Now().Add(wait).Before(deadline)
		retryCause, done := p.relayOnce(w, r, l, res.up, mayRetry)
		res.done()
		if done {
			return
		}
		p.m.retries.WithLabelValues(l.role, retryCause).Inc()
		p.log.Warn("leg did not reach its server; re-sending it unchanged", "role", l.role, "server", res.up.addr,
			"cause", retryCause, "attempt", attempt+1, "after", wait)
		exclude = res.up
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			p.m.disconnects.WithLabelValues(l.ep).Inc()
			return
		}
	}
}

// backoffFor is the wait before re-send attempt+1: the retry backoff doubled per attempt (at
// most 32 times), drawn uniformly from its upper half so that clients re-sending together
// spread out.
func (p *Proxy) backoffFor(attempt int) time.Duration {
	d := p.backoff << min(attempt, 5)
	return d/2 + time.Duration(rand.Int64N(int64(d/2)+1))
}

// relayOnce runs one attempt. It returns done=false, with the cause, only when the request
// cannot have reached the server and mayRetry is set; the caller then re-sends it.
func (p *Proxy) relayOnce(w http.ResponseWriter, r *http.Request, l leg, up *upstream, mayRetry bool) (string, bool) {
	g := p.m.inFlight.WithLabelValues(l.role, up.addr)
	g.Inc()
	defer g.Dec()
	ctx, cancel := context.WithCancelCause(r.Context())
	defer cancel(nil)
	var timer *time.Timer
	if l.stream {
		timer = time.AfterFunc(l.firstChunk, func() { cancel(errKVTimeout) })
	} else {
		timer = time.AfterFunc(p.reqTimeout, func() { cancel(errRequestTimeout) })
	}
	defer timer.Stop()
	start := time.Now()
	// failed and timedOut answer the client with the leg's failure; the attempt is then done.
	failed := func(status int, msg string, cause error) {
		e := &LegError{Role: l.role, Server: up.addr, Status: status, Message: msg, Err: cause}
		if l.responses && l.stream {
			p.failResponsesStream(w, r, l.ep, e)
			return
		}
		p.fail(w, r, l.ep, l.anthropic, e)
	}
	timedOut := func() {
		if errors.Is(context.Cause(ctx), errKVTimeout) {
			p.m.timeouts.WithLabelValues(l.role, l.firstChunkKind).Inc()
			if l.stream {
				p.m.firstChunk.WithLabelValues(l.ep).Inc()
			}
			what := "kv_transfer_timeout_ms"
			if l.firstChunkKind == TimeoutRequest {
				what = "request_timeout_s"
			}
			failed(http.StatusGatewayTimeout, fmt.Sprintf("no first token within %s (%s); the request was cancelled", what, l.firstChunk), ErrTimeout)
			return
		}
		p.m.timeouts.WithLabelValues(l.role, TimeoutRequest).Inc()
		failed(http.StatusGatewayTimeout, fmt.Sprintf("no answer within request_timeout_s (%s); the request was cancelled", p.reqTimeout), ErrTimeout)
	}
	timerFired := func() bool {
		c := context.Cause(ctx)
		return errors.Is(c, errKVTimeout) || errors.Is(c, errRequestTimeout)
	}

	resp, retryCause, err := p.send(ctx, up, l.path, l.body)
	if err != nil {
		switch {
		case timerFired():
			timedOut()
			return "", true
		case r.Context().Err() != nil:
			failed(499, "the client went away", errClientGone)
			return "", true
		case retryCause != "" && mayRetry:
			return retryCause, false
		}
		if l.stream {
			p.m.firstChunk.WithLabelValues(l.ep).Inc()
		}
		failed(http.StatusBadGateway, err.Error(), ErrUpstream)
		return "", true
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 400 {
		raw, _ := readBounded(resp.Body, maxErrorBody)
		if l.stream {
			p.m.firstChunk.WithLabelValues(l.ep).Inc()
		}
		msg := workerMessage(raw)
		if l.anthropic && resp.StatusCode == http.StatusNotFound {
			msg = "the servers behind this proxy do not serve /v1/messages: " + msg
		}
		failed(resp.StatusCode, msg, ErrUpstream)
		return "", true
	}
	if !l.stream {
		p.relayJSON(w, r, l, resp, start, timerFired, timedOut, failed)
		return "", true
	}
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if l.aggregate && mt == "application/json" {
		// A server that ignores stream: true answers as asked in the first place.
		l.stream, l.aggregate = false, false
		timer.Stop()
		timer = time.AfterFunc(p.reqTimeout, func() { cancel(errRequestTimeout) })
		defer timer.Stop()
		p.relayJSON(w, r, l, resp, start, timerFired, timedOut, failed)
		return "", true
	}
	if mt != "text/event-stream" {
		p.m.firstChunk.WithLabelValues(l.ep).Inc()
		failed(http.StatusBadGateway, fmt.Sprintf("answered a stream request with %q instead of text/event-stream", resp.Header.Get("Content-Type")), ErrUpstream)
		return "", true
	}
	sr := newSSEReader(resp.Body)
	raw, data, err := sr.next()
	if err == nil {
		if status, msg, isErr := inStreamError(data); isErr {
			p.m.firstChunk.WithLabelValues(l.ep).Inc()
			failed(status, msg, ErrUpstream)
			return "", true
		}
	}
	if err != nil || !timer.Stop() && timerFired() {
		switch {
		case timerFired():
			timedOut()
			return "", true
		case r.Context().Err() != nil:
			failed(499, "the client went away", errClientGone)
			return "", true
		}
		p.m.firstChunk.WithLabelValues(l.ep).Inc()
		if errors.Is(err, io.EOF) {
			failed(http.StatusBadGateway, "the stream ended before its first chunk", ErrUpstream)
			return "", true
		}
		failed(http.StatusBadGateway, "the stream failed before its first chunk: "+err.Error(), ErrUpstream)
		return "", true
	}
	p.m.legSeconds.WithLabelValues(l.role).Observe(time.Since(start).Seconds())
	if l.aggregate {
		p.aggregateRest(ctx, w, r, l, up, cancel, sr, data)
		return "", true
	}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	p.m.responses.WithLabelValues(l.ep).Inc()
	rc := http.NewResponseController(w)
	if _, err := w.Write(raw); err != nil {
		p.m.disconnects.WithLabelValues(l.ep).Inc()
		return "", true
	}
	_ = rc.Flush()
	done := bytes.Equal(data, []byte("[DONE]"))
	for {
		raw, data, err := sr.next()
		if errors.Is(err, io.EOF) {
			return "", true
		}
		if err != nil {
			if done {
				// The answer is complete; the client may close before the server's last bytes.
				return "", true
			}
			if r.Context().Err() != nil {
				p.m.disconnects.WithLabelValues(l.ep).Inc()
				return "", true
			}
			p.m.errors.WithLabelValues(l.ep, "in_stream").Inc()
			p.log.Warn("stream failed after its first chunk", "endpoint", l.ep, "server", up.addr, "err", err)
			msg := fmt.Sprintf("%s server %s: the stream failed: %v", l.role, up.addr, err)
			if l.anthropic {
				_, _ = fmt.Fprintf(w, "event: error\ndata: %s\n\n", anthropicErrorBody(http.StatusBadGateway, msg))
			} else if l.responses {
				_, _ = fmt.Fprintf(w, "event: error\ndata: %s\n\n", responsesErrorEvent(http.StatusBadGateway, msg))
			} else {
				_, _ = fmt.Fprintf(w, "data: %s\n\n", openAIErrorBody(http.StatusBadGateway, msg))
			}
			_ = rc.Flush()
			return "", true
		}
		if _, err := w.Write(raw); err != nil {
			p.m.disconnects.WithLabelValues(l.ep).Inc()
			return "", true
		}
		_ = rc.Flush()
		done = done || bytes.Equal(data, []byte("[DONE]"))
	}
}

// relayJSON relays a non-streamed answer; it ends the attempt whatever happens.
func (p *Proxy) relayJSON(w http.ResponseWriter, r *http.Request, l leg, resp *http.Response, start time.Time,
	timerFired func() bool, timedOut func(), failed func(int, string, error)) {
	raw, err := readBounded(resp.Body, maxGenResponse)
	if err != nil {
		if timerFired() {
			timedOut()
			return
		}
		if r.Context().Err() != nil {
			failed(499, "the client went away", errClientGone)
			return
		}
		failed(http.StatusBadGateway, "reading the answer: "+err.Error(), ErrUpstream)
		return
	}
	p.m.legSeconds.WithLabelValues(l.role).Observe(time.Since(start).Seconds())
	ct := resp.Header.Get("Content-Type")
	if ct == "" {
		ct = "application/json"
	}
	w.Header().Set("Content-Type", ct)
	w.Header().Set("Content-Length", strconv.Itoa(len(raw)))
	w.WriteHeader(http.StatusOK)
	p.m.responses.WithLabelValues(l.ep).Inc()
	_, _ = w.Write(raw)
}

// failResponsesStream answers a /v1/responses stream that failed before its first chunk the way
// trtllm-serve does (guard_responses_stream stays inside the first-chunk pull): a 200 and an
// `error` event.
func (p *Proxy) failResponsesStream(w http.ResponseWriter, r *http.Request, ep string, e *LegError) {
	if errors.Is(e.Err, errClientGone) || r.Context().Err() != nil {
		p.m.disconnects.WithLabelValues(ep).Inc()
		return
	}
	p.m.errors.WithLabelValues(ep, "in_stream").Inc()
	p.log.Warn("request failed", "endpoint", ep, "status", e.Status, "err", e.Error())
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	_, _ = fmt.Fprintf(w, "event: error\ndata: %s\n\n", responsesErrorEvent(e.Status, e.Error()))
	_ = http.NewResponseController(w).Flush()
}

// responsesErrorEvent is the data of an OpenAI Responses `error` event.
func responsesErrorEvent(status int, msg string) []byte {
	return mustJSON(map[string]any{"type": "error", "code": errorType(status), "message": msg, "param": nil, "sequence_number": 0})
}

// serveResponses relays an OpenAI Responses request to a generation server unchanged. A stream
// that fails before its first chunk keeps its 200 and carries an `error` event; a non-streamed
// request fails with an HTTP error.
func (p *Proxy) serveResponses(w http.ResponseWriter, r *http.Request) {
	const ep = EndpointResponses
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
	ri := &routeInfo{promptTokens: textTokens(len(b["input"])), conversationID: conversationID(b, r.Header)}
	p.relayLeg(w, r, leg{ep: ep, path: ep, role: RoleGeneration, body: mustJSON(b), stream: stream, responses: true,
		ri: ri, firstChunk: p.reqTimeout, firstChunkKind: TimeoutRequest})
}

// aggregateRest reads the rest of a stream the client asked to get as one answer, within
// request_timeout_s, and sends that answer. Nothing went to the client yet, so every failure is
// an HTTP error.
func (p *Proxy) aggregateRest(ctx context.Context, w http.ResponseWriter, r *http.Request, l leg, up *upstream,
	cancel context.CancelCauseFunc, sr *sseReader, first []byte) {
	timer := time.AfterFunc(p.reqTimeout, func() { cancel(errRequestTimeout) })
	defer timer.Stop()
	a := &streamAnswer{chat: l.ep == EndpointChat, choices: map[int]*choiceAnswer{}}
	err := a.collect(sr, first)
	if err == nil {
		raw := a.json()
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(len(raw)))
		w.WriteHeader(http.StatusOK)
		p.m.responses.WithLabelValues(l.ep).Inc()
		_, _ = w.Write(raw)
		return
	}
	e := &LegError{Status: http.StatusBadGateway, Message: "reading the answer: " + err.Error(), Err: ErrUpstream}
	var lerr *LegError
	switch {
	case errors.Is(context.Cause(ctx), errRequestTimeout):
		p.m.timeouts.WithLabelValues(l.role, TimeoutRequest).Inc()
		e = &LegError{Status: http.StatusGatewayTimeout, Message: fmt.Sprintf("no answer within request_timeout_s (%s); the request was cancelled", p.reqTimeout), Err: ErrTimeout}
	case r.Context().Err() != nil:
		e = &LegError{Status: 499, Message: "the client went away", Err: errClientGone}
	case errors.As(err, &lerr):
		e = lerr
	}
	e.Role, e.Server = l.role, up.addr
	p.fail(w, r, l.ep, l.anthropic, e)
}

// serveMessages relays an Anthropic Messages request to a generation server unchanged, with
// the same first-chunk rule and the Anthropic error envelope.
func (p *Proxy) serveMessages(w http.ResponseWriter, r *http.Request) {
	leave, ok := p.admit(w, r, EndpointMessages, true)
	if !ok {
		p.m.requests.WithLabelValues(EndpointMessages, "false").Inc()
		return
	}
	defer leave()
	b, release, lerr := p.readRequest(w, r)
	defer release()
	if lerr != nil {
		p.m.requests.WithLabelValues(EndpointMessages, "false").Inc()
		p.fail(w, r, EndpointMessages, true, lerr)
		return
	}
	stream := b.bool("stream")
	p.m.requests.WithLabelValues(EndpointMessages, strconv.FormatBool(stream)).Inc()
	ri := &routeInfo{promptTokens: textTokens(len(b["messages"])), conversationID: conversationID(b, r.Header)}
	p.relayLeg(w, r, leg{ep: EndpointMessages, path: EndpointMessages, role: RoleGeneration, body: mustJSON(b),
		stream: stream, anthropic: true, ri: ri, firstChunk: p.reqTimeout, firstChunkKind: TimeoutRequest})
}
