// Package pooltest is the conformance suite for pool.Pool. Every backend runs it:
//
//	func TestConformance(t *testing.T) {
//		pooltest.Run(t, func(t *testing.T) pool.Pool { return newBackend(t) })
//	}
//
// The factory must return an empty pool with room for at least 64 MiB of pages, large enough
// that the suite never triggers eviction.
package pooltest
