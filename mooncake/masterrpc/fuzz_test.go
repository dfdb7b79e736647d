package masterrpc

import (
	"bytes"
	"testing"
)

// withType prefixes data with a valid type hash, a fuzzed metainfo byte and the literal, so
// the fuzzer explores the data past the type check.
func withType(lit literal, meta byte, data []byte) []byte {
	b := pack(lit, func(*encoder) {})
	b[4] = meta
	return append(b, data...)
}

func seedFrom(f *testing.F, method string) {
	for _, c := range loadCaptured(f) {
		if c.method == method && len(c.resp) > 0 {
			f.Add(c.resp[4], c.resp[len(typePrefix(c.resp)):])
		}
	}
}

// FuzzDecodeReplicas fuzzes the replica-carrying decoders (BatchGetReplicaList and
// BatchPutStart): no input may panic, and a body that decodes must not have promised more
// results than its bytes could hold.
func FuzzDecodeReplicas(f *testing.F) {
	seedFrom(f, "BatchGetReplicaList")
	seedFrom(f, "BatchPutStart")
	f.Fuzz(func(t *testing.T, meta byte, data []byte) {
		if lists, err := decodeBatchReplicaList(withType(respBatchReplicas, meta, data)); err == nil && len(lists) > len(data) {
			t.Fatalf("%d results from %d bytes", len(lists), len(data))
		}
		if res, err := decodeBatchPutStart(withType(respBatchPutStart, meta, data)); err == nil && len(res) > len(data) {
			t.Fatalf("%d results from %d bytes", len(res), len(data))
		}
	})
}

// FuzzDecodeBatchResults fuzzes BatchExistKey's and the batch void results' decoders; a
// decoded existence result is 0, 1 or a negative code.
func FuzzDecodeBatchResults(f *testing.F) {
	seedFrom(f, "BatchExistKey")
	seedFrom(f, "BatchPutEnd")
	f.Fuzz(func(t *testing.T, meta byte, data []byte) {
		if ex, err := decodeBatchExist(withType(respBatchExist, meta, data)); err == nil {
			for _, v := range ex {
				if v > 1 {
					t.Fatalf("existence result %d", v)
				}
			}
		}
		_, _ = decodeBatchVoid(withType(respBatchVoid, meta, data))
	})
}

// FuzzDecodeScalars fuzzes the single-result decoders: void, Ping, ServiceReady's string and
// the storage config, raw and behind a valid type prefix.
func FuzzDecodeScalars(f *testing.F) {
	for _, m := range []string{"ServiceReady", "GetStorageConfig", "Ping", "Remove", "MountSegment"} {
		seedFrom(f, m)
	}
	f.Fuzz(func(t *testing.T, meta byte, data []byte) {
		for _, body := range [][]byte{data, withType(respVoid, meta, data)} {
			if code, err := decodeVoid(body); err == nil && code > 0 {
				t.Fatalf("void result with positive code %d", code)
			}
		}
		_, _, _ = decodePing(withType(respPing, meta, data))
		_, _, _ = decodeString(withType(respString, meta, data))
		_, _, _ = decodeStorageConfig(withType(respStorageConfig, meta, data))
	})
}

// FuzzResponseStream fuzzes reading coro_rpc responses off a connection: headers with any
// lengths must be refused or read within MaxResponseBody, never over-allocated.
func FuzzResponseStream(f *testing.F) {
	f.Add([]byte{0x15, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0xaa, 0xbb})
	f.Add([]byte{0x15, 0, 0, 0, 1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte("HTTP/1.1 400 Bad Request\r\n\r\n"))
	f.Fuzz(func(t *testing.T, stream []byte) {
		r := bytes.NewReader(stream)
		for i := 0; i < 8; i++ {
			h, body, err := readResponse(r)
			if err != nil {
				return
			}
			if len(body) != int(h.Length) || int(h.Length) > MaxResponseBody {
				t.Fatalf("header says %d bytes, read %d", h.Length, len(body))
			}
		}
	})
}
