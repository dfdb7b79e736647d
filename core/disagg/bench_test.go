package disagg_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvctl/kvctl/core/disagg"
)

// BenchmarkProxyOverhead measures one request's latency through the proxy against the same two
// legs sent by the client itself to the same scripted servers, in the same run, in parallel
// (the proxy's path is parallel). It reports p50 and p99 per request; the overhead is the
// difference between the proxy and direct rows.
func BenchmarkProxyOverhead(b *testing.B) {
	s := newSetup(b, 1, 1, "")
	for _, stream := range []bool{false, true} {
		req := map[string]any{"model": "m", "prompt": "NVIDIA is a great company because", "max_tokens": 8, "stream": stream}
		client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
		b.Run(fmt.Sprintf("stream=%v/direct", stream), func(b *testing.B) {
			latency(b, func() error { return direct(client, s, req) })
		})
		b.Run(fmt.Sprintf("stream=%v/proxy", stream), func(b *testing.B) {
			raw, _ := json.Marshal(req)
			latency(b, func() error {
				return drain(client.Post(s.URL+disagg.EndpointCompletions, "application/json", bytes.NewReader(raw)))
			})
		})
	}
}

// direct sends the context leg and the generation leg the proxy would send.
func direct(c *http.Client, s *setup, req map[string]any) error {
	id := time.Now().UnixNano() & (1<<55 - 1)
	ctxReq := map[string]any{}
	for k, v := range req {
		ctxReq[k] = v
	}
	ctxReq["stream"] = false
	ctxReq["disaggregated_params"] = map[string]any{"request_type": "context_only", "disagg_request_id": id}
	raw, _ := json.Marshal(ctxReq)
	resp, err := c.Post("http://"+s.Ctx[0].Addr+disagg.EndpointCompletions, "application/json", bytes.NewReader(raw))
	if err != nil {
		return err
	}
	var ctxResp struct {
		Choices []struct {
			DP map[string]any `json:"disaggregated_params"`
		} `json:"choices"`
		PromptTokenIDs []int64 `json:"prompt_token_ids"`
	}
	dec := json.NewDecoder(resp.Body)
	dec.UseNumber()
	err = dec.Decode(&ctxResp)
	resp.Body.Close()
	if err != nil {
		return fmt.Errorf("context leg: %w", err)
	}
	if len(ctxResp.Choices) == 0 {
		return errors.New("context leg: no choices")
	}
	gen := map[string]any{}
	for k, v := range req {
		gen[k] = v
	}
	dp := ctxResp.Choices[0].DP
	dp["request_type"] = "generation_only"
	gen["disaggregated_params"] = dp
	gen["prompt"] = ctxResp.PromptTokenIDs
	raw, _ = json.Marshal(gen)
	return drain(c.Post("http://"+s.Gen[0].Addr+disagg.EndpointCompletions, "application/json", bytes.NewReader(raw)))
}

func drain(resp *http.Response, err error) error {
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}

// latency runs do in parallel b.N times and reports the p50 and p99 of one call.
func latency(b *testing.B, do func() error) {
	var mu sync.Mutex
	var all []time.Duration
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		var mine []time.Duration
		for pb.Next() {
			t0 := time.Now()
			if err := do(); err != nil {
				b.Error(err)
				return
			}
			mine = append(mine, time.Since(t0))
		}
		mu.Lock()
		all = append(all, mine...)
		mu.Unlock()
	})
	b.StopTimer()
	if len(all) == 0 {
		return
	}
	slices.Sort(all)
	b.ReportMetric(float64(all[len(all)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(all[len(all)*99/100].Microseconds()), "p99-µs")
}
