package daemon

import (
	"testing"

	"github.com/kvctl/kvctl/core/statsapi"
	"github.com/kvctl/kvctl/mooncake"
)

// TestConnectorPoolInPlace pins which backends the connectors use in place: the embedded pool
// (its memory is this process's) and not a Mooncake backend, even one whose pool type happens
// to have the in-place calls.
func TestConnectorPoolInPlace(t *testing.T) {
	o := mooncake.DefaultOptions()
	o.Segments = []mooncake.SegmentSpec{{Name: "s", Capacity: 1 << 20}}
	o.EvictionPeriod = 0 // no goroutine to outlive the test
	d, err := New(Config{Pool: o})
	if err != nil {
		t.Fatal(err)
	}
	p := d.connectorPool()
	if _, ok := p.(mooncake.Viewer); !ok {
		t.Fatal("the embedded backend's connector pool has no in-place reads")
	}
	if _, ok := p.(mooncake.Reserver); !ok {
		t.Fatal("the embedded backend's connector pool has no in-place writes")
	}

	e, err := mooncake.NewEmbedded(o)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	d2, err := New(Config{Backend: &Backend{Pool: e, Info: statsapi.BackendInfo{Kind: statsapi.BackendMooncake, Master: "127.0.0.1:1"}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := d2.connectorPool().(mooncake.Viewer); ok {
		t.Fatal("a Mooncake backend is read in place")
	}
}
