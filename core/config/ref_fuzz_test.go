package config

import (
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// FuzzParseKvctlServerURL fuzzes kv_connector_config.server_url. An accepted URL names a
// clean absolute socket path, a known role (or none) and a positive worker count (or none),
// and the settings written back as a unix:// URL read back the same.
func FuzzParseKvctlServerURL(f *testing.F) {
	for _, s := range []string{
		"unix:///run/kvctl/kvctl.sock",
		"/tmp/kvctl-1000/kvctl.sock?model_key=llama&namespace=prod&role=consumer&async_load=true&async_load_workers=4",
		"unix:///run/kvctl.sock?role=%20Producer%20",
		"unix://host/run/kvctl.sock", "tcp://127.0.0.1:1", "kvctl.sock", "/a/../b.sock", "/a.sock?role=x",
		"/a.sock?model_key=a&model_key=b", "/a.sock?async_load_workers=0", "/a.sock?x=1", "/a.sock?a;b", "",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		s, err := ParseKvctlServerURL(raw)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("refusal without a reason")
			}
			return
		}
		if !filepath.IsAbs(s.Socket) || filepath.Clean(s.Socket) != s.Socket || s.SocketFrom != "server_url" {
			t.Fatalf("%q: socket %q from %q", raw, s.Socket, s.SocketFrom)
		}
		if s.Role != "" {
			if r, err := ParseRole(string(s.Role)); err != nil || r != s.Role {
				t.Fatalf("%q: role %q", raw, s.Role)
			}
		}
		if s.AsyncLoadWorkers < 0 || s.AsyncLoadWorkers > 1<<31-1 {
			t.Fatalf("%q: %d async load workers", raw, s.AsyncLoadWorkers)
		}
		q := url.Values{}
		if s.ModelKey != "" {
			q.Set("model_key", s.ModelKey)
		}
		if s.Namespace != "" {
			q.Set("namespace", s.Namespace)
		}
		if s.Role != "" {
			q.Set("role", string(s.Role))
		}
		q.Set("async_load", strconv.FormatBool(s.AsyncLoad))
		if s.AsyncLoadWorkers != 0 {
			q.Set("async_load_workers", strconv.FormatInt(s.AsyncLoadWorkers, 10))
		}
		again := (&url.URL{Scheme: "unix", Path: s.Socket, RawQuery: q.Encode()}).String()
		back, err := ParseKvctlServerURL(again)
		if err != nil || back != s {
			t.Fatalf("%+v written as %q reads back as %+v, %v", s, again, back, err)
		}
	})
}

// FuzzParsePoolRef fuzzes a mooncake_store pool value. An accepted value is either a
// file:// manifest with a path or a host:port whose port is 1 to 65535, returned as given.
func FuzzParsePoolRef(f *testing.F) {
	for _, s := range []string{
		"file:///etc/kvctl/pool.json", "file://pool.json", "10.0.0.1:50051", "[::1]:50051", "master.svc:50051",
		"file://", "http://m:1", "m:", ":1", "m:0", "m:65536", "m:+1", "m:1x", "",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, pool string) {
		path, addr, err := ParsePoolRef(pool)
		if err != nil {
			if path != "" || addr != "" || err.Error() == "" {
				t.Fatalf("%q: refused with %q, %q, %v", pool, path, addr, err)
			}
			return
		}
		switch {
		case path != "" && addr == "":
			if "file://"+path != pool {
				t.Fatalf("%q: manifest path %q", pool, path)
			}
		case addr != "" && path == "":
			i := strings.LastIndex(addr, ":")
			p, err := strconv.Atoi(addr[i+1:])
			if addr != pool || i <= 0 || err != nil || p < 1 || p > 65535 || strings.Contains(addr, "://") {
				t.Fatalf("%q: master address %q", pool, addr)
			}
		default:
			t.Fatalf("%q: path %q and address %q", pool, path, addr)
		}
	})
}
