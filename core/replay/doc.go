// Package replay replays request traces through kvctl's real connector, a KV cache manager per
// engine rank and a Mooncake pool, and reports what the cache did: hits by tier, tokens
// recomputed, prefix holes, bytes moved, modelled time per phase and rank balance.
//
// # Vocabulary
//
// Trace: requests in arrival order. Two formats are read: the Mooncake FAST'25 JSONL
// (FormatMooncake: timestamp, input_length, output_length and hash_ids, one id per trace block
// of TraceBlockTokens = 512 tokens) and kvctl's token trace (FormatTokens: request id,
// conversation id, arrival, tokens or a token file, output length, cache salt, LoRA id).
//
// Trace block and replay block: a Mooncake trace names blocks of 512 tokens. The replay keys
// and caches blocks of TokensPerBlock synthesised tokens instead (16 by default), one replay
// block per trace block, so that hashing stays cheap: token i of the block with hash id h is a
// fixed function of (seed, h, i), equal ids give equal tokens and a shared prefix of ids stays
// a shared prefix of tokens. A partial last trace block becomes a partial replay block with
// the same fraction of its tokens (at least one, never a whole block). Token figures in the
// report are in trace tokens: whole blocks count TraceBlockTokens, the partial tail its share
// of input_length. Token traces are replayed token for token.
//
// Offline mode: virtual time. The pool's ManualClock follows the arrival times; the pool's
// eviction thread is a tick every TickInterval of virtual time, run with EvictNow. Requests
// are routed in batches of equal arrival time to R attention-DP ranks, each an engine with
// its own KV cache manager (the local cache, GPUBlocks pages) and connector (Scheduler and
// Worker over a host-memory mover), all sharing one embedded pool whose capacity is PoolBytes
// of real pages of PageBytes each. A request is then looked up, allocated, loaded, computed
// and saved before the next one is looked up, so cache state follows arrival order exactly;
// the engines' queueing and prefill time are modelled alongside from a bandwidth model
// (LoadBandwidth, SaveBandwidth) and a prefill rate, and feed the router and the rank balance,
// not the cache.
//
// Scheduler model (Config.Scheduler, --set scheduler=true): instead of serving each request at
// once, every rank runs scheduling passes over its KV cache manager in virtual time, as the
// seed's KVCacheV2Scheduler does: a token budget and request slots per pass, chunked prefill,
// one token per generation request per pass, admission in arrival order against completion
// reservations, connector queries at admission with deferrals, asynchronous parks admitted
// without a charge, and preemption of the most recently admitted request that is not parked
// when a request finds no page. SchedulerCounts reports what it did; sched.go describes each
// rule. An asynchronous transfer queues behind its rank's load worker and reads the pool when it
// starts in virtual time, so a page evicted while it waited fails the load and restarts the
// request (RunReport.FailedLoads); asyncload.go describes how.
//
// Page payloads: offline, a page holds SimPageBytes bytes (64 by default) in engine memory and
// the pool; bytes moved and transfer times are scaled to PageBytes, the real page size.
//
// Hits: local tokens come from the rank's KV cache manager; pool tokens are the connector's
// honoured, successfully loaded offer. The connector always leaves the block holding the last
// prompt token to compute, and a local match of a whole cached prompt stops one token short.
//
// Engines: offline and live, a request served at once goes through connector.Driver, the
// connector's one per-request call sequence, with the engine's KV cache manager around it
// (engine.go): the manager keys a prompt by the same int64 tokens, block hash chain and reuse
// scope as the connector. Offline the Driver calls a connector.LocalRank, live an
// engineapi.RemoteRank.
//
// Live mode: the same trace driven through a running `kvctl serve` over its engine gRPC API,
// by simulated engines that register host memory and call the connector remotely. Their pages
// hold SimPageBytes bytes, and the bytes reported are the bytes the daemon really moved.
package replay
