package config

import (
	"strings"
	"testing"
)

// TestServePoolPrefaultKey pins the pool-prefault key: a boolean, off unless set, and a value that
// is not a boolean is an error naming the key.
func TestServePoolPrefaultKey(t *testing.T) {
	for _, c := range []struct {
		src  string
		want bool
	}{{"pool-size: 64MiB\n", false}, {"pool-prefault: true\n", true}, {"pool-prefault: false\n", false}} {
		f, diags := Load("serve.yaml", []byte(c.src), LoadOptions{Kind: KindServe})
		if diags.HasErrors() || f == nil || f.Serve == nil {
			t.Fatalf("%q: %v", c.src, diags)
		}
		if f.Serve.PoolPrefault != c.want {
			t.Errorf("%q: PoolPrefault = %v, want %v", c.src, f.Serve.PoolPrefault, c.want)
		}
	}
	for _, bad := range []string{"pool-prefault: 64MiB\n", "pool-prefault: [true]\n"} {
		_, diags := Load("serve.yaml", []byte(bad), LoadOptions{Kind: KindServe})
		if !diags.HasErrors() {
			t.Errorf("%q was accepted", bad)
			continue
		}
		if e := diags.Errors()[0]; e.Path != ServeKeyPoolPrefault || !strings.Contains(e.String(), "pool-prefault") {
			t.Errorf("%q: error %v does not name pool-prefault", bad, e)
		}
	}
}

// TestServePoolPrefaultMooncakeWarns checks that pool-prefault with the mooncake backend, which
// does not read it, gives a warning naming the key and no error of its own.
func TestServePoolPrefaultMooncakeWarns(t *testing.T) {
	s := DefaultServeConfig()
	s.PoolBackend, s.PoolPrefault = PoolBackendMooncake, true
	var warned bool
	for _, d := range s.Validate() {
		if d.Path == ServeKeyPoolPrefault {
			if d.Severity != SeverityWarning {
				t.Fatalf("pool-prefault with the mooncake backend: %v, want a warning", d)
			}
			warned = true
		}
	}
	if !warned {
		t.Fatal("no warning for pool-prefault with the mooncake backend")
	}
	s.PoolBackend = PoolBackendEmbedded
	for _, d := range s.Validate() {
		if d.Path == ServeKeyPoolPrefault {
			t.Fatalf("pool-prefault with the embedded backend: %v", d)
		}
	}
}
