package main

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/kvctl/kvctl/commands/cmdutil"
)

// TestReplayLiveSaysWhatTheDaemonDid replays against real `kvctl serve` processes: a healthy
// one, one that is not ready (its Mooncake master does not answer, so no save reaches the pool:
// each counts as dropped before joining, not as failed), and a ready one whose pool is too small
// for the replay's pages (most saves fail). Only the first may exit 0; the others print their
// report, name the lost saves and exit 3 (a replay check that did not hold), the unready one
// with a warning as the run starts.
func TestReplayLiveSaysWhatTheDaemonDid(t *testing.T) {
	const trace = "../../core/replay/testdata/conversation_head500.jsonl"
	tests := []struct {
		name      string
		serve     []string
		replay    string
		code      int
		ready     string
		failed    bool
		notJoined bool // saves dropped before the daemon joined its pool: not failures
		warning   string
		errorText string
	}{
		{name: "healthy", code: 0, ready: "yes"},
		{name: "not ready", serve: []string{"--pool-backend", "mooncake", "--master", "127.0.0.1:1", "--metadata", "http://127.0.0.1:1/metadata", "--pool-size", "64MiB"},
			code: 3, ready: "no", notJoined: true, warning: "kvctl serve is not ready (waiting for the Mooncake master 127.0.0.1:1",
			errorText: "kvctl serve was not ready when the replay started or ended"},
		{name: "saves fail", serve: []string{"--pool-size", "16MiB"}, replay: "--sim-page-size 1048576",
			code: 3, ready: "yes", failed: true, errorText: "saves failed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			socket := shortSocket(t)
			p := startServe(t, socket, tt.serve...)
			args := "replay --target " + socket + " --admin " + p.admin + " --limit 12 --pace max " + tt.replay + " " + trace
			ios, _, stdout, stderr := cmdutil.Test()
			code := runWith(strings.Fields(args), ios, os.Getenv)
			if code != tt.code {
				t.Fatalf("kvctl %s exited %d, want %d\nstdout: %s\nstderr: %s", args, code, tt.code, stdout, stderr)
			}
			lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
			if len(lines) != 2 || !strings.HasSuffix(lines[0], "\tREADY\tSAVES\tFAILED_SAVES") {
				t.Fatalf("table:\n%s", stdout)
			}
			row := strings.Split(lines[1], "\t")
			ready, saves, failed := row[len(row)-3], row[len(row)-2], row[len(row)-1]
			if ready != tt.ready || saves == "0" || saves == "?" || (failed != "0") != tt.failed {
				t.Fatalf("READY %s SAVES %s FAILED_SAVES %s; want READY %s, saves, failures %v\n%s\nstderr: %s", ready, saves, failed, tt.ready, tt.failed, stdout, stderr)
			}
			if tt.warning != "" && !strings.Contains(stderr.String(), "warning: "+tt.warning) {
				t.Errorf("no warning %q:\n%s", tt.warning, stderr)
			}
			if tt.errorText != "" && !strings.Contains(stderr.String(), tt.errorText) {
				t.Errorf("error lacks %q:\n%s", tt.errorText, stderr)
			}
			if tt.failed && !strings.Contains(stderr.String(), "of "+saves+" saves failed") {
				t.Errorf("the error does not count the failed saves:\n%s", stderr)
			}
			if tt.notJoined && !strings.Contains(stderr.String(), saves+" of "+saves+" saves were dropped before kvctl serve had joined its pool") {
				t.Errorf("the error does not count the saves dropped before joining:\n%s", stderr)
			}

			// The JSON report carries the same, and still exits with the same code. (The healthy
			// daemon's pool holds the trace now: the second run may have nothing to save.)
			ios, _, stdout, _ = cmdutil.Test()
			if code := runWith(append(strings.Fields(args), "-o", "json"), ios, os.Getenv); code != tt.code {
				t.Fatalf("-o json exited %d, want %d", code, tt.code)
			}
			var rep struct {
				Live struct {
					Daemon struct {
						Checked      bool  `json:"checked"`
						ReadyAtStart bool  `json:"ready_at_start"`
						Saves        int64 `json:"saves"`
						FailedSaves  int64 `json:"failed_saves"`
						FailedPages  int64 `json:"failed_save_pages"`
						NotJoined    int64 `json:"not_joined_saves"`
					} `json:"daemon"`
				} `json:"live"`
			}
			if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
				t.Fatalf("%v\n%s", err, stdout)
			}
			d := rep.Live.Daemon
			if !d.Checked || d.ReadyAtStart != (tt.ready == "yes") || ((tt.failed || tt.notJoined) && d.Saves == 0) || (d.NotJoined > 0) != tt.notJoined || (d.FailedSaves > 0) != tt.failed || (d.FailedPages > 0) != tt.failed {
				t.Fatalf("live.daemon %+v", d)
			}
		})
	}
}

// TestReplayLiveWithoutAdmin: a replay that cannot read the daemon's stats says so, marks what
// it could not learn as unknown and does not fail for it.
func TestReplayLiveWithoutAdmin(t *testing.T) {
	socket := shortSocket(t)
	startServe(t, socket)
	args := "replay --target " + socket + " --admin 127.0.0.1:1 --limit 5 --pace max ../../core/replay/testdata/conversation_head500.jsonl"
	ios, _, stdout, stderr := cmdutil.Test()
	if code := runWith(strings.Fields(args), ios, os.Getenv); code != 0 {
		t.Fatalf("exited %d\n%s\n%s", code, stdout, stderr)
	}
	if !strings.HasSuffix(strings.TrimSpace(stdout.String()), "\t?\t?\t?") {
		t.Fatalf("unknown figures must read ?:\n%s", stdout)
	}
	if !strings.Contains(stderr.String(), "warning: cannot tell whether kvctl serve is ready or its saves succeed") {
		t.Fatalf("no warning:\n%s", stderr)
	}
}

// TestReplayLivePoolAwareRouter: `kvctl replay --router pool-aware` against a real `kvctl
// serve` routes with the pool-aware router, asking the daemon's pool through --admin for every
// request (none falls back to the work-aware estimate), and says so in its JSON report.
func TestReplayLivePoolAwareRouter(t *testing.T) {
	const trace = "../../core/replay/testdata/conversation_head500.jsonl"
	socket := shortSocket(t)
	p := startServe(t, socket)
	args := "replay --target " + socket + " --admin " + p.admin + " --engines 2 --limit 20 --pace max --router pool-aware -o json " + trace
	ios, _, stdout, stderr := cmdutil.Test()
	if code := runWith(strings.Fields(args), ios, os.Getenv); code != 0 {
		t.Fatalf("kvctl %s exited %d\nstdout: %s\nstderr: %s", args, code, stdout, stderr)
	}
	var rep struct {
		Runs []struct {
			Router   string `json:"router"`
			Requests int    `json:"requests"`
		} `json:"runs"`
		Live struct {
			PoolLookups         int64 `json:"pool_lookups"`
			PoolLookupFallbacks int64 `json:"pool_lookup_fallbacks"`
		} `json:"live"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Fatalf("%v\n%s", err, stdout)
	}
	if len(rep.Runs) != 1 || rep.Runs[0].Router != "pool-aware" || rep.Runs[0].Requests != 20 {
		t.Fatalf("runs %+v: want one pool-aware run of 20 requests", rep.Runs)
	}
	if rep.Live.PoolLookups != 20 || rep.Live.PoolLookupFallbacks != 0 {
		t.Fatalf("pool lookups %d, fallbacks %d: the router did not get the daemon's answer for every request\nstderr: %s",
			rep.Live.PoolLookups, rep.Live.PoolLookupFallbacks, stderr)
	}
}
