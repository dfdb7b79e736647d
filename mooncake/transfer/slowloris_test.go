package transfer_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/kvctl/kvctl/mooncake/transfer"
)

// attacker is a connection from another loopback address (127.0.0.2), so it counts as another
// peer than the reader on 127.0.0.1.
func attacker(t *testing.T, srv *transfer.Server) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", srv.Addr().String())
	if err != nil {
		t.Skipf("cannot dial from 127.0.0.2: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// dripWrite announces a v2 WRITE of size bytes at testBase, sends fast bytes at once and then
// 1 MiB every 700 ms (within the read timeouts these tests use) until the connection fails or
// the test ends.
func dripWrite(t *testing.T, c net.Conn, size uint64, fast int) {
	t.Helper()
	stop := make(chan struct{})
	done := make(chan struct{})
	t.Cleanup(func() { close(stop); _ = c.Close(); <-done })
	go func() {
		defer close(done)
		msg := transfer.AppendHeader(nil, transfer.Header{Size: size, Addr: testBase, Opcode: uint8(transfer.OpWrite), V2: true})
		if _, err := c.Write(append(msg, make([]byte, fast)...)); err != nil {
			return
		}
		chunk := make([]byte, 1<<20)
		for sent := uint64(fast); sent+uint64(len(chunk)) < size; sent += uint64(len(chunk)) {
			select {
			case <-stop:
				return
			case <-time.After(700 * time.Millisecond):
			}
			_ = c.SetWriteDeadline(time.Now().Add(700 * time.Millisecond))
			if _, err := c.Write(chunk); err != nil {
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					continue // the server is not reading this connection: its share is taken
				}
				return
			}
		}
	}()
}

// readsWork checks that a peer reads the whole of [testBase, +size) n times and gets mem.
func readsWork(t *testing.T, srv *transfer.Server, mem []byte, size, n int) {
	t.Helper()
	cl := transfer.NewClient(transfer.ClientOptions{Timeout: 30 * time.Second})
	dst := make([]byte, size)
	for i := range n {
		if err := cl.Read(context.Background(), srv.Addr().String(), testBase, dst); err != nil {
			t.Fatalf("read %d of %d bytes by another peer during the attack: %v (stats %+v)", i, size, err, srv.Stats())
		}
		if !bytes.Equal(dst, mem[:size]) {
			t.Fatalf("read %d returned wrong bytes", i)
		}
	}
}

// TestSlowlorisWritesDoNotStarvePeers: attack 5. Two connections announce the largest WRITEs
// the server takes and drip 1 MiB at a time, each within the read timeout; another peer's
// READs keep being served, because a WRITE holds staging only for the bytes that arrived.
// (When a WRITE took staging for its whole announced size, the two announcements held all of
// it for as long as they dripped, and the reads were refused.) MinRate is set low so the
// progress deadline, tested below, does not end the attack first.
func TestSlowlorisWritesDoNotStarvePeers(t *testing.T) {
	const maxReq = 32 << 20
	srv, mem := startServer(t, transfer.ServerOptions{MaxRequestSize: maxReq, StagingBytes: 2 * maxReq,
		ReadTimeout: 3 * time.Second, WriteTimeout: 3 * time.Second, MinRate: 1 << 10}, maxReq)
	for range 2 {
		dripWrite(t, attacker(t, srv), maxReq, 64<<10)
	}
	time.Sleep(200 * time.Millisecond) // let the server take both announcements
	readsWork(t, srv, mem, maxReq/2, 8)
}

// TestStalledWritesKeptToPeerShare: one peer sends most of three large WRITEs at full speed
// and then drips; it holds staging for what it sent, but never more than its peer share (half
// the staging), so another peer still reads the largest request the server takes.
func TestStalledWritesKeptToPeerShare(t *testing.T) {
	const maxReq = 32 << 20
	srv, mem := startServer(t, transfer.ServerOptions{MaxRequestSize: maxReq, StagingBytes: 2 * maxReq,
		ReadTimeout: 3 * time.Second, WriteTimeout: 3 * time.Second, MinRate: 1 << 10}, maxReq)
	for range 3 {
		dripWrite(t, attacker(t, srv), maxReq, 24<<20)
	}
	time.Sleep(time.Second)
	readsWork(t, srv, mem, maxReq, 4)
}

// TestDripWriteCutOffAtItsDeadline: a WRITE whose bytes keep coming, each chunk within the read
// timeout, but far below MinRate is cut off at its deadline: the status never says OK and the
// region is unchanged.
func TestDripWriteCutOffAtItsDeadline(t *testing.T) {
	const size = 8 << 20
	srv, mem := startServer(t, transfer.ServerOptions{MaxRequestSize: size, ReadTimeout: time.Second,
		WriteTimeout: time.Second, MinRate: 8 << 20}, size)
	before := append([]byte(nil), mem...)
	c := attacker(t, srv)
	if _, err := c.Write(transfer.AppendHeader(nil, transfer.Header{Size: size, Addr: testBase, Opcode: uint8(transfer.OpWrite), V2: true})); err != nil {
		t.Fatal(err)
	}
	// 256 KiB every 200 ms: every 1 MiB chunk arrives within the read timeout, the whole at
	// about 1.3 MiB/s, so the 8 MiB would take over 6 s against a deadline of 2 s.
	cut := make(chan struct{})
	go func() {
		defer close(cut)
		chunk := bytes.Repeat([]byte{0xEE}, 256<<10)
		for sent := 0; sent < size; sent += len(chunk) {
			if _, err := c.Write(chunk); err != nil {
				return
			}
			time.Sleep(200 * time.Millisecond)
		}
	}()
	status := make([]byte, transfer.StatusFrameSize)
	_ = c.SetReadDeadline(time.Now().Add(time.Minute))
	n, _ := c.Read(status)
	<-cut
	if n == transfer.StatusFrameSize {
		if code, _ := transfer.DecodeStatus(status); code == transfer.StatusOK {
			t.Fatal("a WRITE dripped far below MinRate completed")
		}
	}
	if st := srv.Stats(); st.Writes != 0 || st.Aborted+st.Refused == 0 {
		t.Errorf("stats %+v: want the WRITE aborted or refused, none served", st)
	}
	if !bytes.Equal(mem, before) {
		t.Error("a cut-off WRITE changed registered memory")
	}
}
