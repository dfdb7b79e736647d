package serve

import (
	"context"
	"testing"
	"time"

	"github.com/kvctl/kvctl/commands/cmdutil/cmdtest"
	"github.com/kvctl/kvctl/core/config"
)

// TestSecurityFlags pins the names and defaults of serve's security flags, which are contracts
// (operators put them in unit files and configs).
func TestSecurityFlags(t *testing.T) {
	for _, tt := range []struct {
		args string
		want config.ServeSecurity
	}{
		{"", config.ServeSecurity{}},
		{"--engine-group kvctl --max-conns 300 --admin-grants-leases --admin-lease-rate 5 --descriptor-ttl 10s --admin-pprof",
			config.ServeSecurity{EngineGroup: "kvctl", MaxConns: 300, AdminGrantsLeases: true, AdminLeaseRate: 5, AdminPprof: true, DescriptorTTL: 10 * time.Second}},
	} {
		t.Run(tt.args, func(t *testing.T) {
			if got := parseServe(t, tt.args); got.Security != tt.want {
				t.Errorf("got %+v, want %+v", got.Security, tt.want)
			}
		})
	}
}

// TestCallChannelPollFlag pins --call-channel-poll: its name, its default of 0 (the daemon picks)
// and that a negative value (off) and a too long one reach the config checks as given.
func TestCallChannelPollFlag(t *testing.T) {
	for _, tt := range []struct {
		args string
		want time.Duration
		bad  bool
	}{
		{"", 0, false},
		{"--call-channel-poll 500us", 500 * time.Microsecond, false},
		{"--call-channel-poll=-1ns", -1, false},
		{"--call-channel-poll 1s", time.Second, true},
	} {
		t.Run(tt.args, func(t *testing.T) {
			got := parseServe(t, tt.args)
			if got.CallChannelPoll != tt.want {
				t.Errorf("got %v, want %v", got.CallChannelPoll, tt.want)
			}
			s, diags := got.serveConfig()
			_, more := s.Resolve(config.ResolveOptions{})
			diags = append(diags, more...)
			bad := false
			for _, d := range diags {
				bad = bad || d.Path == config.ServeKeyCallChannelPoll
			}
			if s.CallChannelPoll != tt.want || bad != tt.bad {
				t.Errorf("config %v, diagnostics %v; want %v, an error at %s %v", s.CallChannelPoll, diags, tt.want, config.ServeKeyCallChannelPoll, tt.bad)
			}
		})
	}
}

// parseServe runs `kvctl serve args` up to the point it would serve and returns its options.
func parseServe(t *testing.T, args string) *Options {
	t.Helper()
	var got *Options
	cmd := NewCmdServe(cmdtest.Factory(), func(_ context.Context, o *Options) error { got = o; return nil })
	if err := cmdtest.Execute(t, cmd, args); err != nil {
		t.Fatal(err)
	}
	return got
}
