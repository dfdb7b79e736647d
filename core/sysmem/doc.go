// Package sysmem tells how much memory this process may still take: the host's available
// memory (MemAvailable of /proc/meminfo) bounded by the memory limit of the cgroup the process
// runs in, v2 (memory.max) or v1 (memory.limit_in_bytes), so that a daemon in a container sizes
// itself to the container and not to the node.
//
// Vocabulary:
//   - host available: what the kernel estimates can be allocated on the host without swapping.
//   - cgroup limit: the smallest memory limit set on the process's cgroup or any ancestor
//     visible in the mounted hierarchy; none when every level is unlimited.
//   - cgroup available: the limit minus the cgroup's usage, page cache that can be reclaimed at
//     once (inactive file pages) not counted as used.
//   - available: the smaller of host available and cgroup available.
//
// Read takes the file system to read as an fs.FS rooted at "/", so tests feed it fixtures of
// either cgroup version; System reads the real one. MemAvailable is the host figure alone, with
// free pages as its fallback, for a caller that has nothing better.
//
// sysmem imports no kvctl package.
package sysmem
