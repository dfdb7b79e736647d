package masterrpc

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"testing"
)

type capturedCall struct {
	method    string
	req, resp []byte
}

// loadCaptured reads the calls captured between Mooncake's own client and master (the
// release in MooncakeRelease).
func loadCaptured(t testing.TB) []capturedCall {
	t.Helper()
	f, err := os.Open("testdata/wheel-" + MooncakeRelease + ".txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []capturedCall
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) != 3 {
			t.Fatalf("bad line %q", line)
		}
		dec := func(s string) []byte {
			if s == "-" {
				return nil
			}
			b, err := hex.DecodeString(s)
			if err != nil {
				t.Fatal(err)
			}
			return b
		}
		out = append(out, capturedCall{fields[0], dec(fields[1]), dec(fields[2])})
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// typePrefix returns a body's hash, metainfo and literal.
func typePrefix(b []byte) []byte {
	if i := bytes.IndexByte(b[5:], 0); i >= 0 {
		return b[:5+i+1]
	}
	return b
}

// TestLiteralsMatchTheWheel checks, for every call kvctl makes, that the type hash and literal
// kvctl writes and expects are byte for byte the ones Mooncake's own client and master
// exchanged.
func TestLiteralsMatchTheWheel(t *testing.T) {
	lits := map[string][2]literal{
		"MountSegment":        {litMount, respVoid},
		"ReMountSegment":      {litRemount, respVoid},
		"Ping":                {litPing, respPing},
		"BatchExistKey":       {litKeysTenant, respBatchExist},
		"BatchGetReplicaList": {litKeysTenant, respBatchReplicas},
		"BatchPutStart":       {litBatchPutStart, respBatchPutStart},
		"BatchPutEnd":         {litBatchPutEnd, respBatchVoid},
		"Remove":              {litRemove, respVoid},
		"GetReplicaList":      {litKeyTenant, nil},
		"ServiceReady":        {nil, respString},
		"GetStorageConfig":    {nil, respStorageConfig},
	}
	seen := map[string]bool{}
	for _, c := range loadCaptured(t) {
		l, ok := lits[c.method]
		if !ok {
			continue
		}
		seen[c.method] = true
		for i, body := range [][]byte{c.req, c.resp} {
			if l[i] == nil {
				continue
			}
			want := pack(l[i], func(*encoder) {})
			got := typePrefix(body)
			want[4] = got[4] // the length width differs with the data
			if !bytes.Equal(got, want) {
				t.Errorf("%s %s: wheel wrote %x, kvctl %x", c.method, []string{"request", "response"}[i], got, want)
			}
		}
	}
	for m := range lits {
		if !seen[m] {
			t.Errorf("no captured %s", m)
		}
	}
}

func captured(t *testing.T, method string, pred func(c capturedCall) bool) capturedCall {
	t.Helper()
	for _, c := range loadCaptured(t) {
		if c.method == method && (pred == nil || pred(c)) {
			return c
		}
	}
	t.Fatalf("no captured %s", method)
	return capturedCall{}
}

func uuidAt(b []byte, off int) UUID {
	d := &decoder{b: b, off: off}
	return d.uuid()
}

// TestRequestsMatchTheWheel encodes the requests Mooncake's client sent, from the same
// values, and requires the same bytes.
func TestRequestsMatchTheWheel(t *testing.T) {
	var keys300 []string
	for i := 0; i < 300; i++ {
		keys300 = append(keys300, fmt.Sprintf("k%03d", i))
	}
	big := captured(t, "BatchExistKey", func(c capturedCall) bool { return len(c.req) > 1000 })
	if got := encodeKeysTenant(keys300, DefaultTenant); !bytes.Equal(got, big.req) {
		t.Errorf("BatchExistKey of 300 keys (2-byte lengths):\nkvctl %x\nwheel %x", got, big.req)
	}

	start := captured(t, "BatchPutStart", func(c capturedCall) bool { return bytes.Contains(c.resp, []byte("tcp")) })
	client := uuidAt(start.req, len(typePrefix(start.req)))
	cfg := ReplicateConfig{ReplicaNum: 1, SoftPinAction: SoftPinEnable, HasSoftPinTTL: true, SoftPinTTLms: 60000,
		HasGroupIDs: true, GroupIDs: []string{"g1", "g1"}}
	if got := encodeBatchPutStart(client, []string{"b1", "b2"}, []uint64{1000, 300}, cfg, DefaultTenant); !bytes.Equal(got, start.req) {
		t.Errorf("BatchPutStart:\nkvctl %x\nwheel %x", got, start.req)
	}
	end := captured(t, "BatchPutEnd", nil)
	if got := encodeBatchPutEnd(client, []string{"b1", "b2"}, DefaultTenant); !bytes.Equal(got, end.req) {
		t.Errorf("BatchPutEnd:\nkvctl %x\nwheel %x", got, end.req)
	}
	forced := captured(t, "Remove", func(c capturedCall) bool { return bytes.Contains(c.req, []byte{'k', '1', 1}) })
	if got := encodeRemove("k1", true, DefaultTenant); !bytes.Equal(got, forced.req) {
		t.Errorf("Remove:\nkvctl %x\nwheel %x", got, forced.req)
	}
	ping := captured(t, "Ping", nil)
	if got := encodePing(uuidAt(ping.req, len(typePrefix(ping.req)))); !bytes.Equal(got, ping.req) {
		t.Errorf("Ping:\nkvctl %x\nwheel %x", got, ping.req)
	}
	mount := captured(t, "MountSegment", nil)
	d, err := open(mount.req, litMount)
	if err != nil {
		t.Fatal(err)
	}
	seg := Segment{ID: d.uuid(), Name: d.str(), Base: d.u64(), Size: d.u64(), TEEndpoint: d.str(), Protocol: d.str(), HostID: d.str()}
	owner := d.uuid()
	if err := d.done(); err != nil {
		t.Fatal(err)
	}
	if seg.Protocol != "tcp" || seg.Size != 64<<20 || seg.TEEndpoint != seg.Name {
		t.Errorf("the wheel's segment = %+v: the assumptions kvctl mounts with no longer hold", seg)
	}
	if got := encodeMount(seg, owner); !bytes.Equal(got, mount.req) {
		t.Errorf("MountSegment:\nkvctl %x\nwheel %x", got, mount.req)
	}
	remount := captured(t, "ReMountSegment", func(c capturedCall) bool { return bytes.Contains(c.req, mount.req[len(typePrefix(mount.req)):][:16]) })
	if got := encodeRemount([]Segment{seg}, owner); !bytes.Equal(got, remount.req) {
		t.Errorf("ReMountSegment:\nkvctl %x\nwheel %x", got, remount.req)
	}
}

// TestResponsesFromTheWheel decodes the master's captured answers.
func TestResponsesFromTheWheel(t *testing.T) {
	v, code, err := decodeString(captured(t, "ServiceReady", nil).resp)
	if err != nil || code != 0 || v != ProtocolVersion {
		t.Fatalf("ServiceReady = %q %d %v", v, code, err)
	}
	if _, code, err := decodeStorageConfig(captured(t, "GetStorageConfig", nil).resp); err != nil || code != 0 {
		t.Fatalf("GetStorageConfig: %d %v", code, err)
	}
	p, code, err := decodePing(captured(t, "Ping", nil).resp)
	if err != nil || code != 0 || p.ClientStatus < ClientOK {
		t.Fatalf("Ping = %+v %d %v", p, code, err)
	}
	big := captured(t, "BatchExistKey", func(c capturedCall) bool { return len(c.req) > 1000 })
	ex, err := decodeBatchExist(big.resp)
	if err != nil || len(ex) != 300 {
		t.Fatalf("BatchExistKey of 300 = %d results, %v", len(ex), err)
	}
	small := captured(t, "BatchExistKey", func(c capturedCall) bool { return len(c.req) < 1000 })
	if ex, err := decodeBatchExist(small.resp); err != nil || fmt.Sprint(ex) != "[1 0 0]" {
		t.Fatalf("BatchExistKey = %v %v, want [1 0 0]", ex, err)
	}
	start := captured(t, "BatchPutStart", func(c capturedCall) bool { return bytes.Contains(c.resp, []byte("tcp")) })
	st, err := decodeBatchPutStart(start.resp)
	if err != nil || len(st) != 2 || st[0].Code != 0 || st[0].Replicas[0].Size != 1000 || st[1].Replicas[0].Size != 300 ||
		st[0].Replicas[0].Status != ReplicaProcessing || st[0].Replicas[0].Protocol != "tcp" {
		t.Fatalf("BatchPutStart = %+v %v", st, err)
	}
	refused := captured(t, "BatchPutStart", func(c capturedCall) bool { return !bytes.Contains(c.resp, []byte("tcp")) })
	if st, err := decodeBatchPutStart(refused.resp); err != nil || len(st) != 2 || st[0].Code != -600 {
		t.Fatalf("refused BatchPutStart = %+v %v, want -600 (group ids not one per key)", st, err)
	}
	if res, err := decodeBatchVoid(captured(t, "BatchPutEnd", nil).resp); err != nil || fmt.Sprint(res) != "[0 0]" {
		t.Fatalf("BatchPutEnd = %v %v", res, err)
	}
	got := captured(t, "BatchGetReplicaList", func(c capturedCall) bool {
		return bytes.Contains(c.req, []byte("b2")) && !bytes.Contains(c.req, []byte("nope"))
	})
	lists, err := decodeBatchReplicaList(got.resp)
	if err != nil || len(lists) != 2 || lists[1].List.Replicas[0].Size != 300 || lists[1].List.Replicas[0].Status != ReplicaComplete ||
		lists[0].List.LeaseTTLms != 10000 || lists[0].List.Replicas[0].Addr != st[0].Replicas[0].Addr {
		t.Fatalf("BatchGetReplicaList = %+v %v", lists, err)
	}
	misses := captured(t, "BatchGetReplicaList", func(c capturedCall) bool { return bytes.Contains(c.req, []byte("nope")) })
	if lists, err := decodeBatchReplicaList(misses.resp); err != nil || len(lists) != 3 || lists[2].Code != -704 {
		t.Fatalf("BatchGetReplicaList with misses = %+v %v", lists, err)
	}
	missing := captured(t, "Remove", func(c capturedCall) bool { return bytes.Contains(c.req, []byte{'k', '1', 0}) })
	if code, err := decodeVoid(missing.resp); err != nil || code != -704 {
		t.Fatalf("Remove of a missing key = %d %v", code, err)
	}
}

// TestDecodersRejectBadBodies: truncations, trailing bytes, wrong types and lengths that
// promise more than the body holds are errors, never panics or huge allocations.
func TestDecodersRejectBadBodies(t *testing.T) {
	good := captured(t, "BatchGetReplicaList", func(c capturedCall) bool { return bytes.Contains(c.req, []byte("b2")) }).resp
	for n := 0; n < len(good); n++ {
		if _, err := decodeBatchReplicaList(good[:n]); err == nil {
			t.Fatalf("a body cut to %d of %d bytes decoded", n, len(good))
		}
	}
	if _, err := decodeBatchReplicaList(append(bytes.Clone(good), 0)); err == nil {
		t.Fatal("a body with a trailing byte decoded")
	}
	if _, err := decodeBatchExist(good); err == nil {
		t.Fatal("a replica list decoded as an existence list")
	}
	huge := pack(respBatchExist, func(e *encoder) {})
	huge[4] = 0x04 | 3<<3 // 8-byte lengths
	huge = append(huge, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f)
	if _, err := decodeBatchExist(huge); err == nil {
		t.Fatal("a length of 2^63 decoded")
	}
}

// TestReplicaListsKeepTheirOwnStrings: the decoder shares a protocol or endpoint string with the
// replica before it only when the bytes are the same; replicas that alternate between peers and
// protocols each keep their own.
func TestReplicaListsKeepTheirOwnStrings(t *testing.T) {
	type rep struct{ proto, endpoint string }
	want := [][]rep{
		{{"tcp", "10.0.0.7:15002"}},
		{{"tcp", "10.0.0.8:15002"}, {"rdma", "10.0.0.7:15002"}},
		{{"tcp", "10.0.0.7:15002"}},
		{{"rdma", ""}},
		{{"", "10.0.0.7:15002"}},
	}
	body := pack(respBatchReplicas, func(e *encoder) {
		e.length(len(want))
		for i, reps := range want {
			e.u8(1)
			e.length(len(reps))
			for j, r := range reps {
				e.u64(uint64(10*i + j))
				e.u8(ReplicaMemory)
				e.u64(4096)
				e.u64(uint64(0x1000 * (i + 1)))
				e.str(r.proto)
				e.str(r.endpoint)
				e.i32(0)
			}
			e.u64(5000)
			e.u8(0)
		}
	})
	lists, err := decodeBatchReplicaList(body)
	if err != nil || len(lists) != len(want) {
		t.Fatalf("%d lists, %v", len(lists), err)
	}
	for i, reps := range want {
		got := lists[i].List.Replicas
		if len(got) != len(reps) {
			t.Fatalf("list %d: %d replicas, want %d", i, len(got), len(reps))
		}
		for j, r := range reps {
			if got[j].Protocol != r.proto || got[j].Endpoint != r.endpoint || got[j].ID != uint64(10*i+j) {
				t.Errorf("list %d replica %d: %q %q id %d, want %q %q", i, j, got[j].Protocol, got[j].Endpoint, got[j].ID, r.proto, r.endpoint)
			}
		}
	}
}
