// Package kvmem is the vocabulary of an engine's KV memory as kvctl moves it: the layout an
// engine registers (Layout, GroupLayout, Region), the name of one page value in it (PageRef),
// the interfaces a hardware backend implements to copy page values between engine memory and
// host buffers (Mover, Staging, HostRegistrar), and the staging plan that sizes those buffers
// (PlanStaging); how an engine hands its memory over (EngineHandle), and the interfaces through
// which the core reaches device memory without importing the hardware package (DeviceOpener,
// DeviceAllocator).
//
// Vocabulary:
//   - layer group: a KVCacheManagerV2 pool of equal page slots; its id is dense from 0.
//   - region: one contiguous piece of every slot of a group, at Offset + Stride·slot.
//   - page value: the bytes one pool key holds, a slot's regions concatenated in region order;
//     sharded regions differ per rank, replicated regions are the same on every rank.
//   - staging: host buffers, one page value wide, between the pool and engine memory.
//
// The package is a leaf: it imports the standard library only. The gpu package implements its
// interfaces for CUDA, core/hostmem for shared host memory; the core packages use them without
// knowing which hardware is behind, and commands hand gpu's implementations in. The suite every
// Mover backend runs is in kvmem/movertest.
package kvmem
