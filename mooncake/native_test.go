package mooncake_test

import (
	"context"
	"testing"
	"time"

	"github.com/kvctl/kvctl/mooncake"
	"github.com/kvctl/kvctl/mooncake/mooncaketest"
	"github.com/kvctl/kvctl/mooncake/pooltest"
)

// newNative starts a Native pool client with a segment of segSize bytes on m; it is closed by
// t.Cleanup.
func newNative(t testing.TB, m *mooncaketest.Master, segSize int64) *mooncake.Native {
	t.Helper()
	n, err := mooncake.NewNative(context.Background(), mooncake.NativeOptions{
		MasterAddr:  m.RPCAddr,
		MetadataURL: m.MetadataURL,
		AdminURL:    m.AdminURL,
		SegmentSize: segSize,
		Heartbeat:   200 * time.Millisecond,
	})
	if err != nil {
		t.Fatalf("NewNative: %v", err)
	}
	t.Cleanup(func() { _ = n.Close() })
	return n
}

// TestNativeConformance runs the pool conformance suite through Native against the real
// mooncake_master, a fresh master for each case.
func TestNativeConformance(t *testing.T) {
	pooltest.Run(t, func(t *testing.T) mooncake.Pool {
		m := mooncaketest.StartMaster(t, mooncaketest.MasterOptions{})
		return newNative(t, m, 64<<20)
	})
}
