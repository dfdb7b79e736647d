package masterrpc_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/kvctl/kvctl/mooncake/masterrpc"
	"github.com/kvctl/kvctl/mooncake/mooncaketest"
)

// existKeys mounts a segment and stores the first half of n keys "exist/i" on m, returning
// all n.
func existKeys(t *testing.T, c *masterrpc.Client, n int) []string {
	t.Helper()
	ctx := context.Background()
	_, client := mount(t, c, "127.0.0.1:7", 0x7f0000000000, 64<<20)
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("exist/%d", i)
	}
	sizes := make([]uint64, n/2)
	for i := range sizes {
		sizes[i] = 64
	}
	if _, err := c.BatchPutStart(ctx, client, keys[:n/2], sizes, masterrpc.ReplicateConfig{ReplicaNum: 1}, tenant); err != nil {
		t.Fatal(err)
	}
	if _, err := c.BatchPutEnd(ctx, client, keys[:n/2], tenant); err != nil {
		t.Fatal(err)
	}
	return keys
}

// checkExist checks the answers for keys made by existKeys, of which those below stored are
// stored.
func checkExist(keys []string, got []int, stored int) error {
	if len(got) != len(keys) {
		return fmt.Errorf("%d answers for %d keys", len(got), len(keys))
	}
	for i, v := range got {
		var idx int
		if _, err := fmt.Sscanf(keys[i], "exist/%d", &idx); err != nil {
			return err
		}
		if (idx < stored) != (v == 1) {
			return fmt.Errorf("key %s: %d", keys[i], v)
		}
	}
	return nil
}

func rpcConns(t *testing.T, m *mooncaketest.Master) int {
	t.Helper()
	n, err := m.RPCConns(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestLiveConnsBound: Dial opens Conns connections to the real master, and a storm of
// concurrent calls, large and small, never makes the client open more; every call gets its
// own answer and no reconnect happens.
func TestLiveConnsBound(t *testing.T) {
	m := mooncaketest.StartMaster(t, mooncaketest.MasterOptions{})
	ctx := context.Background()
	c, err := masterrpc.Dial(ctx, masterrpc.Options{Addr: m.RPCAddr, Conns: 3})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if n := rpcConns(t, m); n != 3 || c.OpenConns() != 3 {
		t.Fatalf("after Dial with Conns 3: %d connections to the master (%d open by the client's count)", n, c.OpenConns())
	}
	keys := existKeys(t, c, 3000)
	stop := make(chan struct{})
	most := make(chan int, 1)
	go func() { // the sampler
		hi := 0
		for {
			select {
			case <-stop:
				most <- hi
				return
			case <-time.After(2 * time.Millisecond):
			}
			if n, err := m.RPCConns(os.Getpid()); err == nil {
				hi = max(hi, n)
			}
		}
	}()
	var wg sync.WaitGroup
	errs := make(chan error, 24)
	for g := range 24 {
		wg.Go(func() {
			for i := range 20 {
				ks := keys[:1+(g*7+i)%3000]
				if g%3 == 0 {
					ks = keys
				}
				got, err := c.BatchExistKey(ctx, ks, tenant)
				if err == nil {
					err = checkExist(ks, got, 1500)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if hi := <-most; hi > 3 {
		t.Errorf("the client held %d connections to the master during the storm, bound 3", hi)
	}
	if n := rpcConns(t, m); n != 3 {
		t.Errorf("after the storm: %d connections to the master, want 3", n)
	}
	if g := c.Generation(); g != 1 {
		t.Errorf("Generation = %d without a reconnect, want 1", g)
	}
}

// TestLiveMasterKilledMidCall: calls in flight on every connection when the master is killed
// fail with ErrUnavailable at once (not at their timeout), the client closes its
// connections, calls during the backoff fail without waiting, and after a restart the client
// opens its connections again.
func TestLiveMasterKilledMidCall(t *testing.T) {
	m := mooncaketest.StartMaster(t, mooncaketest.MasterOptions{})
	ctx := context.Background()
	c, err := masterrpc.Dial(ctx, masterrpc.Options{Addr: m.RPCAddr, Conns: 4, MinBackoff: 200 * time.Millisecond, MaxBackoff: 400 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	keys := existKeys(t, c, 3000)
	gen := c.Generation()
	var killed time.Time
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() {
			for {
				got, err := c.BatchExistKey(ctx, keys, tenant)
				if err == nil {
					if err = checkExist(keys, got, 1500); err != nil {
						errs <- err
						return
					}
					continue
				}
				mu.Lock()
				k := killed
				mu.Unlock()
				switch {
				case k.IsZero():
					errs <- fmt.Errorf("a call failed before the kill: %w", err)
				case !errors.Is(err, masterrpc.ErrUnavailable):
					errs <- fmt.Errorf("a call cut by the kill: %w, want ErrUnavailable", err)
				case time.Since(k) > 3*time.Second:
					errs <- fmt.Errorf("a call cut by the kill failed only %v later", time.Since(k))
				default:
					errs <- nil
				}
				return
			}
		})
	}
	time.Sleep(200 * time.Millisecond)
	mu.Lock()
	killed = time.Now()
	mu.Unlock()
	m.Kill()
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	start := time.Now()
	if _, err := c.BatchExistKey(ctx, keys[:1], tenant); !errors.Is(err, masterrpc.ErrUnavailable) {
		t.Errorf("a call with the master down: %v", err)
	}
	if d := time.Since(start); d > 100*time.Millisecond {
		t.Errorf("a call with the master down took %v", d)
	}
	if n := c.OpenConns(); n != 0 {
		t.Errorf("%d connections open with the master down", n)
	}
	if n := rpcConns(t, m); n != 0 {
		t.Errorf("%d sockets to the dead master still open", n)
	}
	m.Restart()
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err = c.BatchExistKey(ctx, keys[:1], tenant)
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("no reconnect after the restart: %v", err)
	}
	if c.Generation() == gen {
		t.Error("Generation did not change across the reconnect")
	}
	if n := rpcConns(t, m); n != 4 || c.OpenConns() != 4 {
		t.Errorf("after the reconnect: %d connections to the master (%d by the client's count), want 4", n, c.OpenConns())
	}
}

// TestLiveIdleRestart: a master restarted while the client sat idle with four connections
// costs at most one failed call, as it did with one connection: the first call that finds its
// connection closed has the other dead ones dropped with it.
func TestLiveIdleRestart(t *testing.T) {
	m := mooncaketest.StartMaster(t, mooncaketest.MasterOptions{})
	ctx := context.Background()
	c, err := masterrpc.Dial(ctx, masterrpc.Options{Addr: m.RPCAddr, Conns: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	m.Restart()
	failed := 0
	for range 3 {
		if _, err := c.BatchExistKey(ctx, []string{"x"}, tenant); err != nil {
			if !errors.Is(err, masterrpc.ErrUnavailable) {
				t.Fatalf("a call after the restart: %v", err)
			}
			failed++
		}
	}
	if failed > 1 {
		t.Errorf("%d of 3 calls after an idle restart failed, want at most 1", failed)
	}
	if n := rpcConns(t, m); n != 4 {
		t.Errorf("%d connections to the restarted master, want 4", n)
	}
}
