// Package simkv holds the KV pages of a simulated engine: the deterministic content of a
// computed page (KVBytes), page slots handed out per layer group (Slots), and Memory, which
// poisons allocated pages, writes the KV of computed blocks and checks restored ones byte for
// byte on every rank. The connector's engine tests and core/enginesim share it, so a page
// restored from the pool is checked against the same bytes a cold run computed.
//
// Vocabulary:
//   - block b of a request: its tokens [b*T, (b+1)*T); its KV depends on the tokens up to the
//     block's end plus the draft's prompt lookahead.
//   - page value: the bytes of one block in one layer group on one rank, sharded (its own per
//     rank) or replicated (the same on every rank).
//   - poison: the byte 0xEE a freshly allocated page holds, so that a load that wrote nothing
//     is caught.
//
// It imports only the KV memory vocabulary (core/kvmem); nothing in it knows the connector.
package simkv
