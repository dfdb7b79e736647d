// Package transfer is kvctl's Mooncake Transfer Engine data plane over TCP: a client that reads
// from and writes to a peer's registered memory, a server that serves kvctl's own memory to any
// peer (another kvctl or a real Mooncake client), and a client for the HTTP metadata server
// through which peers find each other's segments.
//
// Vocabulary, after Mooncake's Transfer Engine (see docs/mooncake.md and
// reference/mooncake-wire.md §5–6):
//
//   - segment: the memory one process exposes under one name (Mooncake uses "host:port"). Its
//     descriptor, published under the metadata key "mooncake/ram/<name>", lists the buffers and
//     the TCP data port; "mooncake/rpc_meta/<name>" holds the host peers connect to.
//   - buffer / region: one registered range [base, base+length) of absolute addresses. Peers
//     name bytes by absolute address, never by offset, so a server maps every request to the
//     one region that contains it whole.
//   - target / initiator: the process that owns the memory and the process that moves bytes to
//     or from it. Every request is initiated by the side that does not own the memory.
//   - request: a 24-byte header (size u64 LE, addr u64 LE, opcode u8, 7 bytes the receiver
//     ignores) followed, for a WRITE, by size payload bytes. Opcode 0 is READ, 1 is WRITE.
//   - v2 framing: opcode bit 0x80 set, advertised by a descriptor's tcp_proto_version ≥ 2. The
//     target answers each request with an 8-byte status frame, u64 LE with the magic "MCTV"
//     (0x4D435456) in the high 32 bits and a code in the low 32 bits (0 OK, 1 address
//     rejected). A READ's status comes before its payload; a WRITE's after the payload has been
//     applied. v1 framing has no status frames: a refused request only sees the connection
//     close, and an initiator counts a WRITE complete once its bytes are sent, before the
//     target applied them (the server still applies a v1 WRITE only whole).
//   - connection: a TCP connection carries requests one after another; either side may close
//     it between requests. The server closes it after any refused or malformed request.
//
// # Guarantees
//
// The server bounds-checks every request before it touches memory: size 0, addr+size
// overflowing 64 bits, a range not inside one registered region, a size above
// ServerOptions.MaxRequestSize and an unknown opcode are refused with the status frame a real
// target uses (v2) or a close (v1), and the server keeps serving other connections.
//
// A WRITE is received whole into a staging buffer before any byte reaches registered memory,
// and is then copied in under the region's write lock; a READ copies its range out under the
// region's read lock before sending. So:
//
//   - a WRITE whose initiator vanishes, stalls past the deadlines or sends fewer bytes than it
//     announced changes nothing;
//   - a READ served by this package never returns part of one WRITE and part of another or of
//     the old contents: it sees the range before or after each WRITE that overlaps it;
//   - a v2 WRITE's OK status is sent only after the whole payload is in registered memory, so
//     an initiator that sees OK (and only then) may publish the page as complete, which is what
//     Mooncake's put protocol does with PutEnd.
//
// These guarantees cover access through the Server (remote requests and Server.ReadAt /
// Server.WriteAt). Code that reads or writes a registered slice directly bypasses the region
// lock and must order itself against remote WRITEs by other means (for a pool page: the
// master's put lifecycle, which never hands out a key before its PutEnd).
//
// Staging memory is bounded server-wide by ServerOptions.StagingBytes and per peer (remote IP
// address) by PeerStagingBytes; a request waits for staging room no longer than its read
// deadline. A WRITE takes staging one 1 MiB chunk at a time as its payload arrives, so a peer
// that announces a large WRITE and sends slowly holds only what it sent; a READ takes its
// whole range at once (it is copied out under the region's lock). Every request must finish
// within ReadTimeout (WriteTimeout for a READ) plus its size at MinRate, however it trickles.
// Connections are capped by ServerOptions.MaxConns; a connection idle between requests longer
// than IdleTimeout, or a request that makes no progress for ReadTimeout / WriteTimeout, is
// closed.
//
// # Concurrency and buffers
//
// Server and Client are safe for concurrent use. Server.Register hands the server a slice it
// reads and writes until Unregister returns; Unregister waits for copies in flight to or from
// the region (a READ already copied out still sends its staged bytes). Client.Read and
// Client.Write use the caller's slice only until they return.
package transfer
