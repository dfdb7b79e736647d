package connector

import (
	"context"
	"testing"
	"time"

	"github.com/kvctl/kvctl/pool"
)

// The benchmarks in this file run the worker against the embedded pool (embedded.Embedded),
// which copies and checksums (keys.CopyChecksum) every page on put and get. Each one alternates, within one
// benchmark loop, the connector's transfer and the pool's raw batch call on the same 256 pages
// of 64 KiB, so that both see the same machine load; they report the two throughputs and their
// ratio as custom metrics (MB = 10^6 bytes).

const benchEmbCapacity = 2 * benchPages * (64 << 10)

func benchEmbedded(b *testing.B) *embPool {
	return newEmbPool(b, benchEmbCapacity)
}

func fillEmbedded(b *testing.B, p pool.Pool, ks []string, size int) {
	bufs := make([][]byte, len(ks))
	for i := range bufs {
		bufs[i] = make([]byte, size)
		for j := range bufs[i] {
			bufs[i][j] = byte(i + j*7)
		}
	}
	for i, c := range p.BatchPut(context.Background(), ks, bufs, pool.ReplicateConfig{}) {
		if c != pool.OK {
			b.Fatalf("put %s = %v", ks[i], c)
		}
	}
}

func reportRatio(b *testing.B, name string, bytes int64, conn, raw time.Duration, rawName string) {
	mbps := func(d time.Duration) float64 { return float64(bytes) * float64(b.N) / d.Seconds() / 1e6 }
	b.ReportMetric(mbps(conn), name+"-MB/s")
	b.ReportMetric(mbps(raw), rawName+"-MB/s")
	b.ReportMetric(100*raw.Seconds()/conn.Seconds(), name+"/"+rawName+"-%")
}

// BenchmarkEmbeddedLoad is BenchmarkHostMemLoad's split case with the test double's mover,
// which registers nothing and hands the pool no engine memory: the load gets each batch into
// staging and scatters it into engine memory (the staged path). It reports load-MB/s, get-MB/s
// and load/get-%.
func BenchmarkEmbeddedLoad(b *testing.B) {
	l := benchLayout(benchPages)
	loadVsGet(b, l, newHostMover(l))
}

// BenchmarkEmbeddedSave is BenchmarkHostMemSave's split case with the test double's mover: the
// save gathers each batch into staging and puts it (the staged path). It reports save-MB/s,
// put-MB/s and save/put-%.
func BenchmarkEmbeddedSave(b *testing.B) {
	l := benchLayout(benchPages)
	m := newHostMover(l)
	for i := range m.mem {
		m.mem[i] = byte(i * 7)
	}
	saveVsPut(b, l, m)
}
