package daemon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
)

// MetricsHandler serves the metrics and health listener: /metrics, /healthz and /readyz and
// nothing else, so a scraper or a kubelet probe reaching it learns no keys and changes
// nothing. Every other path is 404.
func (d *Daemon) MetricsHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", d.metricsHandler())
	mux.HandleFunc("GET /healthz", d.serveHealthz)
	mux.HandleFunc("GET /readyz", d.serveReadyz)
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "not found: this listener serves only /metrics, /healthz and /readyz", http.StatusNotFound)
	})
	return mux
}

func (d *Daemon) serveHealthz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = w.Write([]byte("ok\n"))
}

func (d *Daemon) serveReadyz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if !d.ready.Load() {
		w.WriteHeader(http.StatusServiceUnavailable)
		msg := "not ready\n"
		if _, _, reason, _ := d.bstate.get(); reason != "" {
			msg = "not ready: " + reason + "\n"
		}
		_, _ = w.Write([]byte(msg))
		return
	}
	_, _ = w.Write([]byte("ready\n"))
}

// listenMetrics opens the metrics listener when one is configured; nil when not.
func (d *Daemon) listenMetrics(ctx context.Context) (net.Listener, error) {
	if d.cfg.MetricsAddr == "" {
		return nil, nil
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", d.cfg.MetricsAddr)
	if err != nil {
		return nil, fmt.Errorf("metrics listener: %w", err)
	}
	// The same connection cap as the other listeners: it may face any network.
	return d.guardListener(ln, "metrics", nil), nil
}

// serveMetricsListener serves ln until the returned server is shut down; an error other than
// a shutdown goes to errc.
func (d *Daemon) serveMetricsListener(ln net.Listener, wg *sync.WaitGroup, errc chan<- error) *http.Server {
	if ln == nil {
		return nil
	}
	hs := &http.Server{
		Handler:           d.MetricsHandler(),
		ReadHeaderTimeout: AdminReadHeaderTimeout,
		ReadTimeout:       AdminReadTimeout,
		WriteTimeout:      AdminWriteTimeout,
		IdleTimeout:       AdminIdleTimeout,
		MaxHeaderBytes:    AdminMaxHeaderBytes,
		ErrorLog:          slogErrorLog(d.log),
	}
	if g, ok := ln.(*guardedListener); ok {
		g.evictIdleHTTP(hs)
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errc <- fmt.Errorf("metrics http: %w", err)
		}
	}()
	return hs
}
