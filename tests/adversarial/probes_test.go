package adversarial

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// floodKeepAlive opens up to count HTTP/1.1 keep-alive connections to addr, makes one request
// on each (so the server sees an idle keep-alive connection, not one that never spoke) and
// holds them for hold, making another request on each every refresh when refresh > 0. A
// connection the server closes is not reopened.
func floodKeepAlive(addr string, count int, hold, refresh time.Duration) (opened, failed int) {
	raiseOwnLimit()
	type kc struct {
		c net.Conn
		r *bufio.Reader
	}
	var conns []kc
	ask := func(k kc) error {
		_ = k.c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.WriteString(k.c, "GET /healthz HTTP/1.1\r\nHost: flood\r\n\r\n"); err != nil {
			return err
		}
		resp, err := http.ReadResponse(k.r, nil)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.Body.Close()
	}
	for range count {
		c, err := net.DialTimeout("tcp", addr, 2*time.Second)
		if err != nil {
			failed++
			continue
		}
		k := kc{c, bufio.NewReader(c)}
		if ask(k) != nil {
			_ = c.Close()
			failed++
			continue
		}
		conns = append(conns, k)
		opened++
	}
	end := time.Now().Add(hold)
	for time.Now().Before(end) {
		wait := time.Until(end)
		if refresh > 0 {
			wait = min(wait, refresh)
		}
		time.Sleep(wait)
		if refresh > 0 && time.Now().Before(end) {
			for _, k := range conns {
				_ = ask(k)
			}
		}
	}
	for _, k := range conns {
		_ = k.c.Close()
	}
	return opened, failed
}

// probe makes n health probes on fresh connections, as a kubelet does, and returns how many
// got an answer (any HTTP status).
func probe(url string, n int) (answered int, lastErr error) {
	for range n {
		tr := &http.Transport{DisableKeepAlives: true}
		c := &http.Client{Timeout: 5 * time.Second, Transport: tr}
		resp, err := c.Get(url)
		if err != nil {
			lastErr = err
			continue
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		answered++
	}
	return answered, lastErr
}

// TestProbesUnderKeepAliveFlood: another local user holding more idle keep-alive connections
// than the cap on the admin listener and on --metrics-addr (refreshed every 2 s, as the attack
// refreshed them every 45 s) does not starve /readyz and /healthz there: idle connections give
// way to new ones at the cap.
func TestProbesUnderKeepAliveFlood(t *testing.T) {
	requireRoot(t)
	const maxConns = 64
	metrics := freeAddr(t)
	p := startServe(t, serveOpts{args: []string{"--max-conns", fmt.Sprint(maxConns), "--metrics-addr", metrics}})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	outs := make([]string, 2)
	for i, addr := range []string{p.admin, metrics} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, _ := runAs(ctx, nobodyUID, "flood-keepalive", "ADDR="+addr, fmt.Sprintf("COUNT=%d", 2*maxConns), "DURATION=12s", "REFRESH=2s").CombinedOutput()
			outs[i] = strings.TrimSpace(string(out))
		}()
	}
	// Let both floods fill their listeners.
	time.Sleep(6 * time.Second)
	for _, base := range []string{p.admin, metrics} {
		for _, path := range []string{"/readyz", "/healthz"} {
			if n, err := probe("http://"+base+path, 10); n != 10 {
				t.Errorf("%s%s answered %d of 10 probes during the flood (last error: %v)", base, path, n, err)
			}
		}
	}
	wg.Wait()
	for i, out := range outs {
		var opened, failed int
		if _, err := fmt.Sscanf(out, "opened=%d failed=%d", &opened, &failed); err != nil || opened < maxConns {
			t.Errorf("flood %d did not fill the listener (%q): the test proves nothing", i, out)
		}
	}
	p.healthy(t)
}

// freeAddr is a loopback address with a port nothing listens on now.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}
