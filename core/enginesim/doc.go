// Package enginesim is a simulated inference engine that drives `kvctl serve` through its real
// engine API: it registers one or more ranks with shared-memory KV, runs requests through the
// connector lifecycle (lookup, allocation report, metadata, load, compute, save, finish) in
// chunked-prefill passes, writes deterministic KV bytes for every block it computes, and checks
// every page the daemon loads byte for byte against what a cold run computes.
//
// Shared-memory KV is a memfd sealed with F_SEAL_SHRINK and F_SEAL_GROW
// (hostmem.NewSharedMemory), as `kvctl serve` requires: memory that could be truncated under
// the daemon's mapping is refused at Register. CUDA KV (Config.Memory MemoryCUDAFD) comes from
// the kvmem.DeviceAllocator in Config.Device.
//
// End-to-end tests use it against a daemon on a temporary socket, and `kvctl replay` uses it
// for live mode.
//
// Vocabulary:
//   - rank: one registered engine rank; rank 0 runs the scheduler adapter (tensor parallelism).
//   - pass: one forward step: every running request computes up to Chunk tokens.
//   - KV bytes: a page's content is a function of the tokens its block depends on, the rank (for
//     sharded bytes), the layer group and the region set, so a wrong or stale page is detected.
package enginesim
