// Package mooncake is kvctl's KV page pool: the Pool interface the connector uses, an embedded
// pool with the Mooncake master's semantics, and the Mooncake master's HTTP admin API.
package mooncake
