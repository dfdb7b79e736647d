package mooncaketest_test

import (
	"bytes"
	"context"
	"testing"

	"github.com/kvctl/kvctl/mooncake/mooncaketest"
)

// TestRealMasterAndPythonClients proves the harness itself: a page put by one Python store
// client is read back byte for byte by another process over the Transfer Engine, existence and
// removal behave, and the master's metrics count the object.
func TestRealMasterAndPythonClients(t *testing.T) {
	m := mooncaketest.StartMaster(t, mooncaketest.MasterOptions{})
	holder := mooncaketest.StartClient(t, m, mooncaketest.ClientOptions{SegmentSize: 64 << 20})
	actor := mooncaketest.StartClient(t, m, mooncaketest.ClientOptions{})

	value := bytes.Repeat([]byte{0, 1, 2, 0xff, '\n'}, 1<<12)
	if rc := actor.Put("harness/a", value, mooncaketest.PutOptions{}); rc != 0 {
		t.Fatalf("put = %d", rc)
	}
	if got := holder.Get("harness/a"); !bytes.Equal(got, value) {
		t.Fatalf("get returned %d bytes, want the %d put", len(got), len(value))
	}
	if got := actor.BatchIsExist([]string{"harness/a", "harness/missing"}); len(got) != 2 || got[0] != 1 || got[1] != 0 {
		t.Fatalf("batch_is_exist = %v, want [1 0]", got)
	}
	if got := actor.Get("harness/missing"); len(got) != 0 {
		t.Fatalf("get of a missing key returned %d bytes", len(got))
	}
	v, ok, err := m.Metric(context.Background(), "master_key_count")
	if err != nil || !ok || v != 1 {
		t.Fatalf("master_key_count = %v (exposed %v, %v), want 1", v, ok, err)
	}
	if rc := actor.Remove("harness/a", true); rc != 0 {
		t.Fatalf("remove = %d", rc)
	}
	if rc := actor.IsExist("harness/a"); rc != 0 {
		t.Fatalf("is_exist after remove = %d", rc)
	}
	holder.Kill()
	m.Restart()
	if v, ok, _ := m.Metric(context.Background(), "master_key_count"); !ok || v != 0 {
		t.Fatalf("after restart master_key_count = %v (exposed %v), want 0", v, ok)
	}
}
