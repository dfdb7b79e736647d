// Package embedded is kvctl's in-process KV page pool with the Mooncake master's semantics:
// Embedded implements pool.Pool, pool.Viewer and pool.Reserver (in place), and
// mooncake.Inspector, so the daemon serves the master's admin API for it. `kvctl serve` builds
// it through the backend registry (pool-backend embedded); Stats gives its figures, the
// backend-neutral ones as pool.Stats fields and its own in pool.Stats.Detail (DetailSoftPinned
// and the rest).
//
// Vocabulary, after the master (reference/mooncake.md §2):
//
//   - object: one stored page under one key. A put never overwrites: storing an existing key
//     is a successful no-op, as the Mooncake client treats the master's OBJECT_ALREADY_EXISTS.
//   - lease: the object's lease_timeout. An existence probe (when Options.ExistRenewsLease),
//     a get and the admin API's /query_key set it to max(lease, now + LeaseTTL); a finished put
//     sets it to now. A leased object is neither evicted nor removed without force.
//   - soft pin: a fixed deadline set when a put with SoftPinEnable finishes (reads never
//     extend it). Eviction pass 1 skips soft-pinned objects; pass 2 takes them only when the
//     unpinned ones cannot reach the lower bound and AllowEvictSoftPinned is set.
//   - hard pin: the object is never evicted and is left out of the eviction base. It does not
//     block Remove: as on the master, only a lease does.
//   - group: objects put with the same group id. A lease granted to one member refreshes all
//     (when the hit member has less than half a TTL left, or the group changed); eviction takes
//     a chosen member's whole group, and skips the group while any member is leased.
//   - eviction round: one tick of the master's eviction thread. It runs when allocated/capacity
//     is above HighWatermark, or after an allocation failed. It counts objects, not bytes:
//     target = max(ratio, used-hw+ratio) and lowerbound = max(target/2, used-hw) of the eviction
//     base (objects readable, not hard-pinned, not being read). Pass 1 tries its frontier, the
//     target's count of expired, unpinned objects with the oldest lease deadlines (a group
//     taken along counts each member). When the frontier falls short (a member whose group
//     holds a lease is skipped), pass 1 makes up the shortfall from the other candidates in
//     shard order, not by age, as mooncake_master 0.3.13 does: that leaves holes among younger
//     objects (EvictedObject.Refill marks them). Pass 2 runs below the lower bound.
//
// Proven against the real master: TestPoolDifferential runs random sequences of puts (soft
// pins, soft-pin TTLs, hard pins, groups), gets, probes, removes and lease expiries against
// mooncake_master 0.3.13 and this pool, and compares codes and keys after every step
// (docs/perf/pool-differential.md). Deliberate differences, each out of the test's reach on
// purpose: the shard order of a pass 1 refill is this pool's own (FNV-1a of the group id or
// key, mod 1024; the master's depends on std::hash, its hash tables and a selection
// algorithm), so there the test checks invariants only; and one call gives all its keys one
// clock reading, where the master reads the clock per key in an order of its shards, so the
// test uses single-key calls.
//   - segment: a region of memory the pool allocates pages from, first fit with no padding, so
//     used bytes are exactly the sum of the stored sizes; fragmentation shows in Stats.
//   - integrity: every page's XXH3-based checksum (keys.PageChecksum) is taken at put and
//     checked at get (and by BatchView, in place); a mismatch is ErrChecksumMismatch and the
//     bytes must not be used.
//   - in place: Embedded is also a Viewer (BatchView leases and checks values where they lie
//     and returns views of pool memory) and a Reserver (BatchPutStart hands out the memory a
//     value will live in; End takes its checksum there), so the connector can copy pages between
//     the GPU and pool memory registered with the driver without a staging copy.
package embedded
