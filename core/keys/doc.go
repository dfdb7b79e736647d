// Package keys derives the block hashes and pool keys of a prompt, byte-identical to
// TensorRT-LLM's mooncake-store KV connector, vLLM's MooncakeStoreConnector and SGLang's
// HiCache mooncake backend.
//
// # Schemes
//
// Scheme: one engine's way from a prompt to block hashes and pool keys, as one value: its seed,
// serializer, digest and digest length, key layout, and the key inputs (Input) it takes. Every
// scheme is registered in one registry (RegisterScheme, from an init function in its own file:
// scheme_trtllm.go, scheme_vllm.go, scheme_vllm_v0.go, scheme_sglang.go); kvctl's --format
// flag, its help, completion and validation list the registry, and LookupScheme finds a scheme
// by the name a flag or an engine registration gives. Scheme.Derive gives a Result: the
// blocks with their Digest (16 or 32 bytes) and, when asked, their keys.
//
// Format: the name of a scheme with a 16-byte chain (Scheme.Chain, the TensorRT-LLM and kvctl
// schemes). Chain, Recipe and everything downstream of them (the connector, the radix tree,
// replay) run on formats; vLLM's and SGLang's schemes are derived through Scheme.Derive only.
//
// vLLM: h[i] = hash_fn((h[i−1] or NONE_HASH, tuple(tokens), extra keys)), NONE_HASH =
// hash_fn(PYTHONHASHSEED), hash_fn a digest (SHA-256, xxh3-128) of a serialization (pickle
// protocol 5, canonical CBOR, MessagePack) written here byte for byte as CPython, cbor2 and
// msgspec write it. Without the PYTHONHASHSEED the engine ran with, vLLM's keys cannot be
// derived (ErrNoPythonHashSeed). SGLang: SHA-256 page chains over u32 tokens, with the
// namespace seed of extra_key and cache_salt.
//
// # Vocabulary
//
// Token: an int64 token id, encoded as 8 bytes little-endian two's complement. Negative ids
// are legal.
//
// Block: T consecutive tokens of a prompt (T = tokens per block). Block b owns tokens
// [b·T, (b+1)·T). Only full blocks get a hash; a partial tail has none.
//
// Lookahead: L >= 0 extra tokens past a block that its hash also covers, because a one-model
// draft writes the KV of a position from prompt tokens after it. Block b's hash digests tokens
// [b·T, (b+1)·T + L) (its span; windows overlap when L > 0), so a block is hashed only once its
// lookahead tokens exist: n tokens give max(0, n−L) / T blocks. With L = 0 the spans are the
// blocks themselves.
//
// Scope: what besides the tokens decides whether two requests may share KV: the cache salt,
// the LoRA task id and one 32-byte digest per multimodal item (its eight int32 hash chunks,
// each big-endian). A request with multimodal content but no digests is bypassed: it gets no
// keys (see Bypassed).
//
// Seed: the digest of the scope, the parent of block 0.
//
// Chain: the block hashes of a prompt. h[0] = D(seed ‖ enc(span 0)), h[b] = D(h[b−1] ‖
// enc(span b)), where D is the format's 16-byte digest and ‖ is plain concatenation. A chain
// is append-only and is extended with the whole token list each time.
//
// # Formats
//
// B(x) below is unkeyed BLAKE2b with a 16-byte digest set in its parameter block (not a
// truncated BLAKE2b-512); framed(p…) writes each part as a u32 little-endian length followed by
// its bytes; salt is the UTF-8 cache salt, empty when absent; u64le(L) is L as 8 bytes
// little-endian.
//
//   - trtllm (the default), TensorRT-LLM's main line with its prompt-lookahead rule:
//     seed = B(framed(salt, lora, mm_1, …, mm_n)), where lora is empty without an adapter and
//     otherwise the 8-byte little-endian task id (so task 0 differs from none), and each mm_k
//     is a multimodal digest in prompt order. With no scope the preimage is 8 zero bytes. If
//     L > 0 the seed is re-digested: seed = B(seed ‖ "prompt-lookahead" ‖ u64le(L)). Blocks
//     use D = B over lookahead spans.
//   - trtllm-lookahead-v2, the "mooncake-kv-v2" branch: seed = B("mooncake-kv-v2" ‖ "salt" ‖
//     salt), re-digested as above when L > 0; D = B over lookahead spans. It has no LoRA or
//     multimodal scope.
//   - trtllm-v1, the oldest branch: seed = B("salt" ‖ salt); D = B; no lookahead and no LoRA
//     or multimodal scope.
//   - blake3, specific to kvctl and incompatible with TensorRT-LLM: the seed framing, lookahead
//     rule and chain of trtllm, with every digest taken by BLAKE3 in key-derivation mode (context
//     "kvctl 2026-11-30 block hash v1") and cut to 16 bytes. The context is a domain separation,
//     so these hashes are unrelated to any trtllm hash of the same bytes. Pages written under it
//     are invisible to TensorRT-LLM and the reverse.
//
// # Keys
//
// Namespace: the part of a key that is not the block: a namespace string (default "trtllm"),
// the model key (required), and the attention shard of the writing rank.
//
// Shard: "w{W}r{R}", the rank's attention shard (rank R of world W under tensor parallelism).
// Under attention DP every owner holds all heads and uses "w1r0", so owners share pages.
//
// Page key: the key of one page of one block in one layer group,
// "{namespace}/{model}/{shard}/lg{group}/t{T}b{bytes per page}/{hash hex}", integers in plain
// decimal, hash as 32 lowercase hex characters.
//
// Replicated key: the page key of a group's regions whose bytes are the same on every rank,
// with the shard "replicated" and the replicated bytes per page. Only attention rank 0 writes it.
//
// Group key: "{namespace}/{model}/w{W}/{hash hex}", the eviction group into which every page of
// a block is put, so that the pool keeps or evicts the block as a whole.
//
// Block keys: every key that must exist for a block to be a hit: the page key of every shard
// w{W}r{0…W−1} in every layer group, plus the replicated key of each group that has replicated
// regions. A block is a hit only if all of them exist, and a prefix hit ends at the first block
// that is not.
package keys
