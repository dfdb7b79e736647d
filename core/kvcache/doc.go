// Package kvcache models a KV cache manager on top of the block radix tree: GPU page pools
// per layer group, an optional host tier, per-request allocation with local prefix reuse, and
// the connector-facing rules around it.
//
// Vocabulary:
//
//   - Prompt: a request's int64 tokens and its reuse scope. Blocks are keyed by the connector's
//     block hash chain (core/keys) over both, so a block's local identity is the hash its pool
//     keys are derived from, and requests of different scopes never share a local block.
//   - Pool: the GPU pages of one layer group. Every block a request holds takes one page in
//     every pool.
//   - Host tier: slots that keep blocks evicted from the GPU, by key, so a later match can
//     onboard them instead of recomputing.
//   - Local match: the reusable prefix of a prompt in this manager (GPU and host), after the
//     reuse backoff and alignment. The last prompt token is always left to compute.
//   - Declarations: what an attached KV connector's worker and scheduler declare. Only an
//     explicit true counts, and a capacity-only connector's declarations are ignored.
//   - Completion reservation: a logical bound, in blocks, on what an admitted request may
//     still need. A request is admitted only while every bound fits each pool's free and
//     evictable pages. No page is allocated early.
//   - Admission offer: a connector's answer at admission time, stored on the request with
//     the allocation epoch it was made for. A stale epoch means the allocation it described
//     is gone.
//
// A Manager is not safe for concurrent use; a scheduler drives it from one goroutine.
package kvcache
