package daemon_test

import (
	"compress/gzip"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/kvctl/kvctl/core/connector"
	"github.com/kvctl/kvctl/core/daemon"
	"github.com/kvctl/kvctl/core/daemon/daemontest"
	"github.com/kvctl/kvctl/pool/embedded"
)

// TestAdminPprof pins the admin listener's /debug/pprof/: off by default (404 naming the flag,
// on every path under it), and with AdminPprof the index, a named profile, a CPU profile of a
// second (a gzipped profile), no command line, profile lengths outside 1..60 s refused, and a
// symbol lookup's body cut at its bound.
func TestAdminPprof(t *testing.T) {
	popts := embedded.DefaultOptions()
	popts.Segments = []embedded.SegmentSpec{{Name: "s", Capacity: 4 << 20}}
	off := daemontest.Start(t, daemon.Config{Pool: popts, Defaults: connector.Options{StagingBufferBytes: 1 << 20}})
	for _, p := range []string{"/debug/pprof/", "/debug/pprof/profile?seconds=1", "/debug/pprof/heap", "/debug/pprof/trace"} {
		code, body := getText(t, "http://"+off.Info.AdminAddr+p)
		if code != http.StatusNotFound || !strings.Contains(body, "--admin-pprof") {
			t.Errorf("%s without AdminPprof: %d %q", p, code, body)
		}
	}

	on := daemontest.Start(t, daemon.Config{Pool: popts, Defaults: connector.Options{StagingBufferBytes: 1 << 20}, AdminPprof: true})
	base := "http://" + on.Info.AdminAddr
	if code, body := getText(t, base+"/debug/pprof/"); code != http.StatusOK || !strings.Contains(body, "goroutine") {
		t.Errorf("index: %d %.200q", code, body)
	}
	if code, body := getText(t, base+"/debug/pprof/goroutine?debug=1"); code != http.StatusOK || !strings.Contains(body, "goroutine profile: total") {
		t.Errorf("goroutine profile: %d %.200q", code, body)
	}
	code, body := getText(t, base+"/debug/pprof/profile?seconds=1")
	if code != http.StatusOK {
		t.Fatalf("CPU profile: %d %.200q", code, body)
	}
	zr, err := gzip.NewReader(strings.NewReader(body))
	if err != nil {
		t.Fatalf("CPU profile is not gzipped: %v", err)
	}
	if raw, err := io.ReadAll(zr); err != nil || len(raw) == 0 {
		t.Errorf("CPU profile: %d bytes, %v", len(raw), err)
	}
	if code, _ := getText(t, base+"/debug/pprof/cmdline"); code != http.StatusNotFound {
		t.Errorf("cmdline: %d, want 404", code)
	}
	for _, p := range []string{"profile?seconds=61", "profile?seconds=0", "profile?seconds=1e9", "trace?seconds=-1", "trace?seconds=99999999999999999999"} {
		if code, body := getText(t, base+"/debug/pprof/"+p); code != http.StatusBadRequest || !strings.Contains(body, "from 1 to 60") {
			t.Errorf("%s: %d %.200q, want 400 naming the bound", p, code, body)
		}
	}
	// A symbol lookup's body is read up to its bound, however long it runs.
	resp, err := http.Post(base+"/debug/pprof/symbol", "text/plain", strings.NewReader(strings.Repeat("0x1+", 1<<20)))
	if err != nil {
		t.Fatal(err)
	}
	sym, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(sym), "request body too large") {
		t.Errorf("a 4 MiB symbol lookup: %d %.200q, want its body cut at the bound", resp.StatusCode, sym)
	}
	// The rest of the admin API is unchanged.
	if code, _ := getText(t, base+"/healthz"); code != http.StatusOK {
		t.Errorf("/healthz with AdminPprof: %d", code)
	}
}
