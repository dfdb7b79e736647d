package cluster_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/kvctl/kvctl/core/cluster"
	"github.com/kvctl/kvctl/mooncake"
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
		if v != int(mooncake.ErrRPCFail) {
			t.Fatalf("exist before mount: %d", v)
		}
	}
	// A put before the mount asks nothing: not joined, rather than failed.
	for _, c := range p.BatchPut(ctx, keys, [][]byte{{1}, {2}}, mooncake.ReplicateConfig{}) {
		if c != mooncake.ErrNotJoined {
			t.Fatalf("put before mount: %d", c)
		}
	}
	for _, n := range p.BatchGet(ctx, keys, [][]byte{make([]byte, 1), make([]byte, 1)}) {
		if n != int64(mooncake.ErrRPCFail) {
			t.Fatalf("get before mount: %d", n)
		}
	}
	if c := p.Remove(ctx, "a", false); c != mooncake.ErrRPCFail {
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
