package adversarial

import (
	"encoding/json"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvctl/kvctl/mooncake/mooncaketest"
	"github.com/kvctl/kvctl/mooncake/transfer"
)

// teDrip announces a 256 MiB WRITE into the segment at base on the Transfer Engine server at
// addr, from 127.0.0.2 (another peer than the hosts on 127.0.0.1), and then sends 1 MiB every
// 5 s until the test ends: attack 5's slowloris.
func teDrip(t *testing.T, addr string, base uint64) {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Skipf("cannot dial from 127.0.0.2: %v", err)
	}
	stop, done := make(chan struct{}), make(chan struct{})
	t.Cleanup(func() { close(stop); _ = c.Close(); <-done })
	go func() {
		defer close(done)
		hdr := teWriteHeader(256<<20, base)
		if _, err := c.Write(append(hdr, make([]byte, 1<<20)...)); err != nil {
			return
		}
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Second):
			}
			if _, err := c.Write(make([]byte, 1<<20)); err != nil {
				return
			}
		}
	}()
}

// TestTransferEngineSlowloris: two connections announce 256 MiB WRITEs to a host's Transfer
// Engine port and drip 1 MiB at a time; meanwhile another host loads every page it needs from
// that host's segment. When a WRITE took staging for its whole announced size, the two
// announcements held all 512 MiB of it and the other host's reads waited and timed out (its
// engine recomputed instead); now staging follows the bytes that arrived and each peer has a
// share, so every page loads.
func TestTransferEngineSlowloris(t *testing.T) {
	m := mooncaketest.StartMaster(t, mooncaketest.MasterOptions{})
	// A's segment is large enough for a 256 MiB WRITE to be inside it.
	a := startServe(t, serveOpts{args: append(mooncakeArgs(m, m.AdminURL), "--pool-size", "300MiB")})
	waitReadyz(t, a, 200)
	reqs := poisonRequests(8, 4, "cold")
	if res, err := runSim(t, a.socket, "cold", reqs); err != nil || res.ComputedBlocks == 0 {
		t.Fatalf("cold run on A: %+v, %v", res, err)
	}
	var detail struct {
		Segments []struct {
			Name string `json:"segment_name"`
			Base string `json:"base_address"`
			Size int64  `json:"size_bytes"`
		} `json:"segments"`
	}
	if err := json.Unmarshal([]byte(getBody(t, m.AdminURL+"/get_segments_detail")), &detail); err != nil || len(detail.Segments) != 1 {
		t.Fatalf("segments: %+v %v", detail, err)
	}
	seg := detail.Segments[0]
	base, err := strconv.ParseUint(strings.TrimPrefix(seg.Base, "0x"), 16, 64)
	if err != nil || seg.Size < 256<<20 {
		t.Fatalf("segment %+v: %v", seg, err)
	}
	for range 2 {
		teDrip(t, seg.Name, base)
	}
	time.Sleep(500 * time.Millisecond)

	b := startServe(t, serveOpts{args: mooncakeArgs(m, m.AdminURL)})
	waitReadyz(t, b, 200)
	warm, err := runSim(t, b.socket, "warm", poisonRequests(8, 4, "warm"))
	if err != nil {
		t.Fatal(err)
	}
	blocks := 0
	for _, q := range reqs {
		blocks += (len(q.Tokens) - 1) / poisonT
	}
	if warm.LoadedBlocks != blocks || warm.Restarts != 0 {
		t.Fatalf("B during the slowloris on A: %+v; want all %d blocks loaded from A and no failed load", warm, blocks)
	}
	a.alive(t)
}

// teWriteHeader is a v2 WRITE header for size bytes at addr.
func teWriteHeader(size, addr uint64) []byte {
	return transfer.AppendHeader(nil, transfer.Header{Size: size, Addr: addr, Opcode: uint8(transfer.OpWrite), V2: true})
}
