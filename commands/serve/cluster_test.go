package serve

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvctl/kvctl/commands/cmdutil/cmdtest"
	"github.com/kvctl/kvctl/core/config"
	"github.com/kvctl/kvctl/core/statsapi"
)

// TestClusterFlags pins the mooncake backend's flag names and what they fill.
func TestClusterFlags(t *testing.T) {
	var got *Options
	cmd := NewCmdServe(cmdtest.Factory(), func(_ context.Context, o *Options) error { got = o; return nil })
	err := cmdtest.Execute(t, cmd, "--pool-backend mooncake --master 10.0.0.5:50051 --metadata http://10.0.0.5:8080/metadata "+
		"--host-address 10.0.0.7 --transfer-port 15000 --local-buffer-size 32MiB --protocol tcp --device-name mlx5_0 "+
		"--mooncake-config /etc/mooncake.json --master-admin http://10.0.0.5:9003 --pool-timeout 3s --locate-window 250ms --pool-size 8GiB --socket /tmp/s.sock")
	if err != nil {
		t.Fatal(err)
	}
	want := config.ClusterKeys{Master: "10.0.0.5:50051", Metadata: "http://10.0.0.5:8080/metadata", HostAddress: "10.0.0.7",
		LocalBufferSize: "32MiB", Protocol: "tcp", DeviceName: "mlx5_0", MooncakeConfig: "/etc/mooncake.json",
		PoolTimeout: 3 * time.Second, MasterAdmin: "http://10.0.0.5:9003", TransferPort: 15000, LocateWindow: 250 * time.Millisecond}
	if got.Cluster != want || got.PoolBackend != "mooncake" || got.PoolSize != "8GiB" {
		t.Fatalf("options %+v\nwant cluster %+v", got.Cluster, want)
	}
	got.LogLevel, got.LogFormat = "info", "text" // the root command's flags, absent here
	sc, diags := got.serveConfig()
	if diags.HasErrors() || sc.Master != want.Master || sc.TransferPort != 15000 {
		t.Fatalf("serve config %+v %v", sc.ClusterKeys, diags)
	}
}

// TestClusterBackendResolves builds the backend from keys without dialling anything: the
// segment is the pool size, the host address defaults to the route to the master, and the
// banner names master, metadata and segment.
func TestClusterBackendResolves(t *testing.T) {
	sc := config.DefaultServeConfig()
	sc.PoolBackend, sc.PoolSize = config.PoolBackendMooncake, "32MiB"
	sc.Master, sc.Metadata, sc.TransferPort = "127.0.0.1:50051", "http://127.0.0.1:8080/metadata", 15000
	plan, diags := sc.Resolve(config.ResolveOptions{})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	b, err := buildBackend(context.Background(), plan, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := *plan.Cluster
	info := b.Info
	if info.Kind != statsapi.BackendMooncake || info.SegmentBytes != 32<<20 || info.HostAddress != "127.0.0.1" ||
		info.Segment != "127.0.0.1:15000" || info.Protocol != "tcp" || c.MasterAdmin != "http://127.0.0.1:9003" {
		t.Fatalf("info %+v cluster %+v", info, c)
	}
	banner := clusterBanner(info)
	for _, w := range []string{"mooncake, master 127.0.0.1:50051", "metadata http://127.0.0.1:8080/metadata", "127.0.0.1:15000, 32MiB donated"} {
		if !strings.Contains(banner, w) {
			t.Errorf("banner %q lacks %q", banner, w)
		}
	}

	sc.PoolSize = "1MiB"
	if _, diags := sc.Resolve(config.ResolveOptions{}); !strings.Contains(fmt.Sprint(diags), "below the 16MiB minimum segment") {
		t.Fatalf("a 1 MiB segment: %v", diags)
	}
	sc.PoolSize, sc.Metadata = "32MiB", "P2PHANDSHAKE"
	if _, diags := sc.Resolve(config.ResolveOptions{}); !diags.HasErrors() {
		t.Fatal("P2PHANDSHAKE accepted")
	}
}
