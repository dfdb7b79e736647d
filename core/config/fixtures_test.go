package config

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	yaml "go.yaml.in/yaml/v3"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/golden")

// fixtureOptions gives the few fixtures that exercise options the options they need.
func fixtureOptions(name string) LoadOptions {
	mem := func() (uint64, bool) { return 256 << 30, true }
	switch filepath.Base(name) {
	case "node-budget.yaml", "budget-ok.yaml":
		return LoadOptions{NodeBudget: true, MemAvailable: mem, RanksOnNode: 8}
	case "inherit.yaml":
		return LoadOptions{Env: func(k string) string {
			if k == EnvConfigPath {
				return "testdata/inherit-mooncake.json"
			}
			return ""
		}}
	}
	return LoadOptions{}
}

func TestFixtures(t *testing.T) {
	for _, dir := range []string{"valid", "invalid"} {
		names, err := filepath.Glob(filepath.Join("testdata", dir, "*"))
		if err != nil || len(names) == 0 {
			t.Fatalf("no fixtures in %s: %v", dir, err)
		}
		for _, path := range names {
			name := filepath.Join(dir, filepath.Base(path))
			t.Run(name, func(t *testing.T) {
				data, err := os.ReadFile(path)
				if err != nil {
					t.Fatal(err)
				}
				f, ds := Load(name, data, fixtureOptions(name))
				if dir == "valid" && ds.HasErrors() {
					t.Errorf("valid fixture has errors:\n%s", text(ds))
				}
				if dir == "invalid" && !ds.HasErrors() {
					t.Errorf("invalid fixture has no error:\n%s", text(ds))
				}
				if dir == "valid" && f == nil {
					t.Errorf("valid fixture gave no File")
				}
				for _, d := range ds {
					if d.Message == "" || d.Line <= 0 || d.Column <= 0 || d.File != name {
						t.Errorf("diagnostic without message, place or file: %#v", d)
					}
				}
				checkGolden(t, filepath.Join("testdata", "golden", name), ds)
			})
		}
	}
}

func text(ds Diagnostics) string {
	var b strings.Builder
	for _, d := range ds {
		b.WriteString(d.String())
		b.WriteByte('\n')
	}
	return b.String()
}

// checkGolden compares the diagnostics in the three output formats a command prints.
func checkGolden(t *testing.T, base string, ds Diagnostics) {
	t.Helper()
	if ds == nil {
		ds = Diagnostics{}
	}
	js, err := json.MarshalIndent(ds, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	ys, err := yaml.Marshal(ds)
	if err != nil {
		t.Fatal(err)
	}
	outs := map[string][]byte{".txt": []byte(text(ds)), ".json": append(js, '\n'), ".yaml": ys}
	for ext, got := range outs {
		file := base + ext
		if *update {
			if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(file, got, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		want, err := os.ReadFile(file)
		if err != nil {
			t.Fatalf("missing golden file (run go test -update): %v", err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s differs from the golden file:\n got: %s\nwant: %s", file, got, want)
		}
	}
}
