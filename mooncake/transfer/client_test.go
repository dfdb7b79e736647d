package transfer_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvctl/kvctl/mooncake/transfer"
)

func TestClientRoundTrip(t *testing.T) {
	srv, _ := startServer(t, transfer.ServerOptions{}, 20<<20)
	cl := transfer.NewClient(transfer.ClientOptions{})
	defer cl.Close()
	ctx := context.Background()
	peer := srv.Addr().String()
	for _, n := range []int{1, 4096, 64 << 10, 1<<20 + 3, 16 << 20} {
		want := randomBytes(uint64(n), n)
		addr := testBase + 7
		if err := cl.Write(ctx, peer, addr, want); err != nil {
			t.Fatalf("write %d: %v", n, err)
		}
		landed := make([]byte, n)
		if err := srv.ReadAt(addr, landed); err != nil || !bytes.Equal(landed, want) {
			t.Fatalf("write %d did not land in the region", n)
		}
		got := make([]byte, n)
		if err := cl.Read(ctx, peer, addr, got); err != nil {
			t.Fatalf("read %d: %v", n, err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("read %d: first difference at %d", n, firstDiff(got, want))
		}
	}
	if err := cl.Read(ctx, peer, testBase, nil); err != nil {
		t.Errorf("empty read: %v", err)
	}
	// One pooled connection served all of it.
	if st := srv.Stats(); st.Conns != 1 {
		t.Errorf("%d connections open, want the one pooled connection", st.Conns)
	}
}

func TestClientRefusalNamesAddressAndSize(t *testing.T) {
	srv, _ := startServer(t, transfer.ServerOptions{}, 1<<20)
	cl := transfer.NewClient(transfer.ClientOptions{})
	defer cl.Close()
	peer := srv.Addr().String()
	addr := testBase + 1<<20 - 100
	for _, op := range []string{"READ", "WRITE"} {
		var err error
		// 8 MiB: the WRITE's refusal arrives while most of the body is still unsent.
		buf := make([]byte, 8<<20)
		if op == "READ" {
			err = cl.Read(context.Background(), peer, addr, buf)
		} else {
			err = cl.Write(context.Background(), peer, addr, buf)
		}
		var refused *transfer.RefusedError
		if !errors.As(err, &refused) {
			t.Fatalf("%s out of range: %v, want RefusedError", op, err)
		}
		msg := err.Error()
		for _, part := range []string{op, fmt.Sprintf("%#x", addr), "8388608 bytes", peer, "status 1", "address rejected"} {
			if !strings.Contains(msg, part) {
				t.Errorf("%s refusal %q does not name %q", op, msg, part)
			}
		}
	}
	err := cl.Read(context.Background(), peer, ^uint64(0)-3, make([]byte, 8))
	if err == nil || !strings.Contains(err.Error(), "overflows") {
		t.Errorf("wrapping range: %v", err)
	}
}

// rawTarget accepts connections on loopback and hands each to fn: a scripted target for
// behaviours a correct server never shows.
func rawTarget(t *testing.T, fn func(c net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { _ = ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				fn(c)
			}()
		}
	}()
	return ln.Addr().String()
}

// dribblingTarget answers each connection's first READ with status OK and payload, 777 bytes
// at a time, the first few chunks a millisecond apart.
func dribblingTarget(t *testing.T, payload []byte) string {
	return rawTarget(t, func(c net.Conn) {
		hdr := make([]byte, 24)
		if _, err := io.ReadFull(c, hdr); err != nil {
			return
		}
		reply := append(bytes.Clone(statusOK), payload...)
		for i := 0; i < len(reply); i += 777 {
			if _, err := c.Write(reply[i:min(i+777, len(reply))]); err != nil {
				return
			}
			if i < 8*777 {
				time.Sleep(time.Millisecond)
			}
		}
	})
}

// A target that sends its reply a few bytes at a time: the client assembles short reads.
func TestClientShortReads(t *testing.T) {
	payload := randomBytes(3, 100000)
	peer := dribblingTarget(t, payload)
	cl := transfer.NewClient(transfer.ClientOptions{})
	defer cl.Close()
	got := make([]byte, len(payload))
	if err := cl.Read(context.Background(), peer, testBase, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, payload) {
		t.Fatalf("short reads reassembled wrongly at %d", firstDiff(got, payload))
	}
}

// A target that never answers: the client gives up at the ctx deadline with an error that
// says so, and a cancelled ctx ends a transfer in flight.
func TestClientHonoursContext(t *testing.T) {
	peer := rawTarget(t, func(c net.Conn) { _, _ = io.Copy(io.Discard, c) })
	cl := transfer.NewClient(transfer.ClientOptions{})
	defer cl.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	err := cl.Read(ctx, peer, testBase, make([]byte, 64))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("read from a silent target: %v, want DeadlineExceeded", err)
	}
	if !strings.Contains(err.Error(), peer) {
		t.Errorf("error %q does not name the peer", err)
	}

	ctx, cancel = context.WithCancel(context.Background())
	go func() { time.Sleep(100 * time.Millisecond); cancel() }()
	err = cl.Write(ctx, peer, testBase, make([]byte, 64<<20))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled write: %v, want Canceled", err)
	}

	// Without a ctx deadline, ClientOptions.Timeout applies.
	short := transfer.NewClient(transfer.ClientOptions{Timeout: 150 * time.Millisecond})
	defer short.Close()
	if err := short.Read(context.Background(), peer, testBase, make([]byte, 8)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("read under ClientOptions.Timeout: %v", err)
	}
}

// v1 framing: the Legacy client talks to a target without status frames; a v2 client that
// reaches a v1 target (stale descriptor) fails fast on the missing magic instead of taking
// payload for a status.
func TestClientFraming(t *testing.T) {
	payload := bytes.Repeat([]byte{0x7b}, 4096)
	v1 := rawTarget(t, func(c net.Conn) {
		hdr := make([]byte, 24)
		for {
			if _, err := io.ReadFull(c, hdr); err != nil {
				return
			}
			h, _ := transfer.DecodeHeader(hdr)
			if h.Op() == transfer.OpWrite {
				if _, err := io.CopyN(io.Discard, c, int64(h.Size)); err != nil {
					return
				}
				continue
			}
			// A v1 target treats anything but WRITE as READ and streams at once.
			if _, err := c.Write(payload[:h.Size]); err != nil {
				return
			}
		}
	})
	legacy := transfer.NewClient(transfer.ClientOptions{Legacy: true})
	defer legacy.Close()
	got := make([]byte, 4096)
	if err := legacy.Read(context.Background(), v1, testBase, got); err != nil || !bytes.Equal(got, payload) {
		t.Fatalf("legacy read: %v", err)
	}
	if err := legacy.Write(context.Background(), v1, testBase, payload); err != nil {
		t.Fatalf("legacy write: %v", err)
	}

	v2 := transfer.NewClient(transfer.ClientOptions{})
	defer v2.Close()
	err := v2.Read(context.Background(), v1, testBase, got)
	if !errors.Is(err, transfer.ErrMalformed) || !strings.Contains(err.Error(), "MCTV") {
		t.Fatalf("v2 read from a v1 target: %v, want ErrMalformed naming the magic", err)
	}

	// A v1 target refuses by closing; the Legacy client reports that, not success or a hang.
	closer := rawTarget(t, func(c net.Conn) {
		hdr := make([]byte, 24)
		_, _ = io.ReadFull(c, hdr)
	})
	err = legacy.Read(context.Background(), closer, testBase, got)
	if err == nil || !strings.Contains(err.Error(), "refused or gone") {
		t.Fatalf("legacy read from a closing target: %v", err)
	}
}

// A pooled connection the server closed while idle is replaced transparently.
func TestClientReplacesStaleConnections(t *testing.T) {
	srv, mem := startServer(t, transfer.ServerOptions{IdleTimeout: 100 * time.Millisecond}, 1<<20)
	// The test reads mem only through the server from here on: remote writes race with
	// direct access (see the package documentation).
	want := bytes.Clone(mem[:4096])
	cl := transfer.NewClient(transfer.ClientOptions{})
	defer cl.Close()
	peer := srv.Addr().String()
	got := make([]byte, 4096)
	for i := range 3 {
		if err := cl.Read(context.Background(), peer, testBase, got); err != nil {
			t.Fatalf("read %d: %v", i, err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("read %d returned wrong bytes", i)
		}
		waitFor(t, "the idle connection to be closed", func() bool { return srv.Stats().Conns == 0 })
	}
	if err := cl.Write(context.Background(), peer, testBase, got); err != nil {
		t.Fatalf("write on a stale pooled connection: %v", err)
	}
}

// Many goroutines share one client against one server.
func TestClientConcurrent(t *testing.T) {
	srv, _ := startServer(t, transfer.ServerOptions{}, 8<<20)
	cl := transfer.NewClient(transfer.ClientOptions{MaxIdlePerPeer: 4})
	defer cl.Close()
	peer := srv.Addr().String()
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			page := randomBytes(uint64(g), 256<<10)
			addr := testBase + uint64(g)*(256<<10)
			got := make([]byte, len(page))
			for range 10 {
				if err := cl.Write(context.Background(), peer, addr, page); err != nil {
					t.Error(err)
					return
				}
				if err := cl.Read(context.Background(), peer, addr, got); err != nil {
					t.Error(err)
					return
				}
				if !bytes.Equal(got, page) {
					t.Errorf("goroutine %d read back different bytes", g)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// With staging room for one request, concurrent requests wait their turn instead of being
// refused, and every one completes with the right bytes.
func TestServerStagingPressure(t *testing.T) {
	const page = 1 << 20
	srv, _ := startServer(t, transfer.ServerOptions{MaxRequestSize: page, StagingBytes: page}, 8*page)
	cl := transfer.NewClient(transfer.ClientOptions{})
	defer cl.Close()
	peer := srv.Addr().String()
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			want := randomBytes(uint64(1000+g), page)
			addr := testBase + uint64(g)*page
			if err := cl.Write(context.Background(), peer, addr, want); err != nil {
				t.Error(err)
				return
			}
			got := make([]byte, page)
			if err := cl.Read(context.Background(), peer, addr, got); err != nil {
				t.Error(err)
				return
			}
			if !bytes.Equal(got, want) {
				t.Errorf("page %d read back different bytes", g)
			}
		}()
	}
	wg.Wait()
	// A READ is counted once its reply is sent, possibly just after the client has the bytes.
	waitFor(t, "8 writes, 8 reads and no refusals counted", func() bool {
		st := srv.Stats()
		return st.Refused == 0 && st.Writes == 8 && st.Reads == 8
	})
}
