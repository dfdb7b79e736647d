package config

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"
)

func TestValidateClusterKeys(t *testing.T) {
	base := func() ServeConfig {
		s := DefaultServeConfig()
		s.PoolBackend = PoolBackendMooncake
		s.Master = "10.0.0.5:50051"
		s.Metadata = "http://10.0.0.5:8080/metadata"
		return s
	}
	tests := []struct {
		name    string
		edit    func(*ServeConfig)
		path    string // "" = valid
		message string
	}{
		{"master and metadata", func(*ServeConfig) {}, "", ""},
		{"mooncake.json alone", func(s *ServeConfig) { s.Master, s.Metadata, s.MooncakeConfig = "", "", "/etc/mooncake.json" }, "", ""},
		{"pool host:port alone", func(s *ServeConfig) { s.Master, s.Pool = "", "10.0.0.5:50051" }, "", ""},
		{"no master", func(s *ServeConfig) { s.Master = "" }, ServeKeyMaster, "needs the master's address"},
		{"master without port", func(s *ServeConfig) { s.Master = "10.0.0.5" }, ServeKeyMaster, "is not host:port"},
		{"master port out of range", func(s *ServeConfig) { s.Master = "10.0.0.5:70000" }, ServeKeyMaster, "between 1 and 65535"},
		{"P2P handshake", func(s *ServeConfig) { s.Metadata = "P2PHANDSHAKE" }, ServeKeyMetadata, "P2PHANDSHAKE metadata is not supported"},
		{"metadata not a URL", func(s *ServeConfig) { s.Metadata = "10.0.0.5:8080" }, ServeKeyMetadata, "is not an http:// URL"},
		{"rdma", func(s *ServeConfig) { s.Protocol = "rdma" }, ServeKeyProtocol, `protocol "rdma" is not supported`},
		{"host with port", func(s *ServeConfig) { s.HostAddress = "10.0.0.7:1234" }, ServeKeyHostAddress, "is not an IP address or host name"},
		{"IPv6 host", func(s *ServeConfig) { s.HostAddress = "fd00::7" }, "", ""},
		{"bad buffer", func(s *ServeConfig) { s.LocalBufferSize = "lots" }, ServeKeyLocalBufferSize, ""},
		{"negative timeout", func(s *ServeConfig) { s.PoolTimeout = -time.Second }, ServeKeyPoolTimeout, "must not be negative"},
		{"locate window off", func(s *ServeConfig) { s.LocateWindow = -time.Second }, "", ""},
		{"locate window too long", func(s *ServeConfig) { s.LocateWindow = 2 * time.Minute }, ServeKeyLocateWindow, "above the 1m0s limit"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := base()
			tt.edit(&s)
			errs := s.Validate().Errors()
			if tt.path == "" {
				if len(errs) != 0 {
					t.Fatalf("want valid, got %v", errs)
				}
				return
			}
			if len(errs) != 1 || errs[0].Path != tt.path || !strings.Contains(errs[0].Message, tt.message) {
				t.Fatalf("want one error at %s containing %q, got %v", tt.path, tt.message, errs)
			}
		})
	}
}

func TestClusterKeysWarnOnEmbedded(t *testing.T) {
	s := DefaultServeConfig()
	s.Master, s.HostAddress = "10.0.0.5:50051", "10.0.0.7"
	ds := s.Validate()
	if ds.HasErrors() || len(ds) != 2 || ds[0].Path != ServeKeyMaster || ds[0].Severity != SeverityWarning || ds[1].Path != ServeKeyHostAddress {
		t.Fatalf("want two warnings, got %v", ds)
	}
}

func TestServeFileClusterKeys(t *testing.T) {
	src := `pool-backend: mooncake
master: 10.0.0.5:50051
metadata: http://10.0.0.5:8080/metadata
host-address: 10.0.0.7
pool-size: 8GiB
local-buffer-size: 32MiB
protocol: tcp
pool-timeout: 3s
locate-window: 500ms
`
	f, ds := Load("serve.yaml", []byte(src), LoadOptions{})
	if ds.HasErrors() || f == nil || f.Kind != KindServe {
		t.Fatalf("load: %v", ds)
	}
	s := f.Serve
	if s.Master != "10.0.0.5:50051" || s.Metadata != "http://10.0.0.5:8080/metadata" || s.HostAddress != "10.0.0.7" ||
		s.LocalBufferSize != "32MiB" || s.Protocol != "tcp" || s.PoolTimeout != 3*time.Second ||
		s.LocateWindow != 500*time.Millisecond {
		t.Fatalf("decoded %+v", s.ClusterKeys)
	}
	c, ds := s.ResolveCluster(nil)
	if ds.HasErrors() {
		t.Fatal(ds)
	}
	if c.SegmentBytes != 8<<30 || c.LocalBufferBytes != 32<<20 || c.HostAddress != "10.0.0.7" {
		t.Fatalf("resolved %+v", c)
	}

	// A bad value is reported at its line.
	_, ds = Load("serve.yaml", []byte("pool-backend: mooncake\nmaster: 10.0.0.5\nmetadata: P2PHANDSHAKE\n"), LoadOptions{})
	errs := ds.Errors()
	if len(errs) != 2 || errs[0].Line != 2 || errs[0].Path != ServeKeyMaster || errs[1].Line != 3 {
		t.Fatalf("diagnostics: %v", ds)
	}
}

// TestResolveClusterFromTRTLLMConfig reads a mooncake.json as TensorRT-LLM renders it,
// unchanged, and lets a serve key win over it.
func TestResolveClusterFromTRTLLMConfig(t *testing.T) {
	s := DefaultServeConfig()
	s.PoolBackend, s.PoolSize, s.MooncakeConfig = PoolBackendMooncake, "auto", "testdata/valid/mooncake-tcp.json"
	if ds := s.Validate(); ds.HasErrors() {
		t.Fatal(ds)
	}
	c, ds := s.ResolveCluster(nil)
	if ds.HasErrors() {
		t.Fatal(ds)
	}
	want := Cluster{Master: "10.0.0.5:50051", Metadata: "http://10.0.0.5:8080/metadata", HostAddress: "10.0.0.7", Protocol: "tcp",
		SegmentBytes: 3355443200, LocalBufferBytes: 1 << 30}
	if c.Master != want.Master || c.Metadata != want.Metadata || c.HostAddress != want.HostAddress || c.Protocol != want.Protocol ||
		c.SegmentBytes != want.SegmentBytes || c.LocalBufferBytes != want.LocalBufferBytes {
		t.Fatalf("resolved %+v\nwant %+v", c, want)
	}
	if c.Sources[ServeKeyMaster] != s.MooncakeConfig || c.Sources[ServeKeyPoolSize] != s.MooncakeConfig {
		t.Fatalf("sources %v", c.Sources)
	}

	s.Master, s.PoolSize, s.HostAddress = "10.0.0.9:50051", "1GiB", "10.0.0.8"
	c, ds = s.ResolveCluster(nil)
	if ds.HasErrors() || c.Master != "10.0.0.9:50051" || c.SegmentBytes != 1<<30 || c.HostAddress != "10.0.0.8" || c.Sources[ServeKeyMaster] != "flag or config" {
		t.Fatalf("keys must win over mooncake.json: %+v %v", c, ds)
	}
}

func TestResolveClusterRefusesRDMAConfig(t *testing.T) {
	// The repository's typical RDMA mooncake.json: protocol and metadata name where they came from.
	s := DefaultServeConfig()
	s.PoolBackend, s.MooncakeConfig = PoolBackendMooncake, "testdata/valid/mooncake.json"
	_, ds := s.ResolveCluster(nil)
	var paths []string
	for _, e := range ds.Errors() {
		paths = append(paths, e.Path)
		if !strings.Contains(e.Message, "(from testdata/valid/mooncake.json)") {
			t.Errorf("%s does not name the file: %s", e.Path, e.Message)
		}
	}
	if strings.Join(paths, ",") != "metadata,protocol" {
		t.Fatalf("errors at %v, want metadata and protocol: %v", paths, ds)
	}
	// Overriding both makes it usable.
	s.Metadata, s.Protocol = "http://10.0.0.5:8080/metadata", "tcp"
	if c, ds := s.ResolveCluster(nil); ds.HasErrors() || c.Master != "10.0.0.5:50051" || c.DeviceName != "mlx5_0,mlx5_1" {
		t.Fatalf("%+v %v", c, ds)
	}
}

func TestResolveClusterFromManifestAndErrors(t *testing.T) {
	dir := t.TempDir()
	man := dir + "/pool.json"
	if err := os.WriteFile(man, []byte(`{"master_server_address": "10.0.0.5:50051", "metadata_server": "http://10.0.0.5:8080/metadata", "protocol": "tcp", "namespace": "prod"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	s := DefaultServeConfig()
	s.PoolBackend, s.Pool = PoolBackendMooncake, "file://"+man
	c, ds := s.ResolveCluster(nil)
	if ds.HasErrors() || c.Master != "10.0.0.5:50051" || c.Metadata != "http://10.0.0.5:8080/metadata" || c.Sources[ServeKeyMaster] != man {
		t.Fatalf("%+v %v", c, ds)
	}
	s.Pool, s.MooncakeConfig = "", dir+"/missing.json"
	_, ds = s.ResolveCluster(func(string) ([]byte, error) { return nil, errors.New("no such file") })
	if errs := ds.Errors(); len(errs) == 0 || errs[0].Path != ServeKeyMooncakeConfig || !strings.Contains(errs[0].Message, "no such file") {
		t.Fatalf("unreadable mooncake.json: %v", ds)
	}
}

func TestRouteAddress(t *testing.T) {
	got, err := RouteAddress(context.Background(), "127.0.0.1:50051")
	if err != nil || got != "127.0.0.1" {
		t.Fatalf("RouteAddress: %q %v", got, err)
	}
	if _, err := RouteAddress(context.Background(), "not-an-address"); err == nil {
		t.Fatal("want an error for an address without a port")
	}
}

// FuzzResolveCluster feeds arbitrary mooncake.json bytes through the resolver: it must report
// problems, never panic.
func FuzzResolveCluster(f *testing.F) {
	for _, p := range []string{"testdata/valid/mooncake-tcp.json", "testdata/valid/mooncake.json"} {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(`{"master_server_address": "[::1]:1", "global_segment_size": -5, "local_buffer_size": "1PiB"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		s := DefaultServeConfig()
		s.PoolBackend, s.MooncakeConfig = PoolBackendMooncake, "m.json"
		c, ds := s.ResolveCluster(func(string) ([]byte, error) { return data, nil })
		if !ds.HasErrors() && (c.Master == "" || c.Protocol != ProtocolTCP || c.LocalBufferBytes <= 0 || c.SegmentBytes < 0) {
			t.Fatalf("accepted %+v from %q", c, data)
		}
	})
}
