package main

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func req(ts int64, input int, ids ...uint64) Request {
	return Request{Timestamp: ts, InputLength: input, Hashes: ids}
}

// base is a cluster of two hosts whose blocks are 1 byte per token, links of 512 B/s and local
// reads of 1024 B/s, so a whole block takes 1 s over a link and 0.5 s from the own segment.
func base() Config {
	return Config{Hosts: 2, Copies: 1, SegmentBytes: 1 << 20, TokenBytes: 1, LinkBandwidth: 512, LocalBandwidth: 1024,
		Placement: PlaceLocal, Router: RouteAffinity, Replicas: 1, Seed: 1}
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func TestReadTraceRefusesBadRequests(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{`{"timestamp":0,"input_length":10,"hash_ids":[]}`, "line 1: no hash_ids"},
		{`{"timestamp":0,"input_length":600,"hash_ids":[1]}`, "input_length 600 does not fit 1 blocks"},
		{`{"timestamp":0,"input_length":100,"hash_ids":[1,2]}`, "input_length 100 does not fit 2 blocks"},
		{"{\"timestamp\":5,\"input_length\":10,\"hash_ids\":[1]}\n{\"timestamp\":4,\"input_length\":10,\"hash_ids\":[1]}", "line 2: timestamp 4 before the previous request's 5"},
		{`{"timestamp":0,`, "line 1:"},
		{``, "no requests"},
	} {
		_, err := ReadTrace(strings.NewReader(c.in))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v, want one containing %q", c.in, err, c.want)
		}
	}
}

func TestConfigValidateNamesTheProblem(t *testing.T) {
	for _, c := range []struct {
		mod  func(*Config)
		want string
	}{
		{func(c *Config) { c.Hosts = 0 }, "hosts 0"},
		{func(c *Config) { c.Hosts = maxHosts + 1 }, "hosts 4097"},
		{func(c *Config) { c.Copies = 0 }, "copies 0"},
		{func(c *Config) { c.SegmentBytes = 0 }, "segment bytes 0"},
		{func(c *Config) { c.LinkBandwidth = math.NaN() }, "link bandwidth NaN"},
		{func(c *Config) { c.LocalBandwidth = math.Inf(1) }, "local bandwidth +Inf"},
		{func(c *Config) { c.Placement = "near" }, `placement "near"`},
		{func(c *Config) { c.Router = "x" }, `router "x"`},
		{func(c *Config) { c.Replicas = 3 }, "replicas 3"},
	} {
		cfg := base()
		c.mod(&cfg)
		if _, err := Run([]Request{req(0, 1, 1)}, cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("error %v, want one containing %q", err, c.want)
		}
	}
}

// A second turn finds its first turn's blocks: the hit is the stored prefix, the block holding
// the last prompt token is always computed, and a whole cached prompt loads all but its last
// block. With local placement and affinity routing both turns meet on one host and load at the
// local rate.
func TestHitsAreTheStoredPrefix(t *testing.T) {
	trace := []Request{
		req(0, 1100, 1, 2, 3),         // 512 + 512 + 76 tokens, all computed and saved
		req(10_000, 1600, 1, 2, 3, 4), // blocks 1..3 stored: three whole blocks of this prompt hit
		req(20_000, 1100, 1, 2, 3),    // whole prompt stored: all but its last block load
	}
	r, err := Run(trace, base())
	if err != nil {
		t.Fatal(err)
	}
	// Turn 2: blocks 1 and 2 (512 each) and block 3 as it is in this request (512 tokens);
	// turn 3: blocks 1 and 2 only.
	if want := int64(512 + 512 + 512 + 512 + 512); r.HitTokens != want {
		t.Fatalf("hit tokens %d, want %d", r.HitTokens, want)
	}
	if r.InputTokens != 1100+1600+1100 {
		t.Fatalf("input tokens %d", r.InputTokens)
	}
	if r.RemoteHitBytes != 0 || r.LocalHitBytes != 2560 {
		t.Fatalf("remote %d local %d hit bytes, want 0 and 2560", r.RemoteHitBytes, r.LocalHitBytes)
	}
	// Loads of 1536 and 1024 bytes at 1024 B/s: 1.5 s and 1 s.
	if !near(r.LoadMeanMs, 1250) || !near(r.LoadP99Ms, 1500) {
		t.Fatalf("load mean %v ms p99 %v ms, want 1250 and 1500", r.LoadMeanMs, r.LoadP99Ms)
	}
}

// Two requests at once, on two other hosts, reading a block from the host that saved it queue
// on that host's outgoing link: the second load ends a link-time after the first.
func TestRemoteLoadsQueueOnTheOwnersLink(t *testing.T) {
	cfg := base()
	cfg.Hosts = 3
	// Affinity routes by the first two ids: block 7, shared, then one that picks the host.
	second := map[int]uint64{}
	for id := uint64(100); len(second) < 3; id++ {
		if h := route(cfg, []uint64{7, id}, nil); second[h] == 0 {
			second[h] = id
		}
	}
	trace := []Request{
		req(0, 1024, 7, second[0]),       // host 0 saves block 7 in its own segment
		req(100_000, 1024, 7, second[1]), // hosts 1 and 2 read it at the same moment
		req(100_000, 1024, 7, second[2]),
	}
	r, err := Run(trace, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if r.RemoteHitBytes != 1024 || r.LocalHitBytes != 0 {
		t.Fatalf("remote %d local %d hit bytes, want 1024 remote", r.RemoteHitBytes, r.LocalHitBytes)
	}
	// One block is 512 B at 512 B/s: the first load takes 1 s, the second waits for it.
	if !near(r.LoadMeanMs, 1500) || !near(r.LoadP99Ms, 2000) {
		t.Fatalf("load mean %v ms p99 %v ms, want 1500 and 2000", r.LoadMeanMs, r.LoadP99Ms)
	}
	if !near(r.LinkBusy, 2.0/100) {
		t.Fatalf("busiest link %v busy, want 2 s of 100 s", r.LinkBusy)
	}
}

// A full segment evicts its least recently used block: a block read since stays.
func TestFullSegmentEvictsLeastRecentlyUsed(t *testing.T) {
	cfg := base()
	cfg.Hosts = 1
	cfg.SegmentBytes = 2 * 512
	trace := []Request{
		req(0, 1024, 1, 2),    // stores 1 and 2: full
		req(1000, 1024, 1, 9), // reads 1, stores 9: evicts 2 (least recently used)
		req(2000, 1024, 2, 8), // 2 is gone: no hit; stores 2 and 8, evicting 1 and 9
		req(3000, 1024, 2, 5), // 2 is back: hit
	}
	r, err := Run(trace, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if r.HitTokens != 1024 || r.Evictions != 4 {
		t.Fatalf("hit tokens %d evictions %d, want 1024 and 4", r.HitTokens, r.Evictions)
	}
}

// Copies replay the trace side by side with ids of their own: the hit rate of independent
// users is the trace's, the requests and tokens scale.
func TestCopiesDoNotShareBlocks(t *testing.T) {
	trace := []Request{req(0, 1024, 1, 2), req(10, 1536, 1, 2, 3)}
	one, err := Run(trace, base())
	if err != nil {
		t.Fatal(err)
	}
	cfg := base()
	cfg.Copies = 3
	three, err := Run(trace, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if three.Requests != 3*one.Requests || three.HitTokens != 3*one.HitTokens || !near(three.HitRate, one.HitRate) {
		t.Fatalf("3 copies: %d requests %d hit tokens rate %v; one: %d %d %v", three.Requests, three.HitTokens, three.HitRate, one.Requests, one.HitTokens, one.HitRate)
	}
}

// The command on the conversation trace: one row per host count, placement and router, the
// hit rate within what the trace allows (a block's first use is always a miss).
func TestCommandOnTheConversationTrace(t *testing.T) {
	path := filepath.Join("..", "..", "..", "shared", "traces", "conversation_trace.jsonl")
	if _, err := os.Stat(path); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skipf("no conversation trace here: %v", err)
	}
	var out bytes.Buffer
	if err := run([]string{"--trace", path, "--hosts", "8", "--scale-from", "8", "-o", "json"}, &out); err != nil {
		t.Fatal(err)
	}
	var rs []Result
	if err := json.Unmarshal(out.Bytes(), &rs); err != nil {
		t.Fatal(err)
	}
	if len(rs) != 4 {
		t.Fatalf("%d rows, want 4 (2 placements × 2 routers)", len(rs))
	}
	for _, r := range rs {
		if r.Requests != 12031 || r.HitRate < 0.30 || r.HitRate > 0.40 || r.LoadP50Ms <= 0 {
			t.Errorf("%+v", r)
		}
		if r.Placement == PlaceLocal && r.Router == RouteAffinity && r.RemoteShare > 0.2 {
			t.Errorf("local placement with affinity routing read %.0f%% of its hits from other hosts", 100*r.RemoteShare)
		}
	}
	if err := run([]string{"--trace", path, "--hosts", "12", "--scale-from", "8"}, &out); err == nil || !strings.Contains(err.Error(), "--hosts 12 is not a multiple of --scale-from 8") {
		t.Fatalf("error %v", err)
	}
}

// A hot block read by many hosts at once: with one replica every read queues on its owner's
// outgoing link; with two the reads split between the owners and the slowest load about halves.
func TestReplicasSpreadReadsOfAHotBlock(t *testing.T) {
	trace := []Request{req(0, 1024, 7, 1)}
	for i := range 40 {
		trace = append(trace, req(100_000, 1024, 7, uint64(1000+i)))
	}
	var p99 [3]float64
	for reps := 1; reps <= 2; reps++ {
		cfg := base()
		cfg.Hosts, cfg.Replicas = 8, reps
		r, err := Run(trace, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if r.HitTokens == 0 {
			t.Fatal("no hits")
		}
		p99[reps] = r.LoadP99Ms
	}
	if !(p99[2] < 0.75*p99[1]) {
		t.Fatalf("p99 load %v ms with two replicas, %v ms with one: want well below", p99[2], p99[1])
	}
}

// A read takes the replica in its own segment, else the one whose owner's link frees first.
func TestPickTakesLocalThenLeastBusy(t *testing.T) {
	out := []link{{free: 5}, {free: 1}, {free: 3}}
	a, b, c := &lruNode{b: block{seg: 0}}, &lruNode{b: block{seg: 1}}, &lruNode{b: block{seg: 2}}
	if got := pick([]*lruNode{a, b, c}, 2, out); got != c {
		t.Fatalf("picked segment %d, want the reader's own 2", got.b.seg)
	}
	if got := pick([]*lruNode{a, c, b}, 3, out); got != b {
		t.Fatalf("picked segment %d, want 1 (its link frees first)", got.b.seg)
	}
	cfg := base()
	cfg.Hosts, cfg.Replicas = 5, 3
	segs := placeReplicas(cfg, 4, newRand(1))
	if len(segs) != 3 || segs[0] != 4 || segs[1] == segs[2] || slices.Contains(segs[1:], 4) {
		t.Fatalf("replicas in %v: want 3 distinct segments, the saver's own first", segs)
	}
}
