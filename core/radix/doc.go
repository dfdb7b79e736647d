// Package radix holds the block radix tree that KV cache reuse is matched against, and a pool
// index built on the same tree.
//
// Vocabulary:
//
//   - T, tokens per block: the page granularity. A full block holds T tokens; a partial block
//     (always the last block of a sequence) holds fewer.
//   - Block key: the chain hash of a block (keys.Hash). It commits to every token before it, so a
//     key identifies one position in one prefix and is unique across the whole tree.
//   - Scope: the reuse scope a block's key chain was seeded with (cache salt, LoRA adapter,
//     multimodal digests). Keys already keep scopes apart; content comparisons (partial reuse,
//     the sibling prefix rules) are made only between blocks of the same scope.
//   - Node: one block under its parent. The root is the empty prefix and holds no block.
//   - Match: the longest reusable prefix of a query. Full blocks are followed by key; with
//     partial reuse the block that diverges may still contribute the longest common token
//     prefix it shares with one of the last node's children.
//   - Raw depth: how far the content of the query agrees with the tree (before backoff,
//     alignment and pruning). It is kept for diagnostics.
//   - Backoff: tokens dropped from the tail of every match, for state that reads ahead
//     (a one-model draft). Alignment: after the backoff, the match is trimmed down to a
//     multiple of the alignment, which must divide T.
//   - Pruning: per-block coverage rules (SSM snapshots, attention coverage) that can only
//     shorten a match. Every cut is re-aligned, so one walk yields the final endpoint.
//   - Reference count: how many holders pin a node. Unreferenced leaves are evictable, least
//     recently used first.
//   - Hole (pool index): a block the pool no longer holds while blocks after it in the same
//     chain are still held; those are reported as behind the hole.
//
// A Tree is not safe for concurrent use. Match and Probe do not modify the tree, so several
// goroutines may call them at once as long as no goroutine modifies the tree meanwhile.
package radix
