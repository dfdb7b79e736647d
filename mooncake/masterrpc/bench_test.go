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
