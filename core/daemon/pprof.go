package daemon

import (
	"fmt"
	"net/http"
	"net/http/pprof"
	"strconv"
)

// MaxProfileSeconds bounds the seconds of a CPU profile or execution trace over the admin API.
// net/http/pprof extends the write deadline to whatever a request asks, and the runtime runs
// one CPU profile at a time: an unbounded request would hold the profiler.
const MaxProfileSeconds = 60

// maxSymbolBody bounds the body of a POST /debug/pprof/symbol: the handler reads addresses until
// the body ends and buffers a line of answer for each.
const maxSymbolBody = 64 << 10

// pprofPrefix is where the admin listener serves Go's runtime profiles with Config.AdminPprof.
const pprofPrefix = "/debug/pprof/"

// pprofOffMessage is the 404 body of a profile path while Config.AdminPprof is off.
const pprofOffMessage = "profiling is off on this kvctl serve; start it with --admin-pprof (config key admin-pprof) to serve Go's runtime profiles under /debug/pprof/\n"

// pprofHandler serves the standard net/http/pprof endpoints under /debug/pprof/: the index and
// every named profile (heap, allocs, goroutine, block, mutex, threadcreate), a CPU profile
// (profile?seconds=N, 30 s by default) and an execution trace (trace?seconds=N, 1 s by default),
// and symbol lookups. N above MaxProfileSeconds, or not a whole positive number, is refused with
// 400; the runtime allows one CPU profile at a time (a second answers 500), and a profile ends
// early when its client goes away. A symbol lookup's body is read up to maxSymbolBody.
// /debug/pprof/cmdline is not served: the daemon's command line is not the profiles' business. With Config.AdminPprof off every path under the prefix answers 404 naming the flag.
func (d *Daemon) pprofHandler() http.Handler {
	if !d.cfg.AdminPprof {
		return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(pprofOffMessage))
		})
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+pprofPrefix+"profile", boundedSeconds(pprof.Profile))
	mux.HandleFunc("GET "+pprofPrefix+"trace", boundedSeconds(pprof.Trace))
	mux.HandleFunc("GET "+pprofPrefix+"symbol", pprof.Symbol)
	mux.HandleFunc("POST "+pprofPrefix+"symbol", func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, maxSymbolBody)
		pprof.Symbol(w, r)
	})
	mux.HandleFunc("GET "+pprofPrefix+"cmdline", http.NotFound)
	mux.HandleFunc("GET "+pprofPrefix, pprof.Index)
	return mux
}

// boundedSeconds refuses a profile request whose seconds parameter is present but not a whole
// number of seconds in [1, MaxProfileSeconds].
func boundedSeconds(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if v := r.URL.Query().Get("seconds"); v != "" {
			if n, err := strconv.ParseInt(v, 10, 64); err != nil || n < 1 || n > MaxProfileSeconds {
				w.Header().Set("Content-Type", "text/plain; charset=utf-8")
				w.WriteHeader(http.StatusBadRequest)
				_, _ = fmt.Fprintf(w, "seconds=%.32q: want a whole number of seconds from 1 to %d\n", v, MaxProfileSeconds)
				return
			}
		}
		h(w, r)
	}
}
