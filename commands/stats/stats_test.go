package stats

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvctl/kvctl/commands/cmdutil"
	"github.com/kvctl/kvctl/commands/cmdutil/cmdtest"
	"github.com/kvctl/kvctl/core/daemon"
	"github.com/kvctl/kvctl/core/daemon/daemontest"
	"github.com/kvctl/kvctl/core/enginesim"
	"github.com/kvctl/kvctl/core/probe"
	corestats "github.com/kvctl/kvctl/core/stats"
	"github.com/kvctl/kvctl/mooncake/mooncaketest"
	"github.com/kvctl/kvctl/pool"
	"github.com/kvctl/kvctl/pool/embedded"
)

var update = flag.Bool("update", false, "rewrite golden files")

func TestFlags(t *testing.T) {
	tests := []struct {
		args    string
		check   func(t *testing.T, o *Options)
		wantErr string
	}{
		{args: "--pool a:1 --pool http://b:2", check: func(t *testing.T, o *Options) {
			if len(o.Pools) != 2 || o.Pools[1] != "http://b:2" || o.Timeout != 5*time.Second || o.Watch != 0 {
				t.Errorf("%+v", o)
			}
		}},
		{args: "--from-log x.log --watch 2 --timeout 1s", check: func(t *testing.T, o *Options) {
			if len(o.FromLog) != 1 || o.Watch != 2 || o.Timeout != time.Second {
				t.Errorf("%+v", o)
			}
		}},
		{args: "", wantErr: "give --pool URL or --from-log FILE"},
		{args: "--pool a:1 --watch -2", wantErr: "--watch -2"},
		{args: "--pool a:1 --timeout -1s", wantErr: "--timeout"},
		{args: "--pool a:1 extra", wantErr: "unknown command"},
	}
	for _, tt := range tests {
		t.Run(tt.args, func(t *testing.T) {
			f := cmdtest.Factory()
			var got *Options
			cmd := NewCmdStats(f, func(o *Options) error { got = o; return nil })
			err := cmdtest.Execute(t, cmd, tt.args)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("got %v, want an error containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, got)
		})
	}
}

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	cmdtest.Golden(t, name, got, *update)
}

func options(ios *cmdutil.IOStreams, format string) *Options {
	return &Options{IO: ios, Timeout: 5 * time.Second, OutputFormat: format, Seams: cmdutil.Seams{Now: func() time.Time { return time.Unix(0, 0).UTC() }}}
}

// masterReplay serves the real master's recorded responses by path, with the bodies of
// override in place of the recorded ones; paths it has no recording for get the master's
// recorded 404.
func masterReplay(t *testing.T, override map[string]string) *httptest.Server {
	load := func(name string) mooncaketest.Recording { return mooncaketest.Load(t, "populated", name) }
	byPath := map[string]mooncaketest.Recording{
		"/metrics":             load("metrics.txt"),
		"/metrics/summary":     load("metrics_summary.txt"),
		"/get_segments_detail": load("get_segments_detail.txt"),
		"/get_all_segments":    load("get_all_segments.txt"),
	}
	notFound := load("not_found_path.txt")
	for path, body := range override {
		rec, ok := byPath[path]
		if !ok {
			rec = notFound
		}
		rec.Body = []byte(body)
		byPath[path] = rec
	}
	return mooncaketest.ReplayServer(t, byPath, notFound)
}

func TestRecordedMaster(t *testing.T) {
	srv := masterReplay(t, nil)
	for _, format := range []string{"table", "json", "yaml"} {
		t.Run(format, func(t *testing.T) {
			ios, _, out, _ := cmdutil.Test()
			o := options(ios, format)
			o.Pools = []string{srv.URL}
			if err := runStats(context.Background(), o); err != nil {
				t.Fatal(err)
			}
			golden(t, "master."+format, []byte(strings.ReplaceAll(out.String(), srv.URL, "http://ADDR")))
		})
	}
	ios, _, out, _ := cmdutil.Test()
	o := options(ios, cmdutil.FormatJSON)
	o.Pools = []string{strings.TrimPrefix(srv.URL, "http://")}
	if err := runStats(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	var r probe.StatsReport
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatal(err)
	}
	s := r.Sources[0]
	if s.Kind != "mooncake-master" || s.Role != "leader" || s.Usage.CapacityBytes != 67108864 || s.Usage.UsedBytes != 1188864 ||
		s.Usage.Objects != 6 || s.Usage.SoftPinnedObjects != 2 || s.Gets.Misses != 3 || s.Gets.Hits != 0 ||
		len(s.Usage.Segments) != 1 || s.Usage.Segments[0].Name != "127.0.0.1:12806" || s.PrefixHoles != nil || s.Evictions.ByPass != nil {
		t.Errorf("%+v %+v %+v", s, s.Usage, s.Gets)
	}
}

// startServe runs a real kvctl serve daemon on a pool whose clock the test moves.
func startServe(t *testing.T) (*daemon.Daemon, *embedded.ManualClock, string) {
	t.Helper()
	clock := embedded.NewManualClock(time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC))
	po := embedded.DefaultOptions()
	po.Segments = []embedded.SegmentSpec{{Name: "seg0", Capacity: 16 << 20}}
	po.EvictionPeriod = 0
	po.Clock = clock
	r := daemontest.Start(t, daemon.Config{Pool: po, Version: "test"})
	return r.Daemon, clock, r.Info.AdminAddr
}

// script fills the pool past its high watermark with 1 MiB pages, some soft-pinned and some
// grouped, reads a few back (hits and misses), and runs one eviction round.
func script(t *testing.T, p *embedded.Embedded, clock *embedded.ManualClock) {
	t.Helper()
	ctx := context.Background()
	page := bytes.Repeat([]byte{7}, 1<<20)
	for i := 0; i < 15; i++ {
		cfg := pool.ReplicateConfig{}
		switch {
		case i < 3:
			cfg.SoftPinAction = pool.SoftPinEnable
		case i < 7:
			cfg.GroupIDs = []string{fmt.Sprintf("g%d", i/2)}
		}
		if c := p.BatchPut(ctx, []string{fmt.Sprintf("k%02d", i)}, [][]byte{page}, cfg); c[0] != pool.OK {
			t.Fatalf("put %d: %v", i, c[0])
		}
		clock.Advance(time.Second)
	}
	got := p.BatchGet(ctx, []string{"k00", "k14", "nope"}, buffers(3))
	if got[0] < 0 || got[1] < 0 || got[2] >= 0 {
		t.Fatalf("gets %v", got)
	}
	clock.Advance(time.Minute)
	if _, ran := p.EvictNow(); !ran {
		t.Fatal("no eviction round ran")
	}
}

// buffers returns n distinct 1 MiB get buffers: the pool writes each one concurrently.
func buffers(n int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		out[i] = make([]byte, 1<<20)
	}
	return out
}

func TestServe(t *testing.T) {
	d, clock, addr := startServe(t)
	script(t, d.Pool(), clock)
	for _, format := range []string{"table", "json", "yaml"} {
		t.Run(format, func(t *testing.T) {
			ios, _, out, _ := cmdutil.Test()
			o := options(ios, format)
			o.Pools = []string{addr}
			if err := runStats(context.Background(), o); err != nil {
				t.Fatal(err)
			}
			golden(t, "serve."+format, []byte(strings.ReplaceAll(out.String(), addr, "ADDR")))
		})
	}
	ios, _, out, _ := cmdutil.Test()
	o := options(ios, cmdutil.FormatJSON)
	o.Pools = []string{addr}
	if err := runStats(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	var r probe.StatsReport
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatal(err)
	}
	st, _ := d.Pool().Stats(context.Background())
	s := r.Sources[0]
	if s.Kind != "kvctl-serve" || s.Version != "test" || s.Gets.Hits != 2 || s.Gets.Misses != 1 || s.Usage.Objects != st.Objects ||
		*s.Usage.GroupedObjects != st.Detail[embedded.DetailGrouped] || s.Usage.SoftPinnedObjects != st.Detail[embedded.DetailSoftPinned] || s.Evictions.EvictedKeys == 0 ||
		s.Evictions.ByPass.Pass1+s.Evictions.ByPass.Pass2 != st.Detail[embedded.DetailEvictedPass1]+st.Detail[embedded.DetailEvictedPass2] || s.PrefixHoles == nil || s.Loads == nil {
		t.Errorf("%+v\nusage %+v\nevictions %+v\npool %+v", s, s.Usage, s.Evictions, st)
	}
}

// writeLog writes stats lines with core/stats' reporter in format, plus other lines.
func writeLog(t *testing.T, format string) string {
	t.Helper()
	var buf bytes.Buffer
	buf.WriteString("level=INFO msg=\"kvctl serve ready\"\n")
	var h slog.Handler = slog.NewTextHandler(&buf, nil)
	if format == "json" {
		h = slog.NewJSONHandler(&buf, nil)
	}
	h = dropTime{h}
	r, err := corestats.NewReporter(corestats.ReporterOptions{Interval: time.Second, Logger: slog.New(h).With("engine", "e0")})
	if err != nil {
		t.Fatal(err)
	}
	r.RecordLookup(corestats.HoleStats{Lookups: 3, LookedUpBlocks: 12, HitBlocks: 5, Holes: 2, HoleBlocks: 3, RecomputedStoredTokens: 96})
	s := &corestats.LoadSample{Pages: 16, StoreCalls: 2, LandedBytes: 1 << 20, Transfer: 4 * time.Millisecond}
	s.Phases[corestats.PhaseGet] = corestats.PhaseTime{Wall: 3 * time.Millisecond, CPU: time.Millisecond}
	r.RecordLoad(s)
	r.Flush()
	buf.WriteString("[TRT-LLM] [I] mooncake-store prefix-hole stats: lookups=1 looked_up_blocks=4 hit_blocks=1 holes=1 hole_blocks=1 recomputed_stored_tokens=64\n")
	buf.WriteString("[TRT-LLM] [I] mooncake-store rank 0 load stats: loads=1 pages=4 store_calls=1 landed_bytes=4096 transfer_ms mean=1.0 max=1.0 get_wall_ms=0.5 get_cpu_ms=0.25\n")
	path := filepath.Join(t.TempDir(), "connector-"+format+".log")
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// dropTime leaves the time out of log records so that the log, and the golden output, are stable.
type dropTime struct{ slog.Handler }

func (d dropTime) Handle(ctx context.Context, r slog.Record) error {
	r.Time = time.Time{}
	return d.Handler.Handle(ctx, r)
}
func (d dropTime) WithAttrs(a []slog.Attr) slog.Handler { return dropTime{d.Handler.WithAttrs(a)} }

func TestFromLog(t *testing.T) {
	for _, logFormat := range []string{"text", "json"} {
		path := writeLog(t, logFormat)
		for _, format := range []string{"table", "json", "yaml"} {
			t.Run(logFormat+"/"+format, func(t *testing.T) {
				ios, _, out, _ := cmdutil.Test()
				o := options(ios, format)
				o.FromLog = []string{path}
				if err := runStats(context.Background(), o); err != nil {
					t.Fatal(err)
				}
				// Both log formats give the same report.
				golden(t, "log."+format, []byte(strings.ReplaceAll(out.String(), path, "FILE")))
			})
		}
	}
	ios, _, out, _ := cmdutil.Test()
	o := options(ios, cmdutil.FormatJSON)
	o.FromLog = []string{writeLog(t, "text")}
	if err := runStats(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	var r probe.StatsReport
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatal(err)
	}
	s := r.Sources[0]
	want := corestats.HoleStats{Lookups: 4, LookedUpBlocks: 16, HitBlocks: 6, Holes: 3, HoleBlocks: 4, RecomputedStoredTokens: 160}
	if *s.PrefixHoles != want || s.Loads.Loads != 2 || s.Loads.Pages != 20 || s.Log.HoleLines != 2 || s.Log.LoadLines != 2 || s.Log.Skipped != 1 {
		t.Errorf("%+v %+v %+v", s.PrefixHoles, s.Loads, s.Log)
	}
}

func TestFromLogErrors(t *testing.T) {
	dir := t.TempDir()
	none := filepath.Join(dir, "none.log")
	os.WriteFile(none, []byte("level=INFO msg=started\nlevel=INFO msg=stopped\n"), 0o644)
	bad := filepath.Join(dir, "bad.log")
	os.WriteFile(bad, []byte("x\nmooncake-store prefix-hole stats: lookups=many\n"), 0o644)
	tests := []struct {
		file string
		code int
		want string
	}{
		{none, cmdutil.ExitValidation, "no \"prefix-hole stats\" or \"load stats\" lines among 2 lines"},
		{bad, cmdutil.ExitValidation, "1 malformed, the first at line 2"},
		{filepath.Join(dir, "missing.log"), cmdutil.ExitFailure, "missing.log"},
	}
	for _, tt := range tests {
		ios, _, _, _ := cmdutil.Test()
		o := options(ios, cmdutil.FormatTable)
		o.FromLog = []string{tt.file}
		err := runStats(context.Background(), o)
		if cmdutil.ExitCode(err) != tt.code || err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v (exit %d), want exit %d and %q", tt.file, err, cmdutil.ExitCode(err), tt.code, tt.want)
		}
	}
}

func TestPoolErrors(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-time.After(5 * time.Second):
		}
	}))
	defer slow.Close()
	badMetrics := masterReplay(t, map[string]string{"/metrics": "master_key_count{ 3\n"})
	badSummary := masterReplay(t, map[string]string{"/metrics/summary": "hello"})
	badServe := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`{"version":`))
	}))
	defer badServe.Close()

	tests := []struct {
		name, pool string
		code       int
		want       []string
	}{
		{"unreachable", closed, cmdutil.ExitUnreachable, []string{"pool http://" + closed + " is unreachable"}},
		{"timeout", slow.URL, cmdutil.ExitUnreachable, []string{"pool " + slow.URL + " did not answer within 200ms"}},
		{"malformed metrics", badMetrics.URL, cmdutil.ExitFailure, []string{"pool " + badMetrics.URL + " sent a response kvctl cannot read", "/metrics"}},
		{"malformed summary", badSummary.URL, cmdutil.ExitFailure, []string{"cannot read", "/metrics/summary"}},
		{"malformed stats", badServe.URL, cmdutil.ExitFailure, []string{"cannot read", "/v1/stats"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ios, _, out, _ := cmdutil.Test()
			o := options(ios, cmdutil.FormatTable)
			o.Pools = []string{tt.pool}
			o.Timeout = 200 * time.Millisecond
			err := runStats(context.Background(), o)
			if got := cmdutil.ExitCode(err); got != tt.code {
				t.Fatalf("exit %d (%v), want %d", got, err, tt.code)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("message %q lacks %q", err, w)
				}
			}
			if out.Len() != 0 {
				t.Errorf("nothing should reach stdout: %q", out)
			}
		})
	}
}

func TestWatchDeltas(t *testing.T) {
	d, clock, addr := startServe(t)
	script(t, d.Pool(), clock)
	master := masterReplay(t, nil)
	getMore := func() {
		d.Pool().BatchGet(context.Background(), []string{"k14", "k14", "k13", "gone"}, buffers(4))
	}

	t.Run("pipe", func(t *testing.T) {
		ios, _, out, _ := cmdutil.Test()
		o := options(ios, cmdutil.FormatJSON)
		o.Pools = []string{addr, master.URL}
		o.Watch, o.Iterations = 2, 2
		o.Sleep = func(context.Context, time.Duration) error { getMore(); return nil }
		if err := runStats(context.Background(), o); err != nil {
			t.Fatal(err)
		}
		dec := json.NewDecoder(out)
		var reports []probe.StatsReport
		for {
			var r probe.StatsReport
			if err := dec.Decode(&r); err == io.EOF {
				break
			} else if err != nil {
				t.Fatal(err)
			}
			reports = append(reports, r)
		}
		if len(reports) != 2 || reports[0].Sources[0].Delta != nil {
			t.Fatalf("want two reports, the first without deltas: %+v", reports)
		}
		if d := reports[1].Sources[0].Delta; d == nil || d.Hits != 3 || d.Misses != 1 {
			t.Errorf("serve delta %+v", d)
		}
		if d := reports[1].Sources[1].Delta; d == nil || *d != (probe.Counters{}) {
			t.Errorf("the recorded master does not change: %+v", d)
		}
	})

	t.Run("terminal", func(t *testing.T) {
		ios, _, out, _ := cmdutil.Test()
		ios.SetStdoutTTY(true)
		o := options(ios, cmdutil.FormatTable)
		o.Pools = []string{addr}
		o.Watch, o.Iterations = 5, 2
		o.Sleep = func(context.Context, time.Duration) error { getMore(); return nil }
		if err := runStats(context.Background(), o); err != nil {
			t.Fatal(err)
		}
		s := out.String()
		if strings.Count(s, "\x1b[H\x1b[2J") != 2 || !strings.Contains(s, "every 5s") || !strings.Contains(s, "+3") {
			t.Errorf("%q", s)
		}
	})

	t.Run("cancelled", func(t *testing.T) {
		ios, _, _, _ := cmdutil.Test()
		o := options(ios, cmdutil.FormatTable)
		o.Pools = []string{addr}
		o.Watch = 1
		ctx, cancel := context.WithCancel(context.Background())
		o.Sleep = func(ctx context.Context, _ time.Duration) error { cancel(); <-ctx.Done(); return ctx.Err() }
		if err := runStats(ctx, o); !errors.Is(err, context.Canceled) {
			t.Fatalf("%v", err)
		}
	})
}

// TestServeWithEngines reads the prefix-hole and load figures of a kvctl serve that real engines
// used over its engine socket: a cold engine saves, a warm engine loads every offered block, and
// kvctl stats must report what the daemon counted, including the engine that has gone.
func TestServeWithEngines(t *testing.T) {
	r := daemontest.Start(t, daemon.Config{})
	ctx := context.Background()
	const T = 16
	var reqs []enginesim.Request
	for i := range 6 {
		toks := make([]int64, 5*T+3)
		for j := range toks {
			toks[j] = int64(1000*i + j)
		}
		reqs = append(reqs, enginesim.Request{ID: fmt.Sprintf("r%d", i), Tokens: toks})
	}
	for _, name := range []string{"cold", "warm"} {
		e, err := enginesim.Start(ctx, enginesim.Config{Socket: r.Info.Socket, ModelKey: "m", Name: name, TokensPerBlock: T})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.Run(ctx, reqs, 0); err != nil {
			t.Fatal(err)
		}
		if err := e.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	ios, _, out, _ := cmdutil.Test()
	o := options(ios, cmdutil.FormatJSON)
	o.Pools = []string{r.Info.AdminAddr}
	if err := runStats(ctx, o); err != nil {
		t.Fatal(err)
	}
	var res probe.StatsReport
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatal(err)
	}
	s := res.Sources[0]
	// Each prompt has 5 full blocks; the lookup leaves the block of the last token, so the warm
	// engine hits 5 blocks per request (the last full block ends before the last token).
	want := int64(len(reqs) * 5)
	if s.PrefixHoles == nil || s.PrefixHoles.HitBlocks != want || s.PrefixHoles.Lookups != int64(2*len(reqs)) {
		t.Errorf("prefix holes %+v, want %d hit blocks over %d lookups", s.PrefixHoles, want, 2*len(reqs))
	}
	if s.Loads == nil || s.Loads.Pages != want || s.Loads.LandedBytes != want*4096 || s.Loads.FailedPages != 0 {
		t.Errorf("loads %+v, want %d pages of 4096 bytes", s.Loads, want)
	}
	if s.Engines == nil || *s.Engines != 0 {
		t.Errorf("engines %v, want 0 registered after both left", s.Engines)
	}
}

// TestSeveralPoolsOneDown reads a real kvctl serve and an address nothing listens on: every
// target that answers is printed, the dead one as an error row, and the exit code is the
// worst (4, unreachable), once and under --watch alike.
func TestSeveralPoolsOneDown(t *testing.T) {
	_, _, addr := startServe(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := l.Addr().String()
	l.Close()
	for _, watch := range []int{0, 1} {
		ios, _, out, errOut := cmdutil.Test()
		o := options(ios, "table")
		o.Pools = []string{addr, dead}
		o.Watch, o.Iterations = watch, 2
		o.Sleep = func(context.Context, time.Duration) error { return nil }
		err := runStats(context.Background(), o)
		if watch == 0 && cmdutil.ExitCode(err) != cmdutil.ExitUnreachable {
			t.Errorf("watch %d: exit %d (%v), want %d", watch, cmdutil.ExitCode(err), err, cmdutil.ExitUnreachable)
		}
		if watch == 1 && (err != nil || !strings.Contains(errOut.String(), dead)) {
			t.Errorf("watch: %v; stderr %q should name %s", err, errOut, dead)
		}
		got := out.String()
		if !strings.Contains(got, "http://"+addr+"\tkind\tkvctl-serve") || !strings.Contains(got, "http://"+dead+"\tkind\terror") ||
			!strings.Contains(got, "http://"+dead+"\terror\t") || !strings.Contains(got, "gets found ratio") {
			t.Errorf("watch %d: table lacks the healthy target, the error row or the get ratio label:\n%s", watch, got)
		}
		if watch == 1 && strings.Count(got, "kvctl-serve") != 2 {
			t.Errorf("watch: want two tables:\n%s", got)
		}
	}
}

// TestServeSavesAndHitRate pins the rows a kvctl serve adds: its prefix hit rate beside the
// pool's own gets (which are not called a hit ratio), and its saves with the failed ones. The
// daemon's 16 MiB pool cannot hold the 24 MiB of 1 MiB pages one request saves, so saves fail;
// the table, the JSON and --watch's deltas must all say as much as /v1/stats does.
func TestServeSavesAndHitRate(t *testing.T) {
	po := embedded.DefaultOptions()
	po.Segments = []embedded.SegmentSpec{{Name: "small", Capacity: 16 << 20}}
	r := daemontest.Start(t, daemon.Config{Pool: po})
	ctx := context.Background()
	const T = 16
	run := func(name string, blocks int) {
		t.Helper()
		toks := make([]int64, blocks*T+1)
		for j := range toks {
			toks[j] = int64(j)
		}
		e, err := enginesim.Start(ctx, enginesim.Config{Socket: r.Info.Socket, ModelKey: "m", Name: name, TokensPerBlock: T,
			PageBytes: []int{1 << 20}, Slots: blocks + 1})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.Run(ctx, []enginesim.Request{{ID: name, Tokens: toks}}, 0); err != nil {
			t.Fatal(err)
		}
		if err := e.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	run("fits", 4)
	run("too-big", 24)
	run("warm", 4)
	st, err := r.Daemon.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Saves.Saves == 0 || st.Saves.FailedSaves == 0 || st.Saves.FailedSaves == st.Saves.Saves || st.HitRates.Pool == 0 {
		t.Fatalf("the script did not make saves fail and others succeed, or no pool hits: saves %+v hit rates %+v", st.Saves, st.HitRates)
	}

	ios, _, out, _ := cmdutil.Test()
	o := options(ios, cmdutil.FormatTable)
	o.Pools = []string{r.Info.AdminAddr}
	if err := runStats(ctx, o); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	if strings.Contains(got, "hit ratio") {
		t.Errorf("the pool's get ratio is still called a hit ratio:\n%s", got)
	}
	row := func(metric string) string {
		for _, l := range strings.Split(got, "\n") {
			f := strings.Split(l, "\t")
			if len(f) == 4 && f[1] == metric {
				return f[2]
			}
		}
		t.Errorf("no %q row:\n%s", metric, got)
		return ""
	}
	sv := st.Saves
	wantRate := fmt.Sprintf("%.2f%% (%.2f%% local, %.2f%% pool) of %d prompt tokens", 100*st.HitRates.Total, 100*st.HitRates.Local, 100*st.HitRates.Pool, st.HitRates.PromptTokens)
	for metric, want := range map[string]string{
		"saves":           fmt.Sprint(sv.Saves),
		"failed saves":    fmt.Sprint(sv.FailedSaves),
		"save pages":      fmt.Sprintf("%d (%d stored, %d already in the pool, %d failed, %d refused)", sv.Pages, sv.PutPages, sv.SkippedPages, sv.FailedPages, sv.RefusedPages),
		"prefix hit rate": wantRate,
		"gets found":      fmt.Sprint(st.Pool.Hits),
	} {
		if g := row(metric); g != want {
			t.Errorf("%s: %q, want %q", metric, g, want)
		}
	}
	row("gets found ratio")

	ios, _, out, _ = cmdutil.Test()
	o = options(ios, cmdutil.FormatJSON)
	o.Pools = []string{r.Info.AdminAddr}
	if err := runStats(ctx, o); err != nil {
		t.Fatal(err)
	}
	var res probe.StatsReport
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatal(err)
	}
	s := res.Sources[0]
	if s.Saves == nil || *s.Saves != sv || s.HitRates == nil || *s.HitRates != st.HitRates {
		t.Errorf("JSON saves %+v hit rates %+v; /v1/stats says %+v %+v", s.Saves, s.HitRates, sv, st.HitRates)
	}

	// --watch: a failed save between two reports shows in the deltas.
	ios, _, out, _ = cmdutil.Test()
	o = options(ios, cmdutil.FormatJSON)
	o.Pools = []string{r.Info.AdminAddr}
	o.Watch, o.Iterations = 1, 2
	o.Sleep = func(context.Context, time.Duration) error { run("too-big-again", 24); return nil }
	if err := runStats(ctx, o); err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(out.Bytes()))
	var reports []probe.StatsReport
	for dec.More() {
		var rep probe.StatsReport
		if err := dec.Decode(&rep); err != nil {
			t.Fatal(err)
		}
		reports = append(reports, rep)
	}
	if len(reports) != 2 || reports[1].Sources[0].Delta == nil || reports[1].Sources[0].Delta.Saves == 0 || reports[1].Sources[0].Delta.FailedSaves == 0 {
		t.Fatalf("watch deltas: %+v", reports)
	}
}
