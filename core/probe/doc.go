// Package probe answers questions about what a live pool holds for a prompt and about what a
// connector reported: it does the work of `kvctl probe-pool` (Admin, RPC: a prompt's
// lookup keys, derived by the key recipe of core/keys, asked of a pool and analysed into a
// Report) and of `kvctl stats` (Gather: pools and connector logs read into a StatsReport). The
// commands keep their flags and their rendering. A failed request to a pool is a *PoolError,
// which says whether it timed out by the error's type, never by its text.
//
// It is a client of kvctl serve: it reads /v1/stats through the wire types of core/statsapi and
// never imports the server (core/daemon). It may import core/keys, core/stats, core/statsapi and
// mooncake (the admin API client and the master's RPC client).
//
// # Vocabulary
//
// Target: a pool's HTTP admin address. Either a Mooncake master (its admin port, 9003 by
// default) or a `kvctl serve` admin address; both answer the master's read endpoints, and only
// kvctl serve answers /v1/stats, which is how the two are told apart.
//
// Complete block: a block every key of which (every peer shard of every layer group, plus the
// replicated keys) is present. Hit, hole, hole blocks and recomputed stored tokens mean what
// they mean in core/stats: the hit is the run of leading complete blocks; a hole is a run of
// incomplete blocks after the hit that has a complete block behind it; the recomputed stored
// tokens of a hole are the tokens of the complete blocks that follow it, up to the next
// incomplete block. Incomplete blocks that reach the end of the prompt are the missing tail, not
// a hole.
//
// Stats line: a "prefix-hole stats" or "load stats" line a connector logs once per stats
// interval, in kvctl's slog text or JSON form or in the form TensorRT-LLM's mooncake_store
// connector logs with mooncake_store.stats_interval set
// (https://github.com/NVIDIA/TensorRT-LLM/pull/21195).
package probe
