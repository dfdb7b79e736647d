package serve

// The pool backends `kvctl serve` can build: each registers itself with the backend registry
// (pool.Register) when its package is linked in.
import (
	_ "github.com/kvctl/kvctl/core/cluster"  // pool-backend mooncake
	_ "github.com/kvctl/kvctl/pool/embedded" // pool-backend embedded
)
