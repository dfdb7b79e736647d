// Package mooncake is what kvctl speaks of Mooncake: Native, a pool.Pool over a real Mooncake
// cluster (the master's RPC protocol, package masterrpc, for metadata and the Transfer
// Engine's TCP transport, package transfer, for bytes; docs/mooncake.md says what it speaks and
// which release it is proven against); the master's HTTP admin API (NewAdminHandler serves an
// Inspector with the master's endpoints and formats, checked against responses recorded from a
// real master in testdata/http; NewAdminClient talks to a real master or to that handler); the
// master's error codes (pool.Code has the master's values) and its metrics.
//
// The embedded pool with the master's semantics is package pool/embedded; its differential
// test against the real master (TestPoolDifferential) lives here, beside the master's client.
package mooncake
