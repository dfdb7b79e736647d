package mooncake_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/kvctl/kvctl/mooncake"
	"github.com/kvctl/kvctl/mooncake/mooncaketest"
	"github.com/kvctl/kvctl/mooncake/transfer"
	"github.com/kvctl/kvctl/pool"
)

// checkNeverWrong reads every key and fails on anything but a miss, a failed get, or the
// exact bytes that were put: a half-written or foreign page must never be returned.
func checkNeverWrong(t *testing.T, n *mooncake.Native, keys []string, size int) (hits int) {
	t.Helper()
	for _, k := range keys {
		dst := make([]byte, size)
		got := n.BatchGet(context.Background(), []string{k}, [][]byte{dst})
		switch {
		case got[0] < 0:
		case got[0] == int64(size) && bytes.Equal(dst, interopPage(k, size)):
			hits++
		default:
			t.Fatalf("get %s = %d with wrong bytes", k, got[0])
		}
	}
	return hits
}

// TestFaultMasterRestartMidPut kills the master while puts stream into a segment over the
// Transfer Engine and starts it again: the clients reconnect and remount by themselves, puts
// succeed again, and no key ever reads back anything but its own complete page.
func TestFaultMasterRestartMidPut(t *testing.T) {
	m := mooncaketest.StartMaster(t, mooncaketest.MasterOptions{})
	owner := newNative(t, m, 128<<20)
	writer := newNative(t, m, 0) // every page it puts crosses the Transfer Engine to owner
	const size = 1 << 20
	var (
		mu   sync.Mutex
		keys []string
		oks  = map[string]time.Time{}
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			k := fmt.Sprintf("mid/%d", i)
			c := writer.BatchPut(context.Background(), []string{k}, [][]byte{interopPage(k, size)}, pool.ReplicateConfig{})
			mu.Lock()
			keys = append(keys, k)
			if c[0] == pool.OK {
				oks[k] = time.Now()
			}
			mu.Unlock()
			if c[0] != pool.OK {
				time.Sleep(20 * time.Millisecond)
			}
		}
	}()
	time.Sleep(300 * time.Millisecond)
	m.Kill()
	killed := time.Now()
	time.Sleep(500 * time.Millisecond)
	m.Restart()
	deadline := time.Now().Add(15 * time.Second)
	for {
		mu.Lock()
		var after int
		for _, at := range oks {
			if at.After(killed) {
				after++
			}
		}
		mu.Unlock()
		if after >= 5 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	if owner.Remounts() < 1 {
		t.Fatal("the segment owner did not remount after the restart")
	}
	var okAfter []string
	for k, at := range oks {
		if at.After(killed) {
			okAfter = append(okAfter, k)
		}
	}
	if len(okAfter) < 5 {
		t.Fatalf("only %d puts succeeded after the restart", len(okAfter))
	}
	checkNeverWrong(t, owner, keys, size)
	if hits := checkNeverWrong(t, writer, okAfter, size); hits != len(okAfter) {
		t.Fatalf("%d of %d pages put after the restart read back", hits, len(okAfter))
	}
	// A client that starts after the restart has no cached address for the owner's segment:
	// it resolves it from the metadata the owner published again when it remounted.
	late := newNative(t, m, 0)
	if hits := checkNeverWrong(t, late, okAfter, size); hits != len(okAfter) {
		t.Fatalf("a client started after the restart read %d of %d pages", hits, len(okAfter))
	}
}

// TestFaultSegmentOwnerKilled: the process holding the pages dies. Reads of its pages fail or
// miss, never return wrong bytes, and once the master's client TTL passes they are misses.
func TestFaultSegmentOwnerKilled(t *testing.T) {
	const size = 64 << 10
	run := func(t *testing.T, m *mooncaketest.Master, keys []string, kill func()) {
		n := newNative(t, m, 0)
		if hits := checkNeverWrong(t, n, keys, size); hits != len(keys) {
			t.Fatalf("%d of %d pages readable before the kill", hits, len(keys))
		}
		kill()
		if hits := checkNeverWrong(t, n, keys, size); hits != 0 {
			t.Fatalf("%d pages of a dead segment read back", hits)
		}
		// The failed reads marked the owner's segment unhealthy: its pages are misses at once,
		// while the master still lists them.
		if got := n.BatchIsExist(context.Background(), keys); fmt.Sprint(got) != fmt.Sprint(make([]int, len(keys))) {
			t.Fatalf("a dead owner's pages offered after failed reads: %v", got)
		}
		if h := n.SegmentHealth(); h.ToUnhealthy != 1 {
			t.Fatalf("segment health after the owner died: %+v, want one transition to unhealthy", h)
		}
		deadline := time.Now().Add(20 * time.Second)
		for {
			c := n.BatchGet(context.Background(), keys[:1], [][]byte{make([]byte, size)})[0]
			if c == int64(pool.ErrObjectNotFound) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the master still lists a dead owner's pages: get = %d", c)
			}
			time.Sleep(200 * time.Millisecond)
		}
		if got := n.BatchIsExist(context.Background(), keys); fmt.Sprint(got) != fmt.Sprint(make([]int, len(keys))) {
			t.Fatalf("a dropped segment's pages listed: %v", got)
		}
	}
	keys := []string{"own/0", "own/1", "own/2"}
	t.Run("PythonOwner", func(t *testing.T) {
		m := mooncaketest.StartMaster(t, mooncaketest.MasterOptions{ClientTTL: 2 * time.Second})
		py := mooncaketest.StartClient(t, m, mooncaketest.ClientOptions{SegmentSize: 16 << 20})
		for _, k := range keys {
			py.Put(k, interopPage(k, size), mooncaketest.PutOptions{})
		}
		run(t, m, keys, py.Kill)
	})
	t.Run("KvctlOwner", func(t *testing.T) {
		m := mooncaketest.StartMaster(t, mooncaketest.MasterOptions{ClientTTL: 2 * time.Second})
		_, kill := startHelper(t, m, "own", len(keys), size, 1<<20)
		run(t, m, keys, kill)
	})
}

// TestFaultHostileTransferPeer: a peer asking kvctl's Transfer Engine server for bytes outside
// the mounted segment, or to write there, is refused, and the segment keeps serving pages.
func TestFaultHostileTransferPeer(t *testing.T) {
	m := mooncaketest.StartMaster(t, mooncaketest.MasterOptions{})
	owner := newNative(t, m, 4<<20)
	reader := newNative(t, m, 0)
	ctx := context.Background()
	const key, size = "hostile/page", 64 << 10
	if c := owner.BatchPut(ctx, []string{key}, [][]byte{interopPage(key, size)}, pool.ReplicateConfig{}); c[0] != pool.OK {
		t.Fatalf("put = %v", c[0])
	}
	te := transfer.NewClient(transfer.ClientOptions{Timeout: 2 * time.Second})
	t.Cleanup(func() { _ = te.Close() })
	peer := owner.SegmentName() // host:port of its data server
	buf := make([]byte, 4096)
	for _, addr := range []uint64{0, 1 << 20, 1 << 47} {
		if err := te.Read(ctx, peer, addr, buf); !errors.Is(err, transfer.ErrRefused) {
			t.Fatalf("read at %#x outside the segment = %v, want a refusal", addr, err)
		}
		if err := te.Write(ctx, peer, addr, buf); !errors.Is(err, transfer.ErrRefused) {
			t.Fatalf("write at %#x outside the segment = %v, want a refusal", addr, err)
		}
	}
	// A range that wraps past 2^64, sent raw (kvctl's own client refuses to send it): the
	// target answers with the v2 "address rejected" status or closes the connection.
	c, err := net.Dial("tcp", peer)
	if err != nil {
		t.Fatal(err)
	}
	hdr := make([]byte, 24)
	binary.LittleEndian.PutUint64(hdr[0:], 4096)
	binary.LittleEndian.PutUint64(hdr[8:], ^uint64(0)-100)
	hdr[16] = 0x80 // READ, framing v2
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write(hdr); err != nil {
		t.Fatal(err)
	}
	status := make([]byte, 8)
	if _, err := io.ReadFull(c, status); err == nil {
		if v := binary.LittleEndian.Uint64(status); v>>32 != 0x4D435456 || uint32(v) == 0 {
			t.Fatalf("status %#x to a wrapping read, want a refusal", v)
		}
		if n, _ := c.Read(make([]byte, 1)); n != 0 {
			t.Fatal("payload bytes followed the refusal")
		}
	}
	_ = c.Close()
	if hits := checkNeverWrong(t, reader, []string{key}, size); hits != 1 {
		t.Fatal("the segment stopped serving after the refused requests")
	}
}

// TestFaultPutToKilledPeer: the process whose segment a put writes into dies before the master
// drops it. A put of fifteen 64 KiB pages the master lays out back to back there (written four
// to a WRITE) reports every page failed, none of them is listed afterwards (revoked), and the
// failed writes mark the segment unhealthy once.
func TestFaultPutToKilledPeer(t *testing.T) {
	const page, pages = 64 << 10, 16
	m := mooncaketest.StartMaster(t, mooncaketest.MasterOptions{})
	_, kill := startHelper(t, m, "put-dead-holder", 0, 0, 16<<20)
	w := newNative(t, m, 0)
	ctx := context.Background()
	keys := make([]string, pages)
	vals := make([][]byte, pages)
	for i := range keys {
		keys[i] = fmt.Sprintf("put-dead/%d", i)
		vals[i] = bytes.Repeat([]byte{byte(i + 1)}, page)
	}
	// One page first, so the writer knows the peer and the rest would be coalesced.
	if c := w.BatchPut(ctx, keys[:1], vals[:1], pool.ReplicateConfig{}); c[0] != pool.OK {
		t.Fatalf("put before the kill: %v", c[0])
	}
	kill()
	for i, c := range w.BatchPut(ctx, keys[1:], vals[1:], pool.ReplicateConfig{}) {
		if c == pool.OK {
			t.Errorf("put %s into a dead peer's segment: OK", keys[1+i])
		}
	}
	if got := w.BatchIsExist(ctx, keys[1:]); fmt.Sprint(got) != fmt.Sprint(make([]int, pages-1)) {
		t.Errorf("pages of a failed put listed: %v", got)
	}
	if h := w.SegmentHealth(); h.ToUnhealthy != 1 {
		t.Errorf("segment health after the failed put: %+v, want one transition to unhealthy", h)
	}
}
