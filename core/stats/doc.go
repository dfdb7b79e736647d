// Package stats counts what a connector's lookups and loads did and reports it: prefix-hole
// stats folded from lookups, load-phase stats recorded by loads, one log line of each kind at
// most once per interval, and Prometheus metrics.
//
// # Vocabulary
//
// Lookup: one prefix query of a request against the pool. Its candidate blocks are the blocks
// past the locally computed prefix, up to (not including) the block holding the last prompt
// token. One existence call answers for every key of every candidate.
//
// Looked-up blocks: the candidate blocks of a lookup. Hit blocks: the leading candidates that
// are complete (every key present); the hit ends at the first incomplete block.
//
// Hole: a maximal run of incomplete blocks after the hit that is followed by at least one
// complete block, i.e. a gap the pool opened in the middle of a chain it otherwise still holds.
// A run of incomplete blocks that reaches the last candidate is not a hole: the chain simply
// ends there. Hole blocks: the incomplete blocks inside holes.
//
// Recomputed stored tokens: the tokens of complete blocks behind the first incomplete block.
// They are in the pool but a prefix is only served up to its first gap, so they are computed
// again.
//
// Load phases: resolve (pool keys from the transfer list), fence (waiting until the engine's
// pages may be written), describe (pairing keys with staging slots), get (the pool reads), unstage
// (copying landed slots into engine memory) and sync (waiting for those copies; zero where the
// mover completes a copy before it returns). Each phase records wall seconds and the CPU seconds
// of the thread that ran it.
package stats
