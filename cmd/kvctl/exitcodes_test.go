package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvctl/kvctl/commands/cmdutil"
)

// TestExitCodes is the README's exit-code table, checked across every command in one place:
//
//	1  a file named on the command line cannot be read (missing, a directory, no permission)
//	2  a flag or argument is wrong: a value that does not parse, a count outside its bounds
//	3  what was read is invalid (a config file or environment value, a malformed trace)
//	4  the pool, engine or GPU does not answer
//
// Each case names a command and the one thing wrong with its invocation.
func TestExitCodes(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	missing := filepath.Join(dir, "nosuch")
	trace := write("trace.jsonl", `{"timestamp": 0, "input_length": 1024, "output_length": 8, "hash_ids": [1, 2]}`+"\n"+
		`{"timestamp": 10, "input_length": 1024, "output_length": 8, "hash_ids": [1, 2]}`+"\n")
	smallServe := write("small.yaml", "pool-backend: embedded\npool-size: 1MiB\n")
	badSizeServe := write("badsize.yaml", "pool-backend: embedded\npool-size: 64GB\n")
	mooncakeJSON, err := filepath.Abs("../../examples/mooncake.json")
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "k.sock")
	serve := "serve --admin-addr= --socket " + sock + " "

	tests := []struct {
		args   string
		code   int
		stderr string
	}{
		// 1: a file that cannot be read, whichever command reads it
		{"hash --tokens-file " + missing, 1, "no such file"},
		{"hash --tokens-file " + dir, 1, "is a directory"},
		{"validate-config " + missing, 1, "no such file"},
		{"validate-config " + dir, 1, "is a directory"},
		{"replay " + missing, 1, "no such file"},
		{"replay " + dir, 1, "is a directory"},
		{"stats --from-log " + missing, 1, "no such file"},
		{"serve --config " + missing, 1, "no such file"},
		{"serve --config " + dir, 1, "is a directory"},
		{"--config " + missing + " version", 1, "no such file"},

		// 2: flags, sizes and counts
		{"nosuchcommand", 2, "unknown command"},
		{"replay --pool-size 12XB " + trace, 2, "unknown unit"},
		{serve + "--pool-size 12XB", 2, "invalid --pool-size"},
		{serve + "--pool-size 64GB", 2, "1024-based"},
		{serve + "--pool-size 1MiB", 2, "below the 16MiB minimum"},
		{"replay --pool-size 64GB " + trace, 2, "1024-based"},
		{"replay --load-bandwidth 25GB " + trace, 2, "1024-based"},
		{"hash --world-size 2000000000 0 1", 2, "--world-size 2000000000: want 1 to 4096"},
		{"hash --tokens-per-block 100000000 0 1", 2, "--tokens-per-block"},
		{"replay --ranks 100000000 " + trace, 2, "--ranks 100000000: want 1 to 1024"},
		{"replay --target " + sock + " --engines 100000000 " + trace, 2, "--engines"},
		{"replay --gpu-blocks 0 " + trace, 2, "--gpu-blocks"},
		{"replay --set router=round-robin " + trace, 2, "want one of"},
		{"validate-config --ranks-on-node 100000000 " + trace, 2, "--ranks-on-node"},
		{"validate-config --for client " + mooncakeJSON, 2, "--for"},
		{"stats --pool 127.0.0.1:1 --watch -1", 2, ""},

		// 3: what was read is invalid
		{"validate-config " + smallServe, 3, "below the 16MiB minimum"},
		{serve + "--config " + smallServe, 3, "below the 16MiB minimum"},
		{"validate-config " + badSizeServe, 3, "1024-based"},
		{serve + "--config " + badSizeServe, 3, "1024-based"},
		{"validate-config --for serve " + mooncakeJSON, 3, `protocol "rdma" is not supported`},

		// 4: nothing answers
		{"stats --timeout 0.2 --pool 127.0.0.1:1", 4, ""},
		{"replay --target " + sock + " " + trace, 4, ""},

		// 0: the spellings both work
		{"replay --set router=work_aware --ranks 2 " + trace, 0, ""},
		{"replay --set router=work-aware --ranks 2 " + trace, 0, ""},
		{"replay --router work_aware --ranks 2 " + trace, 0, ""},
		{"validate-config " + mooncakeJSON, 0, ""},
	}
	t.Setenv("XDG_CONFIG_HOME", dir)
	t.Setenv("XDG_RUNTIME_DIR", dir)
	for _, tt := range tests {
		t.Run(tt.args, func(t *testing.T) {
			ios, _, stdout, stderr := cmdutil.Test()
			code := runWith(strings.Fields(tt.args), ios, os.Getenv)
			if code != tt.code {
				t.Fatalf("kvctl %s exited %d, want %d\nstdout: %s\nstderr: %s", tt.args, code, tt.code, stdout, stderr)
			}
			if tt.stderr != "" && !strings.Contains(stderr.String()+stdout.String(), tt.stderr) {
				t.Errorf("kvctl %s: output lacks %q\nstdout: %s\nstderr: %s", tt.args, tt.stderr, stdout, stderr)
			}
		})
	}
}
