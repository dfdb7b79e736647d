package cluster_test

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvctl/kvctl/core/cluster"
	"github.com/kvctl/kvctl/mooncake"
	"github.com/kvctl/kvctl/mooncake/mooncaketest"
	"github.com/kvctl/kvctl/pool"
)

func TestNewRefusesMissingAddresses(t *testing.T) {
	if _, err := cluster.New(cluster.Options{Native: mooncake.NativeOptions{MetadataURL: "http://127.0.0.1:1/metadata"}}); err == nil {
		t.Fatal("no master accepted")
	}
	if _, err := cluster.New(cluster.Options{Native: mooncake.NativeOptions{MasterAddr: "127.0.0.1:1"}}); err == nil {
		t.Fatal("no metadata server accepted")
	}
}

// TestBeforeMount: a pool whose master never answered fails every data call at once, the way
// a client with an unreachable master does, and Mount reports the master unreachable.
func TestBeforeMount(t *testing.T) {
	port := strconv.Itoa(freePort(t)) // nothing listens there
	p, err := cluster.New(cluster.Options{Native: mooncake.NativeOptions{MasterAddr: "127.0.0.1:" + port,
		MetadataURL: "http://127.0.0.1:" + port + "/metadata", SegmentSize: 16 << 20, CallTimeout: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx := context.Background()
	if err := p.Ping(ctx); err == nil {
		t.Fatal("ping of a closed port succeeded")
	}
	if err := p.Mount(ctx); err == nil {
		t.Fatal("mount without a master succeeded")
	}
	keys := []string{"a", "b"}
	for _, v := range p.BatchIsExist(ctx, keys) {
		if v != int(pool.ErrRPCFail) {
			t.Fatalf("exist before mount: %d", v)
		}
	}
	// A put before the mount asks nothing: not joined, rather than failed.
	for _, c := range p.BatchPut(ctx, keys, [][]byte{{1}, {2}}, pool.ReplicateConfig{}) {
		if c != pool.ErrNotJoined {
			t.Fatalf("put before mount: %d", c)
		}
	}
	for _, n := range p.BatchGet(ctx, keys, [][]byte{make([]byte, 1), make([]byte, 1)}) {
		if n != int64(pool.ErrRPCFail) {
			t.Fatalf("get before mount: %d", n)
		}
	}
	if c := p.Remove(ctx, "a", false); c != pool.ErrRPCFail {
		t.Fatalf("remove before mount: %d", c)
	}
	if _, err := p.Segments(ctx); !errors.Is(err, cluster.ErrNotMounted) {
		t.Fatalf("segments before mount: %v", err)
	}
	if _, err := p.Stats(ctx); !errors.Is(err, cluster.ErrNotMounted) {
		t.Fatalf("stats before mount: %v", err)
	}
	if p.SegmentName() != "" || p.Remounts() != 0 {
		t.Fatal("a segment name or remounts before mount")
	}
	if err := p.Unmount(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.Mount(ctx); err == nil {
		t.Fatal("mount after unmount succeeded")
	}
}

// TestDerivedAdminOfAnotherMaster: an admin address derived from the master's host (nothing was
// given) that turns out to serve another master (two real masters, each with a segment) is
// dropped with a warning: the pool mounts, and its segments are its own, not the other
// cluster's. A given one that serves another master fails Mount, every time, with
// ErrForeignAdmin; the master's own admin server is kept.
func TestDerivedAdminOfAnotherMaster(t *testing.T) {
	a := mooncaketest.StartMaster(t, mooncaketest.MasterOptions{})
	b := mooncaketest.StartMaster(t, mooncaketest.MasterOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pl := func(m *mooncaketest.Master, admin string, derived bool, log *lockedBuffer) *cluster.Pool {
		t.Helper()
		p, err := cluster.New(cluster.Options{AdminDerived: derived, Logger: slog.New(slog.NewTextHandler(log, nil)),
			Native: mooncake.NativeOptions{MasterAddr: m.RPCAddr, MetadataURL: m.MetadataURL, AdminURL: admin,
				SegmentSize: 16 << 20, CallTimeout: 5 * time.Second}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Close() })
		return p
	}
	other := pl(b, b.AdminURL, false, &lockedBuffer{})
	if err := other.Mount(ctx); err != nil {
		t.Fatalf("a pool with its master's own admin server: %v", err)
	}

	log := &lockedBuffer{}
	derived := pl(a, b.AdminURL, true, log)
	if err := derived.Mount(ctx); err != nil {
		t.Fatalf("a derived admin address of another master failed Mount: %v", err)
	}
	if !strings.Contains(log.String(), "serves another master") {
		t.Errorf("no warning about the foreign admin server:\n%s", log.String())
	}
	segs, err := derived.Segments(ctx)
	if err != nil || len(segs) != 1 || segs[0].Name != derived.SegmentName() {
		t.Errorf("segments with a dropped admin server: %+v, %v; want only %s", segs, err, derived.SegmentName())
	}

	given := pl(a, b.AdminURL, false, &lockedBuffer{})
	for i := 0; i < 2; i++ {
		if err := given.Mount(ctx); !errors.Is(err, cluster.ErrForeignAdmin) || !strings.Contains(err.Error(), b.AdminURL) {
			t.Errorf("mount %d with another master's admin server given: %v, want ErrForeignAdmin naming it", i, err)
		}
	}
}
