package disagg

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
)

// FuzzSSEReader: any body splits into events without panicking, no event exceeds the bound,
// and a body of well-formed events comes back byte for byte.
func FuzzSSEReader(f *testing.F) {
	f.Add([]byte("data: {\"a\":1}\n\ndata: [DONE]\n\n"))
	f.Add([]byte("event: message_start\ndata: {}\n\n\n\ndata: x"))
	f.Add([]byte("data: a\r\ndata: b\r\n\r\n"))
	f.Add([]byte(": keep-alive\n\n"))
	f.Fuzz(func(t *testing.T, body []byte) {
		r := newSSEReader(bytes.NewReader(body))
		var all bytes.Buffer
		for range len(body) + 2 {
			raw, data, err := r.next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return
			}
			if len(raw) > maxEventBytes+2 || len(data) > len(raw) {
				t.Fatalf("event of %d bytes, payload %d", len(raw), len(data))
			}
			all.Write(raw)
		}
		// Well-formed: events of "data: x" lines each ended by a blank line.
		if wellFormed(body) && !bytes.Equal(all.Bytes(), body) {
			t.Fatalf("round trip:\n%q\n%q", body, all.Bytes())
		}
	})
}

func wellFormed(b []byte) bool {
	if len(b) == 0 || !bytes.HasSuffix(b, []byte("\n\n")) || bytes.Contains(b, []byte("\r")) || bytes.HasPrefix(b, []byte("\n")) {
		return false
	}
	return !bytes.Contains(b, []byte("\n\n\n"))
}

// FuzzErrorBodies: a worker's error body of any shape yields a bounded message and never a
// panic; an in-stream error's status is always an HTTP error status.
func FuzzErrorBodies(f *testing.F) {
	f.Add([]byte(`{"object":"error","message":"m","code":503}`))
	f.Add([]byte(`{"error":{"message":"m","code":"429"}}`))
	f.Add([]byte(`{"detail":[{"loc":["body"],"msg":"x"}]}`))
	f.Add([]byte(`{"type":"error","error":{"type":"overloaded_error","message":"m"}}`))
	f.Add([]byte(`not json`))
	f.Fuzz(func(t *testing.T, body []byte) {
		if m := workerMessage(body); len(m) > maxErrorMessage+len("…") || m == "" {
			t.Fatalf("message of %d bytes: %q", len(m), m)
		}
		if st, _, ok := inStreamError(body); ok && (st < 400 || st > 599) {
			t.Fatalf("status %d", st)
		}
	})
}

// FuzzRouteInfo: any request body is accepted or refused with a 400, never a panic.
func FuzzRouteInfo(f *testing.F) {
	f.Add(`{"prompt":"hi"}`, true)
	f.Add(`{"prompt":[1,2,3]}`, true)
	f.Add(`{"prompt":[[1,2]]}`, true)
	f.Add(`{"messages":[{"role":"user","content":"x"}],"prompt_token_ids":[1]}`, false)
	f.Add(`{"conversation_params":{"conversation_id":"c"},"prompt":"x"}`, true)
	f.Fuzz(func(t *testing.T, text string, completions bool) {
		var b body
		if err := json.Unmarshal([]byte(text), &b); err != nil || b == nil {
			return
		}
		ep := EndpointChat
		if completions {
			ep = EndpointCompletions
		}
		ri, lerr := routeInfoOf(ep, b, http.Header{}, 1<<20)
		if lerr != nil {
			if lerr.Status != http.StatusBadRequest || strings.TrimSpace(lerr.Message) == "" {
				t.Fatalf("refusal %+v", lerr)
			}
			return
		}
		if ri.promptTokens < 1 {
			t.Fatalf("prompt tokens %d", ri.promptTokens)
		}
	})
}
