package config

import (
	"strings"
	"testing"
	"time"
)

// TestServeSecurityKeys pins the serve config keys of the security settings and the warnings
// validate-config gives for a remote admin API.
func TestServeSecurityKeys(t *testing.T) {
	src := "admin-addr: 0.0.0.0:9480\nallow-remote-admin: true\nadmin-grants-leases: true\nadmin-lease-rate: 5\nadmin-pprof: true\nengine-group: kvctl\nmax-conns: 300\ndescriptor-ttl: 10s\n"
	f, diags := Load("serve.yaml", []byte(src), LoadOptions{Kind: KindServe})
	if diags.HasErrors() || f == nil || f.Serve == nil {
		t.Fatalf("%v", diags)
	}
	want := ServeSecurity{EngineGroup: "kvctl", MaxConns: 300, AdminGrantsLeases: true, AdminLeaseRate: 5, AdminPprof: true, DescriptorTTL: 10 * time.Second}
	if f.Serve.ServeSecurity != want {
		t.Errorf("got %+v, want %+v", f.Serve.ServeSecurity, want)
	}
	var remote, leases, pprof bool
	for _, d := range diags {
		if d.Severity == SeverityWarning && d.Path == ServeKeyAllowRemoteAdmin && strings.Contains(d.Message, "/get_all_keys") {
			remote = true
		}
		if d.Severity == SeverityWarning && d.Path == ServeKeyAdminGrantsLeases {
			leases = true
		}
		if d.Severity == SeverityWarning && d.Path == ServeKeyAdminPprof && d.Message == AdminPprofRemoteWarning {
			pprof = true
		}
	}
	if !remote || !leases || !pprof {
		t.Errorf("missing warnings (remote admin %v, leases %v, pprof %v): %v", remote, leases, pprof, diags)
	}
	for _, bad := range []string{"max-conns: -1\n", "admin-lease-rate: -2\n", "descriptor-ttl: -1s\n", "max-conns: x\n", "admin-pprof: \"true\"\n"} {
		if _, d := Load("serve.yaml", []byte(bad), LoadOptions{Kind: KindServe}); !d.HasErrors() {
			t.Errorf("%q was accepted", bad)
		}
	}
}
