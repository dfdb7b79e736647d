// Package cluster joins `kvctl serve` to a Mooncake cluster: it turns the mooncake backend's
// settings into a pool the daemon serves from.
//
// Vocabulary:
//   - master: the cluster's mooncake_master, reached over its RPC port; it places every page
//     and knows every segment.
//   - segment: the memory this host donates to the pool (serve's pool-size). It is served to
//     peers over the Transfer Engine (tcp) from the transfer port and published on the
//     metadata server under "host-address:transfer-port".
//   - mounted: the master lists the segment, so it can place pages in it. A restarted master
//     has forgotten every segment; the client mounts its own again.
//
// Pool wraps mooncake.Native with the daemon's supervision hooks (daemon.Mounter and
// daemon.Pinger): it is created, and the segment mounted, only when the master answers, so
// serve can start before the master and wait for it. Until then every data call fails fast
// with ErrRPCFail (lookups miss, saves are dropped), which is what a client with an
// unreachable master answers.
package cluster
