// Package gpu moves KV pages between an engine's memory and host buffers: NVML discovery, CUDA
// driver calls through dlopen, pinned staging pools and streams, and the import of an engine's
// KV memory. It implements the interfaces of core/kvmem (Mover, Staging, HostRegistrar) over
// that hardware; a host-memory backend implements the same Mover for machines without a GPU, so
// the serving path runs everywhere with the same code. Movers that are HostRegistrars also copy
// straight to and from host memory registered with them (an in-process pool's segments), not
// only their own staging.
//
// gpu imports no kvctl package but core/kvmem, the vocabulary it implements.
package gpu
