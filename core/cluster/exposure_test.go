package cluster_test

import (
	"context"
	"errors"
	"net/netip"
	"testing"

	"github.com/kvctl/kvctl/core/cluster"
)

func TestPrivateAddr(t *testing.T) {
	for _, c := range []struct {
		ip      string
		private bool
	}{
		{"127.0.0.1", true}, {"::1", true}, {"10.1.2.3", true}, {"172.16.0.9", true}, {"192.168.1.1", true},
		{"fd00::5", true}, {"fe80::1", true}, {"169.254.0.7", true}, {"100.64.3.4", true}, {"::ffff:10.0.0.1", true},
		{"0.0.0.0", false}, {"::", false}, {"8.8.8.8", false}, {"172.32.0.1", false}, {"203.0.113.5", false},
		{"2001:db8::1", false}, {"::ffff:8.8.8.8", false},
	} {
		if got := cluster.PrivateAddr(netip.MustParseAddr(c.ip)); got != c.private {
			t.Errorf("PrivateAddr(%s) = %v, want %v", c.ip, got, c.private)
		}
	}
}

// TestCheckExposure: each of the three addresses is reported when it is, or a name resolves to,
// a non-private address; private ones and names that do not resolve are not.
func TestCheckExposure(t *testing.T) {
	resolve := func(_ context.Context, host string) ([]netip.Addr, error) {
		switch host {
		case "meta.example":
			return []netip.Addr{netip.MustParseAddr("10.0.0.8"), netip.MustParseAddr("198.51.100.4")}, nil
		case "master.internal":
			return []netip.Addr{netip.MustParseAddr("10.0.0.5")}, nil
		}
		return nil, errors.New("no such host")
	}
	ctx := context.Background()
	if got := cluster.CheckExposure(ctx, "10.0.0.7", "http://master.internal:8080/metadata", "master.internal:50051", resolve); len(got) != 0 {
		t.Errorf("private addresses reported: %+v", got)
	}
	if got := cluster.CheckExposure(ctx, "10.0.0.7", "P2PHANDSHAKE", "nowhere.invalid:50051", resolve); len(got) != 0 {
		t.Errorf("P2PHANDSHAKE or an unresolved name reported: %+v", got)
	}
	got := cluster.CheckExposure(ctx, "203.0.113.9", "http://meta.example:8080/metadata", "[2001:db8::1]:50051", resolve)
	want := []string{"203.0.113.9", "198.51.100.4", "2001:db8::1"}
	if len(got) != len(want) {
		t.Fatalf("exposures %+v, want %v", got, want)
	}
	for i, w := range want {
		if got[i].IP.String() != w {
			t.Errorf("exposure %d: %+v, want %s", i, got[i], w)
		}
	}
}
