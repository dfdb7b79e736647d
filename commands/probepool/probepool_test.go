package probepool

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvctl/kvctl/commands/cmdutil"
	"github.com/kvctl/kvctl/commands/cmdutil/cmdtest"
	"github.com/kvctl/kvctl/core/daemon"
	"github.com/kvctl/kvctl/core/daemon/daemontest"
	"github.com/kvctl/kvctl/core/keys"
	"github.com/kvctl/kvctl/core/probe"
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
		{args: "--pool 127.0.0.1:9003 --model-key m --layer-group 0:64 1 2 3", check: func(t *testing.T, o *Options) {
			if o.Pool != "127.0.0.1:9003" || o.Timeout != 5*time.Second || o.Watch != 0 || o.HasExpectHit || o.RenewLeases {
				t.Errorf("defaults: %+v", o)
			}
			if o.Keys.ModelKey != "m" || len(o.Keys.LayerGroups) != 1 || strings.Join(o.Keys.Args, " ") != "1 2 3" || o.Keys.KeySet != keys.KeySetLookup {
				t.Errorf("key inputs: %+v", o.Keys)
			}
		}},
		{args: "--pool h:1 --tokens-file p.json --expect-hit 0 --renew-leases --timeout 250ms --cache-salt s", check: func(t *testing.T, o *Options) {
			if !o.HasExpectHit || o.ExpectHit != 0 || !o.RenewLeases || o.Timeout != 250*time.Millisecond || !o.Keys.HasCacheSalt {
				t.Errorf("%+v", o)
			}
		}},
		{args: "--pool h:1 --watch 2 1", check: func(t *testing.T, o *Options) {
			if o.Watch != 2 {
				t.Errorf("watch %d", o.Watch)
			}
		}},
		{args: "1 2", wantErr: "--pool is required"},
		{args: "--pool h:1", wantErr: "no tokens"},
		{args: "--pool h:1 --watch -1 1", wantErr: "--watch -1"},
		{args: "--pool h:1 --watch 1 --expect-hit 2 1", wantErr: "cannot be combined"},
		{args: "--pool h:1 --expect-hit -1 1", wantErr: "must not be negative"},
		{args: "--pool h:1 --timeout 0s 1", wantErr: "--timeout"},
	}
	for _, tt := range tests {
		t.Run(tt.args, func(t *testing.T) {
			f := cmdtest.Factory()
			var got *Options
			cmd := NewCmdProbePool(f, func(o *Options) error { got = o; return nil })
			err := cmdtest.Execute(t, cmd, tt.args)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("got %v, want an error containing %q", err, tt.wantErr)
				}
				if cmdutil.ExitCode(err) != cmdutil.ExitUsage {
					t.Errorf("exit code %d, want 2", cmdutil.ExitCode(err))
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

// The prompt of the tests: 10 full blocks of 4 tokens and a 2-token tail, keyed for an
// attention world of 2 with two layer groups, the second with replicated pages: 5 keys a block.
func promptKeys(ios *cmdutil.IOStreams) *cmdutil.KeyFlags {
	var toks []string
	for i := 0; i < 42; i++ {
		toks = append(toks, string(rune('0'+i%10)))
	}
	return &cmdutil.KeyFlags{
		Args: []string{strings.Join(toks, " ")}, Format: "trtllm", TokensPerBlock: 4,
		Namespace: "trtllm", ModelKey: "llama-test", WorldSize: 2, Rank: 1,
		LayerGroups: []string{"0:64", "1:32"}, Replicated: []string{"1:16"}, KeySet: keys.KeySetLookup,
	}
}

// deriveLayout reads the prompt o describes and derives its lookup keys, as probe-pool does.
func deriveLayout(t *testing.T, o *cmdutil.KeyFlags) *keys.Derivation {
	t.Helper()
	ios, _, _, _ := cmdutil.Test()
	s, err := o.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	p, err := derivePrompt(&Options{IO: ios, Keys: o}, s)
	if err != nil {
		t.Fatal(err)
	}
	return p.Derivation
}

func options(ios *cmdutil.IOStreams, pool, format string) *Options {
	return &Options{IO: ios, Keys: promptKeys(ios), Pool: pool, Timeout: 5 * time.Second, OutputFormat: format, Seams: cmdutil.Seams{Now: func() time.Time { return time.Unix(0, 0).UTC() }}}
}

// startServe runs a real kvctl serve daemon with a small pool and returns it with its admin
// address.
func startServe(t *testing.T) (*daemon.Daemon, string) {
	t.Helper()
	po := embedded.DefaultOptions()
	po.Segments = []embedded.SegmentSpec{{Name: "seg0", Capacity: 16 << 20}}
	po.EvictionPeriod = 0
	r := daemontest.Start(t, daemon.Config{Pool: po, AdminGrantsLeases: true})
	return r.Daemon, r.Info.AdminAddr
}

// populate puts every key of the prompt, then removes keys the way eviction would leave them:
// block 2 loses one peer shard's page, blocks 3 and 6 lose every page, and blocks 8 and 9 lose
// their replicated page. So blocks 0-1 hit, 2-3 and 6 are holes, 4-5 and 7 are stored but
// recomputed, and 8-9 are missing at the end.
func populate(t *testing.T, p *embedded.Embedded) []keys.BlockKeys {
	t.Helper()
	ios, _, _, _ := cmdutil.Test()
	o := promptKeys(ios)
	layout := deriveLayout(t, o)
	ctx := context.Background()
	for _, b := range layout.Blocks {
		bufs := make([][]byte, len(b.Keys))
		for i := range bufs {
			bufs[i] = bytes.Repeat([]byte{byte(b.Index)}, 16)
		}
		for i, c := range p.BatchPut(ctx, b.Keys, bufs, pool.ReplicateConfig{}) {
			if c != pool.OK {
				t.Fatalf("put %s: %v", b.Keys[i], c)
			}
		}
	}
	remove := func(k string) {
		if c := p.Remove(ctx, k, true); c != pool.OK {
			t.Fatalf("remove %s: %v", k, c)
		}
	}
	remove(layout.Blocks[2].Keys[3]) // w2r1/lg1
	for _, bi := range []int{3, 6} {
		for _, k := range layout.Blocks[bi].Keys {
			remove(k)
		}
	}
	for _, bi := range []int{8, 9} {
		remove(layout.Blocks[bi].Keys[4]) // replicated/lg1
	}
	return layout.Blocks
}

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	cmdtest.Golden(t, name, got, *update)
}

func TestProbeServe(t *testing.T) {
	d, addr := startServe(t)
	populate(t, d.Pool())
	for _, format := range []string{"table", "json", "yaml"} {
		t.Run(format, func(t *testing.T) {
			ios, _, out, _ := cmdutil.Test()
			if err := runProbePool(context.Background(), options(ios, addr, format)); err != nil {
				t.Fatal(err)
			}
			got := strings.ReplaceAll(out.String(), addr, "ADDR")
			golden(t, "serve."+format, []byte(got))
		})
	}

	ios, _, out, _ := cmdutil.Test()
	if err := runProbePool(context.Background(), options(ios, "http://"+addr, cmdutil.FormatJSON)); err != nil {
		t.Fatal(err)
	}
	var r probe.Report
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatal(err)
	}
	s := r.Summary
	if r.Target != "kvctl-serve" || s.Blocks != 10 || s.HitBlocks != 2 || s.HitTokens != 8 || s.Holes != 2 || s.HoleBlocks != 3 || s.MissingBlocks != 2 || s.RecomputedStoredTokens != 12 {
		t.Fatalf("summary %+v target %s", s, r.Target)
	}
	want := []probe.HoleReport{
		{StartBlock: 2, Blocks: 2, StartToken: 8, EndToken: 16, StoredBlocksBehind: 2, RecomputedStoredTokens: 8},
		{StartBlock: 6, Blocks: 1, StartToken: 24, EndToken: 28, StoredBlocksBehind: 1, RecomputedStoredTokens: 4},
	}
	if len(r.Holes) != 2 || r.Holes[0] != want[0] || r.Holes[1] != want[1] {
		t.Errorf("holes %+v", r.Holes)
	}
	var states []string
	for _, b := range r.Blocks {
		states = append(states, b.State)
	}
	if strings.Join(states, " ") != "hit hit hole hole stored stored hole stored missing missing" {
		t.Errorf("states %v", states)
	}
	if s.KeysChecked != 50 || s.KeysPresent != 50-1-10-2 {
		t.Errorf("keys %d/%d", s.KeysPresent, s.KeysChecked)
	}
	if m, _ := d.Pool().Metrics(context.Background()); m.QueryKeyRequests != 0 || m.Stats.Hits != 0 {
		t.Errorf("a read-only probe must not touch leases or counters: %d query_key, %d hits", m.QueryKeyRequests, m.Stats.Hits)
	}
}

func TestProbeServeRenewLeases(t *testing.T) {
	d, addr := startServe(t)
	blocks := populate(t, d.Pool())
	ios, _, out, _ := cmdutil.Test()
	o := options(ios, addr, cmdutil.FormatJSON)
	o.RenewLeases = true
	if err := runProbePool(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	var r probe.Report
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatal(err)
	}
	if r.Query != "query_key" || r.Summary.HitBlocks != 2 || r.Summary.Holes != 2 {
		t.Fatalf("%+v", r.Summary)
	}
	if _, ok := d.Pool().LeaseDeadline(blocks[0].Keys[0]); !ok {
		t.Error("the probed key has no lease deadline")
	}
	if m, _ := d.Pool().Metrics(context.Background()); m.QueryKeyRequests != 50 {
		t.Errorf("every key is asked of /query_key: %d requests, want 50", m.QueryKeyRequests)
	}
}

func TestExpectHit(t *testing.T) {
	d, addr := startServe(t)
	populate(t, d.Pool())
	for _, tt := range []struct {
		n    int
		code int
	}{{2, 0}, {3, cmdutil.ExitValidation}} {
		ios, _, _, _ := cmdutil.Test()
		o := options(ios, addr, cmdutil.FormatJSON)
		o.ExpectHit, o.HasExpectHit = tt.n, true
		err := runProbePool(context.Background(), o)
		if cmdutil.ExitCode(err) != tt.code {
			t.Errorf("--expect-hit %d: %v, want exit %d", tt.n, err, tt.code)
		}
		if err != nil && !strings.Contains(err.Error(), "expected at least 3 blocks to hit, got 2 of 10") {
			t.Errorf("message: %v", err)
		}
	}
}

// masterReplay serves the real master's recorded responses. /batch_query_keys answers each key
// with the master's recorded entry for a present key ("a") or for a missing one, as present
// says; every path the master does not serve gets its recorded 404.
func masterReplay(t *testing.T, present func(string) bool) *httptest.Server {
	batch := mooncaketest.Load(t, "populated", "batch_query_keys.txt")
	notFound := mooncaketest.Load(t, "populated", "not_found_path.txt")
	var recorded struct {
		Data map[string]json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(batch.Body, &recorded); err != nil {
		t.Fatal(err)
	}
	hit, miss := recorded.Data["a"], recorded.Data["missing_key"]
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/batch_query_keys" {
			notFound.ServeHTTP(w, r)
			return
		}
		raw, _ := url.QueryUnescape(r.URL.RawQuery[len("keys="):])
		var b bytes.Buffer
		b.WriteString(`{"success":true,"data":{`)
		for i, k := range strings.Split(raw, ",") {
			if i > 0 {
				b.WriteByte(',')
			}
			kj, _ := json.Marshal(k)
			b.Write(kj)
			b.WriteByte(':')
			if present(k) {
				b.Write(hit)
			} else {
				b.Write(miss)
			}
		}
		b.WriteString(`}}`)
		answer := batch
		answer.Body = b.Bytes()
		answer.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv
}

func TestFromConfig(t *testing.T) {
	d, addr := startServe(t)
	populate(t, d.Pool())
	yaml := filepath.Join(t.TempDir(), "llm_api.yaml")
	os.WriteFile(yaml, []byte("tensor_parallel_size: 2\nkv_cache_config:\n  tokens_per_block: 4\nkv_connector_config:\n  connector: mooncake-store\n  mooncake_store:\n    pool: 127.0.0.1:50051\n    model_key: llama-test\n"), 0o644)
	ios, _, out, _ := cmdutil.Test()
	o := options(ios, addr, cmdutil.FormatJSON)
	o.Keys.ModelKey, o.Keys.TokensPerBlock, o.Keys.WorldSize = "", 32, 1
	o.Keys.FromConfig = []string{yaml}
	if err := runProbePool(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	var r probe.Report
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatal(err)
	}
	if r.ModelKey != "llama-test" || r.TokensPerBlock != 4 || r.Summary.HitBlocks != 2 || r.Summary.Holes != 2 {
		t.Errorf("model %q T %d summary %+v", r.ModelKey, r.TokensPerBlock, r.Summary)
	}
}

func TestTableColour(t *testing.T) {
	d, addr := startServe(t)
	populate(t, d.Pool())
	for _, colour := range []bool{true, false} {
		ios, _, out, _ := cmdutil.Test()
		ios.SetStdoutTTY(true)
		ios.SetColorEnabled(colour)
		if err := runProbePool(context.Background(), options(ios, addr, cmdutil.FormatTable)); err != nil {
			t.Fatal(err)
		}
		s := out.String()
		if got := strings.Contains(s, "\x1b["); got != colour {
			t.Errorf("colour %v: escape sequences %v:\n%s", colour, got, s)
		}
		if !strings.Contains(s, "hole at block 6 (tokens 24-28)") || !strings.Contains(s, "MISSING") {
			t.Errorf("terminal table:\n%s", s)
		}
	}
}

func TestProbeRecordedMaster(t *testing.T) {
	ios, _, _, _ := cmdutil.Test()
	o := promptKeys(ios)
	layout := deriveLayout(t, o)
	// The master holds blocks 0-4 and 7, but block 2 lacks its replicated page.
	present := map[string]bool{}
	for _, bi := range []int{0, 1, 2, 3, 4, 7} {
		for _, k := range layout.Blocks[bi].Keys {
			present[k] = true
		}
	}
	delete(present, layout.Blocks[2].Keys[4])
	srv := masterReplay(t, func(k string) bool { return present[k] })

	ios, _, out, _ := cmdutil.Test()
	if err := runProbePool(context.Background(), options(ios, srv.URL, cmdutil.FormatJSON)); err != nil {
		t.Fatal(err)
	}
	var r probe.Report
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatal(err)
	}
	s := r.Summary
	if r.Target != "mooncake-master" || s.HitBlocks != 2 || s.Holes != 2 || s.HoleBlocks != 3 || s.RecomputedStoredTokens != 12 || s.MissingBlocks != 2 {
		t.Fatalf("target %s summary %+v holes %+v", r.Target, s, r.Holes)
	}
	if r.Blocks[2].PresentKeys != 4 || r.Blocks[2].Keys[4].Present {
		t.Errorf("block 2: %+v", r.Blocks[2])
	}
}

func TestPoolErrors(t *testing.T) {
	// A port nothing listens on.
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
	garbage := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/batch_query_keys" {
			w.Write([]byte(`{"success":tru`))
			return
		}
		http.NotFound(w, r)
	}))
	defer garbage.Close()
	notPool := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusForbidden)
	}))
	defer notPool.Close()

	tests := []struct {
		name, pool string
		code       int
		want       []string
	}{
		{"unreachable", closed, cmdutil.ExitUnreachable, []string{"pool http://" + closed + " is unreachable"}},
		{"timeout", slow.URL, cmdutil.ExitUnreachable, []string{"pool " + slow.URL + " did not answer within 200ms"}},
		{"malformed", garbage.URL, cmdutil.ExitFailure, []string{"pool " + garbage.URL + " sent a response kvctl cannot read", "malformed response"}},
		{"not a pool", notPool.URL, cmdutil.ExitFailure, []string{"HTTP 403", "not a Mooncake master or kvctl serve"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ios, _, out, _ := cmdutil.Test()
			o := options(ios, tt.pool, cmdutil.FormatTable)
			o.Timeout = 200 * time.Millisecond
			err := runProbePool(context.Background(), o)
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

func TestWatch(t *testing.T) {
	d, addr := startServe(t)
	blocks := populate(t, d.Pool())

	t.Run("terminal redraws in place", func(t *testing.T) {
		ios, _, out, _ := cmdutil.Test()
		ios.SetStdoutTTY(true)
		o := options(ios, addr, cmdutil.FormatTable)
		o.Watch, o.Iterations = 3, 2
		var slept []time.Duration
		o.Sleep = func(_ context.Context, wait time.Duration) error {
			slept = append(slept, wait)
			// Between the two reports the pool loses block 1, so the hit shrinks.
			for _, k := range blocks[1].Keys {
				d.Pool().Remove(context.Background(), k, true)
			}
			return nil
		}
		if err := runProbePool(context.Background(), o); err != nil {
			t.Fatal(err)
		}
		s := out.String()
		if strings.Count(s, "\x1b[H\x1b[2J") != 2 || len(slept) != 1 || slept[0] != 3*time.Second {
			t.Fatalf("want two redraws and one 3s wait, got %v:\n%q", slept, s)
		}
		if !strings.Contains(s, "every 3s: http://"+addr) || !strings.Contains(s, ": 2 of 10 blocks hit") || !strings.Contains(s, ": 1 of 10 blocks hit") {
			t.Errorf("reports:\n%s", s)
		}
	})

	t.Run("pipe gets one JSON document per interval", func(t *testing.T) {
		ios, _, out, _ := cmdutil.Test()
		o := options(ios, addr, cmdutil.FormatJSON)
		o.Watch, o.Iterations = 1, 2
		o.Sleep = func(context.Context, time.Duration) error { return nil }
		if err := runProbePool(context.Background(), o); err != nil {
			t.Fatal(err)
		}
		dec := json.NewDecoder(out)
		n := 0
		for {
			var r probe.Report
			if err := dec.Decode(&r); err == io.EOF {
				break
			} else if err != nil {
				t.Fatal(err)
			}
			n++
		}
		if n != 2 || strings.Contains(out.String(), "\x1b[") {
			t.Errorf("%d documents", n)
		}
	})

	t.Run("cancelled", func(t *testing.T) {
		ios, _, out, _ := cmdutil.Test()
		o := options(ios, addr, cmdutil.FormatTable)
		o.Watch = 1
		ctx, cancel := context.WithCancel(context.Background())
		o.Sleep = func(ctx context.Context, _ time.Duration) error { cancel(); <-ctx.Done(); return ctx.Err() }
		err := runProbePool(ctx, o)
		if !errors.Is(err, context.Canceled) || cmdutil.ExitCode(err) != cmdutil.ExitInterrupted {
			t.Fatalf("%v", err)
		}
		if !strings.Contains(out.String(), "blocks hit") {
			t.Error("the first report comes before the first wait")
		}
	})
}

func TestRunNeedsKeys(t *testing.T) {
	ios, _, _, _ := cmdutil.Test()
	o := options(ios, "127.0.0.1:1", cmdutil.FormatJSON)
	o.Keys.LayerGroups = nil
	if err := runProbePool(context.Background(), o); cmdutil.ExitCode(err) != cmdutil.ExitUsage || !strings.Contains(err.Error(), "--layer-group") {
		t.Errorf("%v", err)
	}
	o = options(ios, "127.0.0.1:1", cmdutil.FormatJSON)
	o.Keys.ModelKey = ""
	if err := runProbePool(context.Background(), o); cmdutil.ExitCode(err) != cmdutil.ExitUsage || !strings.Contains(err.Error(), "--model-key") {
		t.Errorf("%v", err)
	}
}

func TestWatchKeepsGoingWhenThePoolIsDown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	ios, _, out, errOut := cmdutil.Test()
	o := options(ios, addr, cmdutil.FormatTable)
	o.Watch, o.Iterations = 1, 2
	o.Sleep = func(context.Context, time.Duration) error { return nil }
	if err := runProbePool(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(errOut.String(), "pool http://"+addr+" is unreachable"); n != 2 || out.Len() != 0 {
		t.Errorf("want two warnings and no report, got %d:\n%s", n, errOut)
	}
}
