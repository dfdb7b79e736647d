package masterrpc

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// bigKeys is the size of a "big" BatchExistKey in these tests: one the scripted master holds.
const bigKeys = 1000

func keysOf(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = "k" + string(rune('a'+i%26))
	}
	return keys
}

// serialMaster is a scripted master that, like mooncake_master, answers the calls of one
// connection one after another: a call waits until the call before it on its connection has
// been answered. It answers ServiceReady with ProtocolVersion and BatchExistKey with 1 for
// every key. A BatchExistKey of bigKeys keys is held until release is closed; one of two keys
// ("poison") is answered with a frame that is not coro_rpc.
type serialMaster struct {
	addr    string
	release chan struct{}
	held    chan struct{} // receives when a big call starts being held
	open    atomic.Int32  // connections the client has not closed
	once    sync.Once
}

// releaseAll answers the held calls, and every later big call at once.
func (m *serialMaster) releaseAll() { m.once.Do(func() { close(m.release) }) }

func startSerialMaster(t *testing.T) *serialMaster {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m := &serialMaster{addr: ln.Addr().String(), release: make(chan struct{}), held: make(chan struct{}, 64)}
	t.Cleanup(func() { _ = ln.Close(); m.releaseAll() })
	bigLen := len(encodeKeysTenant(keysOf(bigKeys), DefaultTenant))
	poisonLen := len(encodeKeysTenant([]string{"p", "q"}, DefaultTenant))
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			m.open.Add(1)
			type req struct {
				seq, fid uint32
				n        int
			}
			reqs := make(chan req, 64)
			// The reader sees the client close the connection even while a call is held;
			// the worker answers the calls in order.
			go func() {
				defer close(reqs)
				defer m.open.Add(-1)
				for {
					var h [reqHeaderLen]byte
					if _, err := io.ReadFull(c, h[:]); err != nil {
						return
					}
					body := make([]byte, binary.LittleEndian.Uint32(h[12:]))
					if _, err := io.ReadFull(c, body); err != nil {
						return
					}
					reqs <- req{binary.LittleEndian.Uint32(h[4:]), binary.LittleEndian.Uint32(h[8:]), len(body)}
				}
			}()
			go func() {
				defer c.Close()
				for r := range reqs {
					var out []byte
					switch {
					case r.fid == functionID("ServiceReady"):
						out = frame(r.seq, 0, versionBody(ProtocolVersion))
					case r.n == poisonLen:
						out = []byte("HTTP/1.1 400 Bad Request\r\n\r\n")
					default:
						n := 1
						if r.n == bigLen {
							n = bigKeys
							m.held <- struct{}{}
							<-m.release
						}
						out = frame(r.seq, 0, pack(respBatchExist, func(e *encoder) {
							e.length(n)
							for range n {
								e.u8(1)
								e.u8(1)
							}
						}))
					}
					if _, err := c.Write(out); err != nil {
						return
					}
				}
			}()
		}
	}()
	return m
}

func (m *serialMaster) waitHeld(t *testing.T, n int) {
	t.Helper()
	for range n {
		select {
		case <-m.held:
		case <-time.After(5 * time.Second):
			t.Fatal("the big call never reached the master")
		}
	}
}

func bigCall(c *Client) <-chan error {
	done := make(chan error, 1)
	go func() {
		got, err := c.BatchExistKey(context.Background(), keysOf(bigKeys), DefaultTenant)
		if err == nil && (len(got) != bigKeys || got[0] != 1) {
			err = errors.New("the big call got a wrong answer")
		}
		done <- err
	}()
	return done
}

// TestSmallCallBesideBigCall: the master answers a connection's calls in turn, so over one
// connection a small call waits for a big one sent before it; with two it is answered while
// the big one is still being worked on.
func TestSmallCallBesideBigCall(t *testing.T) {
	for _, conns := range []int{1, 2} {
		m := startSerialMaster(t)
		c, err := Dial(context.Background(), Options{Addr: m.addr, Conns: conns, CallTimeout: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		big := bigCall(c)
		m.waitHeld(t, 1)
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		got, err := c.BatchExistKey(ctx, []string{"a"}, DefaultTenant)
		cancel()
		switch {
		case conns == 1 && !errors.Is(err, ErrUnavailable):
			t.Errorf("one connection: a small call behind a held big one = %v, %v; want it to wait (ErrUnavailable)", got, err)
		case conns == 2 && (err != nil || len(got) != 1 || got[0] != 1):
			t.Errorf("two connections: a small call beside a held big one = %v, %v; want [1]", got, err)
		}
		m.releaseAll()
		if err := <-big; err != nil {
			t.Errorf("%d connections: big call: %v", conns, err)
		}
		// The master released everything, so the answers pass again whatever the connection.
		if got, err := c.BatchExistKey(context.Background(), []string{"a"}, DefaultTenant); err != nil || got[0] != 1 {
			t.Errorf("%d connections: a call after the big one = %v, %v", conns, got, err)
		}
		_ = c.Close()
	}
}

// TestCloseWithCallsInFlight: Close fails every call in flight on every connection with
// ErrClosed at once, closes the connections, and leaves no goroutine behind.
func TestCloseWithCallsInFlight(t *testing.T) {
	m := startSerialMaster(t)
	before := runtime.NumGoroutine()
	c, err := Dial(context.Background(), Options{Addr: m.addr, Conns: 3, CallTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if got := m.open.Load(); got != 3 {
		t.Fatalf("master sees %d connections after Dial with Conns 3", got)
	}
	var calls []<-chan error
	for range 9 {
		calls = append(calls, bigCall(c))
	}
	m.waitHeld(t, 3) // one held on each connection, the others queued behind them
	waitFor(t, "9 calls in flight", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		var n int32
		for _, cn := range c.conns {
			n += cn.inflight.Load()
		}
		return n == 9
	})
	start := time.Now()
	_ = c.Close()
	for i, done := range calls {
		select {
		case err := <-done:
			if !errors.Is(err, ErrClosed) {
				t.Errorf("call %d after Close: %v, want ErrClosed", i, err)
			}
		case <-time.After(2 * time.Second):
			t.Fatalf("call %d still waiting 2 s after Close", i)
		}
	}
	t.Logf("9 calls failed %v after Close", time.Since(start))
	if _, err := c.BatchExistKey(context.Background(), []string{"a"}, DefaultTenant); !errors.Is(err, ErrClosed) {
		t.Errorf("a call after Close: %v", err)
	}
	if n := c.OpenConns(); n != 0 {
		t.Errorf("%d connections open after Close", n)
	}
	waitFor(t, "the master to see every connection closed", func() bool { return m.open.Load() == 0 })
	m.releaseAll() // let the scripted master's workers finish too
	waitFor(t, "the goroutines to end", func() bool { return runtime.NumGoroutine() <= before })
}

// TestOneConnectionBreaks: a connection the master answers with garbage is dropped alone: the
// call on it fails with ErrProtocol, a call held on another connection still gets its answer,
// and the idle one stays. A call that finds every open connection busy opens another, and as
// one was lost, Generation changes; opening the connections at Dial counted once.
func TestOneConnectionBreaks(t *testing.T) {
	m := startSerialMaster(t)
	c, err := Dial(context.Background(), Options{Addr: m.addr, Conns: 3, CallTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	if g := c.Generation(); g != 1 {
		t.Fatalf("Generation after Dial = %d, want 1", g)
	}
	big := bigCall(c)
	m.waitHeld(t, 1)
	if _, err := c.BatchExistKey(context.Background(), []string{"p", "q"}, DefaultTenant); !errors.Is(err, ErrProtocol) {
		t.Fatalf("a call answered with garbage: %v, want ErrProtocol", err)
	}
	if n := c.OpenConns(); n != 2 {
		t.Fatalf("%d connections open after one broke, want 2 (the broken one dropped, the others kept)", n)
	}
	if g := c.Generation(); g != 1 {
		t.Fatalf("Generation = %d before any reconnect, want 1", g)
	}
	// Fill both open connections, so the next call opens a third.
	big2 := bigCall(c)
	m.waitHeld(t, 1)
	big3 := bigCall(c)
	m.waitHeld(t, 1)
	if n := c.OpenConns(); n != 3 {
		t.Fatalf("%d connections open after a call found both busy, want 3", n)
	}
	if g := c.Generation(); g != 2 {
		t.Fatalf("Generation = %d after connecting again after a loss, want 2", g)
	}
	m.releaseAll()
	for _, done := range []<-chan error{big, big2, big3} {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}

// TestConnsOption: Conns defaults to DefaultConns and is lowered to MaxConns.
func TestConnsOption(t *testing.T) {
	for _, tt := range []struct{ in, want int }{{0, DefaultConns}, {-3, DefaultConns}, {1, 1}, {MaxConns, MaxConns}, {MaxConns + 1, MaxConns}, {1 << 30, MaxConns}} {
		if got := New(Options{Addr: "127.0.0.1:1", Conns: tt.in}).Conns(); got != tt.want {
			t.Errorf("Conns %d: client keeps %d, want %d", tt.in, got, tt.want)
		}
	}
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("waited 5 s for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestCloseDuringBlockedWrite: a call whose request is still being written when Close runs
// (the master stopped reading, so the write blocks on a full socket) fails with ErrClosed,
// not with the write error Close caused.
func TestCloseDuringBlockedWrite(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		var h [reqHeaderLen]byte
		if _, err := io.ReadFull(c, h[:]); err != nil {
			return
		}
		if _, err := io.CopyN(io.Discard, c, int64(binary.LittleEndian.Uint32(h[12:]))); err != nil {
			return
		}
		if _, err := c.Write(frame(binary.LittleEndian.Uint32(h[4:]), 0, versionBody(ProtocolVersion))); err != nil {
			return
		}
		<-stop // reads nothing more
	}()
	c, err := Dial(context.Background(), Options{Addr: ln.Addr().String(), Conns: 1, CallTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	// About 48 MiB of keys: more than loopback's socket buffers hold, under maxRequestBody.
	keys := make([]string, 1<<20)
	for i := range keys {
		keys[i] = "a-key-of-about-forty-bytes-for-the-test"
	}
	done := make(chan error, 1)
	go func() {
		_, err := c.BatchExistKey(context.Background(), keys, DefaultTenant)
		done <- err
	}()
	// The write is blocked once it has been in flight a while with no answer possible.
	waitFor(t, "the call to be in flight", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return len(c.conns) == 1 && c.conns[0].inflight.Load() == 1
	})
	time.Sleep(200 * time.Millisecond)
	_ = c.Close()
	select {
	case err := <-done:
		if !errors.Is(err, ErrClosed) {
			t.Errorf("a call writing when Close ran: %v, want ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the call still waiting 5 s after Close")
	}
}
