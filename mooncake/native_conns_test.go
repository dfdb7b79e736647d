package mooncake_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvctl/kvctl/mooncake"
	"github.com/kvctl/kvctl/mooncake/mooncaketest"
	"github.com/kvctl/kvctl/pool"
)

// reader starts a Native with no segment and conns master connections whose BatchIsExist
// splits batches into sub-batches of split keys or more (0: the package's default).
func reader(t *testing.T, m *mooncaketest.Master, conns, split int) *mooncake.Native {
	t.Helper()
	n, err := mooncake.NewNative(context.Background(), mooncake.NativeOptions{
		MasterAddr: m.RPCAddr, MetadataURL: m.MetadataURL, MasterConns: conns, CallTimeout: 5 * time.Second,
	})
	if err != nil {
		t.Fatalf("NewNative: %v", err)
	}
	if split > 0 {
		mooncake.SetExistSplit(n, split)
	}
	t.Cleanup(func() { _ = n.Close() })
	return n
}

// storeSome puts, through w, the keys whose want is 1.
func storeSome(t *testing.T, w *mooncake.Native, keys []string, want []int) {
	t.Helper()
	var put []string
	var bufs [][]byte
	for i, k := range keys {
		if want[i] == 1 {
			put, bufs = append(put, k), append(bufs, interopPage(k, 64))
		}
	}
	for i, c := range w.BatchPut(context.Background(), put, bufs, pool.ReplicateConfig{}) {
		if c != pool.OK {
			t.Fatalf("put %s: %v", put[i], c)
		}
	}
}

// TestNativeBatchIsExistSplit: a batch split into sub-batches over several master connections
// gets the same answers, key for key and in order, as one call for the whole batch, for
// present and absent keys on both sides of every sub-batch border, uneven splits, duplicate
// keys and batches too small to split.
func TestNativeBatchIsExistSplit(t *testing.T) {
	m := mooncaketest.StartMaster(t, mooncaketest.MasterOptions{})
	w := newNative(t, m, 64<<20)
	keys := make([]string, 1003)
	want := make([]int, len(keys))
	for i := range keys {
		keys[i] = fmt.Sprintf("split/%d", i)
		if i%7 == 0 || i%4 == 1 || i == len(keys)-1 {
			want[i] = 1
		}
	}
	storeSome(t, w, keys, want)
	split := reader(t, m, 4, 16) // 1,003 keys in 4 sub-batches; 33 in 2; 31 in 1
	one := reader(t, m, 1, 16)   // one connection: never split
	dup := append(slices.Clone(keys[:40]), keys[:40]...)
	rev := slices.Clone(keys)
	slices.Reverse(rev)
	for _, batch := range [][]string{keys, keys[:1000], keys[1:34], keys[:31], keys[:2], dup, rev} {
		exp := make([]int, len(batch))
		for i, k := range batch {
			var idx int
			_, _ = fmt.Sscanf(k, "split/%d", &idx)
			exp[i] = want[idx]
		}
		got := split.BatchIsExist(context.Background(), batch)
		base := one.BatchIsExist(context.Background(), batch)
		if !slices.Equal(got, exp) || !slices.Equal(base, exp) {
			t.Errorf("%d keys from %s: split answers %v,\none call %v,\nwant %v", len(batch), batch[0], got, base, exp)
		}
	}
	st, err := split.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if n := st.Detail[mooncake.StatExistProbes]; n != int64(1003+1000+33+31+2+80+1003) {
		t.Errorf("exist probes = %d, want every key of every batch counted once", n)
	}
}

// TestNativeBatchIsExistSubBatchFails: a sub-batch whose call fails gives its own keys the
// code the whole batch gets when sent as one call (ErrRPCFail for a request the client
// refuses to send), and the other sub-batches' keys their true answers.
func TestNativeBatchIsExistSubBatchFails(t *testing.T) {
	m := mooncaketest.StartMaster(t, mooncaketest.MasterOptions{})
	w := newNative(t, m, 64<<20)
	keys := make([]string, 64)
	want := make([]int, len(keys))
	for i := range keys {
		keys[i] = fmt.Sprintf("part/%d", i)
		want[i] = i % 3 % 2 // present and absent in every sub-batch
	}
	storeSome(t, w, keys, want)
	// A key longer than a request may be: its sub-batch (keys i with i mod 4 = 1, with four
	// sub-batches of 16) cannot be sent.
	keys[5] = strings.Repeat("k", 64<<20+1)
	want[5] = 0
	split := reader(t, m, 4, 16)
	one := reader(t, m, 1, 16)
	got := split.BatchIsExist(context.Background(), keys)
	for i, v := range got {
		exp := want[i]
		if i%4 == 1 {
			exp = int(pool.ErrRPCFail)
		}
		if v != exp {
			t.Errorf("key %d: %d, want %d", i, v, exp)
		}
	}
	for i, v := range one.BatchIsExist(context.Background(), keys) {
		if v != int(pool.ErrRPCFail) {
			t.Fatalf("as one call, key %d: %d, want the whole batch failed with %d", i, v, pool.ErrRPCFail)
		}
	}
}

// TestNativeMasterConns: a Native keeps MasterConns connections to the master whatever runs
// at once (split existence checks, gets, puts, the heartbeat), and when the master is killed
// a split check fails every key with ErrRPCFail at once.
func TestNativeMasterConns(t *testing.T) {
	m := mooncaketest.StartMaster(t, mooncaketest.MasterOptions{})
	n, err := mooncake.NewNative(context.Background(), mooncake.NativeOptions{
		MasterAddr: m.RPCAddr, MetadataURL: m.MetadataURL, SegmentSize: 64 << 20, MasterConns: 3, Heartbeat: 20 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close() })
	mooncake.SetExistSplit(n, 64)
	count := func() int {
		c, err := m.RPCConns(os.Getpid())
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	if c := count(); c != 3 {
		t.Fatalf("%d connections to the master after NewNative with MasterConns 3", c)
	}
	keys := make([]string, 1000)
	for i := range keys {
		keys[i] = fmt.Sprintf("conns/%d", i)
	}
	page := interopPage("conns", 4096)
	stop := make(chan struct{})
	most := make(chan int, 1)
	go func() {
		hi := 0
		for {
			select {
			case <-stop:
				most <- hi
				return
			case <-time.After(2 * time.Millisecond):
			}
			hi = max(hi, count())
		}
	}()
	var wg sync.WaitGroup
	for g := range 12 {
		wg.Go(func() {
			ctx := context.Background()
			for i := range 15 {
				switch g % 3 {
				case 0:
					if got := n.BatchIsExist(ctx, keys); len(got) != len(keys) {
						t.Errorf("%d answers", len(got))
					}
				case 1:
					k := fmt.Sprintf("conns/%d", (g*15+i)%len(keys))
					if c := n.BatchPut(ctx, []string{k}, [][]byte{page}, pool.ReplicateConfig{}); c[0] != pool.OK {
						t.Errorf("put %s: %v", k, c[0])
					}
				default:
					buf := make([]byte, len(page))
					n.BatchGet(ctx, keys[i:i+1], [][]byte{buf})
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	if hi := <-most; hi > 3 {
		t.Errorf("%d connections to the master at once, bound 3", hi)
	}
	m.Kill()
	start := time.Now()
	for i, v := range n.BatchIsExist(context.Background(), keys) {
		if v != int(pool.ErrRPCFail) {
			t.Fatalf("key %d with the master down: %d, want %d", i, v, pool.ErrRPCFail)
		}
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("a split check with the master down took %v", d)
	}
}
