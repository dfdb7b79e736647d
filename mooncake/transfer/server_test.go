package transfer_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvctl/kvctl/mooncake/transfer"
)

const testBase = uint64(0x7f3300001000)

// startServer runs a Server on a loopback socket with one region of size bytes at testBase.
func startServer(t *testing.T, opts transfer.ServerOptions, size int) (*transfer.Server, []byte) {
	t.Helper()
	srv, err := transfer.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	mem := randomBytes(uint64(size), size)
	if err := srv.Register(testBase, mem); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve() }()
	t.Cleanup(func() {
		if err := srv.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return srv, mem
}

func dial(t *testing.T, srv *transfer.Server) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", srv.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	return c
}

func header(size, addr uint64, opcode byte) []byte {
	b := transfer.AppendHeader(nil, transfer.Header{Size: size, Addr: addr})
	b[16] = opcode
	// Real initiators leave the padding uninitialised; the server must ignore it.
	copy(b[17:], "garbage")
	return b
}

// readAll reads what the server sends until it closes the connection.
func readAll(t *testing.T, c net.Conn) []byte {
	t.Helper()
	b, err := io.ReadAll(c)
	if err != nil && !errors.Is(err, net.ErrClosed) {
		var ne net.Error
		if !errors.As(err, &ne) || ne.Timeout() {
			t.Fatalf("reading until close: %v", err)
		}
	}
	return b
}

var (
	statusOK       = transfer.AppendStatus(nil, transfer.StatusOK)
	statusRejected = transfer.AppendStatus(nil, transfer.StatusAddrRejected)
)

// Every request a hostile or broken peer can send is refused the way the real target refuses
// it (v2: status 1 then close; v1: close), memory is untouched, and the server keeps serving.
func TestServerRefusesHostileRequests(t *testing.T) {
	const size = 1 << 20
	srv, mem := startServer(t, transfer.ServerOptions{MaxRequestSize: 4 << 20}, size)
	orig := bytes.Clone(mem)
	for _, tc := range []struct {
		name   string
		req    []byte
		body   int
		wantV2 bool
	}{
		{"read past the end", header(100, testBase+size-10, 0x80), 0, true},
		{"read before the start", header(100, testBase-1, 0x80), 0, true},
		{"write past the end", header(4096, testBase+size-1, 0x81), 4096, true},
		{"write at address 0", header(16, 0, 0x81), 16, true},
		{"addr+size overflows", header(^uint64(0)-testBase+17, testBase, 0x80), 0, true},
		{"write whose addr+size wraps onto the region", header(^uint64(0)-7, testBase+16, 0x81), 64, true},
		{"size 0", header(0, testBase, 0x80), 0, true},
		{"giant read inside no region", header(1<<62, testBase, 0x80), 0, true},
		{"size above the request limit", header(8<<20, testBase, 0x81), 1024, true},
		{"unknown opcode v2", header(16, testBase, 0x85), 0, true},
		{"unknown opcode v1", header(16, testBase, 0x07), 0, false},
		{"v1 read past the end", header(100, testBase+size-10, 0x00), 0, false},
		{"v1 write past the end", header(100, testBase+size-10, 0x01), 100, false},
		{"all ones", bytes.Repeat([]byte{0xff}, 24), 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := srv.Stats().Refused
			c := dial(t, srv)
			if _, err := c.Write(append(tc.req, bytes.Repeat([]byte{0xEE}, tc.body)...)); err != nil {
				t.Fatal(err)
			}
			got := readAll(t, c)
			want := []byte{}
			if tc.wantV2 {
				want = statusRejected
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("server answered %x, want %x then close", got, want)
			}
			if srv.Stats().Refused != before+1 {
				t.Errorf("refused counter %d, want %d", srv.Stats().Refused, before+1)
			}
			if !bytes.Equal(mem, orig) {
				t.Fatalf("refused request changed memory at %d", firstDiff(mem, orig))
			}
			// The server keeps serving.
			assertServes(t, srv, mem)
		})
	}
}

// assertServes reads 4 KiB at testBase over a fresh connection and checks the bytes.
func assertServes(t *testing.T, srv *transfer.Server, mem []byte) {
	t.Helper()
	c := dial(t, srv)
	if _, err := c.Write(header(4096, testBase, 0x80)); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 8+4096)
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatalf("server stopped serving: %v", err)
	}
	if !bytes.Equal(got[:8], statusOK) || !bytes.Equal(got[8:], mem[:4096]) {
		t.Fatal("server answered a valid read wrongly")
	}
}

// Requests follow each other on one connection, v2 and v1 alike, as the real engine's pooled
// lanes send them.
func TestServerPersistentConnection(t *testing.T) {
	srv, mem := startServer(t, transfer.ServerOptions{}, 1<<20)
	c := dial(t, srv)
	payload := randomBytes(9, 150000)
	// v2 WRITE, v2 READ of it back, v1 READ, v1 WRITE, v2 READ.
	if _, err := c.Write(append(header(150000, testBase+4096, 0x81), payload...)); err != nil {
		t.Fatal(err)
	}
	ack := make([]byte, 8)
	if _, err := io.ReadFull(c, ack); err != nil || !bytes.Equal(ack, statusOK) {
		t.Fatalf("write ack %x, %v", ack, err)
	}
	if _, err := c.Write(header(150000, testBase+4096, 0x80)); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 8+150000)
	if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got[:8], statusOK) || !bytes.Equal(got[8:], payload) {
		t.Fatalf("v2 read back: %v", err)
	}
	if _, err := c.Write(header(64, testBase, 0x00)); err != nil {
		t.Fatal(err)
	}
	got = make([]byte, 64)
	if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, mem[:64]) {
		t.Fatalf("v1 read: %x, %v", got, err)
	}
	if _, err := c.Write(append(header(8, testBase, 0x01), "v1write!"...)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write(header(8, testBase, 0x80)); err != nil {
		t.Fatal(err)
	}
	got = make([]byte, 16)
	if _, err := io.ReadFull(c, got); err != nil || string(got[8:]) != "v1write!" {
		t.Fatalf("read after a v1 write: %q, %v", got, err)
	}
	// The server counts a READ once its reply is sent, which can be just after the peer has the
	// bytes: wait for the counters rather than read them once.
	waitFor(t, "the server's counters", func() bool {
		st := srv.Stats()
		return st.Reads == 3 && st.Writes == 2 && st.BytesWritten == 150008 && st.Refused == 0 && st.V1Requests == 2
	})
}

// A peer that stops mid-header, mid-body or never reads its reply holds nothing: the deadlines
// close it, memory is untouched by the cut-off WRITE, and the connection count drops to zero.
func TestServerDeadlinesAndTornWrites(t *testing.T) {
	const size = 32 << 20
	srv, mem := startServer(t, transfer.ServerOptions{
		IdleTimeout: 300 * time.Millisecond, ReadTimeout: 300 * time.Millisecond, WriteTimeout: 300 * time.Millisecond,
	}, size)
	orig := bytes.Clone(mem)

	t.Run("half header", func(t *testing.T) {
		c := dial(t, srv)
		if _, err := c.Write(header(4096, testBase, 0x80)[:10]); err != nil {
			t.Fatal(err)
		}
		if got := readAll(t, c); len(got) != 0 {
			t.Fatalf("server answered a half header with %x", got)
		}
	})
	t.Run("half body then stall", func(t *testing.T) {
		c := dial(t, srv)
		if _, err := c.Write(append(header(1<<20, testBase, 0x81), bytes.Repeat([]byte{1}, 100<<10)...)); err != nil {
			t.Fatal(err)
		}
		if got := readAll(t, c); len(got) != 0 {
			t.Fatalf("server answered a stalled write with %x", got)
		}
	})
	t.Run("half body then close", func(t *testing.T) {
		before := srv.Stats().Aborted
		c := dial(t, srv)
		if _, err := c.Write(append(header(1<<20, testBase+4096, 0x01), bytes.Repeat([]byte{2}, 500<<10)...)); err != nil {
			t.Fatal(err)
		}
		_ = c.Close()
		// Settled before the next subtest counts its own abort.
		waitFor(t, "the cut-off write to be aborted", func() bool { return srv.Stats().Aborted > before })
	})
	t.Run("reader that never reads", func(t *testing.T) {
		abortedBefore := srv.Stats().Aborted
		c := dial(t, srv)
		// A small fixed receive buffer (no autotuning, which may grow to tcp_rmem's 32 MiB
		// maximum) leaves the server's writes blocked on the stalled peer.
		if err := c.(*net.TCPConn).SetReadBuffer(64 << 10); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write(header(size, testBase, 0x80)); err != nil {
			t.Fatal(err)
		}
		// The peer reads nothing until the server has given up on it (the abort counter is
		// monotonic; the connection count could read 0 before the server even accepted).
		waitFor(t, "the server to drop the stalled reader", func() bool { return srv.Stats().Aborted > abortedBefore })
		n, _ := io.Copy(io.Discard, c)
		if n >= size+8 {
			t.Fatalf("server delivered all %d bytes to a peer that stalled", n)
		}
	})
	t.Run("idle connection", func(t *testing.T) {
		c := dial(t, srv)
		if got := readAll(t, c); len(got) != 0 {
			t.Fatalf("idle connection got %x", got)
		}
	})
	waitFor(t, "connections to close", func() bool { return srv.Stats().Conns == 0 })
	if !bytes.Equal(mem, orig) {
		t.Fatalf("cut-off writes changed memory at offset %d", firstDiff(mem, orig))
	}
	if st := srv.Stats(); st.Aborted < 3 || st.Writes != 0 {
		t.Errorf("stats %+v: want ≥3 aborted, no completed write", st)
	}
	assertServes(t, srv, mem)
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A flood of connections past MaxConns is shed on accept; the server keeps serving once the
// flood ends.
func TestServerConnectionFlood(t *testing.T) {
	srv, mem := startServer(t, transfer.ServerOptions{MaxConns: 8}, 1<<20)
	var flood []net.Conn
	for range 8 {
		flood = append(flood, dial(t, srv))
	}
	waitFor(t, "8 connections", func() bool { return srv.Stats().Conns == 8 })
	for range 40 {
		c := dial(t, srv)
		if _, err := c.Write(header(16, testBase, 0x80)); err != nil {
			continue // already closed by the server: also a refusal
		}
		if got := readAll(t, c); len(got) != 0 {
			t.Fatalf("connection over the cap was served: %x", got)
		}
	}
	if got := srv.Stats().ConnsRejected; got != 40 {
		t.Errorf("rejected %d connections, want 40", got)
	}
	for _, c := range flood {
		_ = c.Close()
	}
	waitFor(t, "the flood to drain", func() bool { return srv.Stats().Conns == 0 })
	assertServes(t, srv, mem)
}

// Concurrent remote writes of whole pages and remote reads of them: every read returns one
// page as some write left it, never a mix (the package's no-torn-page guarantee).
func TestServerNoTornPages(t *testing.T) {
	const page = 1 << 20
	srv, _ := startServer(t, transfer.ServerOptions{}, 4*page)
	cl := transfer.NewClient(transfer.ClientOptions{})
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	peer := srv.Addr().String()
	if err := cl.Write(ctx, peer, testBase, bytes.Repeat([]byte{0}, page)); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for w := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if err := cl.Write(ctx, peer, testBase, bytes.Repeat([]byte{byte(1 + w*100 + i%50)}, page)); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	buf := make([]byte, page)
	for i := range 200 {
		var err error
		if i%2 == 0 {
			err = cl.Read(ctx, peer, testBase, buf)
		} else {
			err = srv.ReadAt(testBase, buf)
		}
		if err != nil {
			t.Fatal(err)
		}
		if n := bytes.Count(buf, buf[:1]); n != page {
			t.Fatalf("read %d saw a torn page: %d of %d bytes are %#x", i, n, page, buf[0])
		}
	}
	close(stop)
	wg.Wait()
}

func TestServerRegister(t *testing.T) {
	srv, err := transfer.NewServer(transfer.ServerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	if err := srv.Register(0x1000, make([]byte, 0x1000)); err != nil {
		t.Fatal(err)
	}
	if err := srv.Register(0x3000, make([]byte, 0x1000)); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		base uint64
		n    int
	}{
		{"empty", 0x9000, 0},
		{"at zero", 0, 16},
		{"wraps", ^uint64(0) - 7, 16},
		{"overlaps the first from below", 0x800, 0x801},
		{"inside the first", 0x1800, 16},
		{"overlaps the second's start", 0x2fff, 2},
		{"same base", 0x3000, 1},
	} {
		if err := srv.Register(tc.base, make([]byte, tc.n)); !errors.Is(err, transfer.ErrRegion) {
			t.Errorf("%s: %v, want ErrRegion", tc.name, err)
		}
	}
	if err := srv.Register(0x2000, make([]byte, 0x1000)); err != nil {
		t.Errorf("region exactly between two others: %v", err)
	}
	// A request spanning two adjacent regions is refused: each request must fit one region.
	if err := srv.ReadAt(0x1ff0, make([]byte, 32)); !errors.Is(err, transfer.ErrRegion) {
		t.Errorf("read across two regions: %v", err)
	}
	srv.Unregister(0x2000)
	if err := srv.ReadAt(0x2000, make([]byte, 1)); !errors.Is(err, transfer.ErrRegion) {
		t.Errorf("read of an unregistered region: %v", err)
	}
	srv.Unregister(0x2000) // unknown base: ignored
}

// Unregister waits for remote requests on the region and the server refuses the region after.
func TestServerUnregisterUnderTraffic(t *testing.T) {
	const size = 8 << 20
	srv, _ := startServer(t, transfer.ServerOptions{}, size)
	cl := transfer.NewClient(transfer.ClientOptions{})
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	peer := srv.Addr().String()
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, size)
			for {
				if err := cl.Read(ctx, peer, testBase, buf); err != nil {
					if !errors.Is(err, transfer.ErrRefused) {
						t.Errorf("read while unregistering: %v", err)
					}
					return
				}
			}
		}()
	}
	time.Sleep(50 * time.Millisecond)
	srv.Unregister(testBase)
	wg.Wait()
	err := cl.Read(ctx, peer, testBase, make([]byte, 16))
	if !errors.Is(err, transfer.ErrRefused) {
		t.Fatalf("read after Unregister: %v, want a refusal", err)
	}
}

// A flood of refused requests is logged at most once a second, each line counting the
// refusals it stands for.
func TestServerRefusalLogIsBounded(t *testing.T) {
	var logBuf lockedLog
	srv, mem := startServer(t, transfer.ServerOptions{Logger: slog.New(slog.NewJSONHandler(&logBuf, nil))}, 1<<20)
	start := time.Now()
	const flood = 30
	for range flood {
		c := dial(t, srv)
		if _, err := c.Write(header(16, 8, 0x80)); err != nil {
			t.Fatal(err)
		}
		readAll(t, c)
	}
	elapsed := time.Since(start)
	lines := logBuf.lines()
	if len(lines) < 1 || float64(len(lines)) > 1+elapsed.Seconds()+1 {
		t.Fatalf("%d refusal log lines for %d refusals in %v", len(lines), flood, elapsed)
	}
	if !strings.Contains(lines[0], `"reason":"range not inside one registered region"`) || !strings.Contains(lines[0], `"addr":"0x8"`) {
		t.Errorf("refusal line %s does not say what was refused", lines[0])
	}
	time.Sleep(1100 * time.Millisecond)
	c := dial(t, srv)
	if _, err := c.Write(header(16, 8, 0x80)); err != nil {
		t.Fatal(err)
	}
	readAll(t, c)
	// Every refusal is either a line or counted by a later line (the last one is logged: it
	// came more than a second after the one before).
	all := logBuf.lines()
	accounted := len(all)
	for _, l := range all {
		var rec struct {
			Unlogged *int `json:"unlogged_refusals"`
		}
		if err := json.Unmarshal([]byte(l), &rec); err != nil || rec.Unlogged == nil {
			t.Fatalf("log line %s: %v", l, err)
		}
		accounted += *rec.Unlogged
	}
	if accounted != flood+1 {
		t.Errorf("%d lines account for %d refusals, want %d", len(all), accounted, flood+1)
	}
	if srv.Stats().Refused != flood+1 {
		t.Errorf("refused %d, want %d", srv.Stats().Refused, flood+1)
	}
	assertServes(t, srv, mem)
}

type lockedLog struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedLog) lines() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Split(strings.TrimSpace(l.b.String()), "\n")
}

// ServerStats' JSON field names are a contract (the daemon reports them): add, never rename.
func TestServerStatsJSONFields(t *testing.T) {
	b, err := json.Marshal(transfer.ServerStats{Conns: 1, ConnsRejected: 2, Reads: 3, Writes: 4, BytesRead: 5, BytesWritten: 6, Refused: 7, Aborted: 8, V1Requests: 9})
	if err != nil {
		t.Fatal(err)
	}
	want := `{"conns":1,"conns_rejected":2,"reads":3,"writes":4,"bytes_read":5,"bytes_written":6,"refused":7,"aborted":8,"v1_requests":9}`
	if string(b) != want {
		t.Fatalf("ServerStats JSON\n got %s\nwant %s", b, want)
	}
}
