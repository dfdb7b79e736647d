package transfer_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/kvctl/kvctl/mooncake/mooncaketest"
	"github.com/kvctl/kvctl/mooncake/transfer"
)

// TestClientPieces: ReadPieces and WritePieces move a value that lies in pieces as one request
// to the real server: pieces of a few bytes and of megabytes, empty pieces among them, and more
// pieces than one readv names (1,024); the bytes land in order in the region and come back in
// order into other pieces, on one pooled connection.
func TestClientPieces(t *testing.T) {
	srv, _ := startServer(t, transfer.ServerOptions{}, 20<<20)
	cl := transfer.NewClient(transfer.ClientOptions{})
	defer cl.Close()
	ctx := context.Background()
	peer := srv.Addr().String()
	for i, c := range []struct {
		n           int
		write, read []int // piece sizes, in turn
	}{
		{100, []int{1}, []int{3, 0, 7}},          // 100 and 34 pieces, empty ones among them
		{64 << 10, []int{32 << 10}, []int{1024}}, // K and V; per-layer pieces
		{3000, []int{1}, []int{2}},               // 3,000 and 1,500 pieces: over one readv's 1,024
		{4<<20 + 5, []int{1 << 20, 0, 3}, []int{4<<20 + 1, 4}},
	} {
		want := randomBytes(uint64(i+11), c.n)
		addr := testBase + uint64(i)*5
		if err := cl.WritePieces(ctx, peer, addr, mooncaketest.Pieces(bytes.Clone(want), c.write...)); err != nil {
			t.Fatalf("%d bytes: write pieces: %v", c.n, err)
		}
		landed := make([]byte, c.n)
		if err := srv.ReadAt(addr, landed); err != nil || !bytes.Equal(landed, want) {
			t.Fatalf("%d bytes written as pieces did not land in order (first difference at %d)", c.n, firstDiff(landed, want))
		}
		got := make([]byte, c.n)
		if err := cl.ReadPieces(ctx, peer, addr, mooncaketest.Pieces(got, c.read...)); err != nil {
			t.Fatalf("%d bytes: read pieces: %v", c.n, err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%d bytes read into pieces: first difference at %d", c.n, firstDiff(got, want))
		}
	}
	if err := cl.ReadPieces(ctx, peer, testBase, [][]byte{nil, {}}); err != nil {
		t.Errorf("pieces holding nothing: %v", err)
	}
	if st := srv.Stats(); st.Conns != 1 {
		t.Errorf("%d connections open, want the one pooled connection", st.Conns)
	}
}

// TestClientPiecesFailures: a refusal names the whole request's size, a target that ends the
// payload part way fails the read with io.ErrUnexpectedEOF (the pieces before it filled, the
// read never reported whole), and a target that stalls mid-payload is cut off at the ctx
// deadline.
func TestClientPiecesFailures(t *testing.T) {
	srv, _ := startServer(t, transfer.ServerOptions{}, 1<<20)
	cl := transfer.NewClient(transfer.ClientOptions{})
	defer cl.Close()
	ctx := context.Background()
	err := cl.ReadPieces(ctx, srv.Addr().String(), testBase+1<<20-10, [][]byte{make([]byte, 8), make([]byte, 8)})
	var refused *transfer.RefusedError
	if !errors.As(err, &refused) || refused.Size != 16 || !strings.Contains(err.Error(), "16 bytes") {
		t.Fatalf("pieces past the region: %v, want a refusal of 16 bytes", err)
	}

	payload := randomBytes(5, 5000)
	short := rawTarget(t, func(c net.Conn) {
		hdr := make([]byte, 24)
		if _, err := io.ReadFull(c, hdr); err != nil {
			return
		}
		_, _ = c.Write(append(bytes.Clone(statusOK), payload[:3000]...))
	})
	dst := make([]byte, 5000)
	err = cl.ReadPieces(ctx, short, testBase, mooncaketest.Pieces(dst, 1000))
	if !errors.Is(err, io.ErrUnexpectedEOF) || !strings.Contains(err.Error(), "after 3000 of 5000 bytes") {
		t.Fatalf("payload cut at 3000 of 5000 bytes: %v", err)
	}
	if !bytes.Equal(dst[:3000], payload[:3000]) {
		t.Fatal("the bytes that did arrive are not in their pieces")
	}

	stall := rawTarget(t, func(c net.Conn) {
		hdr := make([]byte, 24)
		if _, err := io.ReadFull(c, hdr); err != nil {
			return
		}
		_, _ = c.Write(append(bytes.Clone(statusOK), payload[:100]...))
		_, _ = io.Copy(io.Discard, c)
	})
	tctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	began := time.Now()
	err = cl.ReadPieces(tctx, stall, testBase, mooncaketest.Pieces(make([]byte, 5000), 64))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a target that stalls mid-payload: %v, want DeadlineExceeded", err)
	}
	if d := time.Since(began); d > 5*time.Second {
		t.Fatalf("the stalled read ended after %v, long past its 200 ms deadline", d)
	}
}

// A target that sends its reply a few bytes at a time, across the pieces' boundaries: readv's
// short reads are reassembled in order.
func TestClientPiecesShortReads(t *testing.T) {
	payload := randomBytes(9, 100000)
	peer := dribblingTarget(t, payload)
	cl := transfer.NewClient(transfer.ClientOptions{})
	defer cl.Close()
	got := make([]byte, len(payload))
	if err := cl.ReadPieces(context.Background(), peer, testBase, mooncaketest.Pieces(got, 1000, 3, 0, 4096)); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, payload) {
		t.Fatalf("short reads reassembled into pieces wrongly at %d", firstDiff(got, payload))
	}
}
