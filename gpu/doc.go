// Package gpu moves KV pages between an engine's memory and host buffers: NVML discovery, CUDA
// driver calls through dlopen, pinned staging pools and streams, and the import of an engine's
// KV memory. It implements the interfaces of core/kvmem over that hardware: Mover, Staging and
// HostRegistrar, and, through CUDA, the DeviceOpener a daemon opens engines' device memory
// with and the DeviceAllocator simulated engines allocate theirs from. core/hostmem implements
// the same Mover over shared host memory for machines without a GPU, so the serving path runs
// everywhere with the same code. Movers that are HostRegistrars also copy straight to and from
// host memory registered with them (an in-process pool's segments), not only their own staging.
// CUDA movers check the pages a load lands on the GPU (kvmem.PageChecker), with kernels of
// kvctl's own (kernels/pagesum.cu: XXH3-64 of each piece of keys.PageChecksum, combined on the
// host): batches the copy kernel moves are checked from the registers it copies (kvCopyCheck),
// others where they landed, after the copy engines (kvUnitCheck).
//
// Every CUDA call runs on the calling goroutine's OS thread, locked to it for the call, with the
// context made current first; the calls of one device, mover or stream are serialized
// (cudaCaller).
//
// gpu imports no kvctl package but core/kvmem, the vocabulary it implements.
package gpu
