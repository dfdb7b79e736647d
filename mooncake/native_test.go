package mooncake_test

import (
	"context"
	"testing"
	"time"

	"github.com/kvctl/kvctl/mooncake"
	"github.com/kvctl/kvctl/mooncake/mooncaketest"
	"github.com/kvctl/kvctl/pool"
	"github.com/kvctl/kvctl/pool/pooltest"
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
	(&pooltest.Suite{NewPool: func(t *testing.T) pool.Pool {
		m := mooncaketest.StartMaster(t, mooncaketest.MasterOptions{})
		return newNative(t, m, 64<<20)
	}}).RunTests(t)
}

// BenchmarkNativeSuite runs the shared pool benchmarks through Native against the real
// mooncake_master (its Transfer Engine over loopback TCP), a fresh master for each.
func BenchmarkNativeSuite(b *testing.B) {
	(&pooltest.Suite{NewBenchPool: func(b *testing.B) pool.Pool {
		m := mooncaketest.StartMaster(b, mooncaketest.MasterOptions{})
		return newNative(b, m, 64<<20)
	}}).RunBenchmarks(b)
}

// TestCodesPinned pins the values and names of the master's error codes: they are the
// master's contract and the JSON kvctl prints carries them.
func TestCodesPinned(t *testing.T) {
	for _, c := range []struct {
		code  pool.Code
		value int32
		name  string
	}{
		{pool.ErrNoAvailableHandle, -200, "NO_AVAILABLE_HANDLE"},
		{mooncake.ErrSegmentNotFoundCode, -101, "SEGMENT_NOT_FOUND"},
		{mooncake.ErrInvalidVersion, -300, "INVALID_VERSION"},
		{pool.ErrObjectNotFound, -704, "OBJECT_NOT_FOUND"},
		{pool.ErrObjectAlreadyExists, -705, "OBJECT_ALREADY_EXISTS"},
		{pool.ErrObjectHasLease, -706, "OBJECT_HAS_LEASE"},
		{mooncake.ErrReplicaIsGone, -712, "REPLICA_IS_GONE"},
		{pool.ErrChecksumMismatch, -800, "CHECKSUM_MISMATCH"},
		{mooncake.ErrMooncakeChecksum, -801, "CHECKSUM_MISMATCH"},
		{pool.ErrRPCFail, -900, "RPC_FAIL"},
		{mooncake.ErrRPCTimeout, -901, "RPC_TIMEOUT"},
		{mooncake.ErrTenantQuotaExceeded, -1700, "TENANT_QUOTA_EXCEEDED"},
	} {
		if int32(c.code) != c.value || c.code.String() != c.name {
			t.Errorf("code %d %s, want %d %s", c.code, c.code, c.value, c.name)
		}
	}
}
