// Package masterrpc is a client of mooncake_master's RPC service: coro_rpc framing over TCP and
// struct_pack message bodies, as Mooncake's own store client speaks them.
//
// Vocabulary, after Mooncake (see docs/mooncake.md for the wire facts and how they were
// verified):
//
//   - call: one request (a 20-byte coro_rpc header naming the handler by function id, then a
//     struct_pack body of the arguments) and one response (a 16-byte header echoing the
//     request's sequence number, then a struct_pack body of the result). A function id is the
//     first four bytes of the MD5 of "mooncake::WrappedMasterService::<Method>".
//   - body: a type hash, a metainfo byte, the type literal and the data. The hash and literal
//     name the message's C++ type; a master of another release answers with other ones, which
//     the decoders report as a *TypeError wrapped in ErrProtocol instead of guessing.
//   - code: a Mooncake ErrorCode. The master reports application errors in the body
//     (expected<T, ErrorCode>), per key for the batch calls; the methods return them as
//     integers or as *CodeError.
//   - segment owner: a client that mounted memory into the pool. It must Ping the master
//     (Mooncake's client does once a second); a Ping answered ClientNeedRemount means the
//     master lost its segments (it restarted) and ReMountSegment must follow.
//   - put lifecycle: BatchPutStart allocates replicas (processing), the writer copies the bytes
//     into them over the Transfer Engine, then BatchPutEnd makes the object readable or
//     BatchPutRevoke frees it. Until the end, readers see nothing.
//
// The Client spreads calls from many goroutines over a few connections (the master runs the
// calls of one connection one after another), multiplexes the calls that share one by sequence
// number, bounds every call by a timeout, reconnects with backoff after a connection breaks,
// and checks the master's store protocol version (ServiceReady) on every connection. Every
// length a response announces is bounded by the bytes that follow it and by MaxItems, and a
// response body by MaxResponseBody.
package masterrpc
