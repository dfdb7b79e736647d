// Package connector is kvctl's KV connector: the scheduler adapter and the worker an engine
// drives, request by request, to restore prompt prefixes from the pool and to publish the KV it
// computed. It follows TensorRT-LLM's mooncake-store connector.
//
// # Vocabulary
//
// Block: T consecutive tokens; ordinal b covers tokens [b·T, (b+1)·T). Pages, offers, loads and
// saves are counted in whole blocks.
//
// Page: one block's KV in one layer group, at a page index (slot) of the engine's memory. A block
// is loaded or saved as a unit: a page in every layer group or none.
//
// Offer: the blocks a lookup found in the pool past the locally computed prefix, as (first
// block, number of blocks). It always leaves the block holding the last prompt token to compute.
// Cancel-load trims it at the head or the tail; the allocation report settles it to the part
// the engine honoured.
//
// Save mark (saved-up-to): the blocks below it are in the pool as far as the adapter knows:
// loaded, or saved by a pass whose saves the worker reported queued. Saves emitted by a pass are
// unconfirmed until that report arrives with the next build; a pass that never reached its
// save step therefore has its saves emitted again.
//
// Metadata: what the adapter hands every worker of the engine per pass: synchronous loads,
// saves and the transfers of requests parked for an asynchronous load. It carries block hashes,
// layer groups and page indices, never keys; each worker derives keys from its own namespace.
//
// # Lifecycle
//
// An engine, per request and pass, calls: Scheduler.Lookup (or AdmissionQuery), optionally
// CancelLoad, UpdateStateAfterAlloc, then per pass Scheduler.BuildMeta (with the previous pass's
// Worker.TakeSubmittedSaves), Worker.BindMeta, Worker.StartLoad and TakeFailedLoadRequests (a
// failed request is RequestReset and re-admitted), the forward pass, Worker.WaitForSave, and
// Worker.GetFinished followed by TakeFailedAsyncLoadRequests; finally RequestFinished and, when
// it reports saves, GetFinished until the request is reported.
//
// Rank is that sequence's callee, one interface for what an engine rank calls: LocalRank
// implements it over a Scheduler and a Worker in process, engineapi.RemoteRank over the engine
// API. Driver is the sequence written once over Ranks, pass by pass, with hooks for what
// differs between engines (page allocation, what computing and restoring a block means, what a
// request's end frees); the connector's engine tests, core/enginesim and core/replay (offline
// and live) all drive the connector through it.
//
// # Failed loads
//
// A page offered at lookup can be gone when it is loaded. On a single rank or an attention-DP
// owner the request is handed back for a restart and its saves leave the pass; under tensor
// parallelism the ranks hold shards of one page and cannot restart a request alone, so the load
// fails with an error wrapping ErrLoadFailed.
package connector
