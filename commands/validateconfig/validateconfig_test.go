package validateconfig

import (
	"context"
	"flag"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvctl/kvctl/commands/cmdutil"
	"github.com/kvctl/kvctl/commands/cmdutil/cmdtest"
)

var update = flag.Bool("update", false, "rewrite golden files")

const fixtures = "../../core/config/testdata"

func TestFlags(t *testing.T) {
	tests := []struct {
		args    string
		check   func(*testing.T, *Options)
		wantErr string
	}{
		{args: "a.yaml b.json", check: func(t *testing.T, o *Options) {
			if len(o.Files) != 2 || o.Strict || o.Render || o.NodeBudget || o.RanksOnNode != 1 {
				t.Errorf("%+v", o)
			}
		}},
		{args: "--kind mooncake-json --strict --render --node-budget --ranks-on-node 8 -", check: func(t *testing.T, o *Options) {
			if o.Kind != "mooncake-json" || !o.Strict || !o.Render || !o.NodeBudget || o.RanksOnNode != 8 || o.Files[0] != "-" {
				t.Errorf("%+v", o)
			}
		}},
		{args: "", wantErr: "at least one FILE"},
		{args: "--kind toml a", wantErr: "--kind"},
		{args: "- -", wantErr: "only once"},
		{args: "--ranks-on-node 0 a", wantErr: "--ranks-on-node"},
	}
	for _, tt := range tests {
		t.Run(tt.args, func(t *testing.T) {
			f := cmdtest.Factory()
			var got *Options
			cmd := NewCmdValidateConfig(f, func(o *Options) error { got = o; return nil })
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

func run(t *testing.T, o *Options) (string, string, int) {
	t.Helper()
	ios, _, out, errOut := cmdutil.Test()
	o.IO = ios
	if o.Getenv == nil {
		o.Getenv = func(string) string { return "" }
	}
	if o.RanksOnNode == 0 {
		o.RanksOnNode = 1
	}
	err := runValidateConfig(context.Background(), o)
	if err != nil && !cmdutil.IsSilent(err) {
		errOut.WriteString(err.Error())
	}
	return out.String(), errOut.String(), cmdutil.ExitCode(err)
}

// TestGolden checks the output of representative files in every format against golden files.
func TestGolden(t *testing.T) {
	files := []string{
		fixtures + "/valid/typical.yaml",
		fixtures + "/valid/tier-overrides.yaml",
		fixtures + "/invalid/decimal-unit.json",
		fixtures + "/invalid/alignment-not-divisor.yaml",
	}
	for _, format := range []string{"table", "json", "yaml"} {
		t.Run(format, func(t *testing.T) {
			out, _, code := run(t, &Options{Files: files, OutputFormat: format})
			if code != cmdutil.ExitValidation {
				t.Errorf("exit code %d, want 3", code)
			}
			cmdtest.Golden(t, "mixed."+format, []byte(out), *update)
		})
	}
}

// TestEveryFixture runs the whole fixture set: every valid file passes, every invalid file fails
// with exit code 3 and at least one located error.
func TestEveryFixture(t *testing.T) {
	for _, dir := range []string{"valid", "invalid"} {
		paths, err := filepath.Glob(filepath.Join(fixtures, dir, "*"))
		if err != nil || len(paths) == 0 {
			t.Fatalf("no fixtures in %s: %v", dir, err)
		}
		for _, p := range paths {
			t.Run(dir+"/"+filepath.Base(p), func(t *testing.T) {
				opts := &Options{Files: []string{p}, OutputFormat: "table"}
				if strings.Contains(p, "budget") {
					opts.NodeBudget = true
					opts.MemAvailable = func() (uint64, bool) { return 64 << 30, true }
				}
				out, _, code := run(t, opts)
				if dir == "valid" {
					if code != 0 || strings.Contains(out, ": error:") {
						t.Errorf("valid fixture: exit %d\n%s", code, out)
					}
					return
				}
				if code != cmdutil.ExitValidation || !strings.Contains(out, ": error:") {
					t.Errorf("invalid fixture: exit %d\n%s", code, out)
				}
			})
		}
	}
}

func TestStrictAndStdin(t *testing.T) {
	warn := fixtures + "/valid/tier-overrides.yaml"
	if _, _, code := run(t, &Options{Files: []string{warn}, OutputFormat: "table"}); code != 0 {
		t.Errorf("warnings alone: exit %d, want 0", code)
	}
	if _, _, code := run(t, &Options{Files: []string{warn}, Strict: true, OutputFormat: "table"}); code != cmdutil.ExitValidation {
		t.Errorf("warnings under --strict: exit %d, want 3", code)
	}

	ios, in, out, _ := cmdutil.Test()
	in.WriteString(`{"master_server_address": "h:1", "model_key": "m", "group_blocks": "false"}`)
	err := runValidateConfig(context.Background(), &Options{IO: ios, Files: []string{"-"}, Kind: "mooncake-json", OutputFormat: "table", RanksOnNode: 1, Getenv: func(string) string { return "" }})
	if cmdutil.ExitCode(err) != cmdutil.ExitValidation || !strings.Contains(out.String(), "<stdin>:1:") || !strings.Contains(out.String(), "group_blocks") {
		t.Errorf("stdin: %v\n%s", err, out.String())
	}
}

func TestRender(t *testing.T) {
	out, errOut, code := run(t, &Options{Files: []string{fixtures + "/valid/typical.yaml", fixtures + "/valid/pool.json"}, Render: true})
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if !strings.HasPrefix(out, "{\n  \"master_server_address\": ") || strings.HasSuffix(out, "\n") {
		t.Errorf("rendered config must be TensorRT-LLM's json.dump(indent=2) bytes:\n%s", out)
	}
	for _, k := range []string{`"global_segment_size": 68719476736`, `"local_buffer_size": 1073741824`, `"model_key": "llama-3.1-70b-instruct@r1"`} {
		if !strings.Contains(out, k) {
			t.Errorf("missing %s in\n%s", k, out)
		}
	}

	_, errOut, code = run(t, &Options{Files: []string{fixtures + "/invalid/alignment-not-divisor.yaml"}, Render: true})
	if code != cmdutil.ExitValidation || !strings.Contains(errOut, "not rendering") {
		t.Errorf("invalid config: exit %d, %s", code, errOut)
	}
	_, errOut, code = run(t, &Options{Files: []string{fixtures + "/valid/pool.json"}, Render: true})
	if code != cmdutil.ExitUsage || !strings.Contains(errOut, "mooncake_store") {
		t.Errorf("no YAML: exit %d, %s", code, errOut)
	}
}

func TestUnreadableFile(t *testing.T) {
	_, errOut, code := run(t, &Options{Files: []string{"/nonexistent/x.yaml"}})
	if code != cmdutil.ExitFailure || !strings.Contains(errOut, "/nonexistent/x.yaml") {
		t.Errorf("exit %d: %s", code, errOut)
	}
}

// TestMisspeltServeKey: a serve config holding only a misspelt key is reported as a serve
// config with an unknown key and the key it likely means, and fails the check.
func TestMisspeltServeKey(t *testing.T) {
	out, _, code := run(t, &Options{Files: []string{fixtures + "/invalid/serve-misspelt-key.yaml"}, OutputFormat: "table"})
	if code != cmdutil.ExitValidation {
		t.Errorf("exit %d, want %d", code, cmdutil.ExitValidation)
	}
	for _, want := range []string{`unknown key "pool-sise" (hint: did you mean pool-size?)`, "INVALID (kvctl-serve)"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}
