package adversarial

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvctl/kvctl/core/enginesim"
	"github.com/kvctl/kvctl/mooncake/mooncaketest"
)

// mcSoakSample is one sample of the Mooncake-mode soak.
type mcSoakSample struct {
	At                   time.Duration
	RSSKiBA, RSSKiBB     int64
	RSSKiBFront          int64
	Runs, WrongBytes     int64
	EngineErrors         int64
	LoadedBlocks         int64
	ProbeMisses          int64
	FrontOK, FrontFailed int64
	TEDrips              int64
}

// TestSoakMooncake runs the floods of the second hardening round against real processes for
// KVCTL_SOAK_MOONCAKE (e.g. 30m): a real mooncake_master; host A (kvctl serve, mooncake
// backend, --object-checksum, --metrics-addr) whose engine saves pages; host B whose engine
// loads them from A's segment over the Transfer Engine; and a disaggregated front
// (kvctl serve --disagg-config) before scripted servers. Meanwhile, from 127.0.0.2: two
// slowloris WRITEs of 256 MiB on A's Transfer Engine port (reopened when cut off) and 300 idle
// connections to it every 20 s; 1,100 idle keep-alive connections to A's metrics listener,
// refreshed; 200 connections to the front that never finish their headers. Every page an
// engine loads is checked byte for byte; /readyz on the metrics listener is probed every 5 s;
// a legitimate client posts to the front every 2 s. It fails when a process exits, a loaded
// page holds a wrong byte, a probe or a legitimate request fails, or RSS grows (the last
// quarter's peak above twice the second quarter's plus 64 MiB), and writes its samples to
// KVCTL_SOAK_OUT when set.
func TestSoakMooncake(t *testing.T) {
	d, err := time.ParseDuration(os.Getenv("KVCTL_SOAK_MOONCAKE"))
	if err != nil || d <= 0 {
		t.Skip("set KVCTL_SOAK_MOONCAKE to a duration (e.g. 30m) to run the Mooncake-mode soak")
	}
	raiseOwnLimit()
	m := mooncaketest.StartMaster(t, mooncaketest.MasterOptions{})
	metrics := freeAddr(t)
	a := startServe(t, serveOpts{args: append(mooncakeArgs(m, m.AdminURL), "--pool-size", "300MiB", "--object-checksum",
		"--metrics-addr", metrics)})
	b := startServe(t, serveOpts{args: append(mooncakeArgs(m, m.AdminURL), "--object-checksum")})
	waitReadyz(t, a, 200)
	waitReadyz(t, b, 200)
	front := startFront(t, "max_connections: 128\nmax_connections_per_peer: 32\nbody_read_timeout_s: 2\n", 0)
	var detail struct {
		Segments []struct {
			Name string `json:"segment_name"`
			Base string `json:"base_address"`
			Size int64  `json:"size_bytes"`
		} `json:"segments"`
	}
	if err := json.Unmarshal([]byte(getBody(t, m.AdminURL+"/get_segments_detail")), &detail); err != nil {
		t.Fatal(err)
	}
	var teAddr string
	var teBase uint64
	for _, s := range detail.Segments {
		// A's segment is the one that can take a 256 MiB WRITE.
		if base, err := strconv.ParseUint(strings.TrimPrefix(s.Base, "0x"), 16, 64); err == nil && s.Size >= 256<<20 {
			teAddr, teBase = s.Name, base
		}
	}
	if teAddr == "" {
		t.Fatal("no segment to flood")
	}

	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var (
		runs, wrong, engErrs, loaded atomic.Int64
		probeMisses                  atomic.Int64
		frontOK, frontFailed, drips  atomic.Int64
		wg                           sync.WaitGroup
		firstErr                     sync.Once
		errText                      atomic.Value
	)
	note := func(err error) {
		firstErr.Do(func() { errText.Store(err.Error()) })
	}
	loop := func(f func()) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				f()
			}
		}()
	}
	sleep := func(d time.Duration) {
		select {
		case <-ctx.Done():
		case <-time.After(d):
		}
	}
	simRun := func(socket, name string, reqs []enginesim.Request) {
		rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer rcancel()
		e, err := enginesim.Start(rctx, enginesim.Config{Socket: socket, ModelKey: "soak-model", Name: name,
			TokensPerBlock: poisonT, Slots: 256, PageBytes: []int{poisonPage}, Chunk: 8 * poisonT})
		if err != nil {
			engErrs.Add(1)
			note(err)
			return
		}
		res, err := e.Run(rctx, reqs, 2)
		_ = e.Close(rctx)
		runs.Add(1)
		loaded.Add(int64(res.LoadedBlocks))
		switch {
		case errors.Is(err, enginesim.ErrWrongBytes):
			wrong.Add(1)
			note(err)
		case err != nil:
			engErrs.Add(1)
			note(err)
		}
	}
	// The engines: A saves (and reloads) a group of prompts, B loads the same prompts from
	// A's segment; 16 groups in turn.
	iter := 0
	loop(func() {
		iter++
		g := iter % 16
		base := poisonRequests(8, 4, fmt.Sprint("g", g))
		for i := range base {
			for j := range base[i].Tokens {
				base[i].Tokens[j] += int64(g) * 1_000_000
			}
		}
		rename := func(suffix string) []enginesim.Request {
			out := make([]enginesim.Request, len(base))
			for i, q := range base {
				out[i] = enginesim.Request{ID: q.ID + "-" + suffix, Tokens: q.Tokens}
			}
			return out
		}
		simRun(a.socket, fmt.Sprint("a", iter), rename(fmt.Sprint("a", iter)))
		simRun(b.socket, fmt.Sprint("b", iter), rename(fmt.Sprint("b", iter)))
	})
	// Transfer Engine: two slowloris WRITEs, reopened when the server cuts them off.
	attacker := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}, Timeout: 2 * time.Second}
	for range 2 {
		loop(func() {
			c, err := attacker.DialContext(ctx, "tcp", teAddr)
			if err != nil {
				sleep(time.Second)
				return
			}
			defer c.Close()
			drips.Add(1)
			hdr := teWriteHeader(256<<20, teBase)
			if _, err := c.Write(append(hdr, make([]byte, 1<<20)...)); err != nil {
				return
			}
			for ctx.Err() == nil {
				sleep(5 * time.Second)
				_ = c.SetWriteDeadline(time.Now().Add(5 * time.Second))
				if _, err := c.Write(make([]byte, 1<<20)); err != nil {
					return
				}
			}
		})
	}
	// Transfer Engine: 300 idle connections (past the cap of 256) for 10 s in every 20.
	loop(func() {
		var conns []net.Conn
		for range 300 {
			if c, err := attacker.DialContext(ctx, "tcp", teAddr); err == nil {
				conns = append(conns, c)
			}
		}
		sleep(10 * time.Second)
		for _, c := range conns {
			_ = c.Close()
		}
		sleep(10 * time.Second)
	})
	// Metrics listener: idle keep-alive connections past its cap, refreshed, and probes.
	loop(func() { floodKeepAlive(metrics, 1100, 20*time.Second, 8*time.Second) })
	loop(func() {
		if n, err := probe("http://"+metrics+"/readyz", 1); n != 1 {
			probeMisses.Add(1)
			note(fmt.Errorf("readyz probe: %w", err))
		}
		sleep(5 * time.Second)
	})
	// Disaggregated front: connections that never finish their headers, and a legitimate
	// client.
	frontAddr := strings.TrimPrefix(front.url, "http://")
	loop(func() {
		var conns []net.Conn
		for range 200 {
			if c, err := attacker.DialContext(ctx, "tcp", frontAddr); err == nil {
				_, _ = io.WriteString(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
				conns = append(conns, c)
			}
		}
		sleep(10 * time.Second)
		for _, c := range conns {
			_ = c.Close()
		}
	})
	legit := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
	loop(func() {
		code, body, err := postFront(legit, front.url, completionBody("legit"))
		if err != nil || code != 200 {
			frontFailed.Add(1)
			note(fmt.Errorf("front: %d %w %s", code, err, body))
		} else {
			frontOK.Add(1)
		}
		sleep(2 * time.Second)
	})

	var samples []mcSoakSample
	start := time.Now()
	tick := time.NewTicker(30 * time.Second)
	defer tick.Stop()
	sample := func() {
		ra, _, _ := procStats(a.cmd.Process.Pid)
		rb, _, _ := procStats(b.cmd.Process.Pid)
		rf, _, _ := procStats(front.pid)
		samples = append(samples, mcSoakSample{At: time.Since(start).Round(time.Second), RSSKiBA: ra, RSSKiBB: rb, RSSKiBFront: rf,
			Runs: runs.Load(), WrongBytes: wrong.Load(), EngineErrors: engErrs.Load(), LoadedBlocks: loaded.Load(),
			ProbeMisses: probeMisses.Load(), FrontOK: frontOK.Load(), FrontFailed: frontFailed.Load(), TEDrips: drips.Load()})
		t.Logf("%+v", samples[len(samples)-1])
	}
	sample()
	exited := ""
	for ctx.Err() == nil && exited == "" {
		select {
		case <-ctx.Done():
		case <-tick.C:
			sample()
		case <-a.done:
			exited = "host A"
		case <-b.done:
			exited = "host B"
		}
	}
	cancel()
	wg.Wait()
	sample()
	if out := os.Getenv("KVCTL_SOAK_OUT"); out != "" {
		data, _ := json.MarshalIndent(map[string]any{"duration": d.String(), "samples": samples}, "", " ")
		_ = os.WriteFile(out, data, 0o644)
	}
	last := samples[len(samples)-1]
	if exited != "" {
		t.Fatalf("%s exited during the soak", exited)
	}
	a.alive(t)
	b.alive(t)
	if last.WrongBytes != 0 || last.EngineErrors != 0 || last.ProbeMisses != 0 || last.FrontFailed != 0 || last.Runs == 0 || last.LoadedBlocks == 0 {
		msg, _ := errText.Load().(string)
		t.Errorf("soak: %+v; first error: %s", last, msg)
	}
	if len(samples) >= 8 {
		for _, pick := range []func(mcSoakSample) int64{
			func(s mcSoakSample) int64 { return s.RSSKiBA },
			func(s mcSoakSample) int64 { return s.RSSKiBB },
			func(s mcSoakSample) int64 { return s.RSSKiBFront },
		} {
			q := len(samples) / 4
			second, lastQ := peak(samples[q:2*q], pick), peak(samples[3*q:], pick)
			if lastQ > 2*second+64<<10 {
				t.Errorf("RSS grew: second quarter peak %d KiB, last quarter peak %d KiB", second, lastQ)
			}
		}
	}
}

func peak(s []mcSoakSample, pick func(mcSoakSample) int64) int64 {
	v := make([]int64, len(s))
	for i, x := range s {
		v[i] = pick(x)
	}
	sort.Slice(v, func(i, j int) bool { return v[i] < v[j] })
	if len(v) == 0 {
		return 0
	}
	return v[len(v)-1]
}
