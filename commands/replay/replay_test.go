package replay

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvctl/kvctl/commands/cmdutil"
	"github.com/kvctl/kvctl/commands/cmdutil/cmdtest"
)

func TestFlags(t *testing.T) {
	tests := []struct {
		args    string
		check   func(*testing.T, *Options)
		wantErr string
	}{
		{args: "trace.jsonl", check: func(t *testing.T, o *Options) {
			if o.Trace != "trace.jsonl" || o.Format != "auto" || o.PoolSize != "unlimited" || o.Ranks != 1 || o.Router != "work-aware" || o.Target != "" {
				t.Errorf("%+v", o)
			}
		}},
		{args: "--set soft_pin_ttl_ms=0,600000 --set group_blocks=false,true --pool-size 2TiB --ranks 4 --plot p.png -", check: func(t *testing.T, o *Options) {
			if len(o.Sets) != 2 || o.Sets[1] != "group_blocks=false,true" || o.PoolSize != "2TiB" || o.Ranks != 4 || o.Plot != "p.png" || o.Trace != "-" {
				t.Errorf("%+v", o)
			}
		}},
		{args: "--target /tmp/e.sock --engines 3 --pace max t", check: func(t *testing.T, o *Options) {
			if o.Target != "/tmp/e.sock" || o.Engines != 3 || o.Pace != PaceMax || o.NoCallChannels {
				t.Errorf("%+v", o)
			}
		}},
		{args: "--target /tmp/e.sock --no-call-channels t", check: func(t *testing.T, o *Options) {
			if !o.NoCallChannels {
				t.Errorf("--no-call-channels: %+v", o)
			}
		}},
		{args: "--no-call-channels t", wantErr: "need --target"},
		{args: "--live --pace max t", check: func(t *testing.T, o *Options) {
			if o.Target != filepath.Join(os.TempDir(), fmt.Sprintf("kvctl-%d", os.Getuid()), "kvctl.sock") || o.Pace != PaceMax {
				t.Errorf("--live must target kvctl serve's default socket: %+v", o)
			}
		}},
		{args: "--live --target x t", wantErr: "--live and --target"},
		{args: "", wantErr: "exactly one TRACE"},
		{args: "a b", wantErr: "exactly one TRACE"},
		{args: "--format csv t", wantErr: "--format"},
		{args: "--pace slow --target x t", wantErr: "--pace"},
		{args: "--engines 0 --target x t", wantErr: "--engines"},
		{args: "--speed 0 --target x t", wantErr: "--speed"},
		{args: "--engines 2 t", wantErr: "need --target"},
		{args: "--target x --set ranks=1,2 t", wantErr: "--set"},
		{args: "--limit -1 t", wantErr: "--limit"},
	}
	for _, tt := range tests {
		t.Run(tt.args, func(t *testing.T) {
			f := cmdtest.Factory()
			var got *Options
			cmd := NewCmdReplay(f, func(_ context.Context, o *Options) error { got = o; return nil })
			err := cmdtest.Execute(t, cmd, tt.args)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || cmdutil.ExitCode(err) != cmdutil.ExitUsage {
					t.Fatalf("got %v, want a usage error containing %q", err, tt.wantErr)
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

func TestParamsRejectBadValues(t *testing.T) {
	base := func() *Options {
		return &Options{PoolSize: "unlimited", Ranks: 1, Router: "work-aware", GPU: 64, TokensPerBlock: 16,
			PageSize: "64MiB", SimPageSize: 64, LoadBandwidth: "25GiB", SaveBandwidth: "25GiB", PrefillRate: 1, DecodeRate: 1}
	}
	for name, mod := range map[string]func(*Options){
		"page-size":        func(o *Options) { o.PageSize = "0" },
		"load-bandwidth":   func(o *Options) { o.LoadBandwidth = "fast" },
		"pool-size":        func(o *Options) { o.PoolSize = "-1" },
		"ranks":            func(o *Options) { o.Ranks = 0 },
		"router":           func(o *Options) { o.Router = "random" },
		"tokens per block": func(o *Options) { o.TokensPerBlock = 0 },
		"prefill rate":     func(o *Options) { o.PrefillRate = 0 },
	} {
		o := base()
		mod(o)
		_, _, err := params(o)
		if err == nil || cmdutil.ExitCode(err) != cmdutil.ExitUsage || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: got %v, want a usage error naming it", name, err)
		}
	}
	if _, _, err := params(base()); err != nil {
		t.Fatal(err)
	}
}

func TestRunTableAndProgress(t *testing.T) {
	ios, _, out, errOut := cmdutil.Test()
	ios.SetStderrTTY(true)
	o := &Options{IO: ios, Trace: "../../core/replay/testdata/conversation_head500.jsonl", Format: "auto", Limit: 50,
		PoolSize: "unlimited", Ranks: 2, Router: "prompt-length", GPU: 256, TokensPerBlock: 16, PageSize: "64MiB",
		SimPageSize: 64, LoadBandwidth: "25GiB", SaveBandwidth: "25GiB", PrefillRate: 50000, DecodeRate: 50,
		Seed: 1, Pace: PaceTrace, Engines: 1, Speed: 1, OutputFormat: cmdutil.FormatTable}
	if err := runReplay(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "RUN\tREQUESTS\tLOCAL") || !strings.HasPrefix(lines[1], "base\t50\t") {
		t.Fatalf("table:\n%s", out)
	}
	if !strings.Contains(errOut.String(), "50/50 requests") {
		t.Fatalf("no progress bar on a terminal: %q", errOut)
	}
}

// The scheduler model's table columns and JSON fields are a contract.
func TestSchedulerModelReport(t *testing.T) {
	base := func(format string) (*Options, *bytes.Buffer) {
		ios, _, out, _ := cmdutil.Test()
		return &Options{IO: ios, Trace: "../../core/replay/testdata/conversation_head500.jsonl", Format: "auto", Limit: 40,
			PoolSize: "unlimited", Ranks: 1, Router: "work-aware", GPU: 256, TokensPerBlock: 16, PageSize: "64MiB",
			SimPageSize: 64, LoadBandwidth: "25GiB", SaveBandwidth: "25GiB", PrefillRate: 50000, DecodeRate: 50,
			Seed: 1, Pace: PaceTrace, Engines: 1, Speed: 1, OutputFormat: format,
			Sets: []string{"scheduler=true", "server=generation", "completion_reservation=false,true"}}, out
	}
	o, out := base(cmdutil.FormatTable)
	if err := runReplay(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 3 || !strings.HasSuffix(lines[0], "\tADMITTED\tDEFERRED\tWAITED\tRESERVED_PEAK\tPREEMPTED") {
		t.Fatalf("table:\n%s", out)
	}
	o, out = base(cmdutil.FormatJSON)
	if err := runReplay(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Runs []struct {
			Scheduler map[string]any `json:"scheduler"`
		} `json:"runs"`
	}
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatal(err)
	}
	want := []string{"passes", "admissions", "admission_queries", "offers_covered", "deferrals", "offers_shrunk",
		"uncharged_parks", "parked", "reservations_refused", "refused_freed", "peak_reservations_held",
		"peak_reserved_blocks", "requests_waited", "wait_passes", "preemptions", "preempted_requests", "long_prefills_demoted"}
	if len(rep.Runs) != 2 {
		t.Fatalf("%d runs", len(rep.Runs))
	}
	for _, r := range rep.Runs {
		for _, k := range want {
			if _, ok := r.Scheduler[k]; !ok {
				t.Fatalf("scheduler object lacks %q: %v", k, r.Scheduler)
			}
		}
		if len(r.Scheduler) != len(want) {
			t.Fatalf("scheduler object has %d fields, want %d: %v", len(r.Scheduler), len(want), r.Scheduler)
		}
		if r.Scheduler["admissions"].(float64) < 40 {
			t.Fatalf("%v admissions for 40 requests", r.Scheduler["admissions"])
		}
	}
	if rep.Runs[1].Scheduler["preemptions"].(float64) != 0 {
		t.Fatalf("with completion reservations %v requests were preempted", rep.Runs[1].Scheduler["preemptions"])
	}
}
