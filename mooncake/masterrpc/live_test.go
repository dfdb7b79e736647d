package masterrpc_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kvctl/kvctl/mooncake/masterrpc"
	"github.com/kvctl/kvctl/mooncake/mooncaketest"
)

const tenant = masterrpc.DefaultTenant

func mount(t *testing.T, c *masterrpc.Client, name string, base, size uint64) (masterrpc.Segment, masterrpc.UUID) {
	t.Helper()
	seg := masterrpc.Segment{ID: masterrpc.UUID{1, uint64(time.Now().UnixNano())}, Name: name, Base: base, Size: size, TEEndpoint: name, Protocol: "tcp"}
	client := masterrpc.UUID{2, uint64(time.Now().UnixNano())}
	if err := c.MountSegment(context.Background(), seg, client); err != nil {
		t.Fatalf("MountSegment: %v", err)
	}
	return seg, client
}

// TestLiveMasterCalls runs every call kvctl makes against the real mooncake_master and checks
// the master's answers: the put lifecycle, existence, replica lists with the address the
// master allocated inside the mounted segment, revoke, remove with its lease rule, segment
// listing and the heartbeat.
func TestLiveMasterCalls(t *testing.T) {
	m := mooncaketest.StartMaster(t, mooncaketest.MasterOptions{LeaseTTL: 5 * time.Second})
	ctx := context.Background()
	c, err := masterrpc.Dial(ctx, masterrpc.Options{Addr: m.RPCAddr})
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if v, err := c.ServiceReady(ctx); err != nil || v != masterrpc.ProtocolVersion {
		t.Fatalf("ServiceReady = %q, %v", v, err)
	}
	if _, err := c.GetStorageConfig(ctx); err != nil {
		t.Fatalf("GetStorageConfig: %v", err)
	}
	const base, size = 0x7f0000000000, 16 << 20
	seg, client := mount(t, c, "127.0.0.1:1", base, size)
	p, err := c.Ping(ctx, client)
	if err != nil {
		t.Fatalf("Ping: %v", err)
	}
	if p.ClientStatus != masterrpc.ClientOK && p.ClientStatus != masterrpc.ClientNeedRemount {
		t.Fatalf("Ping status = %d", p.ClientStatus)
	}

	keys := []string{"a", "b", "c"}
	cfg := masterrpc.ReplicateConfig{ReplicaNum: 1, SoftPinAction: masterrpc.SoftPinEnable, HasSoftPinTTL: true, SoftPinTTLms: 60000,
		HasGroupIDs: true, GroupIDs: []string{"g", "g", ""}}
	started, err := c.BatchPutStart(ctx, client, keys, []uint64{100, 4096, 300}, cfg, tenant)
	if err != nil {
		t.Fatalf("BatchPutStart: %v", err)
	}
	for i, r := range started {
		if r.Code != 0 || len(r.Replicas) != 1 {
			t.Fatalf("BatchPutStart[%d] = %+v", i, r)
		}
		rep := r.Replicas[0]
		if rep.Kind != masterrpc.ReplicaMemory || rep.Endpoint != seg.Name || rep.Addr < base || rep.Addr+rep.Size > base+size || rep.Status != masterrpc.ReplicaProcessing {
			t.Fatalf("replica %d = %+v, want a processing memory replica inside the segment", i, rep)
		}
	}
	if got, _ := c.BatchExistKey(ctx, keys, tenant); got[0] != 0 {
		t.Fatalf("a key whose put has not ended exists: %v", got)
	}
	ends, err := c.BatchPutEnd(ctx, client, keys[:2], tenant)
	if err != nil || ends[0] != 0 || ends[1] != 0 {
		t.Fatalf("BatchPutEnd = %v, %v", ends, err)
	}
	revs, err := c.BatchPutRevoke(ctx, client, keys[2:], tenant)
	if err != nil || revs[0] != 0 {
		t.Fatalf("BatchPutRevoke = %v, %v", revs, err)
	}
	again, err := c.BatchPutStart(ctx, client, []string{"a"}, []uint64{100}, masterrpc.ReplicateConfig{ReplicaNum: 1}, tenant)
	if err != nil || again[0].Code != -705 {
		t.Fatalf("second BatchPutStart of a = %+v, %v; want -705", again, err)
	}
	exist, err := c.BatchExistKey(ctx, []string{"a", "b", "c", "zz"}, tenant)
	if err != nil || exist[0] != 1 || exist[1] != 1 || exist[2] != 0 || exist[3] != 0 {
		t.Fatalf("BatchExistKey = %v, %v; want [1 1 0 0]", exist, err)
	}
	lists, err := c.BatchGetReplicaList(ctx, []string{"b", "zz"}, tenant)
	if err != nil {
		t.Fatalf("BatchGetReplicaList: %v", err)
	}
	if lists[0].Code != 0 || len(lists[0].List.Replicas) != 1 || lists[0].List.Replicas[0].Status != masterrpc.ReplicaComplete ||
		lists[0].List.Replicas[0].Addr != started[1].Replicas[0].Addr || lists[0].List.Replicas[0].Size != 4096 {
		t.Fatalf("replica list of b = %+v, want the complete replica put started", lists[0])
	}
	if lists[1].Code != -704 {
		t.Fatalf("replica list of a missing key = %+v, want -704", lists[1])
	}
	if code, err := c.Remove(ctx, "b", false, tenant); err != nil || code != -706 {
		t.Fatalf("Remove of a just-read key = %d, %v; want -706 (read lease)", code, err)
	}
	if code, err := c.Remove(ctx, "b", true, tenant); err != nil || code != 0 {
		t.Fatalf("forced Remove = %d, %v", code, err)
	}
	if code, _ := c.Remove(ctx, "b", true, tenant); code != -704 {
		t.Fatalf("Remove of a removed key = %d, want -704", code)
	}
	if err := c.UnmountSegment(ctx, seg.ID, client); err != nil {
		t.Fatalf("UnmountSegment: %v", err)
	}
	if got, _ := c.BatchExistKey(ctx, []string{"a"}, tenant); got[0] != 0 {
		t.Fatalf("object of an unmounted segment still exists: %v", got)
	}
}

// TestReconnectAfterMasterRestart: calls fail while the master is down, the client reconnects
// by itself once it is back, and a segment owner's Ping then asks for a remount.
func TestReconnectAfterMasterRestart(t *testing.T) {
	m := mooncaketest.StartMaster(t, mooncaketest.MasterOptions{})
	ctx := context.Background()
	c, err := masterrpc.Dial(ctx, masterrpc.Options{Addr: m.RPCAddr, MaxBackoff: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	seg, client := mount(t, c, "127.0.0.1:2", 0x10000, 1<<20)
	gen := c.Generation()
	m.Kill()
	if _, err := c.BatchExistKey(ctx, []string{"x"}, tenant); !errors.Is(err, masterrpc.ErrUnavailable) {
		t.Fatalf("call with the master down = %v, want ErrUnavailable", err)
	}
	m.Restart()
	deadline := time.Now().Add(10 * time.Second)
	var p masterrpc.PingResponse
	for {
		p, err = c.Ping(ctx, client)
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("no reconnect after restart: %v", err)
	}
	if c.Generation() == gen {
		t.Fatal("Generation did not change across a reconnect")
	}
	if p.ClientStatus != masterrpc.ClientNeedRemount {
		t.Fatalf("Ping after restart = %+v, want NEED_REMOUNT", p)
	}
	if err := c.ReMountSegment(ctx, []masterrpc.Segment{seg}, client); err != nil {
		t.Fatalf("ReMountSegment: %v", err)
	}
	if p, err := c.Ping(ctx, client); err != nil || p.ClientStatus != masterrpc.ClientOK {
		t.Fatalf("Ping after remount = %+v, %v; want OK", p, err)
	}
}

// TestConcurrentCallsShareOneConnection: many goroutines call at once over one connection
// (Conns 1) and each gets its own answer, also while some give up on short deadlines.
func TestConcurrentCallsShareOneConnection(t *testing.T) {
	m := mooncaketest.StartMaster(t, mooncaketest.MasterOptions{})
	ctx := context.Background()
	c, err := masterrpc.Dial(ctx, masterrpc.Options{Addr: m.RPCAddr, Conns: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	_, client := mount(t, c, "127.0.0.1:3", 0x20000, 1<<20)
	if _, err := c.BatchPutStart(ctx, client, []string{"present"}, []uint64{10}, masterrpc.ReplicateConfig{ReplicaNum: 1}, tenant); err != nil {
		t.Fatal(err)
	}
	if _, err := c.BatchPutEnd(ctx, client, []string{"present"}, tenant); err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 64)
	for g := 0; g < 16; g++ {
		go func(g int) {
			for i := 0; i < 50; i++ {
				cctx, cancel := context.WithTimeout(ctx, time.Duration(1+(g*i)%3)*time.Millisecond)
				if g%4 == 0 {
					cancel()
					cctx, cancel = context.WithTimeout(ctx, 10*time.Second)
				}
				keys := []string{"present", "absent", "present"}[:1+(g+i)%3]
				got, err := c.BatchExistKey(cctx, keys, tenant)
				cancel()
				if err != nil {
					if g%4 == 0 || !errors.Is(err, masterrpc.ErrUnavailable) {
						errs <- err
						return
					}
					continue
				}
				want := []int{1, 0, 1}[:len(keys)]
				for j := range want {
					if got[j] != want[j] {
						errs <- errors.New("a call got another call's answer")
						return
					}
				}
			}
			errs <- nil
		}(g)
	}
	for g := 0; g < 16; g++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if got, err := c.BatchExistKey(ctx, []string{"absent", "present"}, tenant); err != nil || got[1] != 1 {
		t.Fatalf("after the storm: %v %v", got, err)
	}
}

// TestLiveObjectChecksum: the real master keeps the checksum a put ends with and returns it
// with the object's replica list; an object put without one has none.
func TestLiveObjectChecksum(t *testing.T) {
	m := mooncaketest.StartMaster(t, mooncaketest.MasterOptions{})
	ctx := context.Background()
	c, err := masterrpc.Dial(ctx, masterrpc.Options{Addr: m.RPCAddr})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	_, client := mount(t, c, "127.0.0.1:4", 0x40000, 1<<20)
	keys := []string{"summed", "plain"}
	if _, err := c.BatchPutStart(ctx, client, keys, []uint64{10, 10}, masterrpc.ReplicateConfig{ReplicaNum: 1}, tenant); err != nil {
		t.Fatal(err)
	}
	const sum = 0xfedcba9876543210
	ends, err := c.BatchPutEndMeta(ctx, client, []masterrpc.ObjectMeta{{Key: "summed", HasChecksum: true, Checksum: sum}, {Key: "plain"}}, tenant)
	if err != nil || ends[0] != 0 || ends[1] != 0 {
		t.Fatalf("BatchPutEndMeta: %v %v", ends, err)
	}
	lists, err := c.BatchGetReplicaList(ctx, keys, tenant)
	if err != nil {
		t.Fatal(err)
	}
	if l := lists[0]; l.Code != 0 || !l.List.HasChecksum || l.List.Checksum != sum {
		t.Errorf("replica list of the summed object: %+v, want checksum %#x", l, uint64(sum))
	}
	if l := lists[1]; l.Code != 0 || l.List.HasChecksum {
		t.Errorf("replica list of an object put without a checksum: %+v", l)
	}
}
