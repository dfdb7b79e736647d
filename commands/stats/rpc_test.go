package stats

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/kvctl/kvctl/commands/cmdutil"
	"github.com/kvctl/kvctl/core/probe"
	"github.com/kvctl/kvctl/mooncake/masterrpc"
	"github.com/kvctl/kvctl/mooncake/mooncaketest"
)

// TestStatsOverRPC reports on a real master through its RPC address, written rpc://host:port
// and as a bare host:port; a dead master exits 4.
func TestStatsOverRPC(t *testing.T) {
	m := mooncaketest.StartMaster(t, mooncaketest.MasterOptions{})
	for _, pool := range []string{probe.RPCScheme + m.RPCAddr, m.RPCAddr} {
		ios, _, out, _ := cmdutil.Test()
		err := runStats(context.Background(), &Options{IO: ios, Pools: []string{pool}, Timeout: 5 * time.Second, OutputFormat: cmdutil.FormatJSON})
		if err != nil {
			t.Fatalf("--pool %s: %v", pool, err)
		}
		var r probe.StatsReport
		if err := json.Unmarshal(out.Bytes(), &r); err != nil {
			t.Fatal(err)
		}
		s := r.Sources[0]
		if s.Kind != probe.KindMasterRPC || s.Version != masterrpc.ProtocolVersion || s.Ready == nil || !*s.Ready || s.Source != probe.RPCScheme+m.RPCAddr {
			t.Fatalf("--pool %s: %+v", pool, s)
		}
	}
	m.Kill()
	ios, _, _, _ := cmdutil.Test()
	err := runStats(context.Background(), &Options{IO: ios, Pools: []string{probe.RPCScheme + m.RPCAddr}, Timeout: time.Second, OutputFormat: cmdutil.FormatJSON})
	if cmdutil.ExitCode(err) != cmdutil.ExitUnreachable {
		t.Fatalf("dead master: %v (exit %d), want 4", err, cmdutil.ExitCode(err))
	}
}
