// Package engineapi is kvctl's engine API: the gRPC service engines call over a local unix
// socket to use the connector (register a KV layout, look up prefix hits, load and save pages,
// finish requests), the descriptor side channel that hands engine memory to the daemon, the
// Go client that tests, replay and Go engines use, the conversions between its messages and the
// connector's types (convert.go, shared by the daemon's server and the clients) and RemoteRank,
// the connector.Rank that calls a registered engine rank over the client.
//
// Transport: gRPC over a unix socket created with mode 0600. File descriptors (shared-memory or
// CUDA virtual-memory handles) cannot travel in gRPC messages, so an engine first sends its
// descriptor over the side channel at FDSocketPath(socket) with SCM_RIGHTS, receives a token, and
// names the token in Register.
//
// Trust: the socket's directory must belong to the daemon's user with mode 0700 (or 0750 for an
// operator-named group); both sockets check the peer's SO_PEERCRED; a registration can be named
// only over the connection that made it. Shared memory must be a memfd sealed with F_SEAL_SHRINK
// so that it cannot be truncated under the daemon's mapping. See docs/SECURITY.md.
//
// Prompts travel packed: Request.tokens_packed holds 8 little-endian bytes a token (PackTokens,
// TokensView, RequestTokens; at most MaxRequestTokens); the repeated tokens field remains for
// older engines. Both ends of the socket use ServerOptions / Dial's settings: 1 MiB flow-control
// windows, a buffer pool that does not clear buffers, and a codec that decodes a LookupRequest
// with a single copy of its prompt.
//
// Or prompts stay out of the message: a scheduler rank registers a prompt arena (PromptArena, a
// sealed memfd handed over the side channel, Client.RegisterPromptArena) and names each prompt
// as a range of it (Request.tokens_arena, decoded by CopyArenaTokens on the daemon's side).
// RemoteRank does that by default and falls back to tokens_packed.
//
// Call channels: an engine may make its calls over one end of a unix SOCK_SEQPACKET socket pair
// handed over the side channel and named in OpenCallChannel, each request and response a message
// of frames (callframe.go: a 16-byte header and up to MaxCallFrameBytes in all), one write and
// one read a call. CallChannels is the Go client: a grpc.ClientConnInterface over a pool of
// channels of one connection that falls back to the connection when every channel is busy or a
// request is above the daemon's bound (Client.UseCallChannels switches a Client to it).
package engineapi
