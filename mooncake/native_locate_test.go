package mooncake_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"testing"
	"time"

	"github.com/kvctl/kvctl/mooncake"
	"github.com/kvctl/kvctl/mooncake/masterrpc"
	"github.com/kvctl/kvctl/mooncake/mooncaketest"
	"github.com/kvctl/kvctl/pool"
)

// Replica-list calls and the keys they carried, as the real master counts them.
const (
	metricReplicaListCalls = "master_batch_get_replica_list_requests_total"
	metricReplicaListItems = "master_batch_get_replica_list_items_total"
)

func masterCount(t *testing.T, m *mooncaketest.Master, name string) float64 {
	t.Helper()
	v, ok, err := m.Metric(context.Background(), name)
	if err != nil || !ok {
		t.Fatalf("master metric %s: ok %v, %v", name, ok, err)
	}
	return v
}

// locateFixture is an owner host that stored pages and a reader host (no segment) that
// locates and gets them, on one real master.
func locateFixture(t *testing.T, opts mooncaketest.MasterOptions, pages int) (m *mooncaketest.Master, owner, reader *mooncake.Native, keys []string, want [][]byte) {
	t.Helper()
	m = mooncaketest.StartMaster(t, opts)
	owner = newNative(t, m, 64<<20)
	ctx := context.Background()
	keys = make([]string, pages)
	want = make([][]byte, pages)
	for i := range keys {
		keys[i] = fmt.Sprintf("locate-%d", i)
		want[i] = make([]byte, 16<<10)
		_, _ = rand.Read(want[i])
	}
	for i, c := range owner.BatchPut(ctx, keys, want, pool.ReplicateConfig{}) {
		if c != pool.OK {
			t.Fatalf("put %s: %v", keys[i], c)
		}
	}
	reader, err := mooncake.NewNative(ctx, mooncake.NativeOptions{MasterAddr: m.RPCAddr, MetadataURL: m.MetadataURL})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = reader.Close() })
	return m, owner, reader, keys, want
}

func getAll(t *testing.T, n *mooncake.Native, keys []string, want [][]byte) {
	t.Helper()
	bufs := make([][]byte, len(keys))
	for i := range bufs {
		bufs[i] = make([]byte, len(want[i]))
	}
	for i, got := range n.BatchGet(context.Background(), keys, bufs) {
		if got != int64(len(want[i])) {
			t.Fatalf("get %s = %d, want %d bytes", keys[i], got, len(want[i]))
		}
		if !bytes.Equal(bufs[i], want[i]) {
			t.Fatalf("get %s: the bytes differ from the ones put", keys[i])
		}
	}
}

// TestBatchLocateAnswersAsExist checks, on the real master, that the lookup's replica-list
// probe gives the existence check's answer for present, absent and still-being-written keys.
func TestBatchLocateAnswersAsExist(t *testing.T) {
	m, owner, reader, keys, _ := locateFixture(t, mooncaketest.MasterOptions{}, 8)
	ctx := context.Background()
	// A put started and never ended: the master holds the key without a complete replica.
	rpc, err := masterrpc.Dial(ctx, masterrpc.Options{Addr: m.RPCAddr})
	if err != nil {
		t.Fatal(err)
	}
	defer rpc.Close()
	start, err := rpc.BatchPutStart(ctx, masterrpc.UUID{7, 7}, []string{"locate-pending"}, []uint64{4096}, masterrpc.ReplicateConfig{ReplicaNum: 1}, "")
	if err != nil || start[0].Code != 0 {
		t.Fatalf("BatchPutStart: %v %+v", err, start)
	}
	probe := append([]string{"locate-absent", "locate-pending"}, keys...)
	exist := reader.BatchIsExist(ctx, probe)
	located := reader.BatchLocate(ctx, probe)
	if fmt.Sprint(exist) != fmt.Sprint(located) {
		t.Fatalf("BatchLocate = %v, BatchIsExist = %v", located, exist)
	}
	if located[0] != 0 || located[1] != 0 || located[2] != 1 {
		t.Fatalf("BatchLocate = %v, want absent 0, pending 0, stored 1", located)
	}
	if got := reader.Located(); got != len(keys) {
		t.Fatalf("%d replica lists kept, want one per stored key (%d)", got, len(keys))
	}
	_ = owner
}

// TestGetAfterLocateAsksNoMaster checks that gets of keys a lookup located read them without
// a master call, and that only the keys not located are asked.
func TestGetAfterLocateAsksNoMaster(t *testing.T) {
	m, _, reader, keys, want := locateFixture(t, mooncaketest.MasterOptions{}, 16)
	ctx := context.Background()
	if got := reader.BatchLocate(ctx, keys[:8]); fmt.Sprint(got) != fmt.Sprint([]int{1, 1, 1, 1, 1, 1, 1, 1}) {
		t.Fatalf("BatchLocate = %v", got)
	}
	calls, items := masterCount(t, m, metricReplicaListCalls), masterCount(t, m, metricReplicaListItems)
	getAll(t, reader, keys[:8], want[:8])
	if c := masterCount(t, m, metricReplicaListCalls); c != calls {
		t.Fatalf("the get of 8 located keys made %v replica-list calls, want none", c-calls)
	}
	// A second get of the same keys (another request's shared prefix) within the time.
	getAll(t, reader, keys[:8], want[:8])
	if c := masterCount(t, m, metricReplicaListCalls); c != calls {
		t.Fatalf("the second get of 8 located keys made %v replica-list calls, want none", c-calls)
	}
	// Located keys and others in one get: the master is asked for the others only.
	getAll(t, reader, keys, want)
	if c, i := masterCount(t, m, metricReplicaListCalls)-calls, masterCount(t, m, metricReplicaListItems)-items; c != 1 || i != 8 {
		t.Fatalf("the get of 8 located and 8 other keys made %v calls for %v keys, want 1 for 8", c, i)
	}
}

// TestLocatedListsExpire checks that a list is used only within half the read lease the master
// granted with it; a later get asks the master again and still reads the right bytes.
func TestLocatedListsExpire(t *testing.T) {
	const lease = 400 * time.Millisecond
	m, _, reader, keys, want := locateFixture(t, mooncaketest.MasterOptions{LeaseTTL: lease}, 4)
	ctx := context.Background()
	reader.BatchLocate(ctx, keys)
	time.Sleep(lease/2 + 50*time.Millisecond)
	calls := masterCount(t, m, metricReplicaListCalls)
	getAll(t, reader, keys, want)
	if c := masterCount(t, m, metricReplicaListCalls) - calls; c != 1 {
		t.Fatalf("a get past half the lease made %v replica-list calls, want 1", c)
	}
	if reader.Located() != 0 {
		t.Fatalf("%d expired lists still kept after the get of their keys", reader.Located())
	}
}

// TestLocateHoldsTheLease checks the premise of keeping the lists: the lease the lookup took
// keeps another client from removing the object (without force) while its list is kept.
func TestLocateHoldsTheLease(t *testing.T) {
	_, owner, reader, keys, want := locateFixture(t, mooncaketest.MasterOptions{LeaseTTL: 5 * time.Second}, 2)
	ctx := context.Background()
	reader.BatchLocate(ctx, keys[:1])
	if c := owner.Remove(ctx, keys[0], false); c != pool.ErrObjectHasLease {
		t.Fatalf("Remove of a located key = %v, want %v", c, pool.ErrObjectHasLease)
	}
	getAll(t, reader, keys[:1], want[:1])
}
