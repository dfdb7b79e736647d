package mooncake_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvctl/kvctl/mooncake"
	"github.com/kvctl/kvctl/mooncake/mooncaketest"
	"github.com/kvctl/kvctl/pool"
)

// TestNativePeerConnsBound checks, against the real master, that concurrent batches reading
// from one peer's segment never hold more than PeerConns connections to it and keep them for
// the next batches, and that every page read is the page written.
func TestNativePeerConnsBound(t *testing.T) {
	m := mooncaketest.StartMaster(t, mooncaketest.MasterOptions{})
	owner := newNative(t, m, 64<<20)
	ctx := context.Background()

	const pages, page, peerConns = 96, 64 << 10, 3
	keys := make([]string, pages)
	want := make([][]byte, pages)
	for i := range keys {
		keys[i] = fmt.Sprintf("peer-conns-%d", i)
		want[i] = make([]byte, page)
		_, _ = rand.Read(want[i])
	}
	for i, c := range owner.BatchPut(ctx, keys, want, pool.ReplicateConfig{}) {
		if c != pool.OK {
			t.Fatalf("put %s: %v", keys[i], c)
		}
	}

	reader, err := mooncake.NewNative(ctx, mooncake.NativeOptions{MasterAddr: m.RPCAddr, MetadataURL: m.MetadataURL,
		Transfers: 8, PeerConns: peerConns})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = reader.Close() })

	var maxConns atomic.Int64
	stop := make(chan struct{})
	polled := make(chan struct{})
	go func() {
		defer close(polled)
		for {
			if c := owner.SegmentServerStats().Conns; c > maxConns.Load() {
				maxConns.Store(c)
			}
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Microsecond):
			}
		}
	}()
	const goroutines, rounds, batch = 4, 3, 16
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			bufs := make([][]byte, batch)
			for r := range rounds {
				for s := 0; s < pages; s += batch {
					for j := range bufs {
						bufs[j] = make([]byte, page)
					}
					ks := keys[s : s+batch]
					for j, n := range reader.BatchGet(ctx, ks, bufs) {
						if n != page || !bytes.Equal(bufs[j], want[s+j]) {
							errs <- fmt.Errorf("goroutine %d round %d: %s: got %d bytes, equal %t", g, r, ks[j], n, bytes.Equal(bufs[j], want[s+j]))
							return
						}
					}
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	<-polled
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got := maxConns.Load(); got > peerConns {
		t.Errorf("the peer served up to %d connections at once, want at most PeerConns = %d", got, peerConns)
	}
	if got := maxConns.Load(); got == 0 {
		t.Error("the poll never saw a connection to the peer: the reads did not cross the Transfer Engine")
	}
	// The peer counts a read once it has written all of it, which may be after the reader
	// has it: wait for the count to settle.
	wantReads := uint64(goroutines * rounds * pages)
	st := owner.SegmentServerStats()
	for deadline := time.Now().Add(5 * time.Second); st.Reads < wantReads && time.Now().Before(deadline); st = owner.SegmentServerStats() {
		time.Sleep(time.Millisecond)
	}
	if st.Reads != wantReads {
		t.Errorf("the peer served %d reads, want %d", st.Reads, wantReads)
	}
	if st.Conns > peerConns || st.Conns == 0 {
		t.Errorf("%d connections stay open to the peer, want 1 to %d kept for the next batches", st.Conns, peerConns)
	}
}
