// Package gpu moves KV pages between an engine's memory and host buffers: NVML discovery, CUDA
// driver calls through dlopen, pinned staging pools and streams, and the import of an engine's
// KV memory. It implements the interfaces of core/kvmem over that hardware: Mover, Staging and
// HostRegistrar, and, through CUDA, the DeviceOpener a daemon opens engines' device memory
// with and the DeviceAllocator simulated engines allocate theirs from. core/hostmem implements
// the same Mover over shared host memory for machines without a GPU, so the serving path runs
// everywhere with the same code. Movers that are HostRegistrars also copy straight to and from
// host memory registered with them (an in-process pool's segments), not only their own staging.
//
// gpu imports no kvctl package but core/kvmem, the vocabulary it implements.
package gpu
