// Package hostmem is the kvmem.Mover backend for engine KV memory in host shared memory, as an
// engine without a GPU (a simulated engine, a CPU test) hands it to kvctl: a memfd sealed
// against shrinking and growing, passed over the unix socket and mapped by both sides.
//
// Vocabulary:
//   - shared memory: the engine's memfd (SharedMemory), sealed with F_SEAL_SHRINK and
//     F_SEAL_GROW, since a file truncated under a mapping faults in whoever touches the lost
//     pages.
//   - host mover: a kvmem.Mover over such a file (NewMover), with plain mappings as staging; it
//     is also a kvmem.HostRegistrar, since any host buffer can be copied to and from it directly.
//   - memory fault: a copy that touched pages the file lost fails with ErrMemoryFault instead of
//     killing the process.
//
// hostmem imports core/kvmem and no other kvctl package. Accelerator memory is the gpu
// package's; the daemon opens shared memory here and device memory through a
// kvmem.DeviceOpener it is given.
package hostmem
