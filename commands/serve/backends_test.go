package serve

import (
	"context"
	"slices"
	"testing"

	"github.com/kvctl/kvctl/commands/cmdutil/cmdtest"
	"github.com/kvctl/kvctl/core/config"
	"github.com/kvctl/kvctl/core/statsapi"
	"github.com/kvctl/kvctl/pool"
)

// TestBackendRegistry pins the registry `kvctl serve` builds its pool from: one entry per
// pool-backend value a serve config accepts, each with its own settings among serve's keys and
// flags, and the Detail figures it reports among /v1/stats's pool fields.
func TestBackendRegistry(t *testing.T) {
	names := pool.Names()
	want := slices.Sorted(slices.Values(config.PoolBackends))
	if !slices.Equal(names, want) {
		t.Fatalf("registered backends %v, want config.PoolBackends %v", names, want)
	}
	cmd := NewCmdServe(cmdtest.Factory(), func(context.Context, *Options) error { return nil })
	keys := config.ServeKeys()
	for _, b := range pool.Backends() {
		if b.Summary == "" {
			t.Errorf("backend %s has no summary", b.Name)
		}
		for _, k := range b.ConfigKeys {
			if !slices.Contains(keys, k) {
				t.Errorf("backend %s reads %q, which is not a serve config key", b.Name, k)
			}
			if cmd.Flags().Lookup(k) == nil {
				t.Errorf("backend %s reads %q, which is not a kvctl serve flag", b.Name, k)
			}
		}
		for _, n := range b.StatsDetail {
			if !(statsapi.PoolStats{}).HasField(n) {
				t.Errorf("backend %s reports Detail %q, not a field of /v1/stats's pool object", b.Name, n)
			}
		}
	}
}

// TestBuildEmbeddedBackend builds the default backend from a resolved plan through the
// registry: a pool of the plan's size that stores and returns a page, and what /v1/stats's
// backend object shows of it.
func TestBuildEmbeddedBackend(t *testing.T) {
	sc := config.DefaultServeConfig()
	sc.PoolSize, sc.PoolPrefault = "16MiB", false
	plan, diags := sc.Resolve(config.ResolveOptions{})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	b, err := buildBackend(context.Background(), plan, nil)
	if err != nil {
		t.Fatal(err)
	}
	if b.Info.Kind != statsapi.BackendEmbedded || b.Info.SegmentBytes != 16<<20 || b.Info.Segment != "kvctl-embedded-0" {
		t.Errorf("info %+v", b.Info)
	}
	ctx := context.Background()
	if c := b.Pool.BatchPut(ctx, []string{"k"}, [][]byte{[]byte("page")}, pool.ReplicateConfig{}); c[0] != pool.OK {
		t.Fatalf("put = %v", c[0])
	}
	buf := make([]byte, 4)
	if n := b.Pool.BatchGet(ctx, []string{"k"}, [][]byte{buf}); n[0] != 4 || string(buf) != "page" {
		t.Fatalf("get = %d %q", n[0], buf)
	}
	if st, err := b.Pool.Stats(ctx); err != nil || st.CapacityBytes != 16<<20 || st.Objects != 1 {
		t.Errorf("stats %+v, %v", st, err)
	}

	plan.Backend = "redis"
	if _, err := buildBackend(ctx, plan, nil); err == nil {
		t.Error("an unregistered backend was built")
	}
}
