package masterrpc

import (
	"fmt"
	"testing"
)

func BenchmarkEncodeBatchExist3000(b *testing.B) {
	keys := make([]string, 3000)
	for i := range keys {
		keys[i] = fmt.Sprintf("exist/%d", i)
	}
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		_ = encodeKeysTenant(keys, DefaultTenant)
	}
}

func BenchmarkDecodeBatchExist3000(b *testing.B) {
	body := pack(respBatchExist, func(e *encoder) {
		e.length(3000)
		for i := 0; i < 3000; i++ {
			e.u8(1)
			e.u8(byte(i & 1))
		}
	})
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if _, err := decodeBatchExist(body); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecodeBatchReplicaList64 decodes the answer to a lookup's BatchGetReplicaList of 64
// present pages, each with one memory replica, as a master holding them on one peer sends it.
func BenchmarkDecodeBatchReplicaList64(b *testing.B) {
	body := pack(respBatchReplicas, func(e *encoder) {
		e.length(64)
		for i := range 64 {
			e.u8(1)
			e.length(1) // one replica
			e.u64(uint64(i))
			e.u8(ReplicaMemory)
			e.u64(64 << 10)
			e.u64(0x7f0000000000 + uint64(i)<<16)
			e.str("tcp")
			e.str("10.0.0.7:15002")
			e.i32(0)
			e.u64(5000) // lease
			e.u8(0)     // no checksum
		}
	})
	if lists, err := decodeBatchReplicaList(body); err != nil || len(lists) != 64 || lists[63].List.Replicas[0].Endpoint != "10.0.0.7:15002" {
		b.Fatalf("%v %v", lists, err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := decodeBatchReplicaList(body); err != nil {
			b.Fatal(err)
		}
	}
}
