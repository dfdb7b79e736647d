package mooncake_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
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
	keys, want := putPages(t, owner, "peer-conns", pages, page)

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
	err = atOnce(goroutines, func(g int) error {
		bufs := make([][]byte, batch)
		for r := range rounds {
			for s := 0; s < pages; s += batch {
				for j := range bufs {
					bufs[j] = make([]byte, page)
				}
				ks := keys[s : s+batch]
				for j, n := range reader.BatchGet(ctx, ks, bufs) {
					if n != page || !bytes.Equal(bufs[j], want[s+j]) {
						return fmt.Errorf("goroutine %d round %d: %s: got %d bytes, equal %t", g, r, ks[j], n, bytes.Equal(bufs[j], want[s+j]))
					}
				}
			}
		}
		return nil
	})
	close(stop)
	<-polled
	if err != nil {
		t.Error(err)
	}
	if got := maxConns.Load(); got > peerConns {
		t.Errorf("the peer served up to %d connections at once, want at most PeerConns = %d", got, peerConns)
	}
	if got := maxConns.Load(); got == 0 {
		t.Error("the poll never saw a connection to the peer: the reads did not cross the Transfer Engine")
	}
	// The peer counts a read once it has written all of it, which may be after the reader
	// has it: wait for the count to settle. Pages lying back to back are read together, so
	// there are at most as many reads as pages, and every byte is read once.
	wantPages, wantBytes := uint64(goroutines*rounds*pages), uint64(goroutines*rounds*pages*page)
	st := owner.SegmentServerStats()
	for deadline := time.Now().Add(5 * time.Second); st.BytesRead < wantBytes && time.Now().Before(deadline); st = owner.SegmentServerStats() {
		time.Sleep(time.Millisecond)
	}
	if st.BytesRead != wantBytes || st.Reads == 0 || st.Reads > wantPages {
		t.Errorf("the peer served %d bytes in %d reads, want %d bytes in 1 to %d reads", st.BytesRead, st.Reads, wantBytes, wantPages)
	}
	if st.Conns > peerConns || st.Conns == 0 {
		t.Errorf("%d connections stay open to the peer, want 1 to %d kept for the next batches", st.Conns, peerConns)
	}
}

// TestNativeGetCoalescesReads checks, against the real master, that a get of pages lying back
// to back in a peer's segment reads them in fewer transfers than pages (at most
// MaxCoalesced bytes a transfer), and that every page lands in its own destination: gets in
// reverse key order, with a missing key among them, and with destinations given as pieces.
func TestNativeGetCoalescesReads(t *testing.T) {
	m := mooncaketest.StartMaster(t, mooncaketest.MasterOptions{})
	owner := newNative(t, m, 64<<20)
	ctx := context.Background()
	const pages, page = 48, 64 << 10
	keys, want := putPages(t, owner, "coalesce", pages, page)
	reader := newNative(t, m, 0)

	// Reverse order, a key nobody wrote in the middle.
	var get []string
	for i := pages - 1; i >= 0; i-- {
		get = append(get, keys[i])
		if i == pages/2 {
			get = append(get, "coalesce-missing")
		}
	}
	before := owner.SegmentServerStats().Reads
	bufs := make([][]byte, len(get))
	for i := range bufs {
		bufs[i] = make([]byte, page)
	}
	got := reader.BatchGet(ctx, get, bufs)
	check := func(what string, got []int64, read func(i int) []byte) {
		t.Helper()
		for i, k := range get {
			if k == "coalesce-missing" {
				if got[i] != int64(mooncake.ErrObjectNotFound) {
					t.Errorf("%s: %s: got %d, want %d (not found)", what, k, got[i], mooncake.ErrObjectNotFound)
				}
				continue
			}
			var p int
			_, _ = fmt.Sscanf(k, "coalesce-%d", &p)
			if got[i] != page || !bytes.Equal(read(i), want[p]) {
				t.Errorf("%s: %s: got %d bytes, equal %t", what, k, got[i], bytes.Equal(read(i), want[p]))
			}
		}
	}
	check("BatchGet", got, func(i int) []byte { return bufs[i] })
	// The peer counts a read once it has written all of it: wait for the count to settle.
	var reads uint64
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if reads = owner.SegmentServerStats().Reads - before; reads >= pages*page/mooncake.MaxCoalesced {
			break
		}
	}
	if reads >= pages || reads < pages*page/mooncake.MaxCoalesced {
		t.Errorf("the peer served %d reads for %d pages of %d bytes, want fewer than the pages and at least one per %d bytes",
			reads, pages, page, mooncake.MaxCoalesced)
	}

	// The same into pieces: each page in three pieces of its own, the first and last uneven.
	pieces := make([][][]byte, len(get))
	for i := range pieces {
		b := make([]byte, page)
		pieces[i] = [][]byte{b[:1000], b[1000 : page-64], b[page-64:]}
	}
	got = reader.BatchGetPieces(ctx, get, pieces)
	check("BatchGetPieces", got, func(i int) []byte { return bytes.Join(pieces[i], nil) })
}

// TestNativePutCoalescesWrites checks, against the real master, that a put of pages the master
// lays out back to back in a peer's segment writes them in fewer transfers than pages (at most
// MaxCoalesced bytes a transfer), with every page's bytes where its key says: pages given whole
// and as uneven pieces, from a writer with object checksums on (each page's checksum taken from
// its own bytes, verified by a reader that checks them) and from one without.
func TestNativePutCoalescesWrites(t *testing.T) {
	m := mooncaketest.StartMaster(t, mooncaketest.MasterOptions{})
	owner := newNative(t, m, 64<<20)
	ctx := context.Background()
	const pages, page = 48, 64 << 10
	for _, c := range []struct {
		name   string
		writer *mooncake.Native
		pieces bool
	}{
		{"whole", newNative(t, m, 0), false},
		{"pieces", newNative(t, m, 0), true},
		{"checksum", checksumNative(t, m, 0), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			keys := make([]string, pages)
			want := make([][]byte, pages)
			for i := range keys {
				keys[i] = fmt.Sprintf("coalesce-put-%s-%d", c.name, i)
				want[i] = make([]byte, page)
				_, _ = rand.Read(want[i])
			}
			before := owner.SegmentServerStats()
			var codes []mooncake.Code
			if c.pieces {
				srcs := make([][][]byte, pages)
				for i, w := range want {
					srcs[i] = [][]byte{w[:1000], w[1000 : page-64], w[page-64:]}
				}
				codes = c.writer.BatchPutPieces(ctx, keys, srcs, pool.ReplicateConfig{})
			} else {
				codes = c.writer.BatchPut(ctx, keys, want, pool.ReplicateConfig{})
			}
			for i, code := range codes {
				if code != pool.OK {
					t.Fatalf("put %s: %v", keys[i], code)
				}
			}
			// The peer counts a write once it has taken all of it; the put returned after
			// every write was answered, so the counts are final.
			st := owner.SegmentServerStats()
			writes, written := st.Writes-before.Writes, st.BytesWritten-before.BytesWritten
			if written != pages*page {
				t.Errorf("the peer took %d bytes, want %d", written, pages*page)
			}
			if writes >= pages || writes < pages*page/mooncake.MaxCoalesced {
				t.Errorf("the peer served %d writes for %d pages of %d bytes, want fewer than the pages and at least one per %d bytes",
					writes, pages, page, mooncake.MaxCoalesced)
			}
			getAll(t, checksumNative(t, m, 0), keys, want)
		})
	}
}
