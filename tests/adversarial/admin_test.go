package adversarial

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvctl/kvctl/core/engineapi"
)

func queryKeyCodes(t *testing.T, url string, n int) map[int]int {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second}
	codes := map[int]int{}
	for range n {
		resp, err := c.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		codes[resp.StatusCode]++
	}
	return codes
}

// TestQueryKeyLeases: /query_key's read lease (which, looped, pinned every key and failed 98 %
// of puts on a full pool) is off by default, with a 403 that says how to turn it on; with
// --admin-grants-leases it works and is rate-limited. Read-only endpoints stay open.
func TestQueryKeyLeases(t *testing.T) {
	p := startServe(t, serveOpts{})
	runEngine(t, p.socket, "writer", 9)
	keysURL := "http://" + p.admin + "/get_all_keys"
	resp, err := http.Get(keysURL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("/get_all_keys (read-only) answered %d", resp.StatusCode)
	}
	var key string
	for _, f := range strings.FieldsFunc(string(body), func(r rune) bool { return r == '\n' || r == '"' || r == ',' || r == '[' || r == ']' }) {
		if strings.HasPrefix(strings.TrimSpace(f), "trtllm/") {
			key = strings.TrimSpace(f)
			break
		}
	}
	if key == "" {
		t.Fatalf("no key listed:\n%.1000s", body)
	}
	q := "http://" + p.admin + "/query_key?key=" + key
	resp, err = http.Get(q)
	if err != nil {
		t.Fatal(err)
	}
	msg, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(string(msg), "--admin-grants-leases") {
		t.Errorf("/query_key without --admin-grants-leases: %d %s", resp.StatusCode, msg)
	}
	if codes := queryKeyCodes(t, "http://"+p.admin+"/batch_query_keys?keys="+key, 5); codes[200] != 5 {
		t.Errorf("/batch_query_keys (read-only) answered %v", codes)
	}

	// With leases on and a rate of 20/s (burst 40), a tight loop of 300 gets at most the burst
	// plus what the rate refills in the loop's time, and the rest 429.
	p2 := startServe(t, serveOpts{args: []string{"--admin-grants-leases", "--admin-lease-rate", "20"}})
	runEngine(t, p2.socket, "writer", 9)
	start := time.Now()
	codes := queryKeyCodes(t, "http://"+p2.admin+"/query_key?key="+key, 300)
	elapsed := time.Since(start).Seconds()
	if most := 40 + int(20*elapsed) + 1; codes[200] > most || codes[200] == 0 {
		t.Errorf("lease grants in %.2fs: %d, want 1..%d (%v)", elapsed, codes[200], most, codes)
	}
	if codes[429] == 0 {
		t.Errorf("no 429 in a loop of 300: %v", codes)
	}
}

// TestQueryKeyLoopFromAnotherUser: the lease loop run by another local user (nobody) is refused
// for as long as it runs, and an engine keeps saving and loading meanwhile.
func TestQueryKeyLoopFromAnotherUser(t *testing.T) {
	requireRoot(t)
	p := startServe(t, serveOpts{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := runAs(ctx, nobodyUID, "query-loop", "URL=http://"+p.admin+"/query_key?key=trtllm/m/x", "DURATION=3s")
	out := make(chan string, 1)
	go func() { b, _ := cmd.CombinedOutput(); out <- string(b) }()
	runEngine(t, p.socket, "busy", 10)
	got := <-out
	var ok, forbidden int
	if _, err := fmt.Sscanf(got, "200=%d 403=%d", &ok, &forbidden); err != nil {
		t.Fatalf("flooder output %q: %v", got, err)
	}
	if ok != 0 || forbidden == 0 {
		t.Errorf("lease loop from another uid: %s", got)
	}
	p.healthy(t)
}

// TestDescriptorFlood: a process that sends descriptors and never registers is capped at its
// own share, so another engine still registers; unclaimed descriptors expire on a timer even
// when nothing new arrives.
func TestDescriptorFlood(t *testing.T) {
	p := startServe(t, serveOpts{args: []string{"--descriptor-ttl", "5s"}})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	fdPath := engineapi.FDSocketPath(p.socket)
	_, fds0, _ := procStats(p.cmd.Process.Pid)
	// The flooder is another process: 300 descriptors, then it waits past the TTL and sends one.
	cmd := runAs(ctx, 0, "flood-fds", "ADDR="+fdPath, "COUNT=300", "DURATION=7s")
	out := make(chan string, 1)
	go func() { b, _ := cmd.CombinedOutput(); out <- string(b) }()
	time.Sleep(time.Second)
	// Meanwhile a real engine registers and runs.
	runEngine(t, p.socket, "legit", 11)
	got := <-out
	var sent, refused, after, refusedAfter int
	var first string
	lines := strings.Split(strings.TrimSpace(got), "\n")
	if len(lines) < 2 {
		t.Fatalf("flooder output: %q", got)
	}
	if _, err := fmt.Sscanf(lines[0], "sent=%d refused=%d first=%q", &sent, &refused, &first); err != nil {
		t.Fatalf("flooder output %q: %v", got, err)
	}
	if _, err := fmt.Sscanf(lines[1], "after=%d refused_after=%d", &after, &refusedAfter); err != nil {
		t.Fatalf("flooder output %q: %v", got, err)
	}
	// 16 per process; a slow run may see the first ones expire (5 s) and a few more taken.
	if sent < 16 || sent > 32 || sent+refused != 300 || !strings.Contains(first, "unclaimed descriptors") {
		t.Errorf("one process's unclaimed descriptors: sent %d, refused %d (%q); want 16 (up to 32 on a slow run) and the rest refused", sent, refused, first)
	}
	if after != 1 {
		t.Errorf("after the TTL the flooder's descriptors had not expired: %s", got)
	}
	// The timer closes the last descriptor the flooder sent, with nothing new arriving.
	var fds int
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if _, fds, _ = procStats(p.cmd.Process.Pid); fds <= fds0 {
			break
		}
	}
	if fds > fds0 {
		t.Errorf("unclaimed descriptors were not closed by the timer: %d descriptors open, %d before the flood", fds, fds0)
	}
	p.alive(t)
}

// TestRemoteAdminWarns: --allow-remote-admin starts, but says what it exposes; without it a
// non-loopback admin address is refused.
func TestRemoteAdminWarns(t *testing.T) {
	code, out := serveExit(t, filepath.Join(socketDir(t), "s"), "--admin-addr", "0.0.0.0:0")
	if code == 0 || !strings.Contains(out, "not loopback") {
		t.Errorf("a non-loopback admin address without --allow-remote-admin: exit %d\n%s", code, out)
	}
	p := startServe(t, serveOpts{args: []string{"--admin-addr", "0.0.0.0:0", "--allow-remote-admin"}})
	if s := p.stderr.String(); !strings.Contains(s, "exposes the admin API without authentication") || !strings.Contains(s, "/get_all_keys") {
		t.Errorf("no warning naming what --allow-remote-admin exposes:\n%s", tail(s, 20))
	}
}
