// Package pooltest is the conformance suite for pool.Pool, with benchmarks. Every backend
// runs it (the embedded pool, mooncake.Native against a real master, cluster.Pool):
//
//	func TestConformance(t *testing.T) {
//		(&pooltest.Suite{NewPool: func(t *testing.T) pool.Pool { return newBackend(t) }}).RunTests(t)
//	}
//
//	func BenchmarkSuite(b *testing.B) {
//		(&pooltest.Suite{NewBenchPool: func(b *testing.B) pool.Pool { return newBackend(b) }}).RunBenchmarks(b)
//	}
//
// A factory must return an empty pool with room for at least 64 MiB of pages, large enough
// that the suite never triggers eviction.
package pooltest
