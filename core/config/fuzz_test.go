package config

import (
	"os"
	"path/filepath"
	"testing"
)

func addSeeds(f *testing.F, pattern string) {
	names, _ := filepath.Glob(pattern)
	for _, n := range names {
		if data, err := os.ReadFile(n); err == nil {
			f.Add(data)
		}
	}
}

// checkFuzzResult holds for any input: Load returns, and every error has a message and, since
// every input is a file with lines, a place.
func checkFuzzResult(t *testing.T, f *File, ds Diagnostics) {
	for _, d := range ds {
		if d.Message == "" {
			t.Fatalf("diagnostic without a message: %#v", d)
		}
		if d.Severity == SeverityError && (d.Line <= 0 || d.Column <= 0) {
			t.Fatalf("error without a place: %#v", d)
		}
	}
	if f == nil && !ds.HasErrors() {
		t.Fatal("no file and no error")
	}
}

func FuzzLoadYAML(f *testing.F) {
	addSeeds(f, "testdata/valid/*.yaml")
	addSeeds(f, "testdata/invalid/*.yaml")
	f.Add([]byte("a: &x [*x]"))
	f.Add([]byte("<<: {a: 1}\nkv_cache_config: {<<: [{tokens_per_block: 7}]}"))
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, k := range []Kind{KindTRTLLM, KindServe, ""} {
			file, ds := Load("f.yaml", data, LoadOptions{Kind: k, NodeBudget: true,
				MemAvailable: func() (uint64, bool) { return 64 << 30, true }})
			checkFuzzResult(t, file, ds)
		}
	})
}

func FuzzLoadJSON(f *testing.F) {
	addSeeds(f, "testdata/valid/*.json")
	addSeeds(f, "testdata/invalid/*.json")
	f.Add([]byte(`{"a": "\ud83d\ude00\ud800", "b": [1e999, -0, NaN]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, k := range []Kind{KindClient, KindManifest} {
			file, ds := Load("f.json", data, LoadOptions{Kind: k, NodeBudget: true,
				MemAvailable: func() (uint64, bool) { return 0, false }})
			checkFuzzResult(t, file, ds)
			if file != nil && file.Manifest != nil && !ds.HasErrors() {
				back, ds2 := Load("f.json", file.Manifest.Marshal(), LoadOptions{Kind: KindManifest})
				if ds2.HasErrors() || back == nil {
					t.Fatalf("a valid manifest does not read back after Marshal: %v", ds2)
				}
			}
			if file != nil && file.Client != nil && !ds.HasErrors() {
				if back, ds2 := Load("f.json", MarshalClientConfig(*file.Client), LoadOptions{Kind: KindClient}); back == nil || ds2.HasErrors() {
					t.Fatalf("a valid client config does not read back: %v", ds2)
				}
			}
		}
	})
}

func FuzzParseSize(f *testing.F) {
	for _, s := range []string{"1GiB", " 1.5 kb ", "4GB", "x", "9999999999999999999999", "0.0000001TiB"} {
		f.Add(s, true)
	}
	f.Fuzz(func(t *testing.T, s string, strict bool) {
		n, err := ParseSize(s, strict)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("empty error")
			}
			return
		}
		if n < 0 {
			t.Fatalf("ParseSize(%q) = %d", s, n)
		}
	})
}
