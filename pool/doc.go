// Package pool is the backend-neutral KV page pool: the Pool interface the connector, probe and
// replay use, its per-key codes (Code, with the Mooncake master's values so a Mooncake backend
// passes its codes through), the per-put options (ReplicateConfig), the figures any backend
// reports (Stats, a backend's own in Stats.Detail under their /v1/stats names), the in-place
// capabilities of a pool in this process's memory (Viewer, Reserver), and the backend registry
// (Register, Lookup) `kvctl serve` builds its pool from.
//
// Backends: pool/embedded (in-process, the default), mooncake.Native and core/cluster's Pool
// (a Mooncake cluster). Every backend runs the conformance suite, pool/pooltest.Suite.
package pool
