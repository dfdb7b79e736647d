// Package engineapi is kvctl's engine API: the gRPC service engines call over a local unix
// socket to use the connector (register a KV layout, look up prefix hits, load and save pages,
// finish requests), the descriptor side channel that hands engine memory to the daemon, and the
// Go client that tests, replay and Go engines use.
//
// Transport: gRPC over a unix socket created with mode 0600. File descriptors (shared-memory or
// CUDA virtual-memory handles) cannot travel in gRPC messages, so an engine first sends its
// descriptor over the side channel at FDSocketPath(socket) with SCM_RIGHTS, receives a token, and
// names the token in Register.
package engineapi
