package cluster_test

import (
	"context"
	"testing"
	"time"

	"github.com/kvctl/kvctl/core/cluster"
	"github.com/kvctl/kvctl/mooncake"
	"github.com/kvctl/kvctl/mooncake/mooncaketest"
	"github.com/kvctl/kvctl/pool"
	"github.com/kvctl/kvctl/pool/pooltest"
)

// mountedPool returns a cluster.Pool with a 64 MiB segment, mounted with a fresh real
// mooncake_master.
func mountedPool(t testing.TB) pool.Pool {
	t.Helper()
	m := mooncaketest.StartMaster(t, mooncaketest.MasterOptions{})
	p, err := cluster.New(cluster.Options{Native: mooncake.NativeOptions{MasterAddr: m.RPCAddr, MetadataURL: m.MetadataURL,
		AdminURL: m.AdminURL, SegmentSize: 64 << 20, CallTimeout: 5 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := p.Mount(ctx); err != nil {
		t.Fatalf("Mount: %v", err)
	}
	return p
}

// TestClusterConformance runs the shared pool conformance suite on cluster.Pool, the daemon's
// pool in Mooncake mode, against the real mooncake_master.
func TestClusterConformance(t *testing.T) {
	(&pooltest.Suite{NewPool: func(t *testing.T) pool.Pool { return mountedPool(t) }}).RunTests(t)
}

// BenchmarkClusterSuite runs the shared pool benchmarks on cluster.Pool against the real
// mooncake_master.
func BenchmarkClusterSuite(b *testing.B) {
	(&pooltest.Suite{NewBenchPool: func(b *testing.B) pool.Pool { return mountedPool(b) }}).RunBenchmarks(b)
}
