package disagg_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/kvctl/kvctl/core/disagg"
	"github.com/kvctl/kvctl/core/disagg/disaggtest"
)

// Seed commit 19, where the front has a counterpart: a generation leg whose KV never arrives
// (no first chunk within kv_transfer_timeout_ms) is cancelled, and the cancel always finishes at
// once (closing the leg's connection cannot be refused), so the request fails as timed out: for
// every endpoint, streamed or not, the client is sent its error response (504, timeout_error,
// naming the timeout), the generation server sees the request cancelled (it frees the
// request's KV), the leg's reservation is released, and the timed-out leg is never re-sent.
func TestTimedOutLegSendsItsErrorAndIsFreed(t *testing.T) {
	s := newSetup(t, 1, 1, "kv_transfer_timeout_ms: 200\nrequest_timeout_s: 600\n")
	gauge := `kvctl_disagg_legs_in_flight{role="generation",server="` + s.Gen[0].Addr + `"}`
	n := 0
	for _, ep := range []string{disagg.EndpointCompletions, disagg.EndpointChat} {
		for _, stream := range []bool{true, false} {
			body := completion(stream, "fault:"+string(disaggtest.FaultGenStall))
			if ep == disagg.EndpointChat {
				body = chat(stream, "fault:"+string(disaggtest.FaultGenStall))
			}
			r := post(t, s.URL+ep, body)
			n++
			if r.Status != http.StatusGatewayTimeout {
				t.Fatalf("%s stream=%v: status %d: %s", ep, stream, r.Status, r.Body)
			}
			if typ, m := errorMessage(t, r.Body); typ != "timeout_error" || !strings.Contains(m, "kv_transfer_timeout_ms") || !strings.Contains(m, "cancelled") {
				t.Fatalf("%s stream=%v: error response %s", ep, stream, r.Body)
			}
			eventually(t, "upstream cancellation", func() bool { return s.Gen[0].Stats().Cancelled == n })
			if g := metric(t, s.URL, gauge); g != 0 {
				t.Fatalf("%s stream=%v: %v generation legs still held after the timeout", ep, stream, g)
			}
			if st := s.Gen[0].Stats(); st.Requests != n {
				t.Fatalf("%s stream=%v: the generation server saw %d requests for %d clients: a timed-out leg was re-sent", ep, stream, st.Requests, n)
			}
		}
	}
	if got := metric(t, s.URL, `kvctl_disagg_timeouts_total{kind="kv_transfer",leg="generation"}`); got != float64(n) {
		t.Fatalf("kv_transfer timeouts %v, want %d", got, n)
	}
}

// Seed commit 19: requests the user cancelled are left to the cancel path. A client that goes
// away while its generation leg still waits for its first chunk cancels the upstream request
// and is counted as a disconnect; the first-chunk timeout never fires for it, so it is not
// failed or counted as timed out. A later request that does time out is the only timeout.
func TestUserCancelledLegIsLeftToTheCancelPath(t *testing.T) {
	s := newSetup(t, 1, 1, "kv_transfer_timeout_ms: 300\nrequest_timeout_s: 600\n")
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.URL+disagg.EndpointCompletions,
		strings.NewReader(`{"prompt":"p","max_tokens":3,"stream":true,"user":"fault:gen_stall"}`))
	done := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		done <- err
	}()
	// The leg has reached the generation server, which holds it without a first chunk.
	eventually(t, "the generation leg", func() bool { return s.Gen[0].Stats().Requests == 1 })
	cancel()
	if err := <-done; err == nil {
		t.Fatal("the cancelled client got an answer")
	}
	eventually(t, "upstream cancellation", func() bool { return s.Gen[0].Stats().Cancelled == 1 })
	eventually(t, "the disconnect", func() bool {
		return metric(t, s.URL, `kvctl_disagg_client_disconnects_total{endpoint="/v1/completions"}`) == 1
	})
	// A request that times out afterwards: its timeout fires after the cancelled request's
	// would have, and is the only one counted.
	r := post(t, s.URL+disagg.EndpointCompletions, completion(true, "fault:"+string(disaggtest.FaultGenStall)))
	if r.Status != http.StatusGatewayTimeout {
		t.Fatalf("status %d: %s", r.Status, r.Body)
	}
	if got := metric(t, s.URL, `kvctl_disagg_timeouts_total{kind="kv_transfer",leg="generation"}`); got != 1 {
		t.Fatalf("kv_transfer timeouts %v, want only the second request's", got)
	}
	if got := metric(t, s.URL, `kvctl_disagg_client_disconnects_total{endpoint="/v1/completions"}`); got != 1 {
		t.Fatalf("disconnects %v, want 1", got)
	}
}
