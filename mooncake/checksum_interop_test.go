package mooncake_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/kvctl/kvctl/mooncake"
	"github.com/kvctl/kvctl/mooncake/masterrpc"
	"github.com/kvctl/kvctl/mooncake/mooncaketest"
	"github.com/kvctl/kvctl/mooncake/transfer"
	"github.com/kvctl/kvctl/pool"
)

func checksumNative(t testing.TB, m *mooncaketest.Master, segSize int64) *mooncake.Native {
	t.Helper()
	n, err := mooncake.NewNative(context.Background(), mooncake.NativeOptions{MasterAddr: m.RPCAddr, MetadataURL: m.MetadataURL,
		SegmentSize: segSize, Heartbeat: 200 * time.Millisecond, ObjectChecksum: true})
	if err != nil {
		t.Fatalf("NewNative: %v", err)
	}
	t.Cleanup(func() { _ = n.Close() })
	return n
}

// TestObjectChecksumInterop: kvctl's object checksum is Mooncake's own. Mooncake's Python client
// with MOONCAKE_STORE_CHECKSUM=1 puts an object (it fills the checksum) that kvctl reads with
// verification on, and reads back with its own verification an object kvctl put; the master
// holds both checksums, and the one the Python client computed equals ObjectChecksum. A value
// of every length class (short, not a multiple of 8, a page) passes both ways. A kvctl object
// rewritten in its segment is refused by the Python client too.
func TestObjectChecksumInterop(t *testing.T) {
	m := mooncaketest.StartMaster(t, mooncaketest.MasterOptions{})
	rpc, err := masterrpc.Dial(context.Background(), masterrpc.Options{Addr: m.RPCAddr})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rpc.Close() })
	py := mooncaketest.StartClient(t, m, mooncaketest.ClientOptions{SegmentSize: 64 << 20, Env: []string{"MOONCAKE_STORE_CHECKSUM=1"}})
	kv := checksumNative(t, m, 64<<20)
	ctx := context.Background()
	for _, size := range []int{1, 13, 4096, 65536 + 5} {
		val := make([]byte, size)
		for i := range val {
			val[i] = byte(i*131 + size)
		}
		pyKey, kvKey := "py-"+string(rune('a'+size%26))+"-"+itoa(size), "kv-"+itoa(size)
		if rc := py.Put(pyKey, val, mooncaketest.PutOptions{}); rc != 0 {
			t.Fatalf("python put %d bytes: rc %d", size, rc)
		}
		lists, err := rpc.BatchGetReplicaList(ctx, []string{pyKey}, masterrpc.DefaultTenant)
		if err != nil || lists[0].Code != 0 || !lists[0].List.HasChecksum || lists[0].List.Checksum != mooncake.ObjectChecksum(val) {
			t.Fatalf("the Python client's checksum of a %d-byte object: %+v, %v; want %#x", size, lists, err, mooncake.ObjectChecksum(val))
		}
		buf := make([]byte, size)
		if got := kv.BatchGet(ctx, []string{pyKey}, [][]byte{buf}); got[0] != int64(size) || !bytes.Equal(buf, val) {
			t.Errorf("kvctl get of a %d-byte object the Python client put with its checksum: %d", size, got[0])
		}
		if c := kv.BatchPut(ctx, []string{kvKey}, [][]byte{val}, pool.ReplicateConfig{}); c[0] != pool.OK {
			t.Fatalf("kvctl put: %v", c[0])
		}
		if got := py.Get(kvKey); !bytes.Equal(got, val) {
			t.Errorf("python get (checksum verified) of a %d-byte object kvctl put: %d bytes", size, len(got))
		}
	}
	// Rewrite one of kvctl's objects in kvctl's segment: Mooncake's client refuses it.
	lists, err := rpc.BatchGetReplicaList(ctx, []string{"kv-4096"}, masterrpc.DefaultTenant)
	if err != nil || lists[0].Code != 0 || len(lists[0].List.Replicas) == 0 {
		t.Fatalf("replica list: %+v %v", lists, err)
	}
	r := lists[0].List.Replicas[0]
	meta, err := transfer.NewMetadataClient(m.MetadataURL, transfer.MetadataOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ep, err := meta.Resolve(ctx, r.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	if err := transfer.NewClient(transfer.ClientOptions{}).Write(ctx, ep.Addr, r.Addr, bytes.Repeat([]byte{0xAA}, int(r.Size))); err != nil {
		t.Fatal(err)
	}
	if got := py.Get("kv-4096"); len(got) != 0 {
		t.Errorf("the Python client served a rewritten page of %d bytes with checksums on", len(got))
	}
	st, err := kv.Stats(ctx)
	if err != nil || st.ChecksumErrors != 0 {
		t.Errorf("checksum errors %d (%v), want 0", st.ChecksumErrors, err)
	}
}

func itoa(n int) string {
	var b []byte
	for {
		b = append([]byte{byte('0' + n%10)}, b...)
		if n /= 10; n == 0 {
			return string(b)
		}
	}
}
