package disagg

import (
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"time"
)

// Health probes: the front is healthy when at least one context server and one generation
// server answer their /health with 200, and ready when it is healthy and not draining. The
// probe result is shared for healthTTL, so a client polling /health cannot multiply the load
// on the servers behind it.
const (
	healthTTL     = time.Second
	healthTimeout = 2 * time.Second
)

type healthProbe struct {
	p *Proxy

	mu      sync.Mutex
	at      time.Time
	last    healthState
	running chan struct{} // closed when the probe in flight ends
}

type healthState struct {
	ContextUp    int `json:"context_up"`
	GenerationUp int `json:"generation_up"`
}

func (h healthState) ok() bool { return h.ContextUp > 0 && h.GenerationUp > 0 }

func newHealthProbe(p *Proxy) *healthProbe { return &healthProbe{p: p} }

// state returns the servers that answered, probing them when the last probe is older than
// healthTTL; concurrent callers share one probe.
func (h *healthProbe) state(ctx context.Context) healthState {
	h.mu.Lock()
	if !h.at.IsZero() && time.Since(h.at) < healthTTL {
		s := h.last
		h.mu.Unlock()
		return s
	}
	wait := h.running
	if wait == nil {
		wait = make(chan struct{})
		h.running = wait
		go h.probe(wait)
	}
	h.mu.Unlock()
	select {
	case <-wait:
	case <-ctx.Done():
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.last
}

func (h *healthProbe) probe(done chan struct{}) {
	ctx, cancel := context.WithTimeout(context.Background(), healthTimeout)
	defer cancel()
	ups := append(append([]*upstream{}, h.p.ctxUps...), h.p.genUps...)
	up := make([]bool, len(ups))
	var wg sync.WaitGroup
	for i, u := range ups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+u.addr+EndpointHealth, nil)
			if err != nil {
				return
			}
			resp, err := h.p.hc.Do(req)
			if err != nil {
				return
			}
			_, _ = readBounded(resp.Body, maxErrorBody)
			resp.Body.Close()
			up[i] = resp.StatusCode == http.StatusOK
		}()
	}
	wg.Wait()
	var s healthState
	for i, u := range ups {
		if !up[i] {
			continue
		}
		if u.role == RoleContext {
			s.ContextUp++
		} else {
			s.GenerationUp++
		}
	}
	h.p.m.backendsUp.WithLabelValues(RoleContext).Set(float64(s.ContextUp))
	h.p.m.backendsUp.WithLabelValues(RoleGeneration).Set(float64(s.GenerationUp))
	h.mu.Lock()
	h.last, h.at, h.running = s, time.Now(), nil
	h.mu.Unlock()
	close(done)
}

type healthBody struct {
	Status            string `json:"status"`
	ContextServers    int    `json:"context_servers"`
	GenerationServers int    `json:"generation_servers"`
	healthState
	Draining bool `json:"draining"`
}

// serveHealth answers 200 when a context and a generation server answer, 503 otherwise.
func (p *Proxy) serveHealth(w http.ResponseWriter, r *http.Request) {
	s := p.health.state(r.Context())
	p.writeHealth(w, s, s.ok())
}

// serveReadyz answers 200 when the front is healthy and not draining, 503 otherwise.
func (p *Proxy) serveReadyz(w http.ResponseWriter, r *http.Request) {
	if p.draining.Load() {
		p.writeHealth(w, healthState{}, false)
		return
	}
	s := p.health.state(r.Context())
	p.writeHealth(w, s, s.ok())
}

func (p *Proxy) writeHealth(w http.ResponseWriter, s healthState, ok bool) {
	b := healthBody{Status: "ok", ContextServers: len(p.ctxUps), GenerationServers: len(p.genUps), healthState: s,
		Draining: p.draining.Load()}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	if !ok {
		b.Status = "unavailable"
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_ = json.NewEncoder(w).Encode(b)
}
