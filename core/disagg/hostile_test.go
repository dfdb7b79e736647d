package disagg_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kvctl/kvctl/core/disagg"
	"github.com/kvctl/kvctl/core/disagg/disaggtest"
)

// endless writes n bytes of filler after prefix.
func endless(w io.Writer, prefix string, n int) {
	_, _ = io.WriteString(w, prefix)
	chunk := strings.Repeat("x", 64<<10)
	for written := 0; written < n; written += len(chunk) {
		if _, err := io.WriteString(w, chunk); err != nil {
			return
		}
	}
}

// Hostile servers: every size a server controls is bounded, and the proxy keeps serving.
func TestHostileServersAreBounded(t *testing.T) {
	huge := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		endless(w, `{"choices":[{"text":"`, 80<<20)
	}))
	t.Cleanup(huge.Close)
	bigEvent := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		endless(w, "data: ", 20<<20)
	}))
	t.Cleanup(bigEvent.Close)
	notSSE := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"choices":[]}`)
	}))
	t.Cleanup(notSSE.Close)
	ctx := disaggtest.StartContext(t)
	gen := disaggtest.StartGeneration(t)

	for _, tc := range []struct {
		name, ctxAddr, genAddr string
		stream                 bool
		want                   string
	}{
		{"context answer over 16 MiB", huge.Listener.Addr().String(), gen.Addr, false, "too large"},
		{"stream event over 8 MiB", ctx.Addr, bigEvent.Listener.Addr().String(), true, "larger than"},
		{"stream answered with JSON", ctx.Addr, notSSE.Listener.Addr().String(), true, "instead of text/event-stream"},
		{"generation answer over 64 MiB", ctx.Addr, huge.Listener.Addr().String(), false, "too large"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url := startProxy(t, loadConfig(t, yamlFor([]string{tc.ctxAddr}, []string{tc.genAddr}, "max_retries: 0\n")), disagg.Options{})
			r := post(t, url+disagg.EndpointCompletions, completion(tc.stream, "x"))
			if r.Status != http.StatusBadGateway {
				t.Fatalf("status %d: %.300s", r.Status, r.Body)
			}
			if _, msg := errorMessage(t, r.Body); !strings.Contains(msg, tc.want) {
				t.Fatalf("message %q lacks %q", msg, tc.want)
			}
			if resp, err := http.Get(url + "/health"); err != nil || resp.StatusCode != 200 {
				t.Fatalf("the proxy stopped serving: %v", err)
			}
		})
	}
}
