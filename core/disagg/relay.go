package disagg

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
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
	anthropic      bool
	ri             *routeInfo
	firstChunk     time.Duration // how long a stream may take to its first chunk
	firstChunkKind string        // the timeout kind counted when it passes
}

// relayLeg sends l, re-sending it (same body, so the same disagg_request_id) only when it cannot
// have reached the server, and relays the answer. A stream's first chunk is read before any
// header goes to the client.
func (p *Proxy) relayLeg(w http.ResponseWriter, r *http.Request, l leg) {
	ctx := r.Context()
	pick := p.genPick
	var exclude *upstream
	for attempt := 0; ; attempt++ {
		res, err := pick.pick(ctx, l.ri, exclude)
		if err != nil {
			p.fail(w, r, l.ep, l.anthropic, &LegError{Role: l.role, Status: http.StatusServiceUnavailable, Message: err.Error(), Err: ErrUpstream})
			return
		}
		retryCause, done := p.relayOnce(w, r, l, res.up, attempt < p.maxRetries)
		res.done()
		if done {
			return
		}
		p.m.retries.WithLabelValues(l.role, retryCause).Inc()
		p.log.Warn("leg did not reach its server; re-sending it unchanged", "role", l.role, "server", res.up.addr,
			"cause", retryCause, "attempt", attempt+1)
		exclude = res.up
	}
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
	failed := func(status int, msg string, cause error) (string, bool) {
		p.fail(w, r, l.ep, l.anthropic, &LegError{Role: l.role, Server: up.addr, Status: status, Message: msg, Err: cause})
		return "", true
	}
	timedOut := func() (string, bool) {
		if errors.Is(context.Cause(ctx), errKVTimeout) {
			p.m.timeouts.WithLabelValues(l.role, l.firstChunkKind).Inc()
			if l.stream {
				p.m.firstChunk.WithLabelValues(l.ep).Inc()
			}
			what := "kv_transfer_timeout_ms"
			if l.firstChunkKind == TimeoutRequest {
				what = "request_timeout_s"
			}
			return failed(http.StatusGatewayTimeout, fmt.Sprintf("no first token within %s (%s); the request was cancelled", what, l.firstChunk), ErrTimeout)
		}
		p.m.timeouts.WithLabelValues(l.role, TimeoutRequest).Inc()
		return failed(http.StatusGatewayTimeout, fmt.Sprintf("no answer within request_timeout_s (%s); the request was cancelled", p.reqTimeout), ErrTimeout)
	}
	timerFired := func() bool {
		c := context.Cause(ctx)
		return errors.Is(c, errKVTimeout) || errors.Is(c, errRequestTimeout)
	}

	resp, retryCause, err := p.send(ctx, up, l.path, l.body)
	if err != nil {
		switch {
		case timerFired():
			return timedOut()
		case r.Context().Err() != nil:
			return failed(499, "the client went away", errClientGone)
		case retryCause != "" && mayRetry:
			return retryCause, false
		}
		if l.stream {
			p.m.firstChunk.WithLabelValues(l.ep).Inc()
		}
		return failed(http.StatusBadGateway, err.Error(), ErrUpstream)
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
		return failed(resp.StatusCode, msg, ErrUpstream)
	}
	if !l.stream {
		raw, err := readBounded(resp.Body, maxGenResponse)
		if err != nil {
			if timerFired() {
				return timedOut()
			}
			if r.Context().Err() != nil {
				return failed(499, "the client went away", errClientGone)
			}
			return failed(http.StatusBadGateway, "reading the answer: "+err.Error(), ErrUpstream)
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
		return "", true
	}
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt != "text/event-stream" {
		p.m.firstChunk.WithLabelValues(l.ep).Inc()
		return failed(http.StatusBadGateway, fmt.Sprintf("answered a stream request with %q instead of text/event-stream", resp.Header.Get("Content-Type")), ErrUpstream)
	}
	sr := newSSEReader(resp.Body)
	raw, data, err := sr.next()
	if err == nil {
		if status, msg, isErr := inStreamError(data); isErr {
			p.m.firstChunk.WithLabelValues(l.ep).Inc()
			return failed(status, msg, ErrUpstream)
		}
	}
	if err != nil || !timer.Stop() && timerFired() {
		switch {
		case timerFired():
			return timedOut()
		case r.Context().Err() != nil:
			return failed(499, "the client went away", errClientGone)
		}
		p.m.firstChunk.WithLabelValues(l.ep).Inc()
		if errors.Is(err, io.EOF) {
			return failed(http.StatusBadGateway, "the stream ended before its first chunk", ErrUpstream)
		}
		return failed(http.StatusBadGateway, "the stream failed before its first chunk: "+err.Error(), ErrUpstream)
	}
	p.m.legSeconds.WithLabelValues(l.role).Observe(time.Since(start).Seconds())
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

// serveMessages relays an Anthropic Messages request to a generation server unchanged, with
// the same first-chunk rule and the Anthropic error envelope.
func (p *Proxy) serveMessages(w http.ResponseWriter, r *http.Request) {
	b, lerr := p.readRequest(w, r)
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
