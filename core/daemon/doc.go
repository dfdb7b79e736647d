// Package daemon is `kvctl serve`: the connector daemon on a GPU host.
//
// One Daemon owns one pool (the embedded pool by default) and serves many engine ranks. Each
// rank registers over the engine socket (gRPC on a unix socket, package engineapi) with its
// model key, shard, KV layout and KV memory; the daemon builds a connector Scheduler (on the
// rank that runs the scheduler adapter) and a Worker for it, over a page Mover opened on the
// rank's memory, and maps every engine API call onto them one to one.
//
// Vocabulary:
//   - engine: one registered engine rank, named by the engine string it registered with. A
//     registration lives as long as the engine connection that made it: an engine whose
//     connection closes without Unregister (a crashed process) is drained and released.
//   - drain: on shutdown the daemon stops taking calls, then closes every worker against one
//     deadline, so that queued saves reach the pool, unmounts this host's segment and closes
//     the pool last.
//   - call channel: a unix SOCK_SEQPACKET socket an engine hands over (OpenCallChannel) to make
//     its calls without HTTP/2. Its calls run through the same handlers and interceptor as the
//     gRPC calls of the connection that opened it, and it closes with that connection.
//   - backend: the pool the daemon serves from, behind the pool.Pool interface: the
//     embedded pool, or a Mooncake cluster client whose segment (the memory this host donates)
//     must be mounted with the master before the daemon is ready. The daemon supervises it:
//     it retries the mount while the master is away, is unready while pings fail, remounts
//     after an outage, and bounds every pool call an engine waits for by the pool timeout.
//
// Alongside, an admin HTTP server answers the Mooncake master's read endpoints for the pool
// (so Mooncake tooling and `kvctl probe-pool` work against it), /metrics in Prometheus text
// (the pool's master-named series and kvctl's own kvctl_* series), /v1/stats as JSON, and
// /healthz and /readyz.
package daemon
