package config

import (
	"testing"
	"time"
)

// TestServeMetricsKeys pins the metrics listener's and the engine series retention's keys:
// read from a file, checked like the flags.
func TestServeMetricsKeys(t *testing.T) {
	f, ds := Load("serve.yaml", []byte("metrics-addr: \":9481\"\nengine-metrics-retention: 90\n"), LoadOptions{Kind: KindServe})
	if ds.HasErrors() || f.Serve == nil {
		t.Fatalf("valid metrics keys refused: %v", ds)
	}
	if f.Serve.MetricsAddr != ":9481" || f.Serve.EngineMetricsRetention != 90*time.Second {
		t.Errorf("read %+v", f.Serve)
	}
	if DefaultServeConfig().EngineMetricsRetention != 15*time.Minute {
		t.Errorf("default engine-metrics-retention %v, want 15m", DefaultServeConfig().EngineMetricsRetention)
	}
	for _, tt := range []struct {
		name string
		s    func(*ServeConfig)
		path string
	}{
		{"not host:port", func(s *ServeConfig) { s.MetricsAddr = "9481" }, ServeKeyMetricsAddr},
		{"the admin address", func(s *ServeConfig) { s.MetricsAddr = s.AdminAddr }, ServeKeyMetricsAddr},
		{"negative retention", func(s *ServeConfig) { s.EngineMetricsRetention = -time.Second }, ServeKeyEngineMetricsTTL},
	} {
		s := DefaultServeConfig()
		tt.s(&s)
		errs := s.Validate().Errors()
		if len(errs) != 1 || errs[0].Path != tt.path {
			t.Errorf("%s: %v, want one error at %s", tt.name, errs, tt.path)
		}
	}
}

// TestServeCallChannelPoll pins the call-channel-poll key: read from a file as a duration,
// negative (off) and zero (the default) accepted, longer than MaxCallChannelPoll refused.
func TestServeCallChannelPoll(t *testing.T) {
	f, ds := Load("serve.yaml", []byte("call-channel-poll: 500us\n"), LoadOptions{Kind: KindServe})
	if ds.HasErrors() || f.Serve == nil || f.Serve.CallChannelPoll != 500*time.Microsecond {
		t.Fatalf("call-channel-poll: 500us read as %+v, %v", f.Serve, ds)
	}
	if DefaultServeConfig().CallChannelPoll != 0 {
		t.Errorf("default call-channel-poll %v, want 0 (the daemon's default)", DefaultServeConfig().CallChannelPoll)
	}
	for _, poll := range []time.Duration{-1, 0, MaxCallChannelPoll} {
		s := DefaultServeConfig()
		s.CallChannelPoll = poll
		if errs := s.Validate().Errors(); len(errs) != 0 {
			t.Errorf("call-channel-poll %v refused: %v", poll, errs)
		}
	}
	s := DefaultServeConfig()
	s.CallChannelPoll = MaxCallChannelPoll + time.Microsecond
	if errs := s.Validate().Errors(); len(errs) != 1 || errs[0].Path != ServeKeyCallChannelPoll {
		t.Errorf("call-channel-poll past the most: %v, want one error at %s", errs, ServeKeyCallChannelPoll)
	}
	if _, ds := Load("serve.yaml", []byte("call-channel-poll: fast\n"), LoadOptions{Kind: KindServe}); !ds.HasErrors() {
		t.Error("call-channel-poll: fast accepted")
	}
}
