"""Plays an inference engine against `kvctl serve`, with its KV pool in a PyTorch CUDA tensor.

The pool is handed to the daemon through a legacy CUDA IPC handle (cuda_ipc in Register). The
script runs a cold pass of N requests, writing deterministic KV bytes on the GPU for every block
it computes, then registers a second engine (a new name, a fresh tensor) that runs the same
prompts warm and checks every page the daemon loaded, byte for byte, on the GPU.

It prints one line `SUMMARY {json}` and exits 0 only when the warm pass loaded something and
every loaded page held the bytes the cold pass computed.

No generated Python stubs are needed: the messages are built at run time from engine.pb, a
FileDescriptorSet made with

    protoc --include_imports --descriptor_set_out=core/daemon/testdata/engine.pb \
        -I core/engineapi core/engineapi/engine.proto

`--memory shm` keeps the pool in a shared-memory file instead (no PyTorch, no GPU): it runs the
same request lifecycle and is there to check the script on a machine without a GPU.

`--calls channel` (the default) makes the engine calls over a call channel (OpenCallChannel in
engine.proto): a unix SOCK_SEQPACKET socket pair whose one end goes to the daemon over the
descriptor side channel, each call one message of frames written and one read, instead of an
HTTP/2 stream; `--calls grpc` makes them as plain gRPC calls. A request larger than the
channel takes (OpenCallChannel's max_message_bytes) goes over gRPC either way. Errors surface
the same way on both: a grpc.RpcError with the daemon's status code and message. Every run
times a plain call on the idle daemon over both transports, checks that a failing call reads
the same over both, and ends by checking that the daemon closes the channel once the gRPC
connection that opened it has ended.

`--bench-calls N` only registers an engine, then reads lines from stdin: for each line holding a
count n it makes n plain calls over each transport (interleaved in chunks) and prints one line
`BENCH {json}` with the mean seconds per call of each; it stops at the end of its input.
"""
import argparse
import array
import fcntl
import hashlib
import json
import mmap
import os
import random
import re
import socket
import struct
import sys
import tempfile
import time
import urllib.request

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

PKG = "kvctl.engine.v1"
SERVICE = PKG + ".Engine"


def send_fd(socket_path, fd):
    """Sends fd over the daemon's descriptor side channel (the engine socket's path + ".fd") and
    returns the token that names it in a request."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(os.path.abspath(socket_path) + ".fd")
        socket.send_fds(s, [b"\0"], [fd])
        token = s.recv(256).decode()
    finally:
        s.close()
    if len(token) != 32:
        raise RuntimeError("descriptor channel: " + token)
    return token


# grpc.StatusCode by its number (each member's value is (number, name)).
STATUS_CODES = {c.value[0]: c for c in grpc.StatusCode}


class CallError(grpc.RpcError, grpc.Call):
    """An error response over a call channel, or the channel's own failure, shaped as the
    grpc.RpcError a plain gRPC call raises: code() a grpc.StatusCode, details() the message."""

    def __init__(self, code, details):
        super().__init__(details)
        self._code, self._details = code, details

    def code(self):
        return self._code

    def details(self):
        return self._details

    def __str__(self):
        return "<CallError of RPC that terminated with:\n\tstatus = %s\n\tdetails = \"%s\"\n>" % (self._code, self._details)

    # grpc.Call's other methods, for code that treats the error as a finished call.
    def initial_metadata(self):
        return ()

    def trailing_metadata(self):
        return ()

    def is_active(self):
        return False

    def time_remaining(self):
        return None

    def cancel(self):
        return False

    def add_callback(self, callback):
        return False


class CallChannel:
    """The engine's end of a call channel (OpenCallChannel in engine.proto).

    Frame header, little-endian: magic "KVC1", method (uint16, CallChannelMethod), flags (bit 0:
    more frames of this message follow), status (0 in requests, the gRPC code in responses),
    call id (uint64, echoed in every frame of the response); then a fragment of the message."""

    MAGIC = 0x3143564B
    HEADER = struct.Struct("<IHBBQ")
    MORE = 1
    # The largest response taken, as the gRPC channel's max_receive_message_length.
    MAX_RESPONSE_BYTES = 64 << 20

    def __init__(self, sock, max_frame_bytes, max_message_bytes):
        if max_frame_bytes <= self.HEADER.size or max_frame_bytes > 1 << 20:
            raise RuntimeError("call channel: the daemon's max_frame_bytes %d is out of range" % max_frame_bytes)
        self.sock = sock
        self.max_frame = max_frame_bytes
        self.max_message = max_message_bytes
        self.max_response = self.MAX_RESPONSE_BYTES
        self.next_id = 1
        self.closed = None  # why the channel can no longer be used
        self.timeout = None
        # What went over the channel: calls, frames each way, messages of more than one frame,
        # the largest request and response.
        self.stats = dict(calls=0, frames_sent=0, frames_received=0, multi_frame_requests=0,
                          multi_frame_responses=0, largest_request_bytes=0, largest_response_bytes=0)
        # One byte more than a frame may hold: a datagram that fills it was truncated.
        self.rbuf = bytearray(max_frame_bytes + 1)
        self.rview = memoryview(self.rbuf)
        # Seconds a call polls for its response before it sleeps in recv (--spin-us).
        self.spin = 0.0

    def _set_timeout(self, timeout):
        # SO_RCVTIMEO rather than socket.settimeout: Python's own timeout costs a poll before
        # every send and recv, two more system calls a call.
        if timeout == self.timeout:
            return
        t = 0 if timeout is None else max(timeout, 1e-3)
        sec = int(t)
        tv = struct.pack("@ll", sec, int((t - sec) * 1e6))
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
        # A daemon that stops reading fails the send instead of hanging it (the channel is then
        # out of step and closed).
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)
        self.timeout = timeout

    def _fail(self, why):
        self.closed = why
        raise CallError(grpc.StatusCode.UNAVAILABLE, "call channel: " + why)

    def call(self, method, request, timeout=None):
        """Sends request (bytes) as a call of method (its CallChannelMethod number) and returns
        the response's bytes; raises CallError for an error response."""
        if self.closed:
            raise CallError(grpc.StatusCode.UNAVAILABLE, "call channel: " + self.closed)
        self._set_timeout(timeout)
        cid = self.next_id
        self.next_id += 1
        frag = self.max_frame - self.HEADER.size
        pack, send = self.HEADER.pack, self.sock.send
        n = len(request)
        st = self.stats
        st["calls"] += 1
        st["largest_request_bytes"] = max(st["largest_request_bytes"], n)
        try:
            if n <= frag:
                send(pack(self.MAGIC, method, 0, 0, cid) + request)
                st["frames_sent"] += 1
            else:
                view = memoryview(request)
                for off in range(0, n, frag):
                    more = self.MORE if off + frag < n else 0
                    send(pack(self.MAGIC, method, more, 0, cid) + view[off : off + frag])
                    st["frames_sent"] += 1
                st["multi_frame_requests"] += 1
        except (BrokenPipeError, ConnectionResetError) as e:
            self._fail("closed by the daemon (sending call %d: %s)" % (cid, e))
        except OSError as e:
            self._fail("sending call %d: %s" % (cid, e))
        return self._response(method, cid)

    def _recv(self):
        """Receives one datagram into rbuf. With spin set it polls for that long first: a thread
        that sleeps in recv is woken by the kernel when the response comes, and on a CPU that
        went idle meanwhile that wake-up can cost more than a short call itself."""
        if self.spin > 0:
            recv, end = self.sock.recv_into, time.perf_counter() + self.spin
            while True:
                try:
                    return recv(self.rbuf, 0, socket.MSG_DONTWAIT)
                except BlockingIOError:
                    if time.perf_counter() >= end:
                        break
        return self.sock.recv_into(self.rbuf)

    def _frame(self, cid):
        try:
            n = self._recv()
        except BlockingIOError:
            # The call's deadline passed. Its response, should it come later, is skipped by
            # call id.
            raise CallError(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
        except OSError as e:
            self._fail("waiting for the response to call %d: %s" % (cid, e))
        if n == 0:
            self._fail("closed by the daemon")
        if n > self.max_frame:
            self._fail("a frame of more than %d bytes, the channel's max_frame_bytes" % self.max_frame)
        self.stats["frames_received"] += 1
        if n < self.HEADER.size:
            self._fail("a frame of %d bytes, shorter than the %d-byte header" % (n, self.HEADER.size))
        magic, m, flags, status, rid = self.HEADER.unpack_from(self.rbuf)
        if magic != self.MAGIC:
            self._fail("a frame with magic %#010x, want %#010x (KVC1)" % (magic, self.MAGIC))
        if flags & ~self.MORE:
            self._fail("a frame with unknown flags %#04x" % flags)
        return m, flags, status, rid, n

    def _response(self, method, cid):
        parts, size, over, frames = [], 0, False, 0
        first = None
        while True:
            m, flags, status, rid, n = self._frame(cid)
            if rid < cid and rid != 0 and first is None:
                continue  # a late frame of a call that timed out
            if rid == 0 and status != 0 and first is None and not flags & self.MORE:
                # An error the daemon could not tie to a call: one of our frames was malformed.
                raise CallError(STATUS_CODES.get(status, grpc.StatusCode.UNKNOWN),
                                bytes(self.rview[self.HEADER.size : n]).decode("utf-8", "replace"))
            if rid != cid or m != method:
                self._fail("a frame of call %d (method %d) came in answer to call %d (method %d)" % (rid, m, cid, method))
            if first is None:
                first = status
            elif status != first:
                self._fail("call %d's response changed status from %d to %d between frames" % (cid, first, status))
            size += n - self.HEADER.size
            frames += 1
            if size > self.max_response:
                over, parts = True, []  # skipped to its last frame, so the ends stay in step
            elif not over:
                parts.append(bytes(self.rview[self.HEADER.size : n]))
            if not flags & self.MORE:
                break
        if over:
            raise CallError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                            "call channel: a response of %d bytes, above the limit of %d" % (size, self.max_response))
        body = parts[0] if len(parts) == 1 else b"".join(parts)
        st = self.stats
        st["largest_response_bytes"] = max(st["largest_response_bytes"], size)
        if frames > 1:
            st["multi_frame_responses"] += 1
        if first != 0:
            raise CallError(STATUS_CODES.get(first, grpc.StatusCode.UNKNOWN), body.decode("utf-8", "replace"))
        return body

    def close(self):
        self.closed = self.closed or "closed"
        self.sock.close()


def channel_method_numbers(pool, service):
    """Each method's CallChannelMethod number, by name: Register -> CALL_CHANNEL_METHOD_REGISTER."""
    enum = pool.FindEnumTypeByName(PKG + ".CallChannelMethod")
    out = {}
    for m in service.methods:
        v = enum.values_by_name.get("CALL_CHANNEL_METHOD_" + re.sub(r"(?<!^)(?=[A-Z])", "_", m.name).upper())
        if v is not None and v.number != 0:
            out[m.name] = v.number
    return out


class API:
    """The Engine service's messages and methods, from a FileDescriptorSet.

    call() goes over the call channel once open_call_channel() has opened one, for every method
    the channel carries; call_grpc() and call_channel() pick the transport."""

    def __init__(self, descriptor_path, socket_path):
        with open(descriptor_path, "rb") as f:
            fds = descriptor_pb2.FileDescriptorSet.FromString(f.read())
        self.pool = descriptor_pool.DescriptorPool()
        for fd in fds.file:
            self.pool.AddSerializedFile(fd.SerializeToString())
        self._classes = {}
        self.socket_path = socket_path
        self.channel = grpc.insecure_channel(
            "unix:" + os.path.abspath(socket_path),
            options=[("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20),
                     # A call channel lives as long as the gRPC connection that opened it, and
                     # with every call on the channel that connection is idle.
                     ("grpc.client_idle_timeout_ms", 2**31 - 1)],
        )
        service = self.pool.FindServiceByName(SERVICE)
        self._methods = {}
        for m in service.methods:
            self._methods[m.name] = self.channel.unary_unary(
                "/%s/%s" % (SERVICE, m.name),
                request_serializer=lambda msg: msg.SerializeToString(),
                response_deserializer=self.cls(m.output_type.full_name).FromString,
            )
        self._inputs = {m.name: m.input_type.full_name for m in service.methods}
        self._outputs = {m.name: m.output_type.full_name for m in service.methods}
        self.channel_methods = channel_method_numbers(self.pool, service)
        self.calls = None  # the CallChannel, once opened
        self.use_channel = True  # call() goes over it once it is open

    def cls(self, name):
        if "." not in name:
            name = PKG + "." + name
        c = self._classes.get(name)
        if c is None:
            d = self.pool.FindMessageTypeByName(name)
            if hasattr(message_factory, "GetMessageClass"):
                c = message_factory.GetMessageClass(d)
            else:
                c = message_factory.MessageFactory(self.pool).GetPrototype(d)
            self._classes[name] = c
        return c

    def msg(self, name, **kw):
        return self.cls(name)(**kw)

    def open_call_channel(self):
        """Opens a call channel: one end of a SOCK_SEQPACKET pair goes to the daemon, which makes
        it a channel of this gRPC connection; the other stays here."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            token = send_fd(self.socket_path, theirs.fileno())
            resp = self.call_grpc("OpenCallChannel", fd_token=token)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()  # the daemon holds its own copy now
        self.calls = CallChannel(ours, resp.max_frame_bytes, resp.max_message_bytes)
        return resp

    def call(self, method, timeout=120, **kw):
        if self.use_channel and self.calls is not None and method in self.channel_methods:
            req = self.cls(self._inputs[method])(**kw)
            body = req.SerializeToString()
            # The daemon takes requests up to max_message_bytes over a channel; a larger one
            # (a prompt of over half a million tokens) goes over gRPC.
            if len(body) <= self.calls.max_message:
                return self._channel_call(method, body, timeout)
            return self._methods[method](req, timeout=timeout)
        return self.call_grpc(method, timeout=timeout, **kw)

    def call_grpc(self, method, timeout=120, **kw):
        req = self.cls(self._inputs[method])(**kw)
        return self._methods[method](req, timeout=timeout)

    def call_channel(self, method, timeout=120, **kw):
        """Makes the call over the channel whatever its size."""
        return self._channel_call(method, self.cls(self._inputs[method])(**kw).SerializeToString(), timeout)

    def _channel_call(self, method, request, timeout):
        body = self.calls.call(self.channel_methods[method], request, timeout)
        try:
            return self.cls(self._outputs[method]).FromString(body)
        except Exception as e:  # a response that does not decode, as gRPC reports one
            raise CallError(grpc.StatusCode.INTERNAL, "call channel: the %s response does not decode: %s" % (method, e))

    def close(self):
        if self.calls is not None:
            self.calls.close()
        self.channel.close()


def pack_tokens(tokens):
    """tokens as Request.tokens_packed: 8 bytes a token, little-endian int64."""
    a = array.array("q", tokens)
    if sys.byteorder != "little":
        a.byteswap()
    return a.tobytes()


def blake_seed(tokens):
    d = hashlib.blake2b(array.array("q", tokens).tobytes(), digest_size=8).digest()
    return int.from_bytes(d, "little") & ((1 << 62) - 1)


class CudaMemory:
    """The KV pool as one CUDA tensor: region l of slot s is bytes [l][s] of a (L, slots, piece) view."""

    def __init__(self, layers, slots, piece, lead=4096):
        import torch

        self.torch = torch
        self.dev = torch.device("cuda", torch.cuda.current_device())
        self.size = layers * slots * piece
        # The pool starts inside the allocation, so the offset in the registration matters.
        self.base = torch.empty(lead + self.size, dtype=torch.uint8, device=self.dev)
        self.mem = self.base[lead:]
        self.regions = self.mem.view(layers, slots, piece)
        self.layers, self.piece = layers, piece
        self.page_bytes = layers * piece
        self.mem.fill_(0xEE)
        torch.cuda.synchronize()

    def register_fields(self, api):
        shared = self.mem.untyped_storage()._share_cuda_()
        handle, storage_offset = shared[1], shared[3]
        offset = storage_offset + self.mem.storage_offset() * self.mem.element_size()
        ipc = api.msg("CudaIPC", handle=handle, offset=offset, size=self.size, device=self.dev.index)
        return {"cuda_ipc": ipc}, {"kind": "cuda_ipc", "handle_bytes": len(handle), "offset": offset, "size": self.size}

    def value(self, seed):
        t = self.torch
        x = t.arange(self.page_bytes // 8, dtype=t.int64, device=self.dev)
        x = (x + seed) * 6364136223846793005
        x = x ^ (x >> 29)
        x = x * 1442695040888963407
        x = x ^ (x >> 32)
        return x.view(t.uint8).view(self.layers, self.piece)

    def poison(self, slots):
        if slots:
            idx = self.torch.tensor(slots, dtype=self.torch.int64, device=self.dev)
            self.regions[:, idx, :] = 0xEE

    def write(self, slot, seed):
        self.regions[:, slot, :] = self.value(seed)

    def mismatches(self, slot, seed):
        got = self.regions[:, slot, :]
        want = self.value(seed)
        if self.torch.equal(got, want):
            return 0
        return int((got != want).sum().item())

    def sync(self):
        self.torch.cuda.synchronize()

    def busy(self, seconds):
        """Keeps the GPU computing for about seconds, then waits for it: what the previous
        step's forward pass leaves behind when an engine calls StartLoad."""
        t = self.torch
        if not hasattr(self, "_busy"):
            self._busy = t.randn(2048, 2048, device=self.dev, dtype=t.float16)
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            for _ in range(4):
                self._busy @ self._busy
            t.cuda.synchronize()

    def close(self):
        self.sync()
        del self.regions, self.mem, self.base


class ShmMemory:
    """The KV pool in a shared-memory file (no GPU): the same layout, bytes from SHAKE-256."""

    def __init__(self, layers, slots, piece):
        self.layers, self.slots, self.piece = layers, slots, piece
        self.size = layers * slots * piece
        self.page_bytes = layers * piece
        # kvctl serve accepts only a memfd sealed against shrinking: memory truncated under its
        # mapping would fault in the daemon.
        self.fd = os.memfd_create("torch-engine-kv", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.ftruncate(self.fd, self.size)
        F_ADD_SEALS, F_SEAL_SHRINK, F_SEAL_GROW = 1033, 0x0002, 0x0004
        fcntl.fcntl(self.fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW)
        self.map = mmap.mmap(self.fd, self.size)

    def register_fields(self, api):
        token = send_fd(api.socket_path, self.fd)
        shm = api.msg("SharedMemory", fd_token=token, size=self.size)
        return {"shared_memory": shm}, {"kind": "shared_memory", "size": self.size}

    def value(self, seed):
        return hashlib.shake_256(seed.to_bytes(8, "little")).digest(self.page_bytes)

    def _pieces(self, slot):
        for l in range(self.layers):
            off = (l * self.slots + slot) * self.piece
            yield l * self.piece, off

    def poison(self, slots):
        for s in slots:
            for _, off in self._pieces(s):
                self.map[off : off + self.piece] = b"\xee" * self.piece

    def write(self, slot, seed):
        v = self.value(seed)
        for voff, off in self._pieces(slot):
            self.map[off : off + self.piece] = v[voff : voff + self.piece]

    def mismatches(self, slot, seed):
        v = self.value(seed)
        bad = 0
        for voff, off in self._pieces(slot):
            got = self.map[off : off + self.piece]
            want = v[voff : voff + self.piece]
            if got != want:
                bad += sum(1 for a, b in zip(got, want) if a != b)
        return bad

    def sync(self):
        pass

    def busy(self, seconds):
        pass

    def close(self):
        self.map.close()
        os.close(self.fd)


def prompts(seed, n, T, min_blocks, max_blocks):
    """n prompts of min..max full blocks plus a partial tail; every third shares its first two
    blocks with the one before, as turns of a conversation do."""
    rng = random.Random(seed)
    out, prev = [], None
    for i in range(n):
        toks = list(prev[: 2 * T]) if (i % 3 == 2 and prev is not None) else []
        want = rng.randint(min_blocks, max_blocks) * T + rng.randint(1, T - 1)
        while len(toks) < want:
            toks.append(rng.randrange(150000))
        prev = toks
        out.append(("req-%d" % i, toks))
    return out


WAITING, RUNNING, SAVING, DONE = range(4)


class Req:
    def __init__(self, rid, tokens):
        self.id, self.tokens = rid, tokens
        self.reset()

    def reset(self):
        self.phase = WAITING
        self.pages = None
        self.sent = 0
        self.computed = 0
        self.restore = 0
        self.written = 0
        self.saved = False


class Engine:
    """One engine rank (world size 1, scheduler adapter on) with its own KV pool."""

    def __init__(self, api, args, name, mem):
        self.api, self.args, self.name, self.mem = api, args, name, mem
        self.T = args.tokens_per_block
        self.free = list(range(args.slots - 1, -1, -1))
        piece = args.page_bytes // args.layers
        regions = [api.msg("Region", offset=l * args.slots * piece, stride=piece, size=piece) for l in range(args.layers)]
        layout = api.msg(
            "Layout",
            tokens_per_block=self.T,
            groups=[api.msg("LayerGroup", id=0, slots=args.slots, regions=regions)],
        )
        memory, self.memory_info = mem.register_fields(api)
        resp = api.call(
            "Register",
            engine=name,
            model_key=args.model_key,
            world_size=1,
            rank=0,
            role="both",
            scheduler=True,
            layout=layout,
            transfer_batch_size=args.transfer_batch,
            staging_buffer_bytes=args.staging_bytes,
            **memory,
        )
        self.shard = resp.shard

    def seed(self, r, b):
        return blake_seed(r.tokens[: (b + 1) * self.T])

    def allocate(self, r):
        blocks = (len(r.tokens) + self.T - 1) // self.T
        if len(self.free) < blocks:
            raise RuntimeError("request %s needs %d slots, %d free: raise --slots" % (r.id, blocks, len(self.free)))
        r.pages = self.free[len(self.free) - blocks :][::-1]
        del self.free[len(self.free) - blocks :]
        self.mem.poison(r.pages)  # so a load that writes nothing is caught

    def release(self, r):
        self.free.extend(r.pages)
        r.pages = None

    def block_ids(self, r, start):
        return [self.api.msg("BlockIDs", ids=r.pages[start:])]

    def run(self, reqs):
        a, api, name, T = self.args, self.api, self.name, self.T
        res = dict(requests=len(reqs), passes=0, prompt_tokens=0, matched_tokens=0, loaded_blocks=0,
                   computed_blocks=0, restarts=0, mismatched_blocks=0, mismatched_bytes=0,
                   start_load_seconds=0.0, start_loads=0, rpc_seconds=0.0, loaded_bytes=0, wall_seconds=0.0,
                   start_load_each=[])
        rs = [Req(rid, toks) for rid, toks in reqs]
        by_id = {r.id: r for r in rs}
        res["prompt_tokens"] = sum(len(r.tokens) for r in rs)
        t0 = time.perf_counter()
        deadline = time.monotonic() + a.pass_timeout
        while True:
            if time.monotonic() > deadline:
                raise RuntimeError("pass made no progress within %ds" % a.pass_timeout)
            if all(r.phase == DONE for r in rs):
                break
            res["passes"] += 1
            running = sum(1 for r in rs if r.phase in (RUNNING, SAVING))

            # Admit waiting requests.
            for r in rs:
                if r.phase != WAITING or running >= a.max_running:
                    continue
                lr = api.call("Lookup", engine=name, num_computed_tokens=0,
                              request=api.msg("Request", id=r.id, tokens_packed=pack_tokens(r.tokens), context_only=True))
                self.allocate(r)
                h = lr.matched_tokens
                api.call("UpdateStateAfterAlloc", engine=name, request_id=r.id,
                         block_ids_by_group=self.block_ids(r, 0), honoured_tokens=h)
                r.phase, r.restore = RUNNING, h
                res["matched_tokens"] += h
                running += 1

            # This pass's metadata.
            new, cached, scheduled = [], [], {}
            for r in rs:
                if r.phase != RUNNING:
                    continue
                n = min(a.chunk_blocks * T, len(r.tokens) - r.computed - r.restore)
                rd = api.msg("RequestData", id=r.id, computed_position=r.computed, num_scheduled_tokens=n,
                             new_block_ids_by_group=self.block_ids(r, r.sent))
                (new if r.sent == 0 else cached).append(rd)
                r.sent = len(r.pages)
                scheduled[r.id] = n
            subs = api.call("TakeSubmittedSaves", engine=name)
            meta = api.call("BuildMeta", engine=name, new_requests=new, cached_requests=cached,
                            submitted_saves=list(subs.ids))
            api.call("BindMeta", engine=name, metadata=meta)
            self.mem.sync()  # the poison must land before the daemon's copies
            if a.busy_ms > 0:
                self.mem.busy(a.busy_ms / 1000)
            t1 = time.perf_counter()
            api.call("StartLoad", engine=name)
            t2 = time.perf_counter()
            res["start_load_seconds"] += t2 - t1
            res["start_loads"] += 1
            # Each StartLoad's seconds and the pages it restores, to tell a slow first load
            # from a uniformly slow one.
            res["start_load_each"].append([t2 - t1, sum(r.restore // T for r in rs if r.id in scheduled)])
            failed = api.call("TakeFailedLoads", engine=name)
            # A call that does next to nothing in the daemon: the RPC's own cost, for comparison.
            res["rpc_seconds"] += time.perf_counter() - t2
            for rid in failed.ids:
                r = by_id[rid]
                scheduled.pop(rid, None)
                api.call("RequestReset", engine=name, request_id=rid)
                self.release(r)
                res["matched_tokens"] -= r.restore
                r.reset()
                res["restarts"] += 1

            # Compute: check restored blocks, write the KV of newly computed ones.
            finished_gen = []
            for r in rs:
                if r.id not in scheduled:
                    continue
                n = scheduled[r.id]
                if r.restore > 0:
                    for b in range(r.computed // T, (r.computed + r.restore) // T):
                        bad = self.mem.mismatches(r.pages[b], self.seed(r, b))
                        if bad:
                            res["mismatched_blocks"] += 1
                            res["mismatched_bytes"] += bad
                            if res["mismatched_blocks"] <= 5:
                                print("mismatch: request %s block %d slot %d: %d bytes differ" % (r.id, b, r.pages[b], bad), file=sys.stderr)
                        res["loaded_blocks"] += 1
                        res["loaded_bytes"] += self.mem.page_bytes
                    r.written = (r.computed + r.restore) // T
                r.computed += r.restore + n
                r.restore = 0
                for b in range(r.written, r.computed // T):
                    self.mem.write(r.pages[b], self.seed(r, b))
                    res["computed_blocks"] += 1
                r.written = max(r.written, r.computed // T)
            self.mem.sync()  # the KV must be in memory before the daemon may save it
            for r in rs:
                if r.id in scheduled and r.computed == len(r.tokens):
                    fr = api.call("RequestFinished", engine=name, request_id=r.id)
                    if fr.async_saving:
                        r.phase = SAVING
                        finished_gen.append(r.id)
                    else:
                        r.phase = DONE
                        self.release(r)

            api.call("WaitForSave", engine=name)
            gf = api.call("GetFinished", engine=name, finished_gen=finished_gen)
            for rid in gf.finished_saving:
                if rid in by_id:
                    by_id[rid].saved = True
            idle = True
            for r in rs:
                if r.phase == SAVING and r.saved:
                    r.phase = DONE
                    self.release(r)
                if r.phase in (RUNNING, WAITING):
                    idle = False
            if idle:
                time.sleep(0.0002)  # only saves in flight
        res["wall_seconds"] = time.perf_counter() - t0
        return res

    def close(self):
        self.api.call("Unregister", engine=self.name, timeout=120)


def pinned_anchor(torch, nbytes=64 << 20, reps=20):
    """The same run's link anchor: GB/s (10^9 bytes/s) of one pinned nbytes copy host->device and
    device->host, median of reps timed with CUDA events after three warm-up copies."""
    host = torch.randint(0, 256, (nbytes,), dtype=torch.uint8).pin_memory()
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    out = {}
    for name, dst, src in (("h2d", dev, host), ("d2h", host, dev)):
        times = []
        for i in range(reps + 3):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            dst.copy_(src, non_blocking=True)
            b.record()
            b.synchronize()
            if i >= 3:
                times.append(a.elapsed_time(b) / 1e3)
        times.sort()
        out[name + "_64mib_gbs"] = nbytes / times[len(times) // 2] / 1e9
    del host, dev
    return out


def large_calls(api, engine, seed, prefix):
    """Calls of requests larger than a frame, and one larger than the channel takes: a Lookup of
    a 32k-token prompt that starts with a saved prompt (prefix) over each transport (the answers
    must agree and match the saved blocks), then a prompt over the
    channel's max_message_bytes, which the channel must refuse (RESOURCE_EXHAUSTED) and call()
    sends over gRPC instead, and a plain call over the channel after it."""
    rng = random.Random(seed + 7)
    out = {}
    toks = list(prefix) + [rng.randrange(150000) for _ in range((32 << 10) - len(prefix))]
    for via, call in (("grpc", api.call_grpc), ("channel", api.call_channel)):
        r = call("Lookup", engine=engine, num_computed_tokens=0,
                 request=api.msg("Request", id="large-32k-" + via, tokens_packed=pack_tokens(toks)))
        out["lookup_32k_" + via] = r.matched_tokens
    # Past the bound by one token's bytes and a little more for the other fields.
    toks = [rng.randrange(150000) for _ in range(api.calls.max_message // 8 + 1)]
    req = api.msg("Request", id="large-over", tokens_packed=pack_tokens(toks))
    try:
        api.call_channel("Lookup", engine=engine, num_computed_tokens=0, request=req)
        out["over_channel_error"] = None
    except grpc.RpcError as e:
        out["over_channel_error"] = {"code": e.code().name, "details": e.details()}
    out["over_bytes"] = len(api.msg("LookupRequest", engine=engine, request=req).SerializeToString())
    use, api.use_channel = api.use_channel, True
    try:
        out["over_routed_matched"] = api.call("Lookup", engine=engine, num_computed_tokens=0, request=req).matched_tokens
    finally:
        api.use_channel = use
    api.call_channel("TakeFailedLoads", engine=engine)
    out["channel_after_over"] = "ok"
    return out


def channel_after_connection_end(api, engine, wait=10.0):
    """Ends the gRPC connection that opened the call channel and calls over the channel until
    the daemon has closed it, as it must when that connection ends: the error and how long it
    took to come."""
    api.channel.close()
    t0 = time.monotonic()
    while True:
        try:
            api.call_channel("TakeFailedLoads", engine=engine, timeout=wait)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.UNAVAILABLE or time.monotonic() - t0 > wait:
                return {"code": e.code().name, "details": e.details(), "seconds": time.monotonic() - t0}
        if time.monotonic() - t0 > wait:
            return {"code": "OK", "details": "the channel still answered %.0fs after its connection ended" % wait,
                    "seconds": time.monotonic() - t0}
        time.sleep(0.001)


def time_calls(call, engine, n):
    """The mean seconds of n calls that do next to nothing in the daemon."""
    t0 = time.perf_counter()
    for _ in range(n):
        call("TakeFailedLoads", engine=engine)
    return (time.perf_counter() - t0) / n


def bench_calls(api, args):
    """--bench-calls: registers an engine, then for each count n read from stdin makes n plain
    calls over each transport, in interleaved chunks so that both see the same machine, and
    prints their mean seconds a call as `BENCH {json}`."""
    args.slots = 4
    mem = new_memory(args)
    e = Engine(api, args, args.name + "-bench/rank0", mem)
    for call in (api.call_grpc, api.call_channel):
        time_calls(call, e.name, args.bench_calls)  # warm-up
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        n = int(line)
        took = {"grpc": 0.0, "channel": 0.0}
        done = 0
        while done < n:
            k = min(100, n - done)
            for via, call in (("grpc", api.call_grpc), ("channel", api.call_channel)):
                took[via] += time_calls(call, e.name, k) * k
            done += k
        out = {"calls": n, "grpc_seconds": took["grpc"] / n, "channel_seconds": took["channel"] / n}
        print("BENCH " + json.dumps(out), flush=True)
    e.close()
    mem.close()
    api.close()
    return 0


def new_memory(args):
    piece = args.page_bytes // args.layers
    if args.memory == "cuda":
        return CudaMemory(args.layers, args.slots, piece)
    return ShmMemory(args.layers, args.slots, piece)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--socket", required=True, help="the daemon's engine socket")
    p.add_argument("--descriptor", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "engine.pb"))
    p.add_argument("--stats-url", default="", help="the daemon's /v1/stats, read before the warm engine unregisters")
    p.add_argument("--memory", choices=["cuda", "shm"], default="cuda")
    p.add_argument("--model-key", default="torch-model")
    p.add_argument("--name", default="torch")
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--tokens-per-block", type=int, default=32)
    p.add_argument("--min-blocks", type=int, default=8)
    p.add_argument("--max-blocks", type=int, default=16)
    p.add_argument("--page-bytes", type=int, default=1 << 20)
    p.add_argument("--layers", type=int, default=2, help="regions a page is split into (one per layer)")
    p.add_argument("--max-running", type=int, default=16)
    p.add_argument("--chunk-blocks", type=int, default=4, help="blocks a request computes per pass")
    p.add_argument("--slots", type=int, default=0, help="page slots (0: enough for --max-running requests)")
    p.add_argument("--transfer-batch", type=int, default=0)
    p.add_argument("--busy-ms", type=float, default=0,
                   help="keep the GPU computing this long before each StartLoad, as the previous step's forward pass does in a serving engine (0: the GPU idles between passes)")
    p.add_argument("--staging-bytes", type=int, default=256 << 20)
    p.add_argument("--pass-timeout", type=int, default=300)
    p.add_argument("--spin-us", type=float, default=0,
                   help="microseconds a call channel call polls for its response before sleeping in recv")
    p.add_argument("--calls", choices=["channel", "grpc"], default="channel",
                   help="the transport of engine calls: a call channel or plain gRPC")
    p.add_argument("--bench-calls", type=int, default=0,
                   help="time plain calls over both transports for counts read from stdin (N: warm-up calls)")
    args = p.parse_args()
    if args.page_bytes % (8 * args.layers):
        p.error("--page-bytes must be a multiple of 8 * --layers")
    if args.slots == 0:
        args.slots = args.max_running * (args.max_blocks + 1)

    api = API(args.descriptor, args.socket)
    # A channel is opened whichever transport runs, so both can be timed.
    opened = api.open_call_channel()
    api.calls.spin = args.spin_us / 1e6
    api.use_channel = args.calls == "channel"
    if args.bench_calls:
        return bench_calls(api, args)
    reqs = prompts(args.seed, args.requests, args.tokens_per_block, args.min_blocks, args.max_blocks)
    T = args.tokens_per_block
    # The same failing call over each transport: the error must read the same.
    errors = {}
    for via, call in (("grpc", api.call_grpc), ("channel", api.call_channel)):
        try:
            call("TakeFailedLoads", engine=args.name + "-never-registered/rank0")
            errors[via] = None
        except grpc.RpcError as e:
            errors[via] = {"code": e.code().name, "details": e.details()}
    summary = {"memory": args.memory, "page_bytes": args.page_bytes, "layers": args.layers, "busy_ms": args.busy_ms,
               "tokens_per_block": T, "slots": args.slots, "max_running": args.max_running,
               "calls": args.calls, "spin_us": args.spin_us, "unregistered_call_errors": errors,
               "call_channel": {"max_frame_bytes": opened.max_frame_bytes, "max_message_bytes": opened.max_message_bytes}}
    if args.memory == "cuda":
        import torch

        summary["torch"] = torch.__version__
        summary["gpu"] = torch.cuda.get_device_name()
        summary["anchor"] = pinned_anchor(torch)

    # Cold pass: computes and saves every block.
    mem = new_memory(args)
    cold = Engine(api, args, args.name + "-cold/rank0", mem)
    summary["registration"] = cold.memory_info
    summary["cold"] = cold.run(reqs)
    summary["large_calls"] = large_calls(api, cold.name, args.seed, reqs[0][1])
    cold.close()
    mem.close()

    # Warm pass: a new engine with fresh memory loads what the cold pass saved.
    mem = new_memory(args)
    warm = Engine(api, args, args.name + "-warm/rank0", mem)
    # An engine call's own cost on an idle daemon, over each transport: calls that do next to
    # nothing there.
    for via, call in (("grpc", api.call_grpc), ("channel", api.call_channel)):
        summary["idle_rpc_seconds_" + via] = time_calls(call, warm.name, 200)
    summary["idle_rpc_seconds"] = summary["idle_rpc_seconds_" + args.calls]
    summary["warm"] = warm.run([(rid + "-warm", toks) for rid, toks in reqs])
    # Every full block but the one holding the last prompt token is offered.
    summary["expected_warm_loaded_blocks"] = sum((len(t) - 1) // T for _, t in reqs)
    if args.stats_url:
        with urllib.request.urlopen(args.stats_url, timeout=30) as resp:
            summary["daemon_loads"] = json.load(resp)["loads"]
    warm.close()
    mem.close()
    summary["call_channel_stats"] = dict(api.calls.stats)
    summary["channel_after_connection_end"] = channel_after_connection_end(api, warm.name)
    api.close()

    if args.memory == "cuda":
        # Measured again after the passes: the anchor brackets the loads.
        after = pinned_anchor(torch)
        summary["anchor_after"] = after
    w = summary["warm"]
    problems = []
    if summary["cold"]["mismatched_blocks"] or w["mismatched_blocks"]:
        problems.append("loaded pages held wrong bytes")
    if w["loaded_blocks"] == 0:
        problems.append("the warm pass loaded nothing")
    summary["ok"] = not problems
    summary["problems"] = problems
    print("SUMMARY " + json.dumps(summary), flush=True)
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
