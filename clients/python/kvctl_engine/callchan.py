"""Call channels: engine calls over a unix SOCK_SEQPACKET socket pair instead of HTTP/2.

The engine makes a socket pair, sends one end to the daemon over the descriptor side channel and
names its token in OpenCallChannel; the daemon makes that end a channel of the gRPC connection
that opened it. Each request and each response is a message of one or more frames, each frame one
datagram (core/engineapi/callframe.go, engine.proto). Frame header, little-endian:

    bytes 0-3   magic 0x3143564b ("KVC1")
    bytes 4-5   method: its CallChannelMethod number
    byte  6     flags: bit 0 set when more frames of the same message follow
    byte  7     status: 0 in requests; in responses the gRPC status code (0 OK)
    bytes 8-15  call id, chosen by the engine and echoed in every frame of the response

then up to max_frame_bytes - 16 bytes of the message. A response with status 0 carries the
method's protobuf response; any other status carries the error message as UTF-8. One call at a
time per channel: a CallChannel is not shared between threads without a lock (Client holds one).
"""

from __future__ import annotations

import socket
import struct
import time
from dataclasses import dataclass

import grpc

from .errors import CallTimeout, DaemonUnavailable, KvctlError, ResourceExhausted, error_from_status

__all__ = [
    "FRAME_HEADER",
    "FRAME_MAGIC",
    "FRAME_MORE",
    "MAX_FRAME_BYTES",
    "MAX_RESPONSE_BYTES",
    "CallChannel",
    "CallChannelStats",
]

FRAME_MAGIC = 0x3143564B
FRAME_HEADER = struct.Struct("<IHBBQ")
FRAME_MORE = 1
# MAX_FRAME_BYTES bounds the daemon's max_frame_bytes this side accepts (it answers 64 KiB).
MAX_FRAME_BYTES = 1 << 20
# MAX_RESPONSE_BYTES is the largest response taken, as the gRPC channel's receive bound.
MAX_RESPONSE_BYTES = 64 << 20

_STATUS_CODES = {c.value[0]: c for c in grpc.StatusCode}


@dataclass
class CallChannelStats:
    """What went over a channel: calls, frames each way, messages of more than one frame, the
    largest request and response in bytes."""

    calls: int = 0
    frames_sent: int = 0
    frames_received: int = 0
    multi_frame_requests: int = 0
    multi_frame_responses: int = 0
    largest_request_bytes: int = 0
    largest_response_bytes: int = 0


class CallChannel:
    """The engine's end of a call channel. ``call`` sends one request and returns the response's
    bytes, or raises the KvctlError of the daemon's status (or DaemonUnavailable when the channel
    broke, CallTimeout when the deadline passed). Once broken, every later call raises
    DaemonUnavailable with the first cause."""

    def __init__(self, sock: socket.socket, max_frame_bytes: int, max_message_bytes: int) -> None:
        if max_frame_bytes <= FRAME_HEADER.size or max_frame_bytes > MAX_FRAME_BYTES:
            raise KvctlError("call channel: the daemon's max_frame_bytes %d is out of range" % max_frame_bytes)
        self.sock = sock
        self.max_frame = max_frame_bytes
        self.max_message = max_message_bytes
        self.max_response = MAX_RESPONSE_BYTES
        self.stats = CallChannelStats()
        self.closed: str | None = None  # why the channel can no longer be used
        # Seconds a call polls for its response before it sleeps in recv: a thread woken by the
        # kernel on an idle CPU can cost more than a short call.
        self.spin = 0.0
        self._next_id = 1
        self._timeout: float | None = -1.0
        # One byte more than a frame may hold: a datagram that fills it was truncated.
        self._rbuf = bytearray(max_frame_bytes + 1)
        self._rview = memoryview(self._rbuf)

    def _set_timeout(self, timeout: float | None) -> None:
        # SO_RCVTIMEO rather than socket.settimeout: Python's own timeout costs a poll before
        # every send and recv. A daemon that stops reading fails the send (SO_SNDTIMEO).
        if timeout == self._timeout:
            return
        t = 0.0 if timeout is None else max(timeout, 1e-3)
        sec = int(t)
        tv = struct.pack("@ll", sec, int((t - sec) * 1e6))
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)
        self._timeout = timeout

    def _fail(self, why: str, method: str) -> DaemonUnavailable:
        self.closed = self.closed or why
        return DaemonUnavailable("call channel: " + why, method=method)

    def call(self, method_number: int, request: bytes, timeout: float | None, method: str = "") -> bytes:
        """Sends request as a call of method_number (CallChannelMethod) with a deadline of
        timeout seconds (None: no deadline) and returns the response message's bytes."""
        if self.closed:
            raise DaemonUnavailable("call channel: " + self.closed, method=method)
        self._set_timeout(timeout)
        cid = self._next_id
        self._next_id += 1
        frag = self.max_frame - FRAME_HEADER.size
        pack, send = FRAME_HEADER.pack, self.sock.send
        n = len(request)
        st = self.stats
        st.calls += 1
        st.largest_request_bytes = max(st.largest_request_bytes, n)
        try:
            if n <= frag:
                send(pack(FRAME_MAGIC, method_number, 0, 0, cid) + request)
                st.frames_sent += 1
            else:
                view = memoryview(request)
                for off in range(0, n, frag):
                    more = FRAME_MORE if off + frag < n else 0
                    send(pack(FRAME_MAGIC, method_number, more, 0, cid) + view[off : off + frag])
                    st.frames_sent += 1
                st.multi_frame_requests += 1
        except (BrokenPipeError, ConnectionResetError) as e:
            raise self._fail("closed by the daemon (sending call %d: %s)" % (cid, e), method) from e
        except BlockingIOError as e:
            # The send timed out half-way: the ends are out of step for good.
            raise self._fail("the daemon stopped reading (sending call %d)" % cid, method) from e
        except OSError as e:
            raise self._fail("sending call %d: %s" % (cid, e), method) from e
        return self._response(method_number, cid, timeout, method)

    def _recv(self) -> int:
        if self.spin > 0:
            recv, end = self.sock.recv_into, time.perf_counter() + self.spin
            while True:
                try:
                    return recv(self._rbuf, 0, socket.MSG_DONTWAIT)
                except BlockingIOError:
                    if time.perf_counter() >= end:
                        break
        return self.sock.recv_into(self._rbuf)

    def _frame(self, cid: int, timeout: float | None, method: str) -> tuple[int, int, int, int, int]:
        try:
            n = self._recv()
        except BlockingIOError as e:
            # The deadline passed. A response that comes later is skipped by its call id.
            raise CallTimeout(
                "no response within %.3gs over the call channel (call %d)" % (timeout or 0, cid), method=method
            ) from e
        except OSError as e:
            raise self._fail("waiting for the response to call %d: %s" % (cid, e), method) from e
        if n == 0:
            raise self._fail("closed by the daemon (is kvctl serve still running?)", method)
        if n > self.max_frame:
            raise self._fail("a frame of more than %d bytes, the channel's max_frame_bytes" % self.max_frame, method)
        self.stats.frames_received += 1
        if n < FRAME_HEADER.size:
            raise self._fail("a frame of %d bytes, shorter than the %d-byte header" % (n, FRAME_HEADER.size), method)
        magic, m, flags, status, rid = FRAME_HEADER.unpack_from(self._rbuf)
        if magic != FRAME_MAGIC:
            raise self._fail("a frame with magic %#010x, want %#010x (KVC1)" % (magic, FRAME_MAGIC), method)
        if flags & ~FRAME_MORE:
            raise self._fail("a frame with unknown flags %#04x" % flags, method)
        return m, flags, status, rid, n

    def _response(self, method_number: int, cid: int, timeout: float | None, method: str) -> bytes:
        parts: list[bytes] = []
        size, over, frames = 0, False, 0
        first: int | None = None
        hs = FRAME_HEADER.size
        while True:
            m, flags, status, rid, n = self._frame(cid, timeout, method)
            if first is None and rid != 0 and rid < cid:
                continue  # a late frame of a call that timed out
            if first is None and rid == 0 and status != 0 and not flags & FRAME_MORE:
                # An error the daemon could not tie to a call: one of our frames was malformed.
                code = _STATUS_CODES.get(status, grpc.StatusCode.UNKNOWN)
                raise error_from_status(code, bytes(self._rview[hs:n]).decode("utf-8", "replace"), method)
            if rid != cid or m != method_number:
                raise self._fail(
                    "a frame of call %d (method %d) came in answer to call %d (method %d)"
                    % (rid, m, cid, method_number),
                    method,
                )
            if first is None:
                first = status
            elif status != first:
                raise self._fail(
                    "call %d's response changed status from %d to %d between frames" % (cid, first, status), method
                )
            size += n - hs
            frames += 1
            if size > self.max_response:
                over, parts = True, []  # skipped to its last frame, so the ends stay in step
            elif not over:
                parts.append(bytes(self._rview[hs:n]))
            if not flags & FRAME_MORE:
                break
        if over:
            raise ResourceExhausted(
                "call channel: a response of %d bytes, above the limit of %d" % (size, self.max_response),
                method=method,
            )
        body = parts[0] if len(parts) == 1 else b"".join(parts)
        st = self.stats
        st.largest_response_bytes = max(st.largest_response_bytes, size)
        if frames > 1:
            st.multi_frame_responses += 1
        if first:
            code = _STATUS_CODES.get(first, grpc.StatusCode.UNKNOWN)
            raise error_from_status(code, body.decode("utf-8", "replace"), method)
        return body

    def close(self) -> None:
        self.closed = self.closed or "closed"
        self.sock.close()
