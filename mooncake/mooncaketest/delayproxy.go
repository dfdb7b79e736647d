package mooncaketest

import (
	"context"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// DelayProxy forwards TCP connections to target, holding every chunk it reads for oneWay
// before writing it on, in each direction, so that a client reaches target with a round trip
// 2×oneWay longer, as over a network, while chunks keep flowing back to back (a chunk waits for
// its own time, not for the chunks before it to be written). It returns the proxy's address;
// it closes with the test.
func DelayProxy(tb testing.TB, target string, oneWay time.Duration) string {
	tb.Helper()
	ctx := context.Background()
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	tb.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := (&net.Dialer{}).DialContext(ctx, "tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, up)
			mu.Unlock()
			wg.Go(func() { delayCopy(up, c, oneWay) })
			wg.Go(func() { delayCopy(c, up, oneWay) })
		}
	})
	return ln.Addr().String()
}

// delayCopy copies src to dst, each chunk written oneWay after it was read.
func delayCopy(dst, src net.Conn, oneWay time.Duration) {
	type chunk struct {
		b  []byte
		at time.Time
	}
	ch := make(chan chunk, 1024)
	go func() {
		defer close(ch)
		for {
			b := make([]byte, 64<<10)
			n, err := src.Read(b)
			if n > 0 {
				ch <- chunk{b[:n], time.Now().Add(oneWay)}
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range ch {
		if d := time.Until(c.at); d > 0 {
			time.Sleep(d)
		}
		if _, err := dst.Write(c.b); err != nil {
			break
		}
	}
	_ = dst.Close()
	_, _ = io.Copy(io.Discard, src)
}
